// Package redisstore is limitplane's Redis Store: the counters of every
// gateway and worker process of a data plane live in one Redis (standalone,
// Sentinel or Cluster, through redis.UniversalClient), so a limit means the
// same on all of them.
//
// Each Take is one EVALSHA of a Lua script (reloaded automatically after
// NOSCRIPT) that reads the rate limit's and the quota's state, decides, and
// writes only when the request is allowed: the quota is spent only when the
// rate limit allows, and a denied request changes no counter in any
// algorithm. Time comes from Redis TIME inside the script, so app servers
// with skewed clocks agree. GCRA, fixed windows and quotas are exact to the
// nanosecond (see scripts.go for the integer arithmetic); results equal
// core.GCRAParams.Step for any clock reading in whole microseconds, Redis
// TIME's resolution.
//
// # Batching
//
// By default (Options.Pipeline) a Take that finds fewer than
// Options.PipelineInFlight calls on their way to Redis is sent at once,
// on its own; Takes that come while that many are in flight wait for one
// of them to be back and then go together in one pipeline of EVALSHAs,
// sent by the first of them: one round trip and one read and one write
// system call for the lot. Nothing waits on a timer. A negative
// Options.Pipeline turns batching off. Each call's arguments are written into a pooled
// buffer and its reply, an array of integers, read straight into an
// []int64, so a batched Take allocates about twice.
//
// # Keys
//
// As DESIGN.md fixes: <prefix>{<consumer-hash>}:<kind>:<scope>, where
// consumer-hash is the first 32 hex digits (128 bits) of SHA-256(consumer),
// so raw API keys never reach Redis and all keys of one consumer share a
// Cluster slot; kind is "gcra", "sw", "fw", "sl" (the rate algorithm),
// "quota" (quota epoch 0) or "quota.<epoch>" (see core.Request.QuotaEpoch);
// scope is percent-encoded (every byte outside [A-Za-z0-9._~/-]
// becomes %XX), which is injective, so no consumer or scope containing
// '{', '}', ':' or newlines can collide with another. Every key written has
// a TTL: GCRA's is ceil(TAT − now); a window's and a quota's is the time
// until its period ends; a sliding window's covers two periods; a sliding
// log's is one period after its newest entry (plus Options.TTLMargin).
//
// A GCRA key holds the string "<TAT>:<T>", the theoretical arrival time
// and the emission interval of the limit that wrote it, in decimal ns.
//
// With Options.FollowsControlPlane a global quota (core.Quota.Global) is
// kept in a slot hash "gq.<epoch>:<scope>:<policy>" in the same hash tag,
// with the data plane's "{gq}" keys beside (see global.go).
//
// # Limit changes
//
// A limit change keeps the units spent, not the time (DESIGN.md): a
// request under a limit whose emission interval T differs from the one its
// key was written under converts the key in the same script, TAT' = now +
// ⌈(TAT − now) × T_new / T_old⌉ (exact integer arithmetic, at most 2^62
// ns), writes it, and decides against it. So 3 of 3 per minute spent,
// raised to 6 per minute, leaves exactly 3 more. The conversion costs
// Redis some tens of µs of Lua once per key and change; a key used under
// two limits at once (gateways on two configurations during a rollout) is
// converted back and forth, each time rounding its debt up to the next ns.
// Quota and window counts are kept as they are.
//
// A GCRA key written by an earlier release holds the TAT alone: it is read
// as it is (its T unknown, so not converted), and the next write adds T.
// An earlier release's script cannot read a key in the new form and fails
// on it (the request fails and the FailurePolicy decides): during a
// rolling upgrade, requests of one consumer to old and new gateways meet
// such failures until every gateway runs this release.
//
// # Penalties
//
// Penalize moves a GCRA key's TAT forward in one script, so a third
// party's "slow down" (a Throttle's Backoff) holds back every process
// sharing the Redis, not only the one that heard it.
//
// # Quota epochs
//
// Each quota epoch has its own key, so a request with a raised epoch finds
// no counter and starts a fresh period, the same epoch again spends the
// same counter (a replayed reset changes nothing), and the old epoch's key
// expires by its TTL when its period would have ended. A request with a
// lower epoch, from a gateway that has not yet applied the raise, spends
// the lower epoch's key while it lives, as it would have without the
// reset; once that key has expired it starts a period of its own there.
// Rate-limit keys do not depend on the epoch.
//
// # Settling
//
// A rule with core.LimitSet.Settle charges its quota an estimate, and the
// Hold of an admitted request settles it (core.Hold.Settle) with one
// script that changes only the period charged (see settle.go). Settle
// returns at once, without a round trip: the script is sent in the
// background, in pipelines of up to 64 settles (Options.Pipeline when
// smaller; one at a time with batching off), by at most max(2,
// GOMAXPROCS) goroutines (no more than the client's PoolSize) that start
// when there are settles to send and end when there are none, each call
// under Options.Timeout and the breaker. A settle that fails keeps the
// estimate. A Take of this store whose quota has settles pending sees
// the ones whose Settle returned before it began, so a consumer over
// budget after settling is refused on its next request to this process,
// with Retry-After from the settled count: when all of them are still
// queued, the Take sends them itself, in one pipeline before its own
// script (one round trip for all; up to one round trip more than its
// context allows, as a batched Take sending its batch); otherwise it waits
// for them (not for later ones), bounded by its context and
// Options.Timeout, past which it fails (wrapping
// context.DeadlineExceeded) and the FailurePolicy decides. Takes of other quotas, and every Take while no
// settle is pending, do not wait (one atomic load). Another process
// sharing the Redis sees a settle once it has landed, about one round
// trip after Settle returned; Options.SyncSettle sends it on the caller's
// goroutine instead, for deployments where that window matters. With
// 4,096 settles waiting to be sent, Settle sends its own (backpressure:
// none is dropped). Close waits for the settles pending; a Settle after
// Close is sent on the caller's goroutine.
//
// # Failures
//
// Every call is bounded by Options.Timeout and goes through a circuit
// breaker (github.com/sony/gobreaker/v2): after Options.BreakerFailures
// consecutive failures it fails fast with ErrCircuitOpen for
// Options.BreakerCooldown, then lets one probe through and closes again when
// Redis answers, so limiting resumes by itself. Errors are wrapped with %w;
// core.Engine's FailurePolicy decides what a failure means for the request.
//
// With Options.Seed set (the gateway sets its fallback store there under
// failure_policy fallback), every decision Redis returns is also recorded
// in that in-process store: the quota's count and period end, the GCRA
// TAT, as the reply reports them. When Redis fails, the fallback decides
// from there, so a quota spent before the outage stays spent through it
// and a rate limit mid-burst continues from its TAT; once Redis answers
// again it decides alone, and what the fallback admitted meanwhile is not
// written back. The bound: a process knows only the counts of its own
// last replies, so during an outage it admits up to Max − c more of a
// quota whose last reply it saw said c used; what other processes spent
// after that reply (and, of a key it never saw, the whole quota) is the
// excess over the limit, per process. Rate limits likewise.
//
// How soon a call to a Redis that is down fails is up to the go-redis
// client. With go-redis's defaults a refused connection is dialled 5 times,
// 100 ms apart, and the command retried up to 3 times after 10 ms to 1 s
// pauses, so until the breaker opens each call uses up Options.Timeout.
// Clients from NewClientFromURL dial once and retry without pausing, so a
// refused connection fails at once (a host that does not answer still
// costs the timeout); set DialerRetries 1 and MinRetryBackoff −1 on a
// client of your own for the same. Once PoolSize of its dials have failed,
// a go-redis pool stops dialling and repeats the last dial error until its
// own background probe, once a second, connects again: for up to about a
// second after Redis is back, calls that need a new connection may still
// fail while others already succeed.
package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Defaults for Options' zero fields.
const (
	// DefaultKeyPrefix starts every key unless Options.KeyPrefix is set.
	DefaultKeyPrefix = "limitplane:"
	// DefaultTimeout bounds each Redis call unless Options.Timeout is set.
	DefaultTimeout = 250 * time.Millisecond
	// DefaultBreakerFailures is how many consecutive failures open the
	// circuit breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is how long the breaker stays open before it
	// lets a probe through.
	DefaultBreakerCooldown = time.Second
	// DefaultPipeline is the most Takes in one pipeline unless
	// Options.Pipeline is set.
	DefaultPipeline = 64
)

// ErrCircuitOpen is returned (wrapped) while the circuit breaker is open or
// half-open and busy probing: the store did not call Redis at all.
var ErrCircuitOpen = errors.New("redisstore: circuit breaker open")

// Options configure a Store. The zero value is usable.
type Options struct {
	// KeyPrefix starts every key; default DefaultKeyPrefix. It must not
	// contain '{' or '}', which would move the Cluster hash tag.
	KeyPrefix string
	// Timeout bounds each Redis call (script or reset), in addition to the
	// caller's context; default DefaultTimeout; negative means no bound of
	// the store's own. It bounds a call's socket reads and writes only on
	// a client with ContextTimeoutEnabled (NewClientFromURL sets it); on
	// another, go-redis's ReadTimeout and WriteTimeout do.
	Timeout time.Duration
	// BreakerFailures is the number of consecutive failed calls that opens
	// the circuit breaker; default DefaultBreakerFailures; negative
	// disables the breaker. Calls cancelled by the caller's own context
	// do not count.
	BreakerFailures int
	// BreakerCooldown is how long the open breaker fails fast before one
	// probe call may try Redis again; default DefaultBreakerCooldown.
	BreakerCooldown time.Duration
	// TTLMargin is added to every key's TTL; default 0. Tests that drive
	// a manual clock (Options.Seams) set it, since Redis expires keys in real time.
	TTLMargin time.Duration
	// Pipeline is the most Takes sent to Redis in one pipeline of
	// EVALSHAs (one round trip for all; each script still runs atomically
	// on its own, so decisions are unchanged); default DefaultPipeline.
	// Batching never waits for a timer or for more Takes: a Take that
	// finds fewer than PipelineInFlight pipelines in flight is sent at
	// once, on its own, from its own goroutine, as with batching off; the
	// ones that come while that many are in flight wait for one of them to
	// be back and go together in the next, sent by the first of them. A
	// negative Pipeline turns batching off: each Take
	// is its own EVALSHA on a connection of its own, as many in flight as
	// the client's pool allows.
	Pipeline int
	// PipelineInFlight is how many pipelines (or lone Takes) batching
	// keeps in flight before a Take waits: a Take that finds fewer in
	// flight is sent at once, on its own, from its own goroutine, so up to
	// PipelineInFlight concurrent callers each make one round trip of
	// their own per Take, as with batching off; one that finds
	// PipelineInFlight in flight waits, and the waiting Takes go as one
	// pipeline (up to Pipeline of them) when one of those in flight is
	// back. More in flight keeps Redis and the client busy at once; fewer
	// make fuller pipelines under load. Default max(2, GOMAXPROCS), at most
	// the client's PoolSize (per node for a Cluster client, per shard for
	// a Ring); 1 keeps one in flight at a time.
	PipelineInFlight int
	// PipelineWorkers is the most pipelines in flight at once with
	// batching on: beyond PipelineInFlight, another starts only while
	// Pipeline Takes are already waiting. Default 4 × GOMAXPROCS, and at
	// least PipelineInFlight.
	PipelineWorkers int
	// Seed, if set, is given every decision Redis returns, with its
	// request (core.Seeder), on the caller's goroutine before Take
	// returns: the fallback of failure_policy fallback (a core/memory
	// store) then carries on from the last state this process saw when
	// Redis fails, instead of from zero (see the package comment).
	Seed core.Seeder
	// OnBreakerChange, if set, is called when the breaker changes state
	// (from, to are "closed", "half-open" or "open"), for logs and
	// metrics.
	OnBreakerChange func(from, to string)

	// FollowsControlPlane says the store is in a data plane that follows
	// a control plane whose ledger leases global quotas
	// (core.Quota.Global): such a quota is then spent from the leases the
	// data plane's lease holder (dataplane.QuotaRunner) writes beside the
	// counters, in the same script as the rate limit (see global.go for
	// the keys). Without it a global quota is counted as a plain quota
	// of this data plane, Max per period.
	FollowsControlPlane bool
	// GlobalCutOff is how long after the lease holder's last contact with
	// the control plane an optimistic global quota counts as cut off
	// (its floor is spent) until the holder writes its own; default
	// DefaultGlobalCutOff.
	GlobalCutOff time.Duration

	// InFlightLease is how long an in-flight slot (core.LimitSet.InFlight)
	// stays held without being renewed: the store renews the slots it
	// holds every InFlightLease/3, so a slot of a process that died is
	// free again within InFlightLease of its last renewal. Default
	// DefaultInFlightLease (30 s); whole milliseconds. Slot expiry is
	// Redis TIME, also under a test clock (Options.Seams).
	InFlightLease time.Duration

	// SyncSettle makes core.Hold.Settle send its settle script on the
	// caller's goroutine and return once Redis has answered (or the call
	// failed), as before settling became asynchronous. By default Settle
	// returns at once and the script is sent in the background; this
	// store's later Takes of the same quota wait for it, but another
	// process sharing the Redis does not know of it, so for about one
	// round trip after a response it may still see the estimate. Set
	// SyncSettle when a client's next request may reach another process
	// (gateways behind a load balancer) and must be refused by a settle
	// that took the quota over budget. See the package comment.
	SyncSettle bool

	// Seams are this module's tests' (internal/seams), which code outside
	// the module cannot make: leave it nil. When its Clock is set, the
	// scripts use Clock.Nanotime() as now instead of Redis TIME, so the
	// conformance suite can freeze and step time; with nil, app-server
	// clocks are never read and cannot skew decisions. Readings must be
	// ≥ 0; sliding windows and logs truncate them to whole microseconds.
	Seams *seams.Seams
}

// Store is the Redis Store. It is safe for concurrent use; create it with
// New.
type Store struct {
	client  redis.UniversalClient
	prefix  string
	head    string // prefix + "{": every key starts with it
	timeout time.Duration
	margin  int64 // Options.TTLMargin in whole ms
	clock   core.Clock
	seed    core.Seeder // Options.Seed; nil: none
	breaker *gobreaker.CircuitBreaker[[]int64]
	pipe    *batcher  // nil with batching off
	calls   sync.Pool // of *call
	// follows is Options.FollowsControlPlane, cutoff Options.GlobalCutOff,
	// activeKey the global quotas' active set (GlobalActiveKey).
	follows   bool
	flights   flights // in-flight slots held (inflight.go)
	cutoff    time.Duration
	activeKey string
	activeArg any    // activeKey, boxed once
	marks     marker // with follows: writes the active set's marks
	// settles sends settles in the background (settle.go), unless
	// syncSettle (Options.SyncSettle).
	settles    settles
	syncSettle bool
}

// New returns a Store over client (a *redis.Client, *redis.ClusterClient or
// Sentinel-backed client). It does not contact Redis; the scripts are loaded
// on first use. It fails only for an invalid KeyPrefix.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: nil client")
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("redisstore: New: key prefix %q must not contain '{' or '}'", opts.KeyPrefix)
	}
	s := &Store{client: client, prefix: opts.KeyPrefix, timeout: opts.Timeout, clock: opts.Seams.Or().Clock, seed: opts.Seed}
	if s.prefix == "" {
		s.prefix = DefaultKeyPrefix
	}
	s.head = s.prefix + "{"
	s.flights.init(opts.InFlightLease)
	s.follows, s.cutoff, s.activeKey = opts.FollowsControlPlane, opts.GlobalCutOff, GlobalActiveKey(s.prefix)
	s.activeArg = s.activeKey
	if s.follows {
		s.marks.init(s)
	}
	if s.cutoff <= 0 {
		s.cutoff = DefaultGlobalCutOff
	}
	s.calls.New = func() any { return newCall(s) }
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.margin = int64((opts.TTLMargin + time.Millisecond - 1) / time.Millisecond)
	if opts.BreakerFailures >= 0 {
		fails := uint32(opts.BreakerFailures)
		if fails == 0 {
			fails = DefaultBreakerFailures
		}
		cool := opts.BreakerCooldown
		if cool <= 0 {
			cool = DefaultBreakerCooldown
		}
		st := gobreaker.Settings{
			Name:        "redisstore",
			Timeout:     cool,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= fails },
			IsExcluded:  func(err error) bool { _, ok := err.(callerDone); return ok }, // as attempt returns it
		}
		if f := opts.OnBreakerChange; f != nil {
			st.OnStateChange = func(_ string, from, to gobreaker.State) { f(from.String(), to.String()) }
		}
		s.breaker = gobreaker.NewCircuitBreaker[[]int64](st)
	}
	if opts.Pipeline >= 0 {
		s.pipe = newBatcher(s, client, opts)
	}
	s.syncSettle = opts.SyncSettle
	s.settles.init(s, client, opts)
	return s, nil
}

// Close makes later Takes fail with ErrClosed when batching is on (Takes
// already waiting still get their replies). It waits for the settles
// (core.Hold.Settle) not yet sent or answered, each bounded by
// Options.Timeout, so a clean shutdown loses none; a Settle after Close
// sends its script on the caller's goroutine. With FollowsControlPlane it
// also stops the goroutine that writes global quotas' active-set marks,
// dropping marks not yet written, and it stops the goroutine that renews
// in-flight slots' leases (slots still held then lapse within
// Options.InFlightLease). It does not close the client, which
// belongs to the caller.
func (s *Store) Close() error {
	if s.pipe != nil {
		s.pipe.close()
	}
	s.settles.close()
	if s.follows {
		s.marks.close()
	}
	s.flights.close()
	return nil
}

// Client returns the client the store was made with, for callers that
// keep other data in the same Redis (a data plane's persisted
// configuration). The store does not own it: closing it is the caller's.
func (s *Store) Client() redis.UniversalClient { return s.client }

// FollowsControlPlane reports Options.FollowsControlPlane: global quotas
// are spent from leases (the data plane's QuotaRunner must run).
func (s *Store) FollowsControlPlane() bool { return s.follows }

// KeyPrefix returns the prefix every key of the store starts with.
func (s *Store) KeyPrefix() string { return s.prefix }

// Ping reports whether Redis answers a PING within ctx and
// Options.Timeout, for readiness checks. It goes around the circuit
// breaker (an open breaker would only repeat the last failure) and does not
// count towards it. With a Cluster client it asks every master the client
// knows of (one master down fails every key of its slots, and a node that
// answers for another says nothing of them); with Sentinel, the current
// master. The error wraps go-redis's.
func (s *Store) Ping(ctx context.Context) error {
	if s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("master %s: %w", c.Options().Addr, err)
			}
			return nil
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// callCtx returns a context bounded by Options.Timeout.
func (s *Store) callCtx() (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(context.Background(), s.timeout)
	}
	return context.WithCancel(context.Background())
}

// callerDone marks an error caused by the caller's own context ending: not
// Redis's fault, so the breaker ignores it.
type callerDone struct{ err error }

func (c callerDone) Error() string { return c.err.Error() }
func (c callerDone) Unwrap() error { return c.err }

// call runs f under the timeout and the breaker.
func (s *Store) call(ctx context.Context, f func(context.Context) ([]int64, error)) ([]int64, error) {
	return s.guard(func() ([]int64, error) { return s.attempt(ctx, f) })
}

// attempt runs f under the timeout; an error while ctx has ended is the
// caller's (callerDone).
func (s *Store) attempt(ctx context.Context, f func(context.Context) ([]int64, error)) ([]int64, error) {
	cctx := ctx
	if d, ok := ctx.Deadline(); s.timeout > 0 && (!ok || time.Until(d) > s.timeout) {
		// (A caller's sooner deadline is bound enough; this saves the
		// timer's allocations on the engine's store_timeout path.)
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	v, err := f(cctx)
	if err != nil && ctx.Err() != nil {
		return nil, callerDone{err}
	}
	return v, err
}

// guard runs run under the breaker.
func (s *Store) guard(run func() ([]int64, error)) ([]int64, error) {
	if s.breaker == nil {
		return run()
	}
	v, err := s.breaker.Execute(run)
	switch {
	case errors.Is(err, gobreaker.ErrOpenState):
		return nil, ErrCircuitOpen // its text says it all ("circuit breaker open (circuit breaker is open)" did twice)
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		return nil, fmt.Errorf("%w (half-open: %w)", ErrCircuitOpen, err)
	}
	return v, err
}

// kindNames names the rate key per algorithm.
var kindNames = [...][]byte{core.GCRA: []byte("gcra"), core.SlidingWindow: []byte("sw"), core.FixedWindow: []byte("fw"), core.SlidingLog: []byte("sl")}

// appendQuotaKind appends the quota key's kind for a quota epoch:
// "quota" for epoch 0 (the name quota counters had before epochs, so they
// survive an upgrade), "quota.<epoch in decimal>" otherwise.
func appendQuotaKind(b []byte, epoch uint64) []byte {
	b = append(b, "quota"...)
	if epoch == 0 {
		return b
	}
	return strconv.AppendUint(append(b, '.'), epoch, 10)
}

// consumerHash is the first 128 bits of SHA-256(consumer) in hex. scratch
// is a buffer to hash the consumer from (it is overwritten).
func consumerHash(scratch []byte, consumer string) ([32]byte, []byte) {
	scratch = append(scratch[:0], consumer...)
	h := sha256.Sum256(scratch)
	var hx [32]byte
	hex.Encode(hx[:], h[:16])
	return hx, scratch
}

// appendKey appends <prefix>{<consumer hash>}:<kind>:<escaped scope> to b
// (b[:0] is reused).
func (s *Store) appendKey(b []byte, hx *[32]byte, kind []byte, scope string) []byte {
	b = append(b[:0], s.head...)
	b = append(b, hx[:]...)
	b = append(b, "}:"...)
	b = append(b, kind...)
	b = append(b, ':')
	return appendScope(b, scope)
}

// key returns <prefix>{<consumer-hash>}:<kind>:<escaped scope>.
func (s *Store) key(consumer string, kind []byte, scope string) string {
	hx, _ := consumerHash(nil, consumer)
	return string(s.appendKey(nil, &hx, kind, scope))
}

// appendScope appends scope with every byte outside [A-Za-z0-9._~/-] as
// %XX.
func appendScope(b []byte, scope string) []byte {
	const hexd = "0123456789ABCDEF"
	for i := 0; i < len(scope); i++ {
		c := scope[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._~/-", c) >= 0 {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexd[c>>4], hexd[c&15])
	}
	return b
}

// maxExact is 2^53: Lua numbers are exact integers below it.
const maxExact = int64(1) << 53

// rule is the store's compiled form of a core.LimitSet (core.Rule.Data).
type rule struct {
	alg            core.Algorithm // the rate limit's; GCRA when there is none
	limited, quota bool
	p              core.GCRAParams
	rate           core.Limit
	qt             core.Quota
	// tsuf is ":" and the GCRA emission interval T in decimal ns, boxed
	// once: the suffix of the rate key's value (see gcraValue in
	// scripts.go) and the scripts' argument naming T.
	tsuf any
	// seed is the rule of the same limits on Options.Seed; nil when there
	// is no seeder or it cannot enforce them.
	seed *core.Rule
	// global: the quota is global and the store follows a control plane
	// (takeGlobal spends the leases). gargs are the global script's
	// per-rule arguments (scope, policy), boxed once.
	global bool
	gargs  [2]any
	// inFlight is the in-flight cap (core.LimitSet.InFlight); 0: none.
	inFlight int64
	// settle: the quota's charge is settled after the response
	// (core.LimitSet.Settle; not for a global quota).
	settle bool
}

// Prepare implements core.Store: it validates ls and compiles it. Errors
// wrap core.ErrInvalidLimit, also for a sliding window or log whose Period
// is not a whole number of microseconds, or a sliding window whose Rate ×
// Period in µs reaches 2^53 (Lua numbers are doubles). With Options.Seed
// set, the limits are prepared on the seeder too; when it refuses them
// (an algorithm it lacks), decisions under this rule are not seeded.
func (s *Store) Prepare(ls core.LimitSet) (*core.Rule, error) {
	if err := ls.Validate(); err != nil {
		return nil, err
	}
	r := &rule{limited: ls.Rate.Enforced(), quota: ls.Quota.Enforced(), rate: ls.Rate, qt: ls.Quota, global: s.follows && ls.Quota.IsGlobal(), inFlight: ls.InFlight}
	r.settle = ls.Settle && r.quota && !r.global
	if r.global {
		if err := ls.Quota.Global.Validate(ls.Quota.Max); err != nil {
			return nil, fmt.Errorf("quota: %w", err)
		}
		r.gargs = [2]any{ls.Scope, ls.Quota.Global.Policy}
	}
	if r.limited {
		if err := checkWindow(ls.Rate); err != nil {
			return nil, err
		}
		r.alg, r.p = ls.Rate.Algorithm, ls.Rate.GCRA()
		if r.alg == core.GCRA {
			r.tsuf = ":" + strconv.FormatInt(r.p.T, 10)
		}
	}
	if s.seed != nil {
		if sr, err := s.seed.Prepare(ls); err == nil {
			r.seed = sr
		}
	}
	return core.NewRule(ls, r)
}

// Take implements core.Store: it applies req in one script call. Errors:
// core.ErrInvalidCost, core.ErrForeignRule, and otherwise a failure to
// reach Redis (wrapping the go-redis error, context.DeadlineExceeded after
// Options.Timeout, or ErrCircuitOpen). After a timeout or a lost
// connection it is unknown whether Redis ran the script, so the request may
// have been counted; core.Engine's FailurePolicy decides the request.
// A Take of a quota with settles pending (core.Hold.Settle) waits for them
// first, up to Options.Timeout (see the package comment).
//
// Window algorithms (FixedWindow, SlidingWindow, SlidingLog) count up to
// Rate per Period and ignore Burst; their Status has Limit = Rate and
// Window = Period, ResetAfter is the time until Remaining is back to Rate,
// and a cost above Rate is denied with RetryAfter −1.
func (s *Store) Take(ctx context.Context, req core.Request) (core.Decision, error) {
	n := req.Cost
	if n < 0 || n >= maxExact {
		return core.Decision{}, core.ErrInvalidCost
	}
	r, ok := req.Rule.Data().(*rule) // Data is nil for a nil Rule
	if !ok {
		return core.Decision{}, core.ErrForeignRule
	}
	if r.inFlight > 0 && !core.InFlightSkipped(ctx) {
		return s.takeInFlight(ctx, req, r)
	}
	return s.takeLimits(ctx, req, r)
}

// takeLimits is Take for r's rate limit and quota.
func (s *Store) takeLimits(ctx context.Context, req core.Request, r *rule) (core.Decision, error) {
	n := req.Cost
	limited, quota, p, alg := r.limited, r.quota, r.p, r.alg
	if !limited && !quota {
		return core.Decision{Allowed: true}, nil
	}
	scope := req.Rule.Scope()

	if limited && !quota && alg == core.GCRA {
		return s.takeGCRA(ctx, req, r)
	}
	if r.global {
		return s.takeGlobal(ctx, req, r)
	}

	c := s.calls.Get().(*call)
	c.reset(scripts[alg], 2)
	var hx [32]byte
	hx, c.keys[1].b = consumerHash(c.keys[1].b, req.Consumer)
	c.keys[0].b = s.appendKey(c.keys[0].b, &hx, kindNames[alg], scope)
	c.keys[1].b = s.appendKey(c.keys[1].b, &hx, appendQuotaKind(c.kind[:0], req.QuotaEpoch), scope)
	s.appendNow(c)
	c.int(n)
	if quota {
		c.int(r.qt.Max)
	} else {
		c.args = append(c.args, "-1")
	}
	c.pair(int64(r.qt.Renewal))
	c.int(s.margin)
	if limited {
		c.args = append(c.args, "1")
		switch alg {
		case core.GCRA:
			// The script admits iff next − now ≤ its bound: τ, or τ plus the
			// reservation window (Request.MaxDelay). A cost above the burst
			// is denied whatever the offset: it is sent as bound + 1 ns.
			bound := p.Tau + req.Reservation()
			nt := bound + 1
			if n <= p.Burst {
				nt = n * p.T
			}
			c.args = append(c.args, r.tsuf)
			c.pair(nt)
			c.pair(bound)
		case core.FixedWindow:
			c.int(r.rate.Rate)
			c.pair(int64(r.rate.Period))
		default:
			c.int(r.rate.Rate)
			c.int(r.rate.Period.Microseconds())
		}
	} else {
		c.args = append(c.args, "0")
	}

	var qkey string
	if r.settle && quota && n > 0 {
		qkey = string(c.keys[1].b) // c goes back to its pool in run
	}
	var claimed []*settlement
	if quota && s.settles.pending.Load() != 0 {
		// Settles of this quota pending in the background go first
		// (settle.go): still queued, in this Take's round trip.
		var err error
		if claimed, err = s.settles.before(ctx, c.keys[1].b); err != nil {
			s.calls.Put(c)
			return core.Decision{}, fmt.Errorf("redisstore: take: waiting for a settle of the quota: %w", err)
		}
	}
	var v []int64
	var err error
	if claimed != nil {
		v, err = s.runAfter(ctx, c, claimed, 11)
	} else {
		v, err = s.run(ctx, c, 11)
	}
	if err != nil {
		return core.Decision{}, err
	}
	d, err := decision(req, r, v)
	if err == nil && qkey != "" && d.Allowed && v[9] > 0 {
		d.Hold = core.NewHold(&settlement{s: s, key: qkey, charged: n, end: strconv.FormatInt(v[9]*1000+v[10], 10)})
	}
	if err == nil && r.seed != nil {
		s.seedWith(req, r, d)
	}
	return d, err
}

// seedWith gives d to Options.Seed under the seeder's rule.
func (s *Store) seedWith(req core.Request, r *rule, d core.Decision) {
	req.Rule = r.seed
	s.seed.Seed(req, d)
}

// takeGCRA is Take for a GCRA rate limit without a quota, through the
// smaller gcraOnly script: one key, seven arguments, a reply of three.
func (s *Store) takeGCRA(ctx context.Context, req core.Request, r *rule) (core.Decision, error) {
	p := &r.p
	// The script admits iff next − now ≤ its bound: τ, or τ plus the
	// reservation window (Request.MaxDelay). A cost above the burst is
	// denied whatever the offset: it is sent as bound + 1 ns.
	bound := p.Tau + req.Reservation()
	nt := bound + 1
	if req.Cost <= p.Burst {
		nt = req.Cost * p.T
	}
	c := s.calls.Get().(*call)
	c.reset(gcraOnlyScript, 1)
	var hx [32]byte
	hx, c.keys[0].b = consumerHash(c.keys[0].b, req.Consumer)
	c.keys[0].b = s.appendKey(c.keys[0].b, &hx, kindNames[core.GCRA], req.Rule.Scope())
	s.appendNow(c)
	c.pair(nt)
	c.pair(bound)
	c.int(s.margin)
	c.args = append(c.args, r.tsuf)
	v, err := s.run(ctx, c, 3)
	if err != nil {
		return core.Decision{}, err
	}
	d, err := decision(req, r, v)
	if err == nil && r.seed != nil {
		s.seedWith(req, r, d)
	}
	return d, err
}

// Calls are built as EVALSHA's whole argument list, which go-redis sends
// as it is: "evalsha", the SHA-1, the number of keys, the keys, then the
// script's ARGV (see call).

// appendNow appends the scripts' ARGV[1], ARGV[2]: the test clock's (Options.Seams)
// reading as a pair, or "" (read Redis TIME) and "0".
func (s *Store) appendNow(c *call) {
	if s.clock != nil {
		c.pair(s.clock.Nanotime())
		return
	}
	c.args = append(c.args, "", "0")
}

// run runs c once, batched unless Options.Pipeline is negative, checks
// that it replied want integers, and gives c back to the pool.
func (s *Store) run(ctx context.Context, c *call, want int) ([]int64, error) {
	var v []int64
	var err error
	if s.pipe != nil {
		v, err = s.pipe.do(ctx, c)
	} else {
		v, err = s.direct(ctx, c)
	}
	return s.done(c, v, err, want)
}

// done ends a Take's call c that replied v or err: it gives c back to the
// pool (unless a batch it left still holds it) and checks that the
// script replied want integers.
func (s *Store) done(c *call, v []int64, err error, want int) ([]int64, error) {
	if !c.abandoned {
		c.cmd, c.ctx, c.v, c.batch = nil, nil, nil, nil
		s.calls.Put(c)
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: take: %w", err)
	}
	if len(v) != want {
		return nil, fmt.Errorf("redisstore: take: script replied %d values, want %d", len(v), want)
	}
	return v, nil
}

// checkWindow enforces the sliding algorithms' microsecond arithmetic.
func checkWindow(l core.Limit) error {
	if l.Algorithm != core.SlidingWindow && l.Algorithm != core.SlidingLog {
		return nil
	}
	if l.Period%time.Microsecond != 0 {
		return fmt.Errorf("%w: redisstore: %v period %v is not a whole number of microseconds", core.ErrInvalidLimit, l.Algorithm, l.Period)
	}
	if us := l.Period.Microseconds(); l.Algorithm == core.SlidingWindow && (l.Rate+1) > maxExact/us {
		return fmt.Errorf("%w: redisstore: sliding window rate %d × period %v reaches 2^53 µs", core.ErrInvalidLimit, l.Rate, l.Period)
	}
	return nil
}

func pair(u, r int64) time.Duration { return time.Duration(u*1000 + r) }

// decision turns the script's reply into a Decision (see scripts.go for
// the reply layout).
func decision(req core.Request, rl *rule, v []int64) (core.Decision, error) {
	code, n := v[0], req.Cost
	p, alg, limited, quota := &rl.p, rl.alg, rl.limited, rl.quota
	var d core.Decision
	var rateRetry, rateDelay time.Duration
	if limited {
		if alg == core.GCRA {
			cost := n
			if code == 2 {
				cost = 0 // the quota denied; the rate limit was only peeked
			}
			r := p.Reserve(int64(pair(v[1], v[2])), 0, cost, req.Reservation())
			if r.Allowed != (code != 1) {
				return core.Decision{}, fmt.Errorf("redisstore: take: script verdict %d disagrees with core GCRA %+v", code, r)
			}
			d.Rate = core.Status{Limit: p.Burst, Remaining: r.Remaining, ResetAfter: time.Duration(r.ResetAfter), Window: time.Duration(p.Tau)}
			rateRetry, rateDelay = time.Duration(r.RetryAfter), time.Duration(r.Delay)
		} else {
			d.Rate = core.Status{Limit: rl.rate.Rate, Remaining: v[1], ResetAfter: pair(v[2], v[3]), Window: rl.rate.Period}
			rateRetry = pair(v[4], v[5])
			if alg != core.FixedWindow {
				d.Rate.ResetAfter, rateRetry = time.Duration(v[2])*time.Microsecond, time.Duration(v[4])*time.Microsecond
			}
			if n > rl.rate.Rate {
				rateRetry = -1
			}
		}
	}
	if quota {
		d.Quota = core.Status{Limit: rl.qt.Max, Remaining: max(rl.qt.Max-v[6], 0), ResetAfter: pair(v[7], v[8]), Window: rl.qt.Renewal}
	}
	var top core.Status
	switch code {
	case 0:
		d.Allowed = true
		if limited {
			d.DecidedBy, top, d.Delay = core.KindRate, d.Rate, rateDelay
		} else {
			d.DecidedBy, top = core.KindQuota, d.Quota
		}
	case 1:
		d.DecidedBy, top, d.RetryAfter = core.KindRate, d.Rate, rateRetry
	case 2:
		d.DecidedBy, top, d.RetryAfter = core.KindQuota, d.Quota, d.Quota.ResetAfter
		if n > rl.qt.Max {
			d.RetryAfter = -1
		}
	default:
		return core.Decision{}, fmt.Errorf("redisstore: take: script replied code %d", code)
	}
	d.Limit, d.Remaining, d.ResetAfter = top.Limit, top.Remaining, top.ResetAfter
	return d, nil
}

// ResetQuota implements core.Store: it deletes the quota key of (consumer,
// scope) at epoch, so the next request of that epoch starts a new period;
// other epochs' keys are untouched. Deleting a key that does not exist is
// not an error. Failures are reported as for Take.
func (s *Store) ResetQuota(ctx context.Context, consumer, scope string, epoch uint64) error {
	key := s.key(consumer, appendQuotaKind(nil, epoch), scope)
	_, err := s.call(ctx, func(ctx context.Context) ([]int64, error) {
		return nil, s.client.Del(ctx, key).Err()
	})
	if err != nil {
		return fmt.Errorf("redisstore: reset quota: %w", err)
	}
	return nil
}

// Penalize implements core.Store: it moves the TAT of (req.Consumer,
// req.Rule.Scope()) to at least now + d + τ − T, the earliest state in
// which a unit request conforms exactly d from now, in one script call,
// so every process sharing the Redis holds back together (a Throttle's
// Backoff). It never moves the TAT backwards; the key gets the TTL a GCRA
// Take would give it (ceil(TAT − now) plus Options.TTLMargin). d above
// core.MaxReservation (2^61 ns, about 73 years) is treated as that. Time
// is Redis TIME (a test clock in tests: Options.Seams), as for Take. A rule without an
// enforced GCRA rate limit (none, or a window algorithm) changes nothing
// and Redis is not called; nor for d ≤ 0. A nil or foreign rule is
// refused with core.ErrForeignRule. With Options.Seed set, the TAT the
// key has afterwards is given to the seeder too (a decision with only the
// rate limit's ResetAfter set), so a fallback holds back as well.
// Failures are reported as for Take.
func (s *Store) Penalize(ctx context.Context, req core.Request, d time.Duration) error {
	r, ok := req.Rule.Data().(*rule) // Data is nil for a nil Rule
	if !ok {
		return core.ErrForeignRule
	}
	if d <= 0 || !r.limited || r.alg != core.GCRA {
		return nil
	}
	d = min(d, core.MaxReservation) // keeps d + τ below 2^62
	off := int64(d) + r.p.Tau - r.p.T
	key := s.key(req.Consumer, kindNames[core.GCRA], req.Rule.Scope())
	args := make([]any, 0, 6)
	if s.clock != nil {
		now := s.clock.Nanotime()
		args = append(args, now/1000, now%1000)
	} else {
		args = append(args, "", 0)
	}
	args = append(args, off/1000, off%1000, r.tsuf, s.margin)
	v, err := s.call(ctx, func(ctx context.Context) ([]int64, error) {
		return penalizeScript.Run(ctx, s.client, []string{key}, args...).Int64Slice()
	})
	if err != nil {
		return fmt.Errorf("redisstore: penalize: %w", err)
	}
	if len(v) != 3 {
		return fmt.Errorf("redisstore: penalize: script replied %d values, want 3", len(v))
	}
	if r.seed != nil {
		req.Rule = r.seed
		s.seed.Seed(req, core.Decision{Rate: core.Status{ResetAfter: pair(v[1], v[2])}})
	}
	return nil
}

var _ core.Store = (*Store)(nil)
