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
	// KindInFlight: the in-flight limit decided (LimitSet.InFlight): a
	// denial because the consumer has that many requests in flight, or an
	// admission under a rule with no rate limit or quota.
	KindInFlight
)

// String returns "none", "rate", "quota" or "in_flight".
func (k Kind) String() string {
	switch k {
	case KindRate:
		return "rate"
	case KindQuota:
		return "quota"
	case KindInFlight:
		return "in_flight"
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
//
// A request denied by an in-flight limit (DecidedBy KindInFlight) has
// Limit the cap, Remaining 0 and RetryAfter 0: when a slot frees depends
// on other requests' responses, which no store knows; its Rate and Quota
// are zero (they were not asked). An admitted request under an in-flight
// limit carries the slot in Hold, which the caller must Release when the
// response is done.
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
	// Hold is what the admitted request holds until its response is done
	// (an in-flight slot); the zero Hold when it holds nothing, and
	// always for a denied request. Release it with defer.
	Hold Hold
}

// Request is one question put to a Store: spend Cost units of Rule's rate
// limit and quota for the counters of (Consumer, Rule.Scope()), atomically:
// the quota is spent only when the rate limit allows, and a denied request
// changes no counter.
//
// A Request is six machine words (48 bytes on 64-bit platforms), so that it
// travels in registers through the Store interface call on amd64 and
// arm64; everything about the limits is in the Rule, prepared once. A test
// pins the size.
type Request struct {
	// Consumer identifies whose counters are used. Stores never need it to
	// be secret-free, but callers pass hashes, not raw API keys.
	Consumer string
	// Rule is the prepared limit set, from this store's Prepare. A nil
	// Rule, or one another kind of store prepared (see Rule), is refused with
	// ErrForeignRule.
	Rule *Rule
	// Cost is the number of units, in [0, MaxCost]; 0 peeks without
	// changing state. A cost outside that range is refused with
	// ErrInvalidCost.
	Cost int64
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
	// MaxDelay lets a GCRA rate limit admit the request by reservation:
	// when it does not conform now but will within MaxDelay, its units are
	// taken at once and Decision.Delay says how long the caller must wait
	// before acting. Callers that share a store are then served in order at
	// exactly the limit's pace, one store call each (Wait uses it). 0 means
	// no reservation; values above 2^61 ns are treated as 2^61 ns. Window
	// algorithms ignore it. A quota is spent at reservation time.
	MaxDelay time.Duration
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

// Store keeps counters and applies Requests to them. Implementations must be
// safe for concurrent use and must pass core/storetest.
//
// Limits are bound once: Prepare validates a LimitSet and compiles it into a
// Rule, refusing there what the store cannot enforce (an algorithm it
// lacks: ErrUnsupportedAlgorithm; a limit it cannot count exactly: an error
// wrapping ErrInvalidLimit), and Take checks nothing of the limits again.
type Store interface {
	// Prepare validates s and returns the Rule Requests to this store
	// carry. Errors wrap ErrInvalidLimit or ErrUnsupportedAlgorithm.
	Prepare(s LimitSet) (*Rule, error)
	// Take applies req and returns the decision. An error means no
	// decision could be made (the store is unreachable, the cost is out of
	// range, the rule is foreign); the Decision is then the zero value. A
	// rule that limits nothing is allowed (DecidedBy KindNone).
	Take(ctx context.Context, req Request) (Decision, error)
	// ResetQuota deletes the quota counter of (consumer, scope) at epoch
	// (see Request.QuotaEpoch), so the next request of that epoch starts a
	// new period; a store that keeps one period per key (core/memory)
	// deletes whichever it holds. Counters of other epochs are left to
	// expire.
	ResetQuota(ctx context.Context, consumer, scope string, epoch uint64) error
	// Penalize holds back req's rate limit: afterwards no request of cost 1
	// under req.Rule passes for (req.Consumer, req.Rule.Scope()) before d
	// has elapsed; later ones flow at the rule's rate again. Outbound
	// clients call it when a third party answers 429 with Retry-After, so
	// every caller sharing the store backs off together. req.Cost and
	// req.MaxDelay are ignored. A rule without an enforced GCRA rate limit
	// is left alone (nil); d ≤ 0 does nothing.
	Penalize(ctx context.Context, req Request, d time.Duration) error
}

// Clock is a monotonic clock. Nanotime returns nanoseconds since an
// arbitrary fixed origin; it never goes backwards. Tests freeze and step it
// (see ManualClock).
type Clock interface {
	Nanotime() int64
}

// Seeder is implemented by stores that can carry on from another store's
// counters: core/memory, as the fallback of the Redis store
// (redisstore.Options.Seed), so that a spent quota stays spent while Redis
// is down. The other store prepares its own rules on the seeder too (the
// seeder's Prepare), and Seed(req, d) records d, the decision it made a
// moment ago for req (whose Rule is the seeder's), as the state of req's
// key: for a GCRA rate limit the theoretical arrival time now +
// d.Rate.ResetAfter, for a quota d.Quota.Limit − d.Quota.Remaining units
// used in a period that ends d.Quota.ResetAfter from now, with
// req.QuotaEpoch. State is never moved back: a seeder that holds a later
// TAT or a higher count of the same period keeps it. Seed reports nothing
// and must not block: it runs on the other store's decision path, once per
// decision, and does what it can (a bounded store at its cap skips a new
// key).
type Seeder interface {
	Prepare(s LimitSet) (*Rule, error)
	Seed(req Request, d Decision)
}
