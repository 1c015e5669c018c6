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
	if l.Rate > 0 && l.Period > 0 && l.Burst >= 0 && l.Algorithm <= SlidingLog {
		t := int64(l.Period) / l.Rate
		b := l.EffectiveBurst()
		if hi, lo := bits.Mul64(uint64(b), uint64(t)); t > 0 && hi == 0 && lo <= uint64(maxTolerance) {
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
}

// Conform is GCRA's verdict alone, for callers that need neither Remaining
// nor any duration (computing those costs a division): for a request of cost
// n ≥ 0 at time now against stored TAT tat, it reports whether the request
// conforms and, if so, the TAT to store when n > 0. It agrees with Step:
// ok == Step(tat, now, n).Allowed, and when ok, next == Step(tat, now, n).TAT.
func (p GCRAParams) Conform(tat, now, n int64) (next int64, ok bool) {
	if tat < now {
		tat = now
	}
	if n > p.Burst {
		return tat, false
	}
	next = tat + n*p.T
	return next, next-now <= p.Tau
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
func (p GCRAParams) Step(tat, now, n int64) GCRAResult {
	if tat < now {
		tat = now
	}
	if n > p.Burst {
		return p.result(false, false, tat, now, -1)
	}
	next := tat + n*p.T
	if next-now > p.Tau {
		return p.result(false, false, tat, now, next-p.Tau-now)
	}
	return p.result(true, n > 0, next, now, 0)
}

func (p GCRAParams) result(allowed, store bool, tat, now, retry int64) GCRAResult {
	reset := tat - now
	rem := (p.Tau - reset) / p.T
	if rem < 0 {
		rem = 0
	}
	return GCRAResult{Allowed: allowed, Store: store, TAT: tat, Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}
