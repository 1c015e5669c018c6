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
	clock core.Clock
}

// NewBucket returns a Bucket enforcing l (which must be a limited GCRA
// Limit) with clock (core.NewSystemClock() when nil).
func NewBucket(l core.Limit, clock core.Clock) (*Bucket, error) {
	if l.IsUnlimited() || l.Algorithm != core.GCRA {
		return nil, core.ErrUnsupportedAlgorithm
	}
	p, err := l.CheckedGCRA()
	if err != nil {
		return nil, err
	}
	if clock == nil {
		clock = core.NewSystemClock()
	}
	return &Bucket{p: p, clock: clock}, nil
}

// Allow reports whether one event may happen now, and records it if so.
func (b *Bucket) Allow() bool { return b.AllowN(b.clock.Nanotime(), 1) }

// AllowN reports whether n events may happen at now (ns on the bucket's
// clock), and records them if so. n > burst is never allowed.
func (b *Bucket) AllowN(now, n int64) bool { return b.TakeN(now, n).Allowed }

// TakeN is AllowN returning the full GCRA result (remaining, reset and
// retry times in ns).
func (b *Bucket) TakeN(now, n int64) core.GCRAResult {
	for {
		tat := b.tat.Load()
		r := b.p.Step(tat, now, n)
		if !r.Store || b.tat.CompareAndSwap(tat, r.TAT) {
			return r
		}
	}
}
