package core

import (
	"context"
	"time"
)

// Kind says which limit decided a request.
type Kind uint8

const (
	// KindNone: nothing limited the request (no limit set, or every set
	// limit is Unlimited).
	KindNone Kind = iota
	// KindRate: the rate limit decided.
	KindRate
	// KindQuota: the quota decided.
	KindQuota
)

// String returns "none", "rate" or "quota".
func (k Kind) String() string {
	switch k {
	case KindRate:
		return "rate"
	case KindQuota:
		return "quota"
	}
	return "none"
}

// Status is the state of one limit (rate or quota) after a decision.
type Status struct {
	// Limit is the most requests the limit allows at once: the burst for a
	// rate limit, Max for a quota. Zero when the limit is not configured
	// or is Unlimited.
	Limit int64
	// Remaining is how many unit-cost requests would pass right now.
	Remaining int64
	// ResetAfter is the time until Remaining is back to Limit (rate) or
	// until the quota period renews (quota).
	ResetAfter time.Duration
	// Window is the period the limit is stated over: τ = Burst×T for GCRA
	// (the time one full burst takes to refill), Period for window
	// algorithms, Renewal for a quota.
	Window time.Duration
	// Policy is the ID of the policy the limit came from; set by the
	// Engine. It is "" when no policy sets the limit, from a bare Store,
	// and for a consumer's own APILimits. A Status with Limit 0 and a
	// Policy means that policy made the limit Unlimited.
	Policy string
}

// Decision is the answer to "may this consumer make this request now?".
//
// Limit, Remaining and ResetAfter repeat the Status of the limit that
// decided (the one that denied, or when allowed the rate limit if there is
// one, else the quota), so a caller who only wants one set of numbers can
// read them directly.
type Decision struct {
	// Allowed reports whether the request may proceed. With a shadow policy
	// it is true even when the limit would have denied (see Shadowed).
	Allowed bool
	// DecidedBy says which limit decided.
	DecidedBy Kind
	// Policy is the ID of the policy the deciding limit came from ("" when
	// the limit was set directly on a Request or a key).
	Policy string
	// Limit, Remaining and ResetAfter: see the type's comment.
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed; when denied, the time after which the
	// same request would be allowed (rate), or the quota renewal time; -1
	// when the cost exceeds the burst and can never pass.
	RetryAfter time.Duration
	// Rate and Quota hold both limits' states; a zero Status means the
	// limit is not configured (see Status.Policy for an Unlimited one).
	Rate  Status
	Quota Status
	// Shadowed is true when a shadow policy would have denied the request
	// but it was allowed.
	Shadowed bool
	// Delay is set when the request was admitted by reservation
	// (Request.MaxDelay): the caller must wait this long before acting.
	Delay time.Duration
}

// Request is one question put to a Store: spend Cost units against Rate and
// Quota for the counters of (Consumer, Scope), atomically — the quota is
// spent only when the rate limit allows, and a denied request changes no
// counter.
type Request struct {
	// Consumer identifies whose counters are used. Stores never need it to
	// be secret-free, but callers pass hashes, not raw API keys.
	Consumer string
	// Scope separates counters of one consumer, e.g. per API ("" for
	// key-wide counters).
	Scope string
	// Rate is the rate limit; the zero Limit (absent) or Unlimited skips
	// it (see Limit.Enforced).
	Rate Limit
	// Quota is the quota; the zero Quota (absent) or Unlimited skips it
	// (see Quota.Enforced).
	Quota Quota
	// QuotaEpoch is the epoch of the quota counter this request spends
	// (Consumer.QuotaEpoch, or Limits.QuotaEpoch for a per-API scope).
	// Quota counters are named with their epoch: a request with a higher
	// epoch than the counter a store holds starts a fresh quota period,
	// and the same epoch again changes nothing, so a reset carried as data
	// is idempotent. A store never revives a count it has left behind:
	// how it treats a lower epoch than the one it holds is the store's to
	// document (core/memory spends the newer period; core/redisstore
	// spends the lower epoch's own counter). 0 is the epoch of a key
	// never reset. The rate limit's state does not depend on it.
	QuotaEpoch uint64
	// Cost is the number of units, in [0, MaxCost]; 0 peeks without
	// changing state.
	Cost int64
	// MaxDelay lets a GCRA rate limit admit the request by reservation:
	// when it does not conform now but will within MaxDelay, its units are
	// taken at once and Decision.Delay says how long the caller must wait
	// before acting. Callers that share a store are then served in order at
	// exactly the limit's pace, one store call each (Wait uses it). 0 means
	// no reservation; values above 2^61 ns are treated as 2^61 ns. Window
	// algorithms ignore it. A quota is spent at reservation time.
	MaxDelay time.Duration
	// Distributed is set by the Engine from Policy.Distributed of the
	// policy whose rate limit the request carries: a store that splits
	// limits across processes (dataplane/drl) may decide the rate limit
	// against this process's share. Other stores ignore it.
	Distributed bool
}

// MaxReservation is the largest MaxDelay a store honours, 2^61 ns (about
// 73 years).
const MaxReservation time.Duration = 1 << 61

// Reservation returns MaxDelay in ns, clamped to [0, MaxReservation].
func (r *Request) Reservation() int64 {
	return int64(min(max(r.MaxDelay, 0), MaxReservation))
}

// MaxCost is the largest cost a Request may carry, 2^53 − 1: every store
// refuses a larger one with ErrInvalidCost (the Redis store computes in Lua
// numbers, exact integers below 2^53, and the in-process store matches it).
const MaxCost = MaxCount

// Validate checks the request's limits and cost.
func (r *Request) Validate() error {
	if r.Cost < 0 || r.Cost > MaxCost {
		return ErrInvalidCost
	}
	if err := r.Rate.Validate(); err != nil {
		return err
	}
	return r.Quota.Validate()
}

// Store keeps counters and applies Requests to them. Implementations must be
// safe for concurrent use and must pass core/storetest.
type Store interface {
	// Take applies req and returns the decision. An error means no
	// decision could be made (the store is unreachable, req is invalid);
	// the Decision is then the zero value.
	Take(ctx context.Context, req Request) (Decision, error)
	// ResetQuota deletes the quota counter of (consumer, scope): the next
	// request starts a new period. A store that names quota counters by
	// epoch deletes epoch 0's here and implements QuotaEpochResetter for
	// the others.
	ResetQuota(ctx context.Context, consumer, scope string) error
}

// QuotaEpochResetter is implemented by stores that keep one quota counter
// per epoch (Request.QuotaEpoch), such as the Redis store, whose counters'
// names include it. ResetQuotaEpoch deletes the counter of (consumer,
// scope) at epoch, so the next request of that epoch starts a new period;
// the counters of other epochs are untouched. Engine.ResetQuota calls it
// with the consumer's current epoch; for a store that does not implement
// it, Store.ResetQuota resets whichever period it holds.
type QuotaEpochResetter interface {
	ResetQuotaEpoch(ctx context.Context, consumer, scope string, epoch uint64) error
}

// Clock is a monotonic clock. Nanotime returns nanoseconds since an
// arbitrary fixed origin; it never goes backwards. Tests freeze and step it
// (see ManualClock).
type Clock interface {
	Nanotime() int64
}

// DecisionWriter is implemented by stores that can write a Decision in
// place: TakeInto(ctx, &req, &d) has exactly Take's semantics and
// overwrites all of *d. Call it on the concrete store type (for example a
// *memory.Store guarding a hot key): on a hot in-process key the Decision
// copy it avoids is about a third of the cost. Through this interface the
// pointers escape to the heap, which costs more than the copy, so the
// Engine calls Take.
type DecisionWriter interface {
	TakeInto(ctx context.Context, req *Request, d *Decision) error
}

// AlgorithmSupporter is implemented by stores that enforce only some
// algorithms (the in-process store enforces GCRA only). NewEngine and
// SetConfig refuse policies a store cannot enforce, instead of failing
// every request later with ErrUnsupportedAlgorithm.
type AlgorithmSupporter interface {
	SupportsAlgorithm(a Algorithm) bool
}

// LimitChecker is implemented by stores that can enforce only some limits
// of an algorithm they support (the Redis store counts sliding windows in
// whole microseconds, exactly below 2^53). NewEngine and SetConfig call
// CheckLimit for every policy's rate limit and refuse the config with its
// error, which wraps ErrInvalidLimit, instead of failing every request
// later.
type LimitChecker interface {
	CheckLimit(l Limit) error
}

// Penalizer is implemented by stores that can hold a consumer's rate limit
// back. After Penalize(ctx, consumer, scope, l, d) no request of cost 1
// under l passes before d has elapsed; later ones flow at l's rate again.
// Outbound clients call it when a third party answers 429 with
// Retry-After, so every caller sharing the store backs off together.
type Penalizer interface {
	Penalize(ctx context.Context, consumer, scope string, l Limit, d time.Duration) error
}

// Seeder is implemented by stores that can carry on from another store's
// counters: core/memory, as the fallback of the Redis store
// (redisstore.Options.Seed), so that a spent quota stays spent while Redis
// is down. Seed(req, d) records d, the decision another store made for req
// a moment ago, as the state of req's key: for a GCRA rate limit the
// theoretical arrival time now + d.Rate.ResetAfter, for a quota
// d.Quota.Limit − d.Quota.Remaining units used in a period that ends
// d.Quota.ResetAfter from now, with req.QuotaEpoch. State is never moved
// back: a seeder that holds a later TAT or a higher count of the same
// period keeps it. Seed reports nothing and must not block: it runs on the
// other store's decision path, once per decision, and does what it can
// (a bounded store at its cap skips a new key).
type Seeder interface {
	Seed(req Request, d Decision)
}
