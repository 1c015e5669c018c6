package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// Vectors for the window algorithms. Their semantics, which every store
// listing them in Suite.Algorithms must follow:
//
//   - They count up to Rate units per Period and ignore Burst. The rate
//     Status has Limit = Rate and Window = Period; ResetAfter is the time
//     until Remaining is back to Rate (0 with no state); a cost above Rate
//     is denied with RetryAfter −1; cost 0 peeks; a denied request changes
//     no state.
//   - FixedWindow: a window of Period opens at the first request when none
//     is open (not on a calendar boundary, like a quota), and allows Rate
//     units; a denied request's RetryAfter is the time until the window
//     closes. (At most 2×Rate pass across a boundary, as documented.)
//   - SlidingWindow: windows of Period follow each other from the first
//     request; when a request comes two or more Periods after the current
//     window's start, a fresh chain starts at it. With c units in the
//     current window (started s ago… e = now − s) and p in the previous
//     one, a cost n passes iff p×(Period−e)/Period + c + n ≤ Rate, exactly
//     (rationals, no rounding). Remaining = Rate − c − ceil(p×(Period−e)/
//     Period); RetryAfter is the first instant at which the same request
//     would pass; ResetAfter runs to the end of the window after the
//     current one when c > 0, else to the end of the current one when
//     p > 0.
//   - SlidingLog: exact, as if one timestamp were kept per admitted unit
//     (a store may keep one per request with its cost); the live ones are
//     those in (now − Period, now]; RetryAfter is when enough of them have
//     left.
//
// The vectors step the clock in whole microseconds (and Periods are whole
// microseconds), so a store computing in µs passes.

// windowLimit is a window Limit of rate per period.
func windowLimit(a core.Algorithm, rate int64, period time.Duration) core.Limit {
	return core.Limit{Rate: rate, Period: period, Algorithm: a}
}

// expectWin checks a window decision decided by the rate limit.
func expectWin(t *testing.T, step string, d core.Decision, l core.Limit, allowed bool, remaining int64, reset, retry time.Duration) {
	t.Helper()
	want := core.Status{Limit: l.Rate, Remaining: remaining, ResetAfter: reset, Window: l.Period}
	if d.Allowed != allowed || d.Rate != want || d.RetryAfter != retry || d.DecidedBy != core.KindRate {
		t.Fatalf("%s: got allowed=%v rate=%+v retry=%v by=%v; want allowed=%v rate=%+v retry=%v by=rate",
			step, d.Allowed, d.Rate, d.RetryAfter, d.DecidedBy, allowed, want, retry)
	}
	if d.Limit != want.Limit || d.Remaining != want.Remaining || d.ResetAfter != want.ResetAfter {
		t.Fatalf("%s: top-level fields %d/%d/%v differ from rate status %+v", step, d.Limit, d.Remaining, d.ResetAfter, want)
	}
}

// runWindowCommon holds the vectors every window algorithm shares.
func runWindowCommon(t *testing.T, s Suite, a core.Algorithm) {
	l := windowLimit(a, 10, time.Minute)

	t.Run("PeekEmpty", func(t *testing.T) {
		e := newEnv(t, s)
		expectWin(t, "peek", e.take(core.Call{Rate: l, Cost: 0}), l, true, 10, 0, 0)
		expectWin(t, "peek again", e.take(core.Call{Rate: l, Cost: 0}), l, true, 10, 0, 0)
	})

	t.Run("CostExceedsRate", func(t *testing.T) {
		e := newEnv(t, s)
		expectWin(t, "cost 11", e.take(core.Call{Rate: l, Cost: 11}), l, false, 10, 0, -1)
		d := e.take(core.Call{Rate: l, Cost: 10})
		check(t, "full rate still there", d.Allowed, true)
		check(t, "remaining", d.Remaining, int64(0))
	})

	t.Run("DeniedChangesNoState", func(t *testing.T) {
		e := newEnv(t, s)
		first := e.take(core.Call{Rate: l, Cost: 10})
		check(t, "burst allowed", first.Allowed, true)
		d := e.take(core.Call{Rate: l, Cost: 1})
		check(t, "denied", d.Allowed, false)
		for i := 0; i < 20; i++ {
			again := e.take(core.Call{Rate: l, Cost: 1})
			if again != d {
				t.Fatalf("retry %d: %+v, want the same decision %+v", i, again, d)
			}
		}
		e.clock.Advance(d.RetryAfter - s.Granularity)
		check(t, "one granule before retry-after", e.take(core.Call{Rate: l, Cost: 1}).Allowed, false)
		e.clock.Advance(s.Granularity)
		check(t, "at retry-after", e.take(core.Call{Rate: l, Cost: 1}).Allowed, true)
	})

	t.Run("QuotaSpentOnlyWhenRateAllows", func(t *testing.T) {
		e := newEnv(t, s)
		l := windowLimit(a, 2, time.Second)
		q := core.Quota{Max: 5, Renewal: time.Hour}
		for i := 0; i < 10; i++ {
			e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		}
		d := e.take(core.Call{Rate: l, Quota: q, Cost: 0})
		check(t, "quota remaining after 2 allowed of 10", d.Quota.Remaining, int64(3))
		check(t, "rate remaining", d.Rate.Remaining, int64(0))
		e.clock.Advance(time.Hour / 2)
		for i := 0; i < 10; i++ {
			e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		}
		e.clock.Advance(2 * time.Second)
		check(t, "5th unit", e.take(core.Call{Rate: l, Quota: q, Cost: 1}).Allowed, true)
		d = e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		check(t, "quota denial", d.DecidedBy, core.KindQuota)
		check(t, "quota retry", d.RetryAfter, time.Hour/2-2*time.Second)
		check(t, "rate untouched by quota denial", d.Rate.Remaining, int64(1))
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		e := newEnv(t, s)
		for _, id := range []string{e.id, e.id + "{x}", e.id + ":sw:", e.id + "\n"} {
			for _, scope := range []string{"", "a:b", "{a}"} {
				d := e.take(core.Call{Consumer: id, Scope: scope, Rate: l, Cost: 10})
				check(t, fmt.Sprintf("first burst of %q/%q", id, scope), d.Allowed, true)
			}
		}
	})

	t.Run("ConcurrentFrozenClock", func(t *testing.T) {
		e := newEnv(t, s)
		cl := windowLimit(a, 37, time.Minute)
		check(t, "admitted", hammer(t, e, s.Concurrency, 20, core.Call{Rate: cl, Cost: 1}), int64(37))
		d := e.take(core.Call{Rate: cl, Cost: 0})
		check(t, "remaining", d.Remaining, int64(0))
	})
}

func runFixedWindow(t *testing.T, s Suite) {
	runWindowCommon(t, s, core.FixedWindow)
	l := windowLimit(core.FixedWindow, 10, time.Minute)

	// core/limit.go and issue 3: 10 per 60 s, first request at t=5 s: the
	// 11th at t=50 s gets Retry-After 15 s.
	t.Run("OpensAtFirstRequest", func(t *testing.T) {
		e := newEnv(t, s)
		e.clock.Advance(5 * time.Second)
		for k := int64(1); k <= 10; k++ {
			at := 5*time.Second + time.Duration(k-1)*5*time.Second
			expectWin(t, fmt.Sprintf("request %d at %v", k, at), e.take(core.Call{Rate: l, Cost: 1}), l, true, 10-k, 65*time.Second-at, 0)
			if k < 10 {
				e.clock.Advance(5 * time.Second)
			}
		}
		expectWin(t, "11th at 50s", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 15*time.Second, 15*time.Second)
		e.clock.Advance(15*time.Second - s.Granularity)
		expectWin(t, "one granule before 65s", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, s.Granularity, s.Granularity)
		e.clock.Advance(s.Granularity)
		expectWin(t, "at 65s a new window opens", e.take(core.Call{Rate: l, Cost: 1}), l, true, 9, time.Minute, 0)
	})

	t.Run("BoundaryBurst", func(t *testing.T) {
		e := newEnv(t, s)
		expectWin(t, "1 at 0", e.take(core.Call{Rate: l, Cost: 1}), l, true, 9, time.Minute, 0)
		e.clock.Advance(time.Minute - time.Second)
		expectWin(t, "9 at 59s", e.take(core.Call{Rate: l, Cost: 9}), l, true, 0, time.Second, 0)
		e.clock.Advance(time.Second)
		expectWin(t, "10 at 60s", e.take(core.Call{Rate: l, Cost: 10}), l, true, 0, time.Minute, 0)
	})

	t.Run("IdleThenNewWindow", func(t *testing.T) {
		e := newEnv(t, s)
		e.take(core.Call{Rate: l, Cost: 4})
		e.clock.Advance(200*time.Second + 7*time.Millisecond)
		expectWin(t, "after idle", e.take(core.Call{Rate: l, Cost: 2}), l, true, 8, time.Minute, 0)
		e.clock.Advance(time.Second)
		expectWin(t, "peek", e.take(core.Call{Rate: l, Cost: 0}), l, true, 8, 59*time.Second, 0)
	})
}

func runSlidingWindow(t *testing.T, s Suite) {
	runWindowCommon(t, s, core.SlidingWindow)
	l := windowLimit(core.SlidingWindow, 10, time.Minute)

	t.Run("PreviousWindowWeighted", func(t *testing.T) {
		e := newEnv(t, s)
		for k := int64(1); k <= 10; k++ {
			expectWin(t, fmt.Sprintf("request %d", k), e.take(core.Call{Rate: l, Cost: 1}), l, true, 10-k, 2*time.Minute, 0)
		}
		// 11th: it passes once 10×(60s−e)/60s + 1 ≤ 10 in the next
		// window, i.e. e ≥ 6s: at 66s.
		expectWin(t, "11th", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 2*time.Minute, 66*time.Second)
		e.clock.Advance(66*time.Second - time.Microsecond)
		// previous weight ceil(10×(54s+1µs)/60s) = 10
		expectWin(t, "1µs early", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 54*time.Second+time.Microsecond, time.Microsecond)
		e.clock.Advance(time.Microsecond)
		// weight 9, current 1: remaining 0; full again 2 periods after 60s
		expectWin(t, "at 66s", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, 114*time.Second, 0)
		// next: 10×(60s−e)/60s + 2 ≤ 10 at e = 12s
		expectWin(t, "again", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 114*time.Second, 6*time.Second)
	})

	t.Run("FractionalWeight", func(t *testing.T) {
		e := newEnv(t, s)
		l := windowLimit(core.SlidingWindow, 3, time.Second)
		e.take(core.Call{Rate: l, Cost: 3})
		e.clock.Advance(1400 * time.Millisecond)
		// previous 3 weighted 0.6 = 1.8 → 2 units unavailable
		expectWin(t, "peek", e.take(core.Call{Rate: l, Cost: 0}), l, true, 1, 600*time.Millisecond, 0)
		// 1.8 + 1 ≤ 3 passes; remaining 3 − 1 − 2 = 0
		expectWin(t, "take", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, 1600*time.Millisecond, 0)
		// 3×(1s−e)/1s + 2 ≤ 3 from e = 666667µs: 266667µs from now
		expectWin(t, "denied", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 1600*time.Millisecond, 266667*time.Microsecond)
		e.clock.Advance(266666 * time.Microsecond)
		check(t, "1µs early", e.take(core.Call{Rate: l, Cost: 1}).Allowed, false)
		e.clock.Advance(time.Microsecond)
		check(t, "on time", e.take(core.Call{Rate: l, Cost: 1}).Allowed, true)
	})

	t.Run("TwoIdlePeriodsForget", func(t *testing.T) {
		e := newEnv(t, s)
		e.take(core.Call{Rate: l, Cost: 10})
		e.clock.Advance(2 * time.Minute)
		expectWin(t, "fresh", e.take(core.Call{Rate: l, Cost: 1}), l, true, 9, 2*time.Minute, 0)
	})
}

func runSlidingLog(t *testing.T, s Suite) {
	runWindowCommon(t, s, core.SlidingLog)
	l := windowLimit(core.SlidingLog, 3, time.Second)

	t.Run("ExactLog", func(t *testing.T) {
		e := newEnv(t, s)
		expectWin(t, "at 0", e.take(core.Call{Rate: l, Cost: 1}), l, true, 2, time.Second, 0)
		e.clock.Advance(200 * time.Millisecond)
		expectWin(t, "at 200ms", e.take(core.Call{Rate: l, Cost: 1}), l, true, 1, time.Second, 0)
		e.clock.Advance(300 * time.Millisecond)
		expectWin(t, "at 500ms", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, time.Second, 0)
		expectWin(t, "4th waits for the 0ms entry", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, time.Second, 500*time.Millisecond)
		expectWin(t, "cost 2 waits for the 200ms entry", e.take(core.Call{Rate: l, Cost: 2}), l, false, 0, time.Second, 700*time.Millisecond)
		e.clock.Advance(500*time.Millisecond - time.Microsecond)
		expectWin(t, "1µs early", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, 500*time.Millisecond+time.Microsecond, time.Microsecond)
		e.clock.Advance(time.Microsecond)
		expectWin(t, "at 1s", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, time.Second, 0)
		e.clock.Advance(time.Second)
		expectWin(t, "all expired", e.take(core.Call{Rate: l, Cost: 0}), l, true, 3, 0, 0)
	})

	// CostlyRequests: requests of several units are logged as their
	// units: the oldest request's units all leave together, and a retry
	// waits for the request whose leaving makes room.
	t.Run("CostlyRequests", func(t *testing.T) {
		e := newEnv(t, s)
		l := windowLimit(core.SlidingLog, 10, time.Second)
		expectWin(t, "3 at 0", e.take(core.Call{Rate: l, Cost: 3}), l, true, 7, time.Second, 0)
		e.clock.Advance(100 * time.Millisecond)
		expectWin(t, "4 at 100ms", e.take(core.Call{Rate: l, Cost: 4}), l, true, 3, time.Second, 0)
		e.clock.Advance(100 * time.Millisecond)
		expectWin(t, "2 at 200ms", e.take(core.Call{Rate: l, Cost: 2}), l, true, 1, time.Second, 0)
		expectWin(t, "3 waits for the 0ms request", e.take(core.Call{Rate: l, Cost: 3}), l, false, 1, time.Second, 800*time.Millisecond)
		expectWin(t, "5 waits for the 100ms request", e.take(core.Call{Rate: l, Cost: 5}), l, false, 1, time.Second, 900*time.Millisecond)
		expectWin(t, "10 waits for all", e.take(core.Call{Rate: l, Cost: 10}), l, false, 1, time.Second, time.Second)
		e.clock.Advance(800 * time.Millisecond)
		expectWin(t, "3 at 1s", e.take(core.Call{Rate: l, Cost: 3}), l, true, 1, time.Second, 0)
		e.clock.Advance(900 * time.Millisecond)
		expectWin(t, "peek at 1.9s", e.take(core.Call{Rate: l, Cost: 0}), l, true, 7, 100*time.Millisecond, 0)
	})

	// AtMaxCount: a log of Rate 2^53 − 1 admits whole costs exactly across
	// periods, whatever a store's running totals do past 2^53.
	t.Run("AtMaxCount", func(t *testing.T) {
		e := newEnv(t, s)
		const r = core.MaxCount
		// T = Period / Rate must be at least 1 ns: a Period of 10^16 ns
		// (about 116 days), stepped in tenths.
		const p = time.Duration(1e16)
		l := windowLimit(core.SlidingLog, r, p)
		expectWin(t, "r−1 at 0", e.take(core.Call{Rate: l, Cost: r - 1}), l, true, 1, p, 0)
		e.clock.Advance(p)
		expectWin(t, "r−1 at P", e.take(core.Call{Rate: l, Cost: r - 1}), l, true, 1, p, 0)
		e.clock.Advance(p / 10)
		expectWin(t, "1 at 1.1P", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, p, 0)
		expectWin(t, "1 more waits for P", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, p, 9*p/10)
		e.clock.Advance(9 * p / 10)
		expectWin(t, "2 at 2P", e.take(core.Call{Rate: l, Cost: 2}), l, true, r-3, p, 0)
		expectWin(t, "r−3 at 2P", e.take(core.Call{Rate: l, Cost: r - 3}), l, true, 0, p, 0)
		expectWin(t, "1 more waits for 1.1P", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, p, p/10)
		expectWin(t, "2 more wait for 2P", e.take(core.Call{Rate: l, Cost: 2}), l, false, 0, p, p)
		e.clock.Advance(p / 10)
		expectWin(t, "1 at 2.1P", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, p, 0)
	})

	t.Run("SameInstantUnits", func(t *testing.T) {
		e := newEnv(t, s)
		l := windowLimit(core.SlidingLog, 5, time.Second)
		expectWin(t, "2", e.take(core.Call{Rate: l, Cost: 2}), l, true, 3, time.Second, 0)
		expectWin(t, "2 more", e.take(core.Call{Rate: l, Cost: 2}), l, true, 1, time.Second, 0)
		expectWin(t, "1 more", e.take(core.Call{Rate: l, Cost: 1}), l, true, 0, time.Second, 0)
		expectWin(t, "full", e.take(core.Call{Rate: l, Cost: 1}), l, false, 0, time.Second, time.Second)
	})
}

// runCounts checks the bound on counts (core.MaxCount, 2^53 − 1): every
// store refuses a limit above it as an invalid limit, and counts exactly up
// to it, in GCRA, quotas and every window algorithm it lists.
func runCounts(t *testing.T, s Suite) {
	over := int64(core.MaxCount) + 1
	// Periods long enough that T ≥ 1 ns and whole microseconds.
	const long = time.Duration(1e18)

	t.Run("AboveMaxCountRefused", func(t *testing.T) {
		e := newEnv(t, s)
		bad := []core.Call{
			{Rate: core.Limit{Rate: over, Period: long}, Cost: 1},
			{Rate: core.Limit{Rate: 1, Period: 1, Burst: over}, Cost: 1},
			{Quota: core.Quota{Max: over, Renewal: time.Hour}, Cost: 1},
			{Rate: core.PerSecond(5), Quota: core.Quota{Max: over, Renewal: time.Hour}, Cost: 1},
		}
		for _, a := range s.Algorithms {
			bad = append(bad, core.Call{Rate: windowLimit(a, over, long), Cost: 1})
		}
		for _, r := range bad {
			r.Consumer = e.id
			_, err := core.TakeCall(context.Background(), e.store, r)
			if !errors.Is(err, core.ErrInvalidLimit) || !strings.Contains(err.Error(), "above 9007199254740991 (2^53 − 1)") {
				t.Errorf("%+v: error %v, want ErrInvalidLimit naming the bound 2^53 − 1", r, err)
			}
		}
	})

	// exact spends MaxCount − 1, then 2 (denied), 1 and 1 (denied) against
	// a limit of MaxCount, checking every Remaining.
	exact := func(t *testing.T, r core.Call, kind core.Kind) {
		e := newEnv(t, s)
		steps := []struct {
			cost      int64
			allowed   bool
			remaining int64
		}{{core.MaxCount - 1, true, 1}, {2, false, 1}, {1, true, 0}, {1, false, 0}, {0, true, 0}}
		for i, st := range steps {
			r.Cost = st.cost
			d := e.take(r)
			if d.Allowed != st.allowed || d.Remaining != st.remaining || d.Limit != core.MaxCount || d.DecidedBy != kind {
				t.Fatalf("step %d (cost %d): allowed=%v remaining=%d limit=%d by=%v; want allowed=%v remaining=%d limit=%d by=%v",
					i, st.cost, d.Allowed, d.Remaining, d.Limit, d.DecidedBy, st.allowed, st.remaining, int64(core.MaxCount), kind)
			}
		}
	}
	t.Run("QuotaAtMaxCount", func(t *testing.T) {
		exact(t, core.Call{Quota: core.Quota{Max: core.MaxCount, Renewal: time.Hour}}, core.KindQuota)
	})
	t.Run("GCRABurstAtMaxCount", func(t *testing.T) {
		// T = 1 ns; the clock stands still, so nothing refills.
		exact(t, core.Call{Rate: core.Limit{Rate: 1, Period: 1, Burst: core.MaxCount}}, core.KindRate)
	})
	for _, a := range s.Algorithms {
		if a == core.SlidingWindow {
			continue // its Rate × Period bound (in the store) is tighter
		}
		t.Run(a.String()+"AtMaxCount", func(t *testing.T) {
			exact(t, core.Call{Rate: windowLimit(a, core.MaxCount, long)}, core.KindRate)
		})
	}
}
