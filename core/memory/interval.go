package memory

import (
	"math/bits"
	"sync"

	"github.com/limitplane/limitplane/core"
)

// maxIntervals bounds the emission intervals a Store tags (see intervals):
// 65,536 distinct intervals, far more than a configuration has rate limits.
// A rule prepared once they are all taken gets tag 0, unknown: its keys
// keep their TAT as it is when their limit changes (no carry-over).
const maxIntervals = 1 << 16

// intervals numbers the emission intervals (core.GCRAParams.T) of the rules
// a Store prepares. A slot stores its TAT in the units of one interval and
// names it by its tag (the high half of the slot's check word), so that a
// request under a rule of another interval, a changed limit, finds the tag
// different and has the key rescaled: the debt TAT − now, measured in
// emission intervals, carries over (see Store.Prepare). Tags are 1, 2, …
// in the order intervals are first prepared; 0 is "unknown". An interval
// keeps its tag for the store's life.
type intervals struct {
	mu  sync.Mutex
	tag map[int64]uint32
	ns  []int64 // ns[tag-1] is the interval of tag
}

// tagOf returns the tag of interval T (ns, > 0), numbering it if it is
// new; 0 once maxIntervals are numbered.
func (iv *intervals) tagOf(T int64) uint32 {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if tag, ok := iv.tag[T]; ok {
		return tag
	}
	if len(iv.ns) >= maxIntervals {
		return 0
	}
	if iv.tag == nil {
		iv.tag = make(map[int64]uint32)
	}
	iv.ns = append(iv.ns, T)
	tag := uint32(len(iv.ns))
	iv.tag[T] = tag
	return tag
}

// interval returns the interval of tag, 0 for tag 0 (unknown).
func (iv *intervals) interval(tag uint32) int64 {
	if tag == 0 {
		return 0
	}
	iv.mu.Lock()
	defer iv.mu.Unlock()
	return iv.ns[tag-1]
}

// maxDebt bounds a rescaled debt TAT − now, in ns: τ plus the longest
// reservation, as for any TAT a request can store, far from overflowing a
// clock reading.
const maxDebt = uint64(core.MaxTolerance) + uint64(core.MaxReservation)

// rescale converts a TAT stored in units of emission interval from to the
// units of interval to, at now: a debt d = tat − now > 0 becomes
// ⌈d × to / from⌉ (the same number of emission intervals, rounded up, at
// most maxDebt), so a key that spent k of its burst has spent k of the new
// one. A TAT that has passed (no debt) is the same state under every
// limit and is returned as it is; so is every TAT when an interval is
// unknown (0) or the two are equal.
func rescale(tat, now, from, to int64) int64 {
	if tat <= now || from <= 0 || to <= 0 || from == to {
		return tat
	}
	return now + int64(scaleDebt(uint64(tat-now), from, to))
}

// scaleDebt returns ⌈d × to / from⌉, at most maxDebt, in 128-bit integer
// arithmetic (d × to overflows 64 bits for long debts of long intervals).
// from and to are > 0.
func scaleDebt(d uint64, from, to int64) uint64 {
	hi, lo := bits.Mul64(d, uint64(to))
	if hi >= uint64(from) {
		return maxDebt // the quotient would not fit in 64 bits
	}
	q, r := bits.Div64(hi, lo, uint64(from))
	if r != 0 {
		q++
	}
	return min(q, maxDebt)
}
