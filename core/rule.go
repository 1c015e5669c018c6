package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LimitSet is what one request is checked against: a rate limit, a quota,
// and the scope that names their counters. It is the input of
// Store.Prepare; the Engine builds one per policy (or pair of policies) and
// per consumer's per-API Limits.
type LimitSet struct {
	// Rate is the rate limit; the zero Limit (absent) or Unlimited skips
	// it (see Limit.Enforced).
	Rate Limit
	// Quota is the quota; the zero Quota (absent) or Unlimited skips it
	// (see Quota.Enforced).
	Quota Quota
	// Scope separates counters of one consumer, e.g. per API ("" for
	// key-wide counters, the counters policies share).
	Scope string
	// Distributed asks a store that splits limits across processes
	// (core/drl) to decide the rate limit against this process's share of
	// it (Policy.Distributed). Other stores ignore it.
	Distributed bool
	// InFlight caps the requests of one consumer (on Scope's counters) in
	// flight at once: a request is admitted only if fewer are held, and
	// holds a slot (Decision.Hold) until the caller releases it. 0 means
	// no in-flight limit; negative is refused. A slot is taken only when
	// the rate limit and the quota also allow the request.
	InFlight int64
	// Settle makes the quota's charge an estimate settled after the
	// response: an admitted request's Decision.Hold remembers the quota
	// period it charged and the cost, and Hold.Settle(actual) charges or
	// refunds the difference there (never below zero, never in another
	// period). Without a quota it does nothing. The rate limit keeps the
	// estimate. Stores that cannot settle keep the estimate (no Hold).
	Settle bool
}

// Validate reports why s's rate limit or quota cannot be enforced, wrapping
// ErrInvalidLimit, or nil.
func (s LimitSet) Validate() error {
	if err := s.Rate.Validate(); err != nil {
		return fmt.Errorf("rate: %w", err)
	}
	if err := s.Quota.Validate(); err != nil {
		return fmt.Errorf("quota: %w", err)
	}
	if s.InFlight < 0 || s.InFlight > MaxCount {
		return fmt.Errorf("in_flight: %w: %d must be in [0, 2^53) (0: none)", ErrInvalidLimit, s.InFlight)
	}
	return nil
}

// Rule is a LimitSet bound to one store: validated once by Store.Prepare,
// with what the store needs per request computed once (the GCRA constants,
// a store's own compiled form in Data). A Rule is immutable and safe for
// concurrent use; Requests point to it, as x/time/rate's Limiter holds its
// limit and envoy ratelimit's RateLimit is built once per configuration.
//
// A Rule is only meaningful to the store that prepared it (and to the
// stores that store wraps). A store refuses a nil Rule, and a Rule another
// kind of store prepared, with ErrForeignRule; core/memory also refuses a
// Rule another memory.Store prepared (its interval tags are per store),
// while the Redis stores of one process accept each other's (their rules
// hold no per-store state). The accessors of a nil *Rule return zero
// values, so a wrapper may read them before the store answers.
//
// Kinds of limit are kinds of Rule: a store that learns a new kind (a
// lease, an in-flight cap, a cost settled after the response) recognises
// it in Prepare, compiles it into its Data, and answers it in Take; no new
// Store method or optional interface is needed (DESIGN.md, "Prepared
// rules").
type Rule struct {
	set   LimitSet
	gcra  GCRAParams // valid when rate is set
	rate  bool       // set.Rate.Enforced()
	quota bool       // set.Quota.Enforced()
	data  any
}

// ErrForeignRule is returned by a store handed a nil Rule or one another
// kind of store prepared.
var ErrForeignRule = errors.New("rule not prepared by this store")

// NewRule validates s and returns its Rule with data, a store's own compiled
// form of it (nil for none). Stores call it from Prepare; errors wrap
// ErrInvalidLimit.
func NewRule(s LimitSet, data any) (*Rule, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	r := &Rule{set: s, rate: s.Rate.Enforced(), quota: s.Quota.Enforced(), data: data}
	if r.rate {
		r.gcra = s.Rate.GCRA()
	}
	return r, nil
}

// Limits returns the LimitSet r was prepared from.
func (r *Rule) Limits() LimitSet {
	if r == nil {
		return LimitSet{}
	}
	return r.set
}

// Rate returns the rule's rate limit.
func (r *Rule) Rate() Limit { return r.Limits().Rate }

// Quota returns the rule's quota.
func (r *Rule) Quota() Quota { return r.Limits().Quota }

// Scope returns the scope of the rule's counters.
func (r *Rule) Scope() string {
	if r == nil {
		return ""
	}
	return r.set.Scope
}

// Distributed reports LimitSet.Distributed.
func (r *Rule) Distributed() bool { return r != nil && r.set.Distributed }

// RateEnforced reports whether the rule has a rate limit to count (set and
// not Unlimited).
func (r *Rule) RateEnforced() bool { return r != nil && r.rate }

// QuotaEnforced reports whether the rule has a quota to count.
func (r *Rule) QuotaEnforced() bool { return r != nil && r.quota }

// InFlight returns the rule's in-flight cap (LimitSet.InFlight); 0: none.
func (r *Rule) InFlight() int64 { return r.Limits().InFlight }

// Enforced reports whether the rule limits anything: a request under a rule
// that does not is allowed without asking a store.
func (r *Rule) Enforced() bool { return r != nil && (r.rate || r.quota || r.set.InFlight > 0) }

// GCRA returns the rate limit's GCRA constants, computed once by NewRule;
// the zero GCRAParams when the rate limit is not enforced. For a window
// algorithm they are the constants of the same Limit read as GCRA.
func (r *Rule) GCRA() GCRAParams {
	if r == nil {
		return GCRAParams{}
	}
	return r.gcra
}

// Data returns the store's compiled form given to NewRule.
func (r *Rule) Data() any {
	if r == nil {
		return nil
	}
	return r.data
}

// Call is a Request spelled out with its limits, for callers that ask a
// store once per limit set (tests, tools, one-off outbound calls): TakeCall
// prepares its rule and takes it. Callers that ask many times prepare once
// and reuse the Rule. The fields mean what LimitSet's and Request's do.
type Call struct {
	Consumer    string
	Scope       string
	Rate        Limit
	Quota       Quota
	Distributed bool
	InFlight    int64
	Settle      bool
	QuotaEpoch  uint64
	Cost        int64
	MaxDelay    time.Duration
}

// Limits returns c's LimitSet.
func (c Call) Limits() LimitSet {
	return LimitSet{Rate: c.Rate, Quota: c.Quota, Scope: c.Scope, Distributed: c.Distributed, InFlight: c.InFlight, Settle: c.Settle}
}

// Request returns c as a Request under rule.
func (c Call) Request(rule *Rule) Request {
	return Request{Consumer: c.Consumer, Rule: rule, Cost: c.Cost, QuotaEpoch: c.QuotaEpoch, MaxDelay: c.MaxDelay}
}

// TakeCall prepares c's limits on s and takes c: Prepare's error, else
// Take's. It costs a Prepare (a validation and an allocation) per call.
func TakeCall(ctx context.Context, s Store, c Call) (Decision, error) {
	r, err := s.Prepare(c.Limits())
	if err != nil {
		return Decision{}, err
	}
	return s.Take(ctx, c.Request(r))
}
