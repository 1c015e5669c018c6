// Package twoatomic is a peer for comparison, not a limiter to use.
//
// It re-implements, from its published description (the seed article on
// Tyk's lock-free token bucket; no code was copied), the "two-atomic lazy
// refill" token bucket: the token count and the time of the last refill are
// two separate atomic words, tokens are added on demand from the time
// elapsed since the last refill (whole tokens only), and a token is taken
// with a compare-and-swap loop.
//
// It races by design. The refill reads the last-refill time, adds tokens
// with one CAS and stores the new time with a separate write, so two
// goroutines that read the same last-refill time can both add the tokens
// earned since then: the bucket can admit more than burst + rate × elapsed.
// It also drops the fraction of a token earned since the last whole one at
// each refill, which admits less than the rate under steady load. The
// benchmarks module measures both effects next to limitplane's GCRA, which
// keeps one atomic word per limiter and has neither.
package twoatomic

import (
	"sync/atomic"
	"time"
)

// Bucket is the two-atomic token bucket. Create it with New; it is safe for
// concurrent use (in the sense that it never crashes; see the package
// comment for what it does not guarantee).
type Bucket struct {
	tokens   atomic.Int64 // tokens left
	refilled atomic.Int64 // clock reading (ns) of the last refill
	perSec   int64        // tokens added per second
	capacity int64        // most tokens held
	now      func() int64 // ns on any clock that only goes forward
}

// WallNanos is the clock the article uses: time.Now().UnixNano().
func WallNanos() int64 { return time.Now().UnixNano() }

// New returns a full bucket of capacity tokens refilled at perSecond
// tokens a second, reading time from now (WallNanos when nil).
func New(perSecond, capacity int64, now func() int64) *Bucket {
	if now == nil {
		now = WallNanos
	}
	b := &Bucket{perSec: perSecond, capacity: capacity, now: now}
	b.tokens.Store(capacity)
	b.refilled.Store(now())
	return b
}

// Allow takes one token if there is one.
func (b *Bucket) Allow() bool {
	t := b.now()
	return b.refill(t, b.earned(t)) || b.take()
}

// earned returns the whole tokens earned between the last refill and t.
func (b *Bucket) earned(t int64) int64 {
	return (t - b.refilled.Load()) * b.perSec / int64(time.Second)
}

// refill adds earned tokens and takes one of them, in one CAS on the count,
// then records t as the refill time in a second, separate write. Between
// earned's read and that write, another goroutine can compute the same
// tokens from the same refill time and add them again.
func (b *Bucket) refill(t, earned int64) bool {
	if earned <= 0 {
		return false
	}
	have := b.tokens.Load()
	if !b.tokens.CompareAndSwap(have, min(have+earned, b.capacity)-1) {
		return false
	}
	b.refilled.Store(t)
	return true
}

// take removes one token if the count is positive.
func (b *Bucket) take() bool {
	for {
		have := b.tokens.Load()
		if have <= 0 {
			return false
		}
		if b.tokens.CompareAndSwap(have, have-1) {
			return true
		}
	}
}
