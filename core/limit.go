// Package core holds limitplane's shared vocabulary and pure math: Limit,
// Quota, Policy, Decision, the Store interface every counter backend
// implements, the GCRA arithmetic all stores must agree with, and the Engine
// that turns (consumer, API, cost) into a Decision.
//
// core imports only the standard library. Stores live in sub-packages
// (core/memory, core/redisstore); framework glue lives in adapters/.
package core

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Unlimited, as a Limit's Rate or a Quota's Max, means "no limit": every
// request is allowed and no counter is kept. The value -1 follows Tyk.
// Unlimited is not the same as a limit left out (the zero Limit or Quota):
// when several policies are merged, a left-out limit takes no part, while
// Unlimited takes part and beats every finite limit.
const Unlimited = -1

// MaxTolerance bounds the burst tolerance τ = Burst × T of a valid Limit
// (and therefore every TAT offset), in nanoseconds, so that now + τ + n×T
// can never overflow an int64 nanosecond clock: 2^61 ns, about 73 years.
// Validate refuses a limit above it; stores that check limits on a fast
// path of their own check against it too.
const MaxTolerance = int64(1) << 61

// MaxCount is the largest count a limit may state, 2^53 − 1: a Limit's Rate
// and Burst and a Quota's Max above it are refused by Validate (wrapping
// ErrInvalidLimit), and so by every store, the Engine and the gateway's
// configuration. The Redis store counts in Lua numbers, IEEE doubles, which
// hold every integer up to 2^53 exactly and no longer count one by one above
// it; the in-process store refuses the same limits, so a policy means the
// same in both. It is also the largest integer a JSON or JavaScript client
// reads exactly from a Remaining or Limit field. Equal to MaxCost.
const MaxCount = 1<<53 - 1

// Algorithm selects how a Limit is enforced. The zero value is GCRA.
type Algorithm uint8

const (
	// GCRA is the Generic Cell Rate Algorithm: one stored theoretical
	// arrival time (TAT) per key, equivalent to a token bucket of size Burst
	// refilled at Rate per Period. It is the default.
	GCRA Algorithm = iota
	// SlidingWindow estimates the count of the last Period from the current
	// and previous fixed windows, weighting the previous one by its overlap.
	SlidingWindow
	// FixedWindow counts requests per window of Period that opens at the
	// first request after the previous window closed (as Tyk's quotas do).
	// A client can spend the whole limit at the end of one window and again
	// at the start of the next: up to 2× the limit across a boundary.
	FixedWindow
	// SlidingLog is exact: a request passes iff the units admitted in the
	// last Period plus its cost are at most Rate. The Redis store keeps one
	// entry per microsecond with admitted requests, carrying their cost, so
	// its memory grows with the number of requests per Period (at most
	// Rate), and a request's work does not grow with its cost.
	SlidingLog
)

// String returns the algorithm's configuration name: "gcra",
// "sliding_window", "fixed_window" or "sliding_log".
func (a Algorithm) String() string {
	switch a {
	case GCRA:
		return "gcra"
	case SlidingWindow:
		return "sliding_window"
	case FixedWindow:
		return "fixed_window"
	case SlidingLog:
		return "sliding_log"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm maps a configuration name (see Algorithm.String) to an
// Algorithm. The empty string is GCRA.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "", "gcra":
		return GCRA, nil
	case "sliding_window":
		return SlidingWindow, nil
	case "fixed_window":
		return FixedWindow, nil
	case "sliding_log":
		return SlidingLog, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want gcra, sliding_window, fixed_window or sliding_log)", s)
}

// Errors returned by validation and by stores. Callers branch on them with
// errors.Is.
var (
	// ErrInvalidLimit reports a Limit or Quota that cannot be enforced; the
	// wrapping error names the field and the problem.
	ErrInvalidLimit = errors.New("invalid limit")
	// ErrCostExceedsBurst reports a request whose cost is larger than the
	// burst: it can never be allowed, so Wait gives up at once.
	ErrCostExceedsBurst = errors.New("cost exceeds burst")
	// ErrInvalidCost reports a cost below 0 or above MaxCost.
	ErrInvalidCost = errors.New("cost must be in [0, 2^53)")
	// ErrUnsupportedAlgorithm is returned by a store that does not
	// implement the Limit's Algorithm.
	ErrUnsupportedAlgorithm = errors.New("algorithm not supported by this store")
)

// Limit is a rate limit: Rate events per Period, with bursts of up to Burst
// events. The zero Limit means "no rate limit configured" (see IsZero): the
// limit is absent, which is not the same as Rate == Unlimited (see
// Unlimited).
//
// Under GCRA the emission interval is T = Period / Rate (rounded down to a
// whole nanosecond) and the burst tolerance is τ = Burst × T.
type Limit struct {
	// Rate is the number of events allowed per Period; Unlimited (-1)
	// disables the limit.
	Rate int64
	// Period is the window the Rate is measured over; it must be positive
	// unless Rate is Unlimited.
	Period time.Duration
	// Burst is the most events that may pass at once. Zero means Rate.
	Burst int64
	// Algorithm selects the enforcement algorithm; the zero value is GCRA.
	Algorithm Algorithm
}

// PerSecond returns a GCRA Limit of r events per second with burst r.
func PerSecond(r int64) Limit { return Limit{Rate: r, Period: time.Second} }

// PerMinute returns a GCRA Limit of r events per minute with burst r.
func PerMinute(r int64) Limit { return Limit{Rate: r, Period: time.Minute} }

// IsZero reports whether l is the zero Limit, meaning "not configured": the
// limit is absent. It is not unlimited (see IsUnlimited).
func (l Limit) IsZero() bool { return l == Limit{} }

// IsUnlimited reports whether l is explicitly unlimited: its Rate is
// Unlimited (-1). The zero Limit is absent, not unlimited, and reports
// false; use Enforced to ask whether a store has anything to count.
func (l Limit) IsUnlimited() bool { return l.Rate == Unlimited }

// Enforced reports whether l limits anything: it is neither absent (zero)
// nor Unlimited. Stores count only enforced limits.
func (l Limit) Enforced() bool { return l.Rate != Unlimited && !l.IsZero() }

// EffectiveBurst returns Burst, or Rate when Burst is zero.
func (l Limit) EffectiveBurst() int64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// EmissionInterval returns T = Period / Rate, the spacing between events at
// the sustained rate, in nanoseconds. It is only meaningful for a valid,
// limited Limit.
func (l Limit) EmissionInterval() time.Duration {
	return l.Period / time.Duration(l.Rate)
}

// Validate reports why l cannot be enforced, wrapping ErrInvalidLimit, or
// nil. The zero Limit and Rate == Unlimited are valid. Otherwise Rate,
// Period and Burst (when set) must be positive, Rate and Burst at most
// MaxCount (2^53 − 1, the largest count every store keeps exactly),
// Period/Rate must be at least one nanosecond, and Burst × T must stay
// below 2^61 ns so no arithmetic can overflow.
func (l Limit) Validate() error {
	if l.IsZero() || l.Rate == Unlimited {
		return nil
	}
	if l.Algorithm > SlidingLog {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, l.Algorithm)
	}
	if l.Rate <= 0 {
		return fmt.Errorf("%w: rate %d must be > 0 (or -1 for unlimited)", ErrInvalidLimit, l.Rate)
	}
	if l.Period <= 0 {
		return fmt.Errorf("%w: period %v must be > 0", ErrInvalidLimit, l.Period)
	}
	if l.Burst < 0 {
		return fmt.Errorf("%w: burst %d must be > 0 (0 means equal to rate)", ErrInvalidLimit, l.Burst)
	}
	if l.Rate > MaxCount {
		return fmt.Errorf("%w: rate %d is above %d (2^53 − 1), the largest count every store keeps exactly", ErrInvalidLimit, l.Rate, int64(MaxCount))
	}
	if l.Burst > MaxCount {
		return fmt.Errorf("%w: burst %d is above %d (2^53 − 1), the largest count every store keeps exactly", ErrInvalidLimit, l.Burst, int64(MaxCount))
	}
	t := int64(l.Period) / l.Rate
	if t == 0 {
		return fmt.Errorf("%w: rate %d per %v is finer than one event per nanosecond", ErrInvalidLimit, l.Rate, l.Period)
	}
	if b := l.EffectiveBurst(); b > MaxTolerance/t {
		return fmt.Errorf("%w: burst %d × emission interval %v overflows", ErrInvalidLimit, b, time.Duration(t))
	}
	return nil
}

// Quota is a budget of Max requests per Renewal period. The period starts at
// the consumer's first request, not on a calendar boundary (Tyk's
// semantics), and a unit is only spent when the rate limit also allows the
// request. The zero Quota means "no quota configured" (absent), which is not
// the same as Max == Unlimited (see Unlimited).
type Quota struct {
	// Max is the number of requests per period; Unlimited (-1) disables
	// the quota.
	Max int64
	// Renewal is the period's length, starting at the first request.
	Renewal time.Duration
	// Global, when its Mode is set, makes the quota one budget shared by
	// the data planes that follow a control plane (issue 22): a store
	// told that it is in such a data plane (redisstore's
	// Options.FollowsControlPlane) spends budget leased from the control
	// plane's ledger instead of counting Max itself. Every other store,
	// and a Redis store not told so, counts the quota as a plain quota of
	// this process's data plane (Max per period). The zero GlobalQuota:
	// not global.
	Global GlobalQuota
}

// GlobalMode is a global quota's mode (GlobalQuota.Mode): what a data
// plane spends when its leases are spent. The zero value means the quota
// is not global.
type GlobalMode uint8

const (
	// NotGlobal: the quota is counted by each data plane on its own.
	NotGlobal GlobalMode = iota
	// GlobalStrict refuses once the leases are spent.
	GlobalStrict
	// GlobalReserved spends the data plane's floor (debited by the ledger
	// at the period's start) whenever the leases are spent.
	GlobalReserved
	// GlobalOptimistic spends the floor only while the data plane is cut
	// off from the control plane (the ledger debits it when reported).
	GlobalOptimistic
)

// String returns "", "strict", "reserved" or "optimistic".
func (m GlobalMode) String() string {
	switch m {
	case NotGlobal:
		return ""
	case GlobalStrict:
		return "strict"
	case GlobalReserved:
		return "reserved"
	case GlobalOptimistic:
		return "optimistic"
	}
	return fmt.Sprintf("GlobalMode(%d)", uint8(m))
}

// GlobalQuota says how a quota is shared across data planes (Quota.Global).
// It is comparable, so a LimitSet holding it stays a map key.
type GlobalQuota struct {
	// Mode is the mode; NotGlobal (zero) turns the rest off.
	Mode GlobalMode
	// Floor is this data plane's floor per period (units) in reserved and
	// optimistic modes, until the ledger names its own.
	Floor int64
	// LeaseDuration is how long a leased chunk may be spent (the ledger's
	// default when 0).
	LeaseDuration time.Duration
	// Policy is the ID of the policy the quota came from, "" for a
	// consumer's own per-API limit: the ledger entry names it
	// (lease.EntryKey.Policy). The Engine sets it when it prepares a
	// policy's limits; a caller building a LimitSet by hand sets it.
	Policy string
}

// IsGlobal reports whether q is an enforced quota marked global.
func (q Quota) IsGlobal() bool { return q.Global.Mode != NotGlobal && q.Enforced() }

// IsZero reports whether q is the zero Quota, meaning "not configured": the
// quota is absent. It is not unlimited (see IsUnlimited).
func (q Quota) IsZero() bool { return q == Quota{} }

// IsUnlimited reports whether q is explicitly unlimited: its Max is
// Unlimited (-1). The zero Quota is absent, not unlimited, and reports
// false; use Enforced to ask whether a store has anything to count.
func (q Quota) IsUnlimited() bool { return q.Max == Unlimited }

// Enforced reports whether q limits anything: it is neither absent (zero)
// nor Unlimited. Stores count only enforced quotas.
func (q Quota) Enforced() bool { return q.Max != Unlimited && !q.IsZero() }

// Validate reports why q cannot be enforced, wrapping ErrInvalidLimit, or
// nil. The zero Quota and Max == Unlimited are valid; otherwise Max and
// Renewal must be positive, Max at most MaxCount (2^53 − 1, the largest
// count every store keeps exactly) and Renewal below 2^61 ns.
func (q Quota) Validate() error {
	if q.IsZero() || q.Max == Unlimited {
		return nil
	}
	if q.Max <= 0 {
		return fmt.Errorf("%w: quota max %d must be > 0 (or -1 for unlimited)", ErrInvalidLimit, q.Max)
	}
	if q.Max > MaxCount {
		return fmt.Errorf("%w: quota max %d is above %d (2^53 − 1), the largest count every store keeps exactly", ErrInvalidLimit, q.Max, int64(MaxCount))
	}
	if q.Renewal <= 0 {
		return fmt.Errorf("%w: quota renewal %v must be > 0", ErrInvalidLimit, q.Renewal)
	}
	if int64(q.Renewal) >= MaxTolerance {
		return fmt.Errorf("%w: quota renewal %v is too long", ErrInvalidLimit, q.Renewal)
	}
	return nil
}

// Validate reports why g cannot be enforced on a quota of max, wrapping
// ErrInvalidLimit, or nil: a mode core does not know, a floor outside
// [0, max], a negative lease duration. Quota.Validate leaves g alone
// (spec validates it where it is written); a store that enforces global
// quotas calls it from Prepare.
func (g GlobalQuota) Validate(max int64) error {
	switch {
	case g.Mode > GlobalOptimistic:
		return fmt.Errorf("%w: unknown global quota mode %d", ErrInvalidLimit, g.Mode)
	case g.Floor < 0 || g.Floor > max:
		return fmt.Errorf("%w: global quota floor %d must be in [0, max %d]", ErrInvalidLimit, g.Floor, max)
	case g.LeaseDuration < 0:
		return fmt.Errorf("%w: global quota lease duration %v is negative", ErrInvalidLimit, g.LeaseDuration)
	}
	return nil
}

// Policy is a named pair of rate limit and quota that keys refer to, as in
// Tyk. A zero Rate or Quota means the policy leaves that limit out: when a
// consumer has several policies, it takes no part in choosing that limit
// (Tyk's partitioned policies: one policy may carry the rate, another the
// quota). Unlimited (-1) means unlimited and beats any finite limit.
type Policy struct {
	// ID names the policy; it appears in Decision.Policy and in the
	// RateLimit-Policy response field.
	ID string
	// Rate is the policy's rate limit; zero leaves it out.
	Rate Limit
	// Quota is the policy's quota; zero leaves it out.
	Quota Quota
	// APIs restricts the policy to these API IDs; empty means every API.
	APIs []string
	// Shadow computes and reports decisions but never denies a request,
	// so a new limit can be tried on live traffic.
	Shadow bool
	// Distributed asks a store that splits limits across processes
	// (core/drl, limitplane's Distributed Rate Limiter after Tyk's DRL)
	// to enforce this policy's rate limit against this process's share of
	// it, in memory; other stores ignore it. Quotas are never split.
	Distributed bool
	// Endpoints are the policy's own limits at endpoints of APIs (Tyk's
	// endpoint-level limits in a policy's access rights), so that plans
	// differ per endpoint: for a consumer with this policy they replace
	// the endpoint's own policies (see PolicyEndpoint).
	Endpoints []PolicyEndpoint
	// Thresholds are percentages of the quota's Max (1 to 100, each
	// once), e.g. [80, 100]: the request whose spend reaches one, in a
	// quota period, is told to Options.QuotaObserver (ThresholdReached).
	// They need a quota of the policy's own, not Unlimited and not
	// global (a data plane's decisions show its leases, not what every
	// data plane spent); none costs nothing.
	Thresholds []int64
	// InFlight caps the consumer's requests in flight at once (Stripe's
	// concurrent-request limiter): 0 leaves it out, a positive value is
	// the most held at once (LimitSet.InFlight). Merged over a consumer's
	// policies as the other limits are: the largest cap wins, and a
	// policy that leaves it out takes no part. It counts on the API's
	// key-wide counters, as the rate limit does, and not at endpoints.
	InFlight int64
	// Settle makes the policy's quota charge an estimate (the request's
	// cost) settled to the actual cost after the response
	// (LimitSet.Settle, core.Hold.Settle).
	Settle bool
}

// PolicyEndpoint is a policy's own limits at one endpoint of an API
// (Config.Endpoints), named by the API's id and the endpoint's method and
// path as the endpoint gives them ({param} names aside). For a consumer
// whose policies have limits at an endpoint, the most generous of those
// (rate and quota chosen apart, as Consumer.Policies says) replace the
// endpoint's own policies, on the same counters (EndpointScope), so a
// change of plan keeps the units spent; the consumer's own limits for the
// API still apply. A consumer whose policies have none there is limited by
// the endpoint's own policies. The shadow and distributed flags are the
// policy's. A global quota is refused.
type PolicyEndpoint struct {
	API, Method, Path string
	Rate              Limit
	Quota             Quota
}

// Validate checks the policy's ID, Rate and Quota.
func (p *Policy) Validate() error {
	if p.ID == "" {
		return fmt.Errorf("%w: policy has an empty id", ErrInvalidLimit)
	}
	if err := p.Rate.Validate(); err != nil {
		return fmt.Errorf("policy %q: rate: %w", p.ID, err)
	}
	if err := p.Quota.Validate(); err != nil {
		return fmt.Errorf("policy %q: quota: %w", p.ID, err)
	}
	if p.InFlight < 0 || p.InFlight > MaxCount {
		return fmt.Errorf("policy %q: in_flight: %w: %d must be in [0, 2^53) (0: none)", p.ID, ErrInvalidLimit, p.InFlight)
	}
	if err := CheckThresholds(p.Thresholds); err != nil {
		return fmt.Errorf("policy %q: %w", p.ID, err)
	}
	if len(p.Thresholds) > 0 && (p.Quota.IsZero() || p.Quota.Max == Unlimited || p.Quota.Global.Mode != NotGlobal) {
		return fmt.Errorf("%w: policy %q: thresholds need a quota (not unlimited, not global)", ErrInvalidLimit, p.ID)
	}
	return nil
}

// CheckThresholds reports why ts cannot be a policy's quota thresholds
// (Policy.Thresholds): a percentage outside 1 to 100, or one listed
// twice; nil when they can (none included). Its errors wrap
// ErrInvalidLimit.
func CheckThresholds(ts []int64) error {
	for i, t := range ts {
		if t < 1 || t > 100 {
			return fmt.Errorf("%w: threshold %d%% is not 1 to 100", ErrInvalidLimit, t)
		}
		for _, u := range ts[:i] {
			if u == t {
				return fmt.Errorf("%w: threshold %d%% is listed twice", ErrInvalidLimit, t)
			}
		}
	}
	return nil
}

// appliesTo reports whether the policy covers api.
func (p *Policy) appliesTo(api string) bool {
	if len(p.APIs) == 0 {
		return true
	}
	for _, a := range p.APIs {
		if a == api {
			return true
		}
	}
	return false
}

// ratePerNs compares set (non-zero, valid) limits by sustained rate: larger
// means more generous, and Unlimited is +Inf.
func ratePerNs(l Limit) float64 {
	if l.Rate == Unlimited {
		return math.Inf(1)
	}
	return float64(l.Rate) / float64(l.Period)
}

// quotaPerNs compares set (non-zero, valid) quotas by allowance per unit of
// time; Unlimited is +Inf.
func quotaPerNs(q Quota) float64 {
	if q.Max == Unlimited {
		return math.Inf(1)
	}
	return float64(q.Max) / float64(q.Renewal)
}
