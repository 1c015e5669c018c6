package core

import (
	"fmt"
	"math/bits"
)

// GCRAParams are a Limit's GCRA constants in nanoseconds, computed once with
// Limit.GCRA so the per-request path does no division.
type GCRAParams struct {
	// T is the emission interval Period/Rate, in ns.
	T int64
	// Tau is the burst tolerance Burst×T, in ns.
	Tau int64
	// Burst is the largest cost that can ever pass.
	Burst int64
}

// GCRA returns l's GCRA constants. l must be valid and limited.
func (l Limit) GCRA() GCRAParams {
	t := int64(l.Period) / l.Rate
	b := l.EffectiveBurst()
	return GCRAParams{T: t, Tau: b * t, Burst: b}
}

// CheckedGCRA validates l (see Validate) and returns its GCRA constants,
// dividing only once: the fast path for stores handed arbitrary Requests.
// l must not be zero or Unlimited.
func (l Limit) CheckedGCRA() (GCRAParams, error) {
	// Rate in [1, MaxCount] and Burst in [0, MaxCount], one comparison each.
	if uint64(l.Rate-1) < MaxCount && l.Period > 0 && uint64(l.Burst) <= MaxCount && l.Algorithm <= SlidingLog {
		t := int64(l.Period) / l.Rate
		b := l.EffectiveBurst()
		if hi, lo := bits.Mul64(uint64(b), uint64(t)); t > 0 && hi == 0 && lo <= uint64(MaxTolerance) {
			return GCRAParams{T: t, Tau: int64(lo), Burst: b}, nil
		}
	}
	if err := l.Validate(); err != nil {
		return GCRAParams{}, err
	}
	return GCRAParams{}, fmt.Errorf("%w: %+v", ErrInvalidLimit, l)
}

// GCRAResult is the outcome of one GCRA step. Durations are nanoseconds.
type GCRAResult struct {
	// Allowed reports whether the request conforms.
	Allowed bool
	// Store reports whether TAT must be written back (allowed with n > 0).
	Store bool
	// TAT is the theoretical arrival time after the call: the value to
	// store when Store is true, otherwise the unchanged effective TAT.
	TAT int64
	// Remaining is how many unit-cost requests would pass right after this
	// call, floor((τ − (TAT − now)) / T), never below 0.
	Remaining int64
	// ResetAfter is TAT − now: the time until the bucket is full again.
	ResetAfter int64
	// RetryAfter is 0 when allowed, the time until the same request would
	// pass when denied, and -1 when the cost exceeds the burst and the
	// request can never pass.
	RetryAfter int64
	// Delay is, for a request admitted by reservation (Reserve), how long
	// from now until it conforms: the caller must wait that long before
	// acting. It is 0 for a request that conforms now.
	Delay int64
}

// Conform is GCRA's verdict alone, for callers that need no Remaining or
// durations: for a request of cost n ≥ 0 at time now against stored TAT tat,
// next is max(tat, now) + n×T, the TAT to store if the request is admitted,
// and ok reports whether it conforms: n ≤ Burst and next − now ≤ τ. (When
// n > Burst, next may have wrapped and means nothing.) Step is built from
// Conform, Remaining and RetryAfter, and stores with a hot path use the
// three directly, which keeps every value in a register.
func (p GCRAParams) Conform(tat, now, n int64) (next int64, ok bool) {
	next = max(tat, now) + n*p.T
	return next, n <= p.Burst && next-now <= p.Tau
}

// ConformWithin is Conform for a reservation: the request is admitted when
// it will conform within maxDelay ns, next − now ≤ τ + maxDelay. It must
// then wait RetryAfter(tat, now, n) before acting. maxDelay must be in
// [0, 2^61]; Request.Validate clamps it.
func (p GCRAParams) ConformWithin(tat, now, n, maxDelay int64) (next int64, ok bool) {
	next = max(tat, now) + n*p.T
	return next, n <= p.Burst && next-now <= p.Tau+maxDelay
}

// Remaining returns how many unit-cost requests would conform at now with
// stored TAT tat: floor((τ − (max(tat, now) − now)) / T), never below 0.
func (p GCRAParams) Remaining(tat, now int64) int64 {
	return max((p.Tau-(max(tat, now)-now))/p.T, 0)
}

// RetryAfter returns how long from now until a request of cost n would
// conform with stored TAT tat: 0 if it conforms now, -1 if it never can
// (n > Burst).
func (p GCRAParams) RetryAfter(tat, now, n int64) int64 {
	if n > p.Burst {
		return -1
	}
	return max(max(tat, now)+n*p.T-p.Tau-now, 0)
}

// Step applies the Generic Cell Rate Algorithm (ITU-T I.371; the "virtual
// scheduling" form) to a request of cost n ≥ 0 at time now, given the stored
// theoretical arrival time tat (0 or any value < now means "no entry"). It is
// a pure function: the caller stores TAT when Store is true.
//
//	new = max(tat, now) + n×T; allowed iff new − now ≤ τ
//
// n == 0 peeks without changing state; n > Burst is denied with
// RetryAfter = -1. Every store's results must equal Step's.
func (p GCRAParams) Step(tat, now, n int64) GCRAResult { return p.Reserve(tat, now, n, 0) }

// Reserve is Step for a request that may wait up to maxDelay ns (see
// Request.MaxDelay): it is admitted, and its units taken, if it will
// conform within maxDelay, and Delay says when. This is GCRA scheduling
// ahead, as golang.org/x/time/rate's Reserve does for a token bucket, and it
// lets callers that share one store be served at exactly the limit's pace.
// Remaining and ResetAfter are computed as by Step; RetryAfter is 0 when
// admitted, else the time until the request conforms without waiting.
func (p GCRAParams) Reserve(tat, now, n, maxDelay int64) GCRAResult {
	next, ok := p.ConformWithin(tat, now, n, maxDelay)
	r := GCRAResult{Allowed: ok, Store: ok && n > 0, RetryAfter: p.RetryAfter(tat, now, n)}
	if ok {
		r.Delay, r.RetryAfter = r.RetryAfter, 0
	} else {
		next = max(tat, now)
	}
	r.TAT, r.Remaining, r.ResetAfter = next, p.Remaining(next, now), next-now
	return r
}
