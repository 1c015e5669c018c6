package drlharness

import (
	"math"
	"slices"
	"time"
)

// windowStep is the slide between two 1 s windows.
const windowStep = 10 * time.Millisecond

// admissions are the admitted requests of a run, each with the interval
// [sent, recv] inside which the gateway admitted it.
type admissions struct {
	sent, recv []int64 // both sorted ascending (separately)
	// long holds the intervals of requests that took longer than a
	// window: they are counted by scanning.
	long [][2]int64
}

func newAdmissions(recs []record, window time.Duration) *admissions {
	a := &admissions{}
	for _, r := range recs {
		if r.status != 200 {
			continue
		}
		a.sent = append(a.sent, r.sent)
		a.recv = append(a.recv, r.recv)
		if r.recv-r.sent >= int64(window) {
			a.long = append(a.long, [2]int64{r.sent, r.recv})
		}
	}
	slices.Sort(a.sent)
	slices.Sort(a.recv)
	return a
}

// within counts the admissions certainly inside [s, e): those sent at or
// after s and answered before e. The gateway admitted each between its
// send and its answer, so this never counts one that was outside; it is a
// lower bound on the true count that misses only requests straddling an
// edge (on loopback, sub-millisecond ones).
func (a *admissions) within(s, e int64) int {
	// #(recv < e) − #(sent < s ∧ recv < e); the second term is
	// #(sent < s) − #(sent < s ∧ recv ≥ e).
	n := lowerBound(a.recv, e) - lowerBound(a.sent, s)
	for _, l := range a.long {
		if l[0] < s && l[1] >= e {
			n++
		}
	}
	return n
}

// lowerBound is the number of values in sorted xs below v.
func lowerBound(xs []int64, v int64) int {
	i, _ := slices.BinarySearch(xs, v)
	return i
}

// worstWindow returns the most admissions certainly inside any window of
// length w starting at a multiple of windowStep in [0, end−w], and the
// start of the first window with that count.
func (a *admissions) worstWindow(w, end time.Duration) (int, time.Duration) {
	best, at := 0, time.Duration(0)
	for s := time.Duration(0); s+w <= end; s += windowStep {
		if n := a.within(int64(s), int64(s+w)); n > best {
			best, at = n, s
		}
	}
	return best, at
}

// reachedFrom returns how long after from the admitted rate reached frac
// × limit for a whole window: the start of the first window of length w,
// starting at or after from (in windowStep steps), that admits at least
// frac × limit × w, minus from. It returns −1 if no such window ends by
// end.
func (a *admissions) reachedFrom(from, end, w time.Duration, limit, frac float64) time.Duration {
	need := int(math.Ceil(frac*limit*w.Seconds() - 1e-9))
	for s := from; s+w <= end; s += windowStep {
		if a.within(int64(s), int64(s+w)) >= need {
			return s - from
		}
	}
	return -1
}
