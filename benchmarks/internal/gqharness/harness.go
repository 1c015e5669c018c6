// Package gqharness runs a global quota (issue 22) across several data
// planes as real processes, and compares it in the same run with what a
// quota does without one.
//
// Every mode of a run gets fresh processes and stores: a control plane
// (cmd/limitplane-controlplane, its bbolt file in a temporary directory,
// admin API and sync port on free loopback ports), and per data plane
// (groups dp1, dp2, …, each with the tag of its name) a redis-server of
// its own on a free loopback port (never 6379) and Options.Gateways
// gateway processes (cmd/limitplane-gateway) that follow the control
// plane with that Redis as their store. Each data plane's gateways reach
// the control plane through a TCP proxy of the harness (cutProxy), so a
// cut (Options.Cuts) takes exactly that data plane off the control plane.
// The policy, the API and the one API key are created through the admin
// API before the gateways start.
//
// The load is open-loop on a fixed schedule: per period Options.Offered
// requests, split over the data planes by Options.Split (largest
// remainder, Counts), rotated by one data plane each period with
// Options.Rotate (Rotated), each data plane's requests of a period evenly
// spaced over it and round-robin over its gateways; every request carries
// the same API key and is counted by the period it was scheduled in and
// its answer's status (200 admitted, 429 refused, anything else an
// error). The gateways' upstream is builtin:echo.
//
// Modes (Mode): config_only is a plain quota Q that every data plane
// counts on its own (Tyk MDCB's N × Q); static_split gives data plane i
// a quota of ⌊Q × its share of the first period's split⌋, as one policy
// per data plane restricted to an API only that data plane serves (API
// tags); lease_strict, lease_reserved and lease_optimistic mark the quota
// global with that mode (spec.GlobalQuota).
//
// Result.Line is the summary line, and Run stops every process it started
// on every path out, also when ctx is cancelled.
package gqharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// Mode is how the quota is shared by the data planes.
type Mode string

// The modes, in the order Run measures them by default.
const (
	// ModeConfigOnly is a plain quota of Q that each data plane counts
	// on its own: N data planes admit up to N × Q.
	ModeConfigOnly Mode = "config_only"
	// ModeStaticSplit gives each data plane ⌊Q × share⌋ of the first
	// period's split, fixed for the run.
	ModeStaticSplit Mode = "static_split"
	// ModeLeaseStrict, ModeLeaseReserved and ModeLeaseOptimistic mark the
	// quota global (quota.global.mode strict, reserved, optimistic).
	ModeLeaseStrict     Mode = "lease_strict"
	ModeLeaseReserved   Mode = "lease_reserved"
	ModeLeaseOptimistic Mode = "lease_optimistic"
)

// AllModes is every mode, in Run's default order.
var AllModes = []Mode{ModeConfigOnly, ModeStaticSplit, ModeLeaseStrict, ModeLeaseReserved, ModeLeaseOptimistic}

// lease reports whether m marks the quota global, and its spec mode.
func (m Mode) lease() (string, bool) {
	s, ok := strings.CutPrefix(string(m), "lease_")
	return s, ok
}

// Cut takes data plane DP (0-based) off the control plane from From to
// To (offsets from the load's start).
type Cut struct {
	DP       int
	From, To time.Duration
}

// Options describe a run. Zero values take the defaults given.
type Options struct {
	// DataPlanes is the number of data planes (default 3); Gateways the
	// gateway processes of each (default 1).
	DataPlanes, Gateways int
	// Quota is Q, requests per Period (default 10000 per 60 s).
	Quota  int64
	Period time.Duration
	// Offered is the requests offered per period, all data planes
	// together (default 3 × Quota); Split weighs them over the data
	// planes (default even), len(Split) == DataPlanes.
	Offered int
	Split   []float64
	// Periods is the number of periods of load (default 5).
	Periods int
	// Rotate rotates the split by one data plane each period.
	Rotate bool
	// Guard is the quiet time before each period's end and after each
	// period's start but the first (see schedule; default min(P/20,
	// 250 ms); negative: none).
	Guard time.Duration
	// Cuts take data planes off the control plane, the way CutKind says
	// (default CutRefuse).
	Cuts    []Cut
	CutKind CutKind
	// KillCP > 0 SIGKILLs the control plane at that offset and restarts
	// it at once on the same bbolt file and ports.
	KillCP time.Duration
	// Floor is quota.global.floor in the reserved and optimistic modes
	// (default 0: none); LeaseDuration quota.global.lease_duration
	// (default: left out, or the Period when that is shorter than 10 s).
	Floor         int64
	LeaseDuration time.Duration
	// Modes are run in this order (default config_only, static_split,
	// lease_strict).
	Modes []Mode
	// CPStop is the probe of cp_calls_on_path: the control plane gets
	// SIGSTOP at CPStopAt for CPStop, then SIGCONT (default: 2 s or a
	// quarter period, whichever is shorter, from the middle of the last
	// period; negative: no probe).
	CPStop, CPStopAt time.Duration
	// NegativeControl runs the lease modes on a control plane built with
	// the test-only tag limitplane_lease_unsafe (BuildUndebited), whose
	// ledger grants leases without debiting them: the harness must report
	// the overshoot (exceeded=YES). UndebitedControlPlaneBin is that
	// binary; empty builds one.
	NegativeControl          bool
	UndebitedControlPlaneBin string
	// UsageWait bounds the wait, after each lease mode's load, for the
	// control plane's usage to equal the harness's counts (default the
	// lease duration + 5 s).
	UsageWait time.Duration

	// ControlPlaneBin and GatewayBin are built binaries; empty builds
	// both.
	ControlPlaneBin, GatewayBin string
	// Dir keeps the run's files (configurations, logs); empty uses a
	// temporary directory, removed at the end.
	Dir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// OnStart, when set, is called with the name and PID of every process
	// a run starts, as it starts (tests check that none is left).
	OnStart func(name string, pid int)
}

func (o Options) withDefaults() (Options, error) {
	if o.DataPlanes == 0 {
		o.DataPlanes = 3
	}
	if o.Gateways == 0 {
		o.Gateways = 1
	}
	if o.Quota == 0 {
		o.Quota = 10000
	}
	if o.Period == 0 {
		o.Period = 60 * time.Second
	}
	if o.Offered == 0 {
		o.Offered = int(3 * o.Quota)
	}
	if o.Periods == 0 {
		o.Periods = 5
	}
	if o.Split == nil {
		o.Split = slices.Repeat([]float64{1}, max(o.DataPlanes, 1))
	}
	if o.Guard == 0 {
		o.Guard = min(o.Period/20, 250*time.Millisecond)
	}
	o.Guard = max(o.Guard, 0)
	if o.CutKind == "" {
		o.CutKind = CutRefuse
	}
	if len(o.Modes) == 0 {
		o.Modes = []Mode{ModeConfigOnly, ModeStaticSplit, ModeLeaseStrict}
	}
	if o.CPStop == 0 {
		o.CPStop = min(2*time.Second, o.Period/4)
	}
	if o.CPStop > 0 && o.CPStopAt == 0 {
		o.CPStopAt = time.Duration(o.Periods-1)*o.Period + o.Period/2
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	run := time.Duration(o.Periods) * o.Period
	switch {
	case o.DataPlanes < 1 || o.DataPlanes > 64:
		return o, fmt.Errorf("gqharness: data planes must be 1 to 64, not %d", o.DataPlanes)
	case o.Gateways < 1 || o.Gateways > 64:
		return o, fmt.Errorf("gqharness: gateways per data plane must be 1 to 64, not %d", o.Gateways)
	case o.Quota < 1:
		return o, errors.New("gqharness: quota must be >= 1")
	case o.Period < time.Second:
		return o, fmt.Errorf("gqharness: period %v is shorter than 1s", o.Period)
	case o.Guard > o.Period/4:
		return o, fmt.Errorf("gqharness: guard %v is more than a quarter of the period %v", o.Guard, o.Period)
	case o.Offered < 0 || o.Periods < 1 || o.Periods > 1000:
		return o, errors.New("gqharness: offered must be >= 0 and periods 1 to 1000")
	case len(o.Split) != o.DataPlanes:
		return o, fmt.Errorf("gqharness: split has %d weights for %d data planes", len(o.Split), o.DataPlanes)
	case o.CutKind != CutRefuse && o.CutKind != CutStall:
		return o, fmt.Errorf("gqharness: cut kind %q (refuse, stall)", o.CutKind)
	case o.Floor < 0 || o.Floor > o.Quota:
		return o, fmt.Errorf("gqharness: floor %d must be 0 to the quota", o.Floor)
	case o.CPStop > 0 && o.CPStopAt+o.CPStop > run:
		return o, fmt.Errorf("gqharness: the control-plane stop %v at %v ends after the load (%v)", o.CPStop, o.CPStopAt, run)
	case o.KillCP >= run:
		return o, fmt.Errorf("gqharness: -kill-cp %v is not within the load (%v)", o.KillCP, run)
	}
	for _, w := range o.Split {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return o, fmt.Errorf("gqharness: split weight %v", w)
		}
	}
	for _, c := range o.Cuts {
		if c.DP < 0 || c.DP >= o.DataPlanes || c.From < 0 || c.To <= c.From {
			return o, fmt.Errorf("gqharness: cut of dp%d from %v to %v", c.DP+1, c.From, c.To)
		}
	}
	for _, m := range o.Modes {
		if !slices.Contains(AllModes, m) {
			return o, fmt.Errorf("gqharness: unknown mode %q", m)
		}
	}
	return o, nil
}

// ErrOptions is wrapped by Run's error for options it refuses.
var ErrOptions = errors.New("gqharness: invalid options")

// optionsError is a refused option; it wraps ErrOptions and the problem.
type optionsError struct{ err error }

func (e optionsError) Error() string   { return e.err.Error() }
func (e optionsError) Unwrap() []error { return []error{ErrOptions, e.err} }

// leaseDuration is the quota.global.lease_duration the run writes: the
// option, or the Period when the default (10 s) would be longer.
func (o Options) leaseDuration() time.Duration {
	if o.LeaseDuration > 0 {
		return o.LeaseDuration
	}
	if o.Period < 10*time.Second {
		return o.Period
	}
	return 0
}

// schedule returns the run's offered counts per period and data plane.
func (o Options) schedule() schedule {
	s := schedule{period: o.Period, guard: o.Guard}
	for k := range o.Periods {
		w := o.Split
		if o.Rotate {
			w = Rotated(o.Split, k)
		}
		s.offered = append(s.offered, Counts(o.Offered, w))
	}
	return s
}

// StaticShares are the quotas of static_split: ⌊Q × share⌋ of the first
// period's split for each data plane.
func (o Options) StaticShares() []int64 {
	var sum float64
	for _, w := range o.Split {
		sum += w
	}
	out := make([]int64, len(o.Split))
	for i, w := range o.Split {
		if sum > 0 {
			out[i] = int64(math.Floor(float64(o.Quota) * w / sum))
		}
	}
	return out
}

// cutOff is the set of data planes cut off from the control plane at
// some time of the run: those of Cuts, and all of them with KillCP.
func (o Options) cutOff() []int {
	var out []int
	for i := range o.DataPlanes {
		if o.KillCP > 0 || slices.ContainsFunc(o.Cuts, func(c Cut) bool { return c.DP == i }) {
			out = append(out, i)
		}
	}
	return out
}

// Result is what one mode of a run measured.
type Result struct {
	Mode Mode
	// Quota is Q; Bound what the mode promises Σ admitted per period
	// stays within: Q for the lease modes, Q + Floor × the data planes
	// cut off (Options.cutOff) for lease_optimistic, 0 (none) for
	// config_only and static_split.
	Quota, Bound int64
	// Offered, Admitted, Refused and Errors are per period and data
	// plane ([k][i]); an error is any answer but 200 and 429, no answer,
	// or a request not sent (too many in flight).
	Offered, Admitted, Refused, Errors [][]int64
	// StaticShares are static_split's quotas per data plane.
	StaticShares []int64
	// P50, P99 are the answer latencies of every 200 and 429.
	P50, P99 time.Duration
	// CPCallsOnPath: see CPProbe. −1 when not measured.
	CPCallsOnPath int64
	// CPProbe describes the cp_calls_on_path probe: the window the
	// control plane was stopped, how many requests were sent in its
	// measured part, and their p99.
	CPProbe CPProbe
	// CPCallsMetric is the sum over the gateways of metrics whose name
	// contains "cp_calls_on_path" or "controlplane_calls_on_path" after
	// the load; −1 when no gateway exports one.
	CPCallsMetric float64
	// Usage is the control plane's usage of the key, lease modes only.
	Usage UsageCheck
	// NegativeControl is "" (off) or "on" (the ledger did not debit).
	NegativeControl string
	// CPRestartTook is how long the control plane's restart took
	// (KillCP), from SIGKILL to /readyz 200.
	CPRestartTook time.Duration
}

// CPProbe is the cp_calls_on_path measure. The control plane is stopped
// (SIGSTOP) from From to To; a request that waits on the control plane
// cannot be answered before To. Counted are the requests sent in
// [From, To − Guard) that got no answer or whose answer came at or after
// To: each waited at least Guard, while the control plane was stopped.
// Guard is min(500 ms, (To − From)/2).
type CPProbe struct {
	From, To, Guard time.Duration
	Sent            int
	P99             time.Duration
}

// UsageCheck compares GET /api/usage/keys/{hash} with the harness's 200s.
type UsageCheck struct {
	// Available is false when the route answers 404 (or the answer holds
	// no per-data-plane admitted counts; Note says which).
	Available bool
	Note      string
	// CP and Harness are admitted counts per data plane (dp1, …), over
	// the whole run.
	CP, Harness map[string]int64
}

// Equal reports whether the control plane's counts equal the harness's,
// per data plane and in total.
func (u UsageCheck) Equal() bool {
	if !u.Available {
		return false
	}
	for dp, n := range u.Harness {
		if u.CP[dp] != n {
			return false
		}
	}
	for dp, n := range u.CP {
		if u.Harness[dp] != n {
			return false
		}
	}
	return true
}

// PerPeriod returns Σ over data planes of v per period.
func PerPeriod(v [][]int64) []int64 {
	out := make([]int64, len(v))
	for k, row := range v {
		for _, n := range row {
			out[k] += n
		}
	}
	return out
}

// MaxOverQ is the most any period admitted above Q (0 if none did).
func (r Result) MaxOverQ() int64 {
	var m int64
	for _, a := range PerPeriod(r.Admitted) {
		m = max(m, a-r.Quota)
	}
	return m
}

// Exceeded reports whether a period admitted more than the mode's bound
// (never for a mode without one).
func (r Result) Exceeded() bool {
	if r.Bound == 0 {
		return false
	}
	return slices.ContainsFunc(PerPeriod(r.Admitted), func(a int64) bool { return a > r.Bound })
}

func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

// Line is the result's summary line: the fields first
// (admitted_per_period, pct_of_q per period, max_over_q, cp_calls_on_path,
// p50_ms, p99_ms), then the bound, each data plane's admitted per period,
// the counts, the probe, and the usage check.
func (r Result) Line() string {
	b := new(strings.Builder)
	adm := PerPeriod(r.Admitted)
	pct := make([]string, len(adm))
	for k, a := range adm {
		pct[k] = fmt.Sprintf("%.1f", 100*float64(a)/float64(r.Quota))
	}
	calls := "unmeasured"
	if r.CPCallsOnPath >= 0 {
		calls = fmt.Sprint(r.CPCallsOnPath)
	}
	fmt.Fprintf(b, "mode=%s admitted_per_period=%s pct_of_q=%s max_over_q=%d cp_calls_on_path=%s p50_ms=%s p99_ms=%s",
		r.Mode, joinInts(adm), strings.Join(pct, ","), r.MaxOverQ(), calls, ms(r.P50), ms(r.P99))
	if r.Bound > 0 {
		exceeded := "no"
		if r.Exceeded() {
			exceeded = "YES"
		}
		fmt.Fprintf(b, " bound=%d exceeded=%s", r.Bound, exceeded)
	}
	dps := make([]string, 0)
	for i := range r.Admitted[0] {
		col := make([]int64, len(r.Admitted))
		for k := range r.Admitted {
			col[k] = r.Admitted[k][i]
		}
		dps = append(dps, fmt.Sprintf("dp%d:%s", i+1, joinInts(col)))
	}
	fmt.Fprintf(b, " dp_admitted=%s", strings.Join(dps, ";"))
	if r.StaticShares != nil {
		fmt.Fprintf(b, " static_shares=%s", joinInts(r.StaticShares))
	}
	sum := func(v [][]int64) (t int64) {
		for _, n := range PerPeriod(v) {
			t += n
		}
		return t
	}
	fmt.Fprintf(b, " offered=%d admitted=%d refused=%d errors=%d", sum(r.Offered), sum(r.Admitted), sum(r.Refused), sum(r.Errors))
	if r.CPCallsOnPath >= 0 {
		p := r.CPProbe
		fmt.Fprintf(b, " cp_calls_on_path_counts=requests_sent_while_cp_sigstopped_answered_only_after_sigcont cp_stop=%.2fs-%.2fs cp_stop_requests=%d cp_stop_p99_ms=%s",
			p.From.Seconds(), p.To.Seconds(), p.Sent, ms(p.P99))
	}
	if r.CPCallsMetric >= 0 {
		fmt.Fprintf(b, " cp_calls_on_path_metric=%g", r.CPCallsMetric)
	}
	if r.CPRestartTook > 0 {
		fmt.Fprintf(b, " cp_restart_took=%.2fs", r.CPRestartTook.Seconds())
	}
	if r.NegativeControl != "" {
		fmt.Fprintf(b, " negative_control=%s", r.NegativeControl)
	}
	if _, ok := r.Mode.lease(); ok {
		u := r.Usage
		if !u.Available {
			fmt.Fprintf(b, " usage=unavailable")
			if u.Note != "" {
				fmt.Fprintf(b, " usage_note=%q", u.Note)
			}
		} else {
			var parts []string
			var cpT, hT int64
			for _, dp := range slices.Sorted(mapsKeys(u.CP, u.Harness)) {
				parts = append(parts, fmt.Sprintf("%s:%d/%d", dp, u.CP[dp], u.Harness[dp]))
				cpT += u.CP[dp]
				hT += u.Harness[dp]
			}
			eq := "no"
			if u.Equal() {
				eq = "yes"
			}
			fmt.Fprintf(b, " usage_cp/harness=%s;total:%d/%d usage_equal=%s", strings.Join(parts, ";"), cpT, hT, eq)
		}
	}
	return b.String()
}

func mapsKeys(ms ...map[string]int64) func(func(string) bool) {
	return func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, m := range ms {
			for k := range m {
				if !seen[k] {
					seen[k] = true
					if !yield(k) {
						return
					}
				}
			}
		}
	}
}

// Run measures each of o.Modes in turn, each with fresh processes and
// stores, and returns their results in that order. It stops every
// process it started before it returns, also when ctx is cancelled or a
// step fails.
func Run(ctx context.Context, o Options) ([]Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, optionsError{err}
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "gqharness"); err != nil {
			return nil, fmt.Errorf("gqharness: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	if o.ControlPlaneBin == "" || o.GatewayBin == "" {
		fmt.Fprintln(o.Log, "building cmd/limitplane-controlplane and cmd/limitplane-gateway")
		if o.ControlPlaneBin, o.GatewayBin, err = Build(ctx, dir); err != nil {
			return nil, err
		}
	}
	negative := ""
	if o.NegativeControl {
		negative = "on"
		if o.UndebitedControlPlaneBin == "" {
			fmt.Fprintln(o.Log, "building cmd/limitplane-controlplane -tags limitplane_lease_unsafe (negative control)")
			if o.UndebitedControlPlaneBin, err = BuildUndebited(ctx, dir); err != nil {
				return nil, err
			}
		}
	}
	var rs []Result
	runs := map[Mode]int{}
	for _, m := range o.Modes {
		fmt.Fprintf(o.Log, "mode %s: %d data planes × %d gateways, Q=%d per %v, offered %d per period split %v rotate=%v, %d periods\n",
			m, o.DataPlanes, o.Gateways, o.Quota, o.Period, o.Offered, o.Split, o.Rotate, o.Periods)
		// A mode named again (-modes a,b,a,b, to interleave) runs afresh
		// in a directory of its own.
		runs[m]++
		mdir := filepath.Join(dir, string(m))
		if runs[m] > 1 {
			mdir += fmt.Sprintf("-%d", runs[m])
		}
		r, err := runMode(ctx, o, m, mdir, negative)
		if err != nil {
			return rs, fmt.Errorf("gqharness: mode %s: %w", m, err)
		}
		fmt.Fprintln(o.Log, r.Line())
		rs = append(rs, r)
	}
	return rs, nil
}

// run is one mode's processes.
type run struct {
	o       Options
	mode    Mode
	dir     string
	ps      set
	cp      *controlPlane
	proxies []*cutProxy
	gws     [][]*gateway // per data plane
	start   time.Time
}

func (r *run) logf(format string, args ...any) {
	at := 0.0
	if !r.start.IsZero() {
		at = time.Since(r.start).Seconds()
	}
	fmt.Fprintf(r.o.Log, "  [%s %7.2fs] %s\n", r.mode, at, fmt.Sprintf(format, args...))
}

func group(i int) string { return fmt.Sprintf("dp%d", i+1) }

// configure writes the mode's APIs, policies and key through the admin
// API and returns the last revision and each data plane's request path.
func (r *run) configure(ctx context.Context) (uint64, []string, error) {
	o := r.o
	put := func(path string, body any) (uint64, error) { return r.cp.mustAdmin(ctx, "PUT", path, body, 200) }
	paths := make([]string, o.DataPlanes)
	var policies []string
	var rev uint64
	var err error
	if r.mode == ModeStaticSplit {
		for i, share := range o.StaticShares() {
			if share < 1 {
				return 0, nil, fmt.Errorf("gqharness: static_split: %s's share of Q is 0 (a quota cannot be 0)", group(i))
			}
			id := "gq-" + group(i)
			if _, err = put("/api/apis/"+id, spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Auth: spec.AuthAPIKey, Tags: []string{group(i)}}); err != nil {
				return 0, nil, err
			}
			pid := "split-" + group(i)
			if _, err = put("/api/policies/"+pid, spec.Policy{ID: pid, APIs: []string{id}, Quota: &spec.Quota{Max: share, Renewal: spec.Duration(o.Period)}}); err != nil {
				return 0, nil, err
			}
			policies = append(policies, pid)
			paths[i] = "/" + id + "/x"
		}
	} else {
		if _, err = put("/api/apis/gq", spec.API{ID: "gq", ListenPath: "/gq/", Target: spec.BuiltinEcho, Auth: spec.AuthAPIKey}); err != nil {
			return 0, nil, err
		}
		q := &spec.Quota{Max: o.Quota, Renewal: spec.Duration(o.Period)}
		if mode, ok := r.mode.lease(); ok {
			q.Global = &spec.GlobalQuota{Mode: mode, LeaseDuration: spec.Duration(o.leaseDuration())}
			if mode != "strict" {
				q.Global.Floor = o.Floor
			}
		}
		if _, err = put("/api/policies/gq", spec.Policy{ID: "gq", Quota: q}); err != nil {
			return 0, nil, err
		}
		policies = []string{"gq"}
		for i := range paths {
			paths[i] = "/gq/x"
		}
	}
	if rev, err = r.cp.mustAdmin(ctx, "POST", "/api/keys", map[string]any{"key": apiKey, "policies": policies}, 201); err != nil {
		return 0, nil, err
	}
	return rev, paths, nil
}

func runMode(ctx context.Context, o Options, mode Mode, dir, negative string) (res Result, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("gqharness: %w", err)
	}
	r := &run{o: o, mode: mode, dir: dir, gws: make([][]*gateway, o.DataPlanes), ps: set{onStart: o.OnStart}}
	var loads []*dpLoad
	defer func() {
		r.ps.StopAll()
		for _, p := range r.proxies {
			p.Close()
		}
		for _, l := range loads {
			l.tr.CloseIdleConnections()
		}
	}()
	groups := make([]string, o.DataPlanes)
	for i := range groups {
		groups[i] = group(i)
	}
	cpBin := o.ControlPlaneBin
	if _, ok := mode.lease(); ok && negative != "" {
		cpBin = o.UndebitedControlPlaneBin
		res.NegativeControl = negative
	}
	if r.cp, err = startControlPlane(ctx, cpBin, dir, groups, &r.ps); err != nil {
		return res, err
	}
	rev, paths, err := r.configure(ctx)
	if err != nil {
		return res, err
	}
	var env []string
	// Each data plane: its Redis, its proxy, its gateways, in parallel.
	errs := make([]error, o.DataPlanes)
	r.proxies = make([]*cutProxy, o.DataPlanes)
	for i := range r.proxies {
		if r.proxies[i], err = newCutProxy(r.cp.sync); err != nil {
			return res, fmt.Errorf("gqharness: proxy: %w", err)
		}
	}
	var wg sync.WaitGroup
	for i := range o.DataPlanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			redisAddr, err := startRedis(ctx, "redis-"+group(i), dir, &r.ps)
			if err != nil {
				errs[i] = err
				return
			}
			for j := range o.Gateways {
				g, err := startGateway(ctx, o.GatewayBin, dir, fmt.Sprintf("%s-gw%d", group(i), j+1), group(i), redisAddr, r.proxies[i].Addr(), env, &r.ps)
				if err != nil {
					errs[i] = err
					return
				}
				if err := g.waitApplied(ctx, rev); err != nil {
					errs[i] = err
					return
				}
				r.gws[i] = append(r.gws[i], g)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	for i, gs := range r.gws {
		urls := make([]string, len(gs))
		for j, g := range gs {
			urls[j] = g.base + paths[i]
		}
		loads = append(loads, newDPLoad(urls))
	}

	reqCtx, cancelReqs := context.WithCancel(context.Background())
	defer cancelReqs()
	defer context.AfterFunc(ctx, cancelReqs)()
	sched := o.schedule()
	r.start = time.Now()
	l := &load{start: r.start, sched: sched, dps: loads, reqCtx: reqCtx}
	evCtx, stopEvents := context.WithCancel(ctx)
	var ev events
	evDone := make(chan struct{})
	go func() { defer close(evDone); r.events(evCtx, &ev) }()
	r.logf("load started")
	l.run(ctx)
	stopEvents()
	<-evDone
	r.logf("load ended")
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if ev.err != nil {
		return res, ev.err
	}
	res.Mode, res.Quota = mode, o.Quota
	if m, ok := mode.lease(); ok {
		res.Bound = o.Quota
		if m == "optimistic" {
			res.Bound += o.Floor * int64(len(o.cutOff()))
		}
	}
	if mode == ModeStaticSplit {
		res.StaticShares = o.StaticShares()
	}
	res.CPRestartTook = ev.restartTook
	r.analyze(&res, sched, loads, &ev)
	res.CPCallsMetric = -1
	for _, gs := range r.gws {
		for _, g := range gs {
			if v, found, err := g.metricSum(ctx, "cp_calls_on_path", "controlplane_calls_on_path"); err == nil && found {
				res.CPCallsMetric = max(res.CPCallsMetric, 0) + v
			}
		}
	}
	if _, ok := mode.lease(); ok {
		res.Usage, err = r.usage(ctx, res)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// events is what the timeline goroutine did.
type events struct {
	stopFrom, stopTo time.Duration // the SIGSTOP window of the control plane; 0, 0: none
	restartTook      time.Duration
	err              error
}

// events runs the run's timeline: cuts, the control-plane kill and the
// cp_calls_on_path probe.
func (r *run) events(ctx context.Context, ev *events) {
	o := r.o
	type step struct {
		at time.Duration
		do func()
	}
	var steps []step
	for _, c := range o.Cuts {
		steps = append(steps,
			step{c.From, func() {
				r.proxies[c.DP].Cut(o.CutKind)
				r.logf("%s cut off from the control plane (%s)", group(c.DP), o.CutKind)
			}},
			step{c.To, func() { r.proxies[c.DP].Restore(); r.logf("%s's link to the control plane restored", group(c.DP)) }})
	}
	var mu sync.Mutex // the control plane's process: the kill and the probe
	if o.KillCP > 0 {
		steps = append(steps, step{o.KillCP, func() {
			mu.Lock()
			defer mu.Unlock()
			t := time.Now()
			r.logf("control plane SIGKILLed; restarting on the same store and ports")
			if err := r.cp.Restart(ctx); err != nil {
				if ctx.Err() == nil {
					ev.err = err
				}
				return
			}
			ev.restartTook = time.Since(t)
			r.logf("control plane back after %v", ev.restartTook.Round(time.Millisecond))
		}})
	}
	if o.CPStop > 0 {
		steps = append(steps, step{o.CPStopAt, func() {
			mu.Lock()
			defer mu.Unlock()
			p := r.cp.proc
			p.Signal(syscall.SIGSTOP)
			ev.stopFrom = time.Since(r.start)
			r.logf("control plane stopped (SIGSTOP) for the cp_calls_on_path probe")
			t := time.NewTimer(time.Until(r.start.Add(o.CPStopAt + o.CPStop)))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			p.Signal(syscall.SIGCONT)
			ev.stopTo = time.Since(r.start)
			r.logf("control plane continued (SIGCONT)")
		}})
	}
	slices.SortStableFunc(steps, func(a, b step) int { return int(a.at - b.at) })
	var wg sync.WaitGroup
	for _, s := range steps {
		t := time.NewTimer(time.Until(r.start.Add(s.at)))
		select {
		case <-ctx.Done():
			t.Stop()
			wg.Wait()
			return
		case <-t.C:
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.do() }()
	}
	wg.Wait()
}

// analyze fills res's counts, latencies and the probe from the records.
func (r *run) analyze(res *Result, sched schedule, loads []*dpLoad, ev *events) {
	o := r.o
	mk := func() [][]int64 {
		v := make([][]int64, o.Periods)
		for k := range v {
			v[k] = make([]int64, o.DataPlanes)
		}
		return v
	}
	res.Offered, res.Admitted, res.Refused, res.Errors = mk(), mk(), mk(), mk()
	for k, row := range sched.offered {
		for i, n := range row {
			res.Offered[k][i] = int64(n)
		}
	}
	var lat []time.Duration
	res.CPCallsOnPath = -1
	var probe []time.Duration
	if ev.stopTo > ev.stopFrom {
		res.CPCallsOnPath = 0
		res.CPProbe = CPProbe{From: ev.stopFrom, To: ev.stopTo, Guard: min(500*time.Millisecond, (ev.stopTo-ev.stopFrom)/2)}
	}
	p := res.CPProbe
	for _, l := range loads {
		l.mu.Lock()
		for _, rec := range l.recs {
			switch rec.status {
			case 200:
				res.Admitted[rec.period][rec.dp]++
			case 429:
				res.Refused[rec.period][rec.dp]++
			default:
				res.Errors[rec.period][rec.dp]++
			}
			answered := rec.status == 200 || rec.status == 429
			if answered {
				lat = append(lat, time.Duration(rec.recv-rec.sent))
			}
			if res.CPCallsOnPath >= 0 && rec.sent >= int64(p.From) && rec.sent < int64(p.To-p.Guard) {
				res.CPProbe.Sent++
				probe = append(probe, time.Duration(rec.recv-rec.sent))
				if !answered || rec.recv >= int64(p.To) {
					res.CPCallsOnPath++
				}
			}
		}
		l.mu.Unlock()
	}
	res.P50, res.P99 = quantile(lat, 0.5), quantile(lat, 0.99)
	res.CPProbe.P99 = quantile(probe, 0.99)
}

// quantile is the q-quantile of d (nearest rank), sorting d; 0 if empty.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

// usage reads GET /api/usage/keys/{hash} until its per-data-plane
// admitted counts equal the harness's or o.UsageWait passes, and returns
// the last comparison. A 404 is "unavailable".
func (r *run) usage(ctx context.Context, res Result) (UsageCheck, error) {
	u := UsageCheck{Harness: map[string]int64{}}
	for i := range r.o.DataPlanes {
		for k := range res.Admitted {
			u.Harness[group(i)] += res.Admitted[k][i]
		}
	}
	wait := r.o.UsageWait
	if wait == 0 {
		wait = max(r.o.leaseDuration(), 10*time.Second) + 5*time.Second
	}
	path := "/api/usage/keys/" + identity.HashKey(apiKey).String()
	deadline := time.Now().Add(wait)
	for {
		status, body, err := r.cp.admin(ctx, "GET", path, nil)
		switch {
		case err != nil:
			u.Available, u.Note = false, err.Error()
		case status == 404:
			u.Available, u.Note = false, ""
			return u, nil
		case status != 200:
			u.Available, u.Note = false, fmt.Sprintf("status %d: %.200s", status, body)
		default:
			// The last answer stays in the mode's directory (usage.json)
			// for a look at its entries after the run.
			_ = os.WriteFile(filepath.Join(r.dir, "usage.json"), body, 0o600)
			u.CP = admittedByDataPlane(body)
			u.Available = u.CP != nil
			if !u.Available {
				u.Note = fmt.Sprintf("no data_plane/admitted pairs in %.200s", body)
			}
		}
		if u.Equal() || time.Now().After(deadline) {
			return u, nil
		}
		select {
		case <-ctx.Done():
			return u, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// admittedByDataPlane sums, per data plane, the "admitted" of every JSON
// object in body that has a string "data_plane" (or "dataplane", or
// "group") and a numeric "admitted", at any depth: it reads the usage
// answer without depending on its exact shape. nil when there is none.
func admittedByDataPlane(body []byte) map[string]int64 {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil
	}
	var out map[string]int64
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			adm, okA := x["admitted"].(float64)
			var dp string
			okD := false
			for _, name := range []string{"data_plane", "dataplane", "group"} {
				if dp, okD = x[name].(string); okD {
					break
				}
			}
			if okA && okD {
				if out == nil {
					out = map[string]int64{}
				}
				out[dp] += int64(adm)
				return
			}
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}
