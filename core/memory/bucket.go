package memory

import (
	"sync/atomic"

	"github.com/limitplane/limitplane/core"
)

// Bucket is a single GCRA limiter with no key lookup: one atomic TAT updated
// by a CAS loop. Use it to guard one resource (an outbound API, a job
// queue) in one process. It is safe for concurrent use; the zero value is
// not usable, create it with NewBucket.
type Bucket struct {
	tat   atomic.Int64
	p     core.GCRAParams
	clock clock
}

// NewBucket returns a Bucket enforcing l (which must be a limited GCRA
// Limit) with clock (core.NewSystemClock() when nil).
func NewBucket(l core.Limit, clock core.Clock) (*Bucket, error) {
	if !l.Enforced() || l.Algorithm != core.GCRA {
		return nil, core.ErrUnsupportedAlgorithm
	}
	p, err := l.CheckedGCRA()
	if err != nil {
		return nil, err
	}
	return &Bucket{p: p, clock: newClock(clock)}, nil
}

// Allow reports whether one event may happen now, and records it if so.
func (b *Bucket) Allow() bool {
	var now int64 // b.clock.now(), inlined by hand
	switch c := &b.clock; {
	case c.coarse != nil:
		now = c.coarse.Nanotime()
	case c.isSystem:
		now = c.system.Nanotime()
	default:
		now = c.any.Nanotime()
	}
	return b.AllowN(now, 1)
}

// AllowN reports whether n events may happen at now (ns on the bucket's
// clock), and records them if so. n > burst is never allowed, nor is n < 0
// (which would give units back); n == 0 only asks. It computes no Remaining
// or durations (see TakeN), which keeps it to a load, a few compares and,
// when allowed with n > 0, one CAS.
func (b *Bucket) AllowN(now, n int64) bool {
	if n < 0 {
		return false
	}
	for {
		tat := b.tat.Load()
		next, ok := b.p.Conform(tat, now, n)
		if !ok || n == 0 || b.tat.CompareAndSwap(tat, next) {
			return ok
		}
	}
}

// TakeN is AllowN returning the full GCRA result (remaining, reset and
// retry times in ns). For n < 0 it changes nothing and returns the state
// with Allowed false and RetryAfter −1.
func (b *Bucket) TakeN(now, n int64) core.GCRAResult {
	if n < 0 {
		r := b.p.Step(b.tat.Load(), now, 0)
		r.Allowed, r.RetryAfter = false, -1
		return r
	}
	for {
		tat := b.tat.Load()
		r := b.p.Step(tat, now, n)
		if !r.Store || b.tat.CompareAndSwap(tat, r.TAT) {
			return r
		}
	}
}
