// Package drlharness runs limitplane's distributed rate limiter (DRL, issue
// 12) as real processes and measures it against Tyk's equal split.
//
// A run builds cmd/limitplane-gateway, starts one redis-server on a free
// loopback port (never 6379) and Options.Gateways gateway processes, each
// with its own generated YAML file, and drives them with open-loop load
// over keep-alive HTTP connections: the offered rate (Options.Offered,
// requests/s) is split over the gateways by Options.Split, as a load
// balancer would, every request carries the same API key (the hot key),
// and every answer is recorded with the times it was sent and answered and
// its status (200 admitted, 429 refused, anything else an error). It does
// this once per mode, and every process it starts it stops, on success,
// error or cancellation:
//
//   - ModeEqual is Tyk's DRL as a peer: each gateway enforces R/N (burst
//     B/N) in its own memory store, N = Options.Gateways, with no Redis.
//   - ModeDRL is limitplane's: the gateways share the Redis store and the
//     policy is `distributed: true` under a `drl:` section, so hot keys
//     are decided in process against a share that follows demand.
//
// Result.Line is the summary the issue asks for:
//
//	mode=drl admitted_per_s=… pct_of_possible=… worst_window=… bound=… redis_calls_on_path=…
//
// Scenarios (Options.Churn, Step, KillAllocator, RedisPause, SlowLink,
// StallAt, MoveAt) add events at set times of the run; each is logged to
// Options.Log and measured in the Result.
package drlharness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/procs"
)

// Mode names how the gateways share the limit.
type Mode string

// The modes of a run, in the order Run measures them by default.
const (
	// ModeEqual is Tyk's flat split: rate R/N and burst B/N per gateway,
	// in process, N fixed at Options.Gateways.
	ModeEqual Mode = "equal"
	// ModeDRL is limitplane's distributed rate limiter.
	ModeDRL Mode = "drl"
)

// storePrefix is the Redis store's key prefix in ModeDRL: the store's keys
// are "<prefix>{<hash of the consumer>}:...", which is how the harness
// tells its script calls from the DRL's.
const storePrefix = "lpdrl:"

// Options describe a run. Zero values take the defaults given.
type Options struct {
	// Gateways is the number of gateway processes (default 4).
	Gateways int
	// Rate is the global limit R in requests per second (default 1000);
	// Burst is B (default 100). The bound on any 1 s window is R + B.
	Rate, Burst int64
	// Offered is the total offered load in requests per second (default
	// 1500).
	Offered float64
	// Split weighs the offered load over the gateways (default even);
	// len(Split) == Gateways.
	Split []float64
	// Duration is the length of the load (default 30 s); Warmup its start
	// left out of admitted_per_s (default 3 s).
	Duration, Warmup time.Duration
	// Modes are run in this order (default equal, then drl).
	Modes []Mode
	// Poisson makes each gateway's arrivals a Poisson process instead of
	// evenly spaced, seeded by Seed.
	Poisson bool
	Seed    uint64

	// The drl: section of ModeDRL (0 leaves the gateway's default):
	// Interval is H, MaxGateways, JoinReserve and Headroom as in the
	// README; Unsafe runs the DRL mode's gateways from a build with the
	// test-only tag limitplane_drl_unsafe (UnsafeGatewayBin), whose
	// allocator publishes grows before shrinks and so breaks the bound:
	// no file, flag or variable of a normal build can turn that on.
	Interval    time.Duration
	MaxGateways int
	JoinReserve int
	Headroom    float64
	Unsafe      bool

	// Churn: every 20–30 s (seeded) a gateway leaves (SIGKILL) or, when
	// one is missing, a new gateway process joins in its place. The load
	// of a missing gateway goes to the others.
	Churn bool
	// Step: gateway 0 is offered 200/s, and from StepAt (default a third
	// into the run, at least Warmup) 5000/s; Offered and Split then apply
	// to the other gateways. Result.TimeTo95 measures the step.
	Step   bool
	StepAt time.Duration
	// KillAllocator: at KillAt (default a third into the run) SIGKILL the
	// gateway holding the allocator lease (in ModeEqual, gateway 0).
	KillAllocator bool
	KillAt        time.Duration
	// RedisPause > 0: SIGSTOP redis-server at PauseAt (default a third
	// into the run) for RedisPause, then SIGCONT.
	RedisPause time.Duration
	PauseAt    time.Duration
	// SlowLink > 0 puts every gateway's Redis connection through a proxy
	// of the harness and holds every byte Redis sends gateway 0 for
	// SlowLink (its calls land at once, their answers and pub/sub messages
	// arrive late). SlowTables > 0 holds only what carries a table to
	// gateway 0 (an answer holding a Table's JSON, a message on the tables
	// channel; see tablePatterns), so gateway 0 applies every table
	// SlowTables late while its other calls go at full speed. Either
	// starts at SlowAt (default: when the load starts). StallFor > 0
	// stalls gateway 0's link both ways at StallAt for StallFor.
	SlowLink, SlowTables, SlowAt, StallAt, StallFor time.Duration
	// MoveAt > 0: at MoveAt the split becomes MoveSplit and, when
	// MoveOffered > 0, the offered load MoveOffered.
	MoveAt      time.Duration
	MoveSplit   []float64
	MoveOffered float64

	// Timeline logs each gateway's admissions per second of the run (by
	// answer time) to Log.
	Timeline bool

	// GatewayBin is a built cmd/limitplane-gateway; empty builds one.
	GatewayBin string
	// UnsafeGatewayBin is cmd/limitplane-gateway built with
	// -tags limitplane_drl_unsafe, for Unsafe; empty builds one.
	UnsafeGatewayBin string
	// Dir holds the run's files (configurations, logs); empty uses a
	// temporary directory, removed at the end.
	Dir string
	// Log receives progress and event lines; nil discards them.
	Log io.Writer
}

// withDefaults fills in the defaults and checks o.
func (o Options) withDefaults() (Options, error) {
	if o.Gateways == 0 {
		o.Gateways = 4
	}
	if o.Rate == 0 {
		o.Rate = 1000
	}
	if o.Burst == 0 {
		o.Burst = 100
	}
	if o.Offered == 0 {
		o.Offered = 1500
	}
	if o.Duration == 0 {
		o.Duration = 30 * time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = 3 * time.Second
	}
	if len(o.Modes) == 0 {
		o.Modes = []Mode{ModeEqual, ModeDRL}
	}
	if o.Split == nil {
		o.Split = slices.Repeat([]float64{1}, max(o.Gateways, 1))
	}
	third := max(o.Warmup, o.Duration/3)
	if o.StepAt == 0 {
		o.StepAt = third
	}
	if o.KillAt == 0 {
		o.KillAt = third
	}
	if o.PauseAt == 0 {
		o.PauseAt = third
	}
	if o.StallFor > 0 && o.StallAt == 0 {
		o.StallAt = o.Duration / 2
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	switch {
	case o.Gateways < 1 || o.Gateways > 100:
		return o, fmt.Errorf("drlharness: gateways must be 1 to 100, not %d", o.Gateways)
	case o.Rate < 1 || o.Burst < 1:
		return o, errors.New("drlharness: rate and burst must be >= 1")
	case o.Offered < 0 || o.MoveOffered < 0:
		return o, errors.New("drlharness: offered load must be >= 0")
	case len(o.Split) != o.Gateways:
		return o, fmt.Errorf("drlharness: split has %d weights for %d gateways", len(o.Split), o.Gateways)
	case o.MoveAt > 0 && len(o.MoveSplit) != o.Gateways:
		return o, fmt.Errorf("drlharness: move split has %d weights for %d gateways", len(o.MoveSplit), o.Gateways)
	case o.Warmup >= o.Duration:
		return o, fmt.Errorf("drlharness: warmup %v must be shorter than the duration %v", o.Warmup, o.Duration)
	}
	for _, w := range append(slices.Clone(o.Split), o.MoveSplit...) {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return o, fmt.Errorf("drlharness: split weight %v", w)
		}
	}
	for _, m := range o.Modes {
		if m != ModeEqual && m != ModeDRL {
			return o, fmt.Errorf("drlharness: unknown mode %q (equal, drl)", m)
		}
	}
	return o, nil
}

// Result is what one mode of a run measured.
type Result struct {
	Mode Mode
	// Sent counts the requests the load scheduled; Admitted (200),
	// Refused (429) and Errors (anything else: another status, no
	// answer, or not sent because the gateway was gone or too many
	// requests were in flight) the answers, over the whole run.
	Sent, Admitted, Refused, Errors int64
	// AdmittedPerS is the admitted rate after the warmup (by answer
	// time); PctOfPossible its percentage of min(R, offered), integrated
	// over the same span.
	AdmittedPerS, PctOfPossible float64
	// WorstWindow is the most admissions certainly inside any 1 s window
	// (sliding in 10 ms steps over the whole run, all gateways), starting
	// at WorstWindowAt; Bound is R + B.
	WorstWindow   int
	WorstWindowAt time.Duration
	Bound         int64
	// RedisCallsOnPath counts the store's rate-limit script calls seen by
	// Redis (see scriptStats); Scripts has the details. Always 0 in
	// ModeEqual, which has no Redis.
	RedisCallsOnPath int64
	Scripts          scriptCounts
	// TimeTo95 (Step): from the step until the start of the first whole
	// second that admitted at least 95 % of R (see
	// admissions.reachedFrom); −1: never.
	TimeTo95 time.Duration
	// NewAllocatorAfter, NewEpochAfter (KillAllocator, ModeDRL): from the
	// kill until another gateway held the lease, and until a gateway ran
	// a table epoch above the newest one at the kill; −1: never.
	NewAllocatorAfter, NewEpochAfter time.Duration
	// PausedPerS (RedisPause): the admitted rate while Redis was stopped;
	// RecoveredAfter: from SIGCONT until the start of the first whole
	// second that admitted at least 90 % of min(R, offered); −1: never.
	PausedPerS     float64
	RecoveredAfter time.Duration
	// PausedLatePerS (RedisPause): the admitted rate from 2H + 500 ms
	// after SIGSTOP until SIGCONT, when every gateway's table is stale and
	// it runs the key at its floor.
	PausedLatePerS float64
	// ErrorKinds counts the errors by kind: "transport" (no answer: the
	// connection failed or timed out after 5 s), "dropped" (not sent: no
	// gateway in the slot, or too many requests in flight), or the HTTP
	// status.
	ErrorKinds map[string]int64
	// Slots has the counts of each gateway position (a slot's gateway
	// may have been replaced by churn).
	Slots []SlotCounts

	opts Options
}

// SlotCounts are one gateway position's answers over the run, and its
// admissions answered after the warmup.
type SlotCounts struct {
	Sent, Admitted, Refused, Errors, AdmittedAfterWarmup int64
}

// Exceeded reports whether some window admitted more than the bound.
func (r Result) Exceeded() bool { return int64(r.WorstWindow) > r.Bound }

// Line is the result's summary line: the five fields first, then
// the counts and each scenario's measures.
func (r Result) Line() string {
	o := r.opts
	b := new(strings.Builder)
	exceeded := "no"
	if r.Exceeded() {
		exceeded = "YES"
	}
	fmt.Fprintf(b, "mode=%s admitted_per_s=%.1f pct_of_possible=%.1f worst_window=%d bound=%d exceeded=%s redis_calls_on_path=%d",
		r.Mode, r.AdmittedPerS, r.PctOfPossible, r.WorstWindow, r.Bound, exceeded, r.RedisCallsOnPath)
	fmt.Fprintf(b, " worst_window_at=%.2fs sent=%d admitted=%d refused=%d errors=%d", r.WorstWindowAt.Seconds(), r.Sent, r.Admitted, r.Refused, r.Errors)
	for _, k := range slices.Sorted(maps.Keys(r.ErrorKinds)) {
		fmt.Fprintf(b, " errors_%s=%d", k, r.ErrorKinds[k])
	}
	if r.Mode == ModeDRL {
		fmt.Fprintf(b, " noscript=%d drl_script_calls=%d commandstats_script_calls=%d", r.Scripts.NoScript, r.Scripts.Other, r.Scripts.CommandStats)
		if r.Scripts.Lost > 0 {
			fmt.Fprintf(b, " slowlog_lost=%d", r.Scripts.Lost)
		}
	}
	if o.Step {
		fmt.Fprintf(b, " time_to_95pct=%s", dur(r.TimeTo95))
	}
	if o.KillAllocator && r.Mode == ModeDRL {
		fmt.Fprintf(b, " new_allocator_after=%s new_epoch_after=%s", dur(r.NewAllocatorAfter), dur(r.NewEpochAfter))
	}
	if o.RedisPause > 0 && r.Mode == ModeDRL {
		fmt.Fprintf(b, " paused_per_s=%.1f paused_after_2h_per_s=%.1f recovered_after=%s", r.PausedPerS, r.PausedLatePerS, dur(r.RecoveredAfter))
	}
	return b.String()
}

func dur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// Run measures each of o.Modes in turn and returns their results in that
// order. It stops every process it started before it returns, also when
// ctx is cancelled or a step fails.
func Run(ctx context.Context, o Options) ([]Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "drlharness"); err != nil {
			return nil, fmt.Errorf("drlharness: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	if o.GatewayBin == "" {
		fmt.Fprintln(o.Log, "building cmd/limitplane-gateway")
		if o.GatewayBin, err = procs.BuildGateway(ctx, dir); err != nil {
			return nil, err
		}
	}
	if o.Unsafe && o.UnsafeGatewayBin == "" {
		fmt.Fprintln(o.Log, "building cmd/limitplane-gateway -tags limitplane_drl_unsafe")
		if o.UnsafeGatewayBin, err = procs.BuildGateway(ctx, dir, "limitplane_drl_unsafe"); err != nil {
			return nil, err
		}
	}
	var rs []Result
	for _, m := range o.Modes {
		fmt.Fprintf(o.Log, "mode %s: %d gateways, R=%d/s B=%d, offered %.0f/s split %v, %v\n", m, o.Gateways, o.Rate, o.Burst, o.Offered, o.Split, o.Duration)
		r, err := runMode(ctx, o, m, filepath.Join(dir, string(m)))
		if err != nil {
			return rs, fmt.Errorf("drlharness: mode %s: %w", m, err)
		}
		for i, c := range r.Slots {
			fmt.Fprintf(o.Log, "  gateway %d: sent=%d admitted=%d refused=%d errors=%d admitted_after_warmup=%d\n", i, c.Sent, c.Admitted, c.Refused, c.Errors, c.AdmittedAfterWarmup)
		}
		fmt.Fprintln(o.Log, r.Line())
		rs = append(rs, r)
	}
	return rs, nil
}

// run is the state of one mode's run.
type run struct {
	o        Options
	mode     Mode
	dir      string
	children procs.Set
	redis    *procs.Proc
	proxies  []*linkProxy // ModeDRL with SlowLink or a stall: one per slot
	redisAt  string

	mu   sync.Mutex
	gws  []*gateway // per slot; nil while the slot has none
	gens []int

	slots []*slot
	plan  *plan
	load  *load
	start time.Time
}

func (r *run) logf(format string, args ...any) {
	at := 0.0
	if !r.start.IsZero() {
		at = time.Since(r.start).Seconds()
	}
	fmt.Fprintf(r.o.Log, "  [%s %6.2fs] %s\n", r.mode, at, fmt.Sprintf(format, args...))
}

// config returns slot's YAML file, given its admin address.
func (r *run) config(slot int) func(admin string) string {
	o := r.o
	return func(admin string) string {
		b := new(strings.Builder)
		if r.mode == ModeEqual {
			// R/N per second is R requests per N seconds: the emission
			// interval N/R s is exact.
			fmt.Fprintf(b, "store: memory\npolicies:\n  - id: harness\n    rate: {requests: %d, per: %ds, burst: %d}\n",
				o.Rate, o.Gateways, max(1, o.Burst/int64(o.Gateways)))
		} else {
			// Calls to Redis get 2 s (the README's default is 250 ms):
			// the harness shares a small machine with its load, and a
			// slow link must not time the gateway's calls out either.
			addr, timeout := r.redisAt, 2*time.Second
			if r.proxies != nil {
				addr = r.proxies[slot].Addr()
				timeout += o.SlowLink + o.SlowTables
			}
			fmt.Fprintf(b, "store: redis://%s/0\nredis: {key_prefix: %q, timeout: %s}\nfailure_policy: closed\ndrl:\n", addr, storePrefix, timeout)
			if o.Interval > 0 {
				fmt.Fprintf(b, "  interval: %s\n", o.Interval)
			}
			if o.MaxGateways > 0 {
				fmt.Fprintf(b, "  max_gateways: %d\n", o.MaxGateways)
			}
			if o.JoinReserve > 0 {
				fmt.Fprintf(b, "  join_reserve: %d\n", o.JoinReserve)
			}
			if o.Headroom > 0 {
				fmt.Fprintf(b, "  headroom: %g\n", o.Headroom)
			}
			if strings.HasSuffix(b.String(), "drl:\n") {
				// No setting: the section must still be there (drl: {}).
				s := strings.TrimSuffix(b.String(), "\n")
				b.Reset()
				b.WriteString(s + " {}\n")
			}
			fmt.Fprintf(b, "policies:\n  - id: harness\n    rate: {requests: %d, per: 1s, burst: %d}\n    distributed: true\n", o.Rate, o.Burst)
		}
		fmt.Fprintf(b, "admin: {listen: %q}\nkeys:\n  - key: %s\n    policies: [harness]\napis:\n  - id: h\n    listen_path: /h/\n    target: builtin:echo\n    auth: api_key\n", admin, apiKey)
		return b.String()
	}
}

// startSlot starts a new gateway process for slot and points the slot's
// load at it.
func (r *run) startSlot(ctx context.Context, slot int) error {
	r.mu.Lock()
	gen := r.gens[slot]
	r.gens[slot]++
	r.mu.Unlock()
	bin := r.o.GatewayBin
	if r.o.Unsafe && r.mode == ModeDRL {
		bin = r.o.UnsafeGatewayBin
	}
	g, err := startGateway(ctx, bin, r.dir, slot, gen, r.config(slot), &r.children)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.gws[slot] = g
	r.mu.Unlock()
	r.slots[slot].tgt.Store(newTarget(g.url))
	return nil
}

// tablePatterns mark what carries a table to a gateway: the Table's JSON
// (in the answer of the report call or of a read of the table key) and a
// message on the tables channel (limitplane:drl:{group}:tables), per
// core/drl's wire.
var tablePatterns = [][]byte{[]byte(`"epoch":`), []byte(`:tables`)}

// slow starts the slow link of gateway 0.
func (r *run) slow() {
	switch {
	case r.o.SlowLink > 0:
		r.proxies[0].SetDelay(r.o.SlowLink)
		r.logf("gateway 0's link to Redis slowed: what Redis sends it arrives %v late", r.o.SlowLink)
	case r.o.SlowTables > 0:
		r.proxies[0].SetDelay(r.o.SlowTables, tablePatterns...)
		r.logf("gateway 0's tables slowed: what carries a table to it arrives %v late", r.o.SlowTables)
	}
}

// killSlot takes slot out of the load balancer and SIGKILLs its gateway.
func (r *run) killSlot(slot int) {
	r.plan.update(func(p *plan) { p.live[slot] = false })
	if t := r.slots[slot].tgt.Swap(nil); t != nil {
		defer t.tr.CloseIdleConnections()
	}
	r.mu.Lock()
	g := r.gws[slot]
	r.gws[slot] = nil
	r.mu.Unlock()
	if g != nil {
		g.proc.Kill()
	}
}

// live returns the running gateways.
func (r *run) live() []*gateway {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gs []*gateway
	for _, g := range r.gws {
		if g != nil {
			gs = append(gs, g)
		}
	}
	return gs
}

func runMode(ctx context.Context, o Options, mode Mode, dir string) (res Result, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	r := &run{o: o, mode: mode, dir: dir, gws: make([]*gateway, o.Gateways), gens: make([]int, o.Gateways)}
	defer func() {
		r.children.StopAll()
		for _, p := range r.proxies {
			p.Close()
		}
		for _, s := range r.slots {
			if t := s.tgt.Load(); t != nil {
				t.tr.CloseIdleConnections()
			}
		}
	}()
	if mode == ModeDRL {
		if r.redis, r.redisAt, err = startRedis(ctx, dir, &r.children); err != nil {
			return res, err
		}
		if o.SlowLink > 0 || o.SlowTables > 0 || o.StallFor > 0 {
			for range o.Gateways {
				p, err := newLinkProxy(r.redisAt)
				if err != nil {
					return res, fmt.Errorf("drlharness: link proxy: %w", err)
				}
				r.proxies = append(r.proxies, p)
			}
		}
	}
	for i := range o.Gateways {
		r.slots = append(r.slots, &slot{i: i})
	}
	errs := make([]error, o.Gateways)
	var wg sync.WaitGroup
	for i := range o.Gateways {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = r.startSlot(ctx, i) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}

	if r.proxies != nil && o.SlowAt == 0 {
		// Not before: a new connection's handshake (HELLO, CLIENT
		// SETINFO) and PING through a slow link can outlast /readyz's 2 s.
		r.slow()
	}
	r.plan = newPlan(r.slots, o.Offered, o.Split)
	r.plan.update(func(p *plan) {
		for i := range p.live {
			p.live[i] = true
		}
		if o.Step {
			p.fixed[0] = 200
		}
	})
	var stats *scriptStats
	if mode == ModeDRL {
		if stats, err = newScriptStats(ctx, r.redisAt, storePrefix); err != nil {
			return res, err
		}
	}
	// Requests are not cut when the load ends (their answers count), only
	// when the run is cancelled.
	reqCtx, cancelReqs := context.WithCancel(context.Background())
	defer cancelReqs()
	stopCut := context.AfterFunc(ctx, cancelReqs)
	defer stopCut()
	r.start = time.Now()
	r.plan.start = r.start
	r.load = &load{start: r.start, end: o.Duration, slots: r.slots, poisson: o.Poisson, seed: o.Seed, reqCtx: reqCtx}
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	if stats != nil {
		go stats.poll(evCtx)
	}
	var ev events
	evDone := make(chan struct{})
	go func() { defer close(evDone); r.events(evCtx, &ev) }()
	r.logf("load started")
	r.load.run(ctx)
	stopEvents()
	<-evDone
	cancelReqs()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if ev.err != nil {
		return res, ev.err
	}
	res = Result{Mode: mode, Bound: o.Rate + o.Burst, opts: o, TimeTo95: -1, NewAllocatorAfter: -1, NewEpochAfter: -1, RecoveredAfter: -1}
	if stats != nil {
		// The gateways stop first, so that the slow log and commandstats
		// are read when no more calls come.
		var wg sync.WaitGroup
		for _, g := range r.live() {
			wg.Add(1)
			go func() { defer wg.Done(); g.proc.Stop() }()
		}
		wg.Wait()
		if res.Scripts, err = stats.finish(ctx); err != nil {
			return res, err
		}
		res.RedisCallsOnPath = res.Scripts.OnPath
	}
	r.analyze(&res, &ev)
	if res.ErrorKinds["transport"] > 0 {
		// Requests went unanswered: show what the processes said.
		for _, p := range r.children.Procs() {
			r.logf("%s log (end):\n%s", p.Name, p.Tail(1500))
		}
	}
	return res, nil
}

// analyze fills res from the records.
func (r *run) analyze(res *Result, ev *events) {
	o := r.o
	var recs []record
	for _, s := range r.slots {
		s.mu.Lock()
		recs = append(recs, s.recs...)
		s.mu.Unlock()
	}
	var admittedAfter int64
	end := int64(o.Duration)
	res.Slots = make([]SlotCounts, len(r.slots))
	for _, rec := range recs {
		c := &res.Slots[rec.slot]
		c.Sent++
		switch rec.status {
		case 200:
			c.Admitted++
			if rec.recv >= int64(o.Warmup) && rec.recv < end {
				c.AdmittedAfterWarmup++
				admittedAfter++
			}
		case 429:
			c.Refused++
		default:
			c.Errors++
			kind := strconv.Itoa(int(rec.status))
			switch rec.status {
			case statusTransport:
				kind = "transport"
			case statusDropped:
				kind = "dropped"
			}
			if res.ErrorKinds == nil {
				res.ErrorKinds = map[string]int64{}
			}
			res.ErrorKinds[kind]++
		}
	}
	for _, c := range res.Slots {
		res.Sent += c.Sent
		res.Admitted += c.Admitted
		res.Refused += c.Refused
		res.Errors += c.Errors
	}
	span := o.Duration - o.Warmup
	res.AdmittedPerS = float64(admittedAfter) / span.Seconds()
	if p := r.plan.possible(float64(o.Rate), o.Warmup, o.Duration); p > 0 {
		res.PctOfPossible = 100 * float64(admittedAfter) / p
	}
	if o.Timeline {
		r.timeline(recs)
	}
	adm := newAdmissions(recs, time.Second)
	res.WorstWindow, res.WorstWindowAt = adm.worstWindow(time.Second, o.Duration)
	if o.Step {
		res.TimeTo95 = adm.reachedFrom(o.StepAt, o.Duration, time.Second, float64(o.Rate), 0.95)
	}
	res.NewAllocatorAfter, res.NewEpochAfter = ev.newAllocator, ev.newEpoch
	if o.RedisPause > 0 && ev.resumed > 0 {
		paused := adm.within(int64(o.PauseAt), int64(ev.resumed))
		res.PausedPerS = float64(paused) / (ev.resumed - o.PauseAt).Seconds()
		h := o.Interval
		if h == 0 {
			h = time.Second
		}
		if late := o.PauseAt + 2*h + 500*time.Millisecond; late < ev.resumed {
			res.PausedLatePerS = float64(adm.within(int64(late), int64(ev.resumed))) / (ev.resumed - late).Seconds()
		}
		limit := min(float64(o.Rate), r.plan.offeredAt(ev.resumed))
		res.RecoveredAfter = adm.reachedFrom(ev.resumed, o.Duration, time.Second, limit, 0.9)
	}
}

// events is what the scenario goroutine observed.
type events struct {
	newAllocator, newEpoch time.Duration
	resumed                time.Duration // when Redis got SIGCONT
	err                    error
}

// sleepUntil waits until offset at of the run; false if ctx ended first.
func (r *run) sleepUntil(ctx context.Context, at time.Duration) bool {
	t := time.NewTimer(time.Until(r.start.Add(at)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// events runs the scenario's timeline.
func (r *run) events(ctx context.Context, ev *events) {
	o := r.o
	ev.newAllocator, ev.newEpoch = -1, -1
	type step struct {
		at time.Duration
		do func()
	}
	var steps []step
	if o.Step {
		steps = append(steps, step{o.StepAt, func() {
			r.plan.update(func(p *plan) { p.fixed[0] = 5000 })
			r.logf("step: gateway 0 offered 5000/s")
		}})
	}
	if o.MoveAt > 0 {
		steps = append(steps, step{o.MoveAt, func() {
			total := o.Offered
			r.plan.update(func(p *plan) {
				p.weights = slices.Clone(o.MoveSplit)
				if o.MoveOffered > 0 {
					p.total = o.MoveOffered
				}
				total = p.total
			})
			r.logf("load moved: split %v, offered %.0f/s", o.MoveSplit, total)
		}})
	}
	if o.SlowAt > 0 && r.proxies != nil {
		steps = append(steps, step{o.SlowAt, r.slow})
	}
	if o.StallFor > 0 && r.proxies != nil {
		steps = append(steps, step{o.StallAt, func() { r.proxies[0].Stall(); r.logf("gateway 0's link to Redis stalled") }},
			step{o.StallAt + o.StallFor, func() { r.proxies[0].Release(); r.logf("gateway 0's link to Redis released") }})
	}
	if o.RedisPause > 0 {
		steps = append(steps, step{o.PauseAt, func() {
			if r.redis == nil {
				r.logf("redis pause: no Redis in this mode")
				return
			}
			r.redis.Signal(syscall.SIGSTOP)
			r.logf("redis-server stopped (SIGSTOP)")
			if r.sleepUntil(ctx, o.PauseAt+o.RedisPause) {
				r.redis.Signal(syscall.SIGCONT)
				ev.resumed = time.Since(r.start)
				r.logf("redis-server continued (SIGCONT)")
			}
		}})
	}
	if o.KillAllocator {
		steps = append(steps, step{o.KillAt, func() { r.killAllocator(ctx, ev) }})
	}
	if o.Churn {
		rng := rand.New(rand.NewPCG(o.Seed, 12))
		at := time.Duration(0)
		for {
			at += 20*time.Second + time.Duration(rng.Int64N(int64(10*time.Second)))
			if at >= o.Duration {
				break
			}
			steps = append(steps, step{at, func() { r.churn(ctx, rng, ev) }})
		}
	}
	slices.SortStableFunc(steps, func(a, b step) int { return int(a.at - b.at) })
	// Steps run in order, each in its own goroutine so a long one (a
	// pause, a join) does not delay the next.
	var wg sync.WaitGroup
	for _, s := range steps {
		if !r.sleepUntil(ctx, s.at) {
			break
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.do() }()
	}
	wg.Wait()
}

// churn makes one gateway leave (SIGKILL) when all are running, else
// starts a new one in a missing gateway's place.
func (r *run) churn(ctx context.Context, rng *rand.Rand, ev *events) {
	r.mu.Lock()
	var up, down []int
	for i, g := range r.gws {
		if g != nil {
			up = append(up, i)
		} else {
			down = append(down, i)
		}
	}
	r.mu.Unlock()
	if len(down) == 0 && len(up) > 1 {
		i := up[rng.IntN(len(up))]
		r.killSlot(i)
		r.logf("churn: gateway %d left (SIGKILL)", i)
		return
	}
	if len(down) > 0 {
		i := down[0]
		if err := r.startSlot(ctx, i); err != nil {
			if ctx.Err() == nil {
				ev.err = err
			}
			return
		}
		r.plan.update(func(p *plan) { p.live[i] = true })
		r.logf("churn: a new gateway joined as gateway %d", i)
	}
}

// killAllocator finds the gateway holding the lease, SIGKILLs it and
// watches the others until one holds the lease and a newer table epoch
// runs. In ModeEqual it kills gateway 0.
func (r *run) killAllocator(ctx context.Context, ev *events) {
	if r.mode == ModeEqual {
		r.killSlot(0)
		r.logf("kill: gateway 0 (SIGKILL; no allocator in this mode)")
		return
	}
	const alloc, epoch = "limitplane_drl_allocator", "limitplane_drl_epoch"
	victim, epoch0 := -1, 0.0
	for victim < 0 && ctx.Err() == nil {
		for _, g := range r.live() {
			m, err := g.metrics(ctx, alloc, epoch)
			if err != nil {
				continue
			}
			epoch0 = max(epoch0, m[epoch])
			if m[alloc] == 1 {
				victim = g.slot
			}
		}
		if victim < 0 {
			r.logf("kill: no gateway reports %s 1 yet", alloc)
			time.Sleep(100 * time.Millisecond)
		}
	}
	if victim < 0 {
		return
	}
	killedAt := time.Since(r.start)
	r.killSlot(victim)
	r.logf("kill: gateway %d held the allocator lease; SIGKILLed (newest epoch %.0f)", victim, epoch0)
	for ctx.Err() == nil && (ev.newAllocator < 0 || ev.newEpoch < 0) {
		for _, g := range r.live() {
			m, err := g.metrics(ctx, alloc, epoch)
			if err != nil {
				continue
			}
			now := time.Since(r.start)
			if m[alloc] == 1 && ev.newAllocator < 0 {
				ev.newAllocator = now - killedAt
				r.logf("kill: gateway %d holds the lease now", g.slot)
			}
			if m[epoch] > epoch0 && ev.newEpoch < 0 {
				ev.newEpoch = now - killedAt
				r.logf("kill: gateway %d runs epoch %.0f", g.slot, m[epoch])
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// offeredAt is the total offered rate at offset t.
func (p *plan) offeredAt(t time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := 0.0
	for _, h := range p.history {
		if h.at <= t {
			r = h.rate
		}
	}
	return r
}

// timeline logs each slot's admissions and refusals per second.
func (r *run) timeline(recs []record) {
	secs := int(r.o.Duration/time.Second) + 1
	adm := make([][]int, len(r.slots))
	ref := make([][]int, len(r.slots))
	for i := range adm {
		adm[i], ref[i] = make([]int, secs), make([]int, secs)
	}
	for _, rec := range recs {
		s := int(rec.recv / int64(time.Second))
		if s >= secs {
			continue
		}
		switch rec.status {
		case 200:
			adm[rec.slot][s]++
		case 429:
			ref[rec.slot][s]++
		}
	}
	for s := range secs {
		b := new(strings.Builder)
		total := 0
		for i := range r.slots {
			fmt.Fprintf(b, " gw%d=%d/%d", i, adm[i][s], adm[i][s]+ref[i][s])
			total += adm[i][s]
		}
		fmt.Fprintf(r.o.Log, "  [%s] second %2d: admitted %4d (admitted/answered:%s)\n", r.mode, s, total, b)
	}
}
