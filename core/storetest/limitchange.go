package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// Vectors for a limit that changes while a key holds state (issue 20,
// "a limit change keeps the tokens spent, not the time"). Every store must
// follow:
//
//   - GCRA: a key's debt carries over in emission intervals. With TAT
//     stored under emission interval T_old, a request under a limit of
//     interval T_new ≠ T_old first converts it: TAT' = now + ⌈(TAT − now)
//     × T_new / T_old⌉ when TAT > now, else the TAT is kept (no debt is no
//     debt under every limit). A change of burst alone keeps T and the
//     TAT. So a key that spent 3 of 3 per minute, raised to 6 per minute,
//     has exactly 3 more at once; one that spent 3 of 6, lowered to 3, has
//     none, and the next after one new emission interval.
//   - Quotas and window algorithms keep their counts: a changed Max (or
//     window Rate) applies to the units already counted in the period (or
//     window).
//
// The rules are prepared once each, as the engine does, and used side by
// side: the old limit's requests still in flight when the new one arrives
// are decided against the converted state too.
func runLimitChange(t *testing.T, s Suite) {
	perMinute := func(n int64) core.Limit { return core.Limit{Rate: n, Period: time.Minute} }

	// steps takes each (limit, allowed, remaining, retry) in turn at the
	// env's clock and checks the rate's decision.
	type step struct {
		l         core.Limit
		allowed   bool
		remaining int64
		retry     time.Duration
	}
	run := func(t *testing.T, e *env, what string, steps ...step) {
		t.Helper()
		for i, st := range steps {
			d := e.take(core.Call{Rate: st.l, Cost: 1})
			if d.Allowed != st.allowed || d.DecidedBy != core.KindRate || d.Rate.Limit != st.l.EffectiveBurst() ||
				d.Rate.Remaining != st.remaining || d.RetryAfter != st.retry {
				t.Fatalf("%s, step %d (%d per %v, burst %d): %+v; want allowed %v, %d of %d remaining, retry after %v",
					what, i+1, st.l.Rate, st.l.Period, st.l.EffectiveBurst(), d, st.allowed, st.remaining, st.l.EffectiveBurst(), st.retry)
			}
		}
	}

	t.Run("RaisedKeepsTokensSpent", func(t *testing.T) {
		e := newEnv(t, s)
		three, six := perMinute(3), perMinute(6) // T = 20s, then 10s
		run(t, e, "3 per minute",
			step{three, true, 2, 0}, step{three, true, 1, 0}, step{three, true, 0, 0}, step{three, false, 0, 20 * time.Second})
		// 3 of 3 spent, raised to 6: exactly 3 more at once.
		run(t, e, "raised to 6 per minute",
			step{six, true, 2, 0}, step{six, true, 1, 0}, step{six, true, 0, 0}, step{six, false, 0, 10 * time.Second})
		e.clock.Advance(10 * time.Second)
		run(t, e, "one new emission interval later", step{six, true, 0, 0}, step{six, false, 0, 10 * time.Second})
	})

	t.Run("LoweredKeepsTokensSpent", func(t *testing.T) {
		e := newEnv(t, s)
		six, three := perMinute(6), perMinute(3)
		run(t, e, "6 per minute", step{six, true, 5, 0}, step{six, true, 4, 0}, step{six, true, 3, 0})
		// 3 of 6 spent, lowered to 3: none more; the next one after one
		// new emission interval (20s).
		run(t, e, "lowered to 3 per minute", step{three, false, 0, 20 * time.Second})
		e.clock.Advance(20*time.Second - s.Granularity)
		run(t, e, "one granule before", step{three, false, 0, s.Granularity})
		e.clock.Advance(s.Granularity)
		run(t, e, "one new emission interval later", step{three, true, 0, 0}, step{three, false, 0, 20 * time.Second})
		// Back to 6 per minute: the 3 spent (20s each, 60s of debt) are 3
		// of 6 again.
		run(t, e, "raised back to 6", step{six, true, 2, 0}, step{six, true, 1, 0}, step{six, true, 0, 0}, step{six, false, 0, 10 * time.Second})
	})

	t.Run("PartlyRefilled", func(t *testing.T) {
		// 10 of 10 per minute spent (T = 6s), 9s later (1.5 intervals
		// refilled, 51s of debt): at 20 per minute (T = 3s) the debt is
		// 8.5 of 20 intervals, 25.5s: 11 more at once, the 12th after
		// 1.5s.
		e := newEnv(t, s)
		ten, twenty := perMinute(10), perMinute(20)
		for i := range 10 {
			run(t, e, "10 per minute", step{ten, true, int64(9 - i), 0})
		}
		e.clock.Advance(9 * time.Second)
		for i := range 11 {
			run(t, e, "raised to 20 per minute", step{twenty, true, int64(10 - i), 0})
		}
		run(t, e, "raised to 20 per minute, 12th", step{twenty, false, 0, 1500 * time.Millisecond})
	})

	t.Run("BurstChanged", func(t *testing.T) {
		// Same T (100ms), other burst: the TAT, and the units spent, are
		// kept.
		e := newEnv(t, s)
		b5 := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
		b10 := core.Limit{Rate: 10, Period: time.Second, Burst: 10}
		b2 := core.Limit{Rate: 10, Period: time.Second, Burst: 2}
		run(t, e, "burst 5", step{b5, true, 4, 0}, step{b5, true, 3, 0}, step{b5, true, 2, 0})
		run(t, e, "burst 10: 7 more", step{b10, true, 6, 0}, step{b10, true, 5, 0}, step{b10, true, 4, 0},
			step{b10, true, 3, 0}, step{b10, true, 2, 0}, step{b10, true, 1, 0}, step{b10, true, 0, 0}, step{b10, false, 0, 100 * time.Millisecond})
		// 10 spent (1s of debt), burst lowered to 2 (τ = 200ms): the next
		// when the debt is down to one interval, 900ms from now.
		run(t, e, "burst 2", step{b2, false, 0, 900 * time.Millisecond})
	})

	t.Run("RateAndBurstRaised", func(t *testing.T) {
		// 10/s burst 5 (T = 100ms) fully spent; 20/s burst 10 (T = 50ms):
		// the 5 spent are 5 of 10, so 5 more at once.
		e := newEnv(t, s)
		l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
		l2 := core.Limit{Rate: 20, Period: time.Second, Burst: 10}
		for i := range 5 {
			run(t, e, "10/s burst 5", step{l, true, int64(4 - i), 0})
		}
		for i := range 5 {
			run(t, e, "20/s burst 10", step{l2, true, int64(4 - i), 0})
		}
		run(t, e, "20/s burst 10, 6th", step{l2, false, 0, 50 * time.Millisecond})
		e.clock.Advance(50 * time.Millisecond)
		run(t, e, "one new emission interval later", step{l2, true, 0, 0})
	})

	t.Run("PeekConverts", func(t *testing.T) {
		// A peek under the new limit answers from the converted state.
		e := newEnv(t, s)
		three, six := perMinute(3), perMinute(6)
		for range 3 {
			e.take(core.Call{Rate: three, Cost: 1})
		}
		d := e.take(core.Call{Rate: six, Cost: 0})
		check(t, "peek under 6 per minute: remaining", d.Remaining, int64(3))
		check(t, "peek under 6 per minute: reset after", d.ResetAfter, 30*time.Second)
		d = e.take(core.Call{Rate: three, Cost: 0})
		check(t, "peek under 3 per minute: remaining", d.Remaining, int64(0))
		check(t, "peek under 3 per minute: reset after", d.ResetAfter, time.Minute)
	})

	t.Run("QuotaKeepsCount", func(t *testing.T) {
		// 3 of a quota of 5 spent; Max raised to 10: 7 more; lowered to 4
		// (10 spent): none. The rate limit beside it converts.
		e := newEnv(t, s)
		q5 := core.Quota{Max: 5, Renewal: time.Hour}
		q10 := core.Quota{Max: 10, Renewal: time.Hour}
		q4 := core.Quota{Max: 4, Renewal: time.Hour}
		for range 3 {
			check(t, "quota 5", e.take(core.Call{Quota: q5, Cost: 1}).Allowed, true)
		}
		for i := range 7 {
			d := e.take(core.Call{Quota: q10, Cost: 1})
			check(t, "quota raised to 10", d.Allowed, true)
			check(t, "quota raised to 10: remaining", d.Quota.Remaining, int64(6-i))
		}
		d := e.take(core.Call{Quota: q10, Cost: 1})
		check(t, "quota 10 spent", d.Allowed, false)
		check(t, "quota 10 spent: decided by", d.DecidedBy, core.KindQuota)
		d = e.take(core.Call{Quota: q4, Cost: 1})
		check(t, "quota lowered to 4", d.Allowed, false)
		check(t, "quota lowered to 4: remaining", d.Quota.Remaining, int64(0))

		// A rate limit with a quota: 2 of 3 per minute and 2 of the quota
		// spent; at 6 per minute, 4 more by the rate, and the quota of 5
		// stops them at 3.
		e = newEnv(t, s)
		for range 2 {
			check(t, "3 per minute with a quota", e.take(core.Call{Rate: perMinute(3), Quota: q5, Cost: 1}).Allowed, true)
		}
		admitted := 0
		var last core.Decision
		for range 5 {
			if last = e.take(core.Call{Rate: perMinute(6), Quota: q5, Cost: 1}); last.Allowed {
				admitted++
			}
		}
		check(t, "6 per minute with the quota: admitted", admitted, 3)
		check(t, "6 per minute with the quota: decided by", last.DecidedBy, core.KindQuota)
		check(t, "6 per minute with the quota: rate remaining", last.Rate.Remaining, int64(1))
	})

	for _, a := range s.Algorithms {
		t.Run(a.String()+"KeepsCount", func(t *testing.T) {
			// 2 of 3 per minute counted; raised to 6 per minute: 4 more in
			// the same window; lowered to 4 (6 counted): none.
			e := newEnv(t, s)
			three, six, four := windowLimit(a, 3, time.Minute), windowLimit(a, 6, time.Minute), windowLimit(a, 4, time.Minute)
			for range 2 {
				check(t, "3 per minute", e.take(core.Call{Rate: three, Cost: 1}).Allowed, true)
			}
			for i := range 4 {
				d := e.take(core.Call{Rate: six, Cost: 1})
				check(t, "raised to 6 per minute", d.Allowed, true)
				check(t, "raised to 6 per minute: remaining", d.Remaining, int64(3-i))
			}
			check(t, "6 per minute, all counted", e.take(core.Call{Rate: six, Cost: 1}).Allowed, false)
			d := e.take(core.Call{Rate: four, Cost: 1})
			check(t, "lowered to 4", d.Allowed, false)
			check(t, "lowered to 4: remaining", d.Remaining, int64(0))
		})
	}

	t.Run("ConcurrentAcrossChange", func(t *testing.T) {
		// 100 per minute, burst 100 (T = 600ms) and 300 per minute, burst
		// 300 (T = 200ms) on one key with a frozen clock, from many
		// goroutines: first under the old limit only, then under both, as
		// a config change lands while old requests are in flight. A unit
		// of either limit is one emission interval of debt in its own
		// units, so the key admits while fewer than 100 (old) or 300 (new)
		// units are spent: exactly 300 in all, whatever the interleaving
		// (a store keeping time would admit 100 old ones and then no new
		// one, as 100 × 600ms is the whole 60s of the new τ).
		for round := range 3 {
			e := newEnv(t, s)
			oldRule, err := e.store.Prepare(core.LimitSet{Rate: perMinute(100)})
			if err != nil {
				t.Fatal(err)
			}
			newRule, err := e.store.Prepare(core.LimitSet{Rate: perMinute(300)})
			if err != nil {
				t.Fatal(err)
			}
			g := max(s.Concurrency, 4)
			const per = 40
			var admitted, admittedOld atomic.Int64
			var failed atomic.Value
			var wg sync.WaitGroup
			changed := make(chan struct{})
			var oldHalf sync.WaitGroup
			for i := range g {
				wg.Add(1)
				if i%2 == 0 {
					oldHalf.Add(1)
				}
				go func() {
					defer wg.Done()
					rule := oldRule
					if i%2 == 1 {
						<-changed // the new limit arrives
						rule = newRule
					}
					req := core.Request{Consumer: e.id, Rule: rule, Cost: 1}
					for j := range per {
						if i%2 == 0 && j == per/4 {
							oldHalf.Done() // a quarter of the old ones went first
						}
						d, err := e.store.Take(context.Background(), req)
						if err != nil {
							failed.Store(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
							if rule == oldRule {
								admittedOld.Add(1)
							}
						}
					}
				}()
			}
			oldHalf.Wait()
			close(changed)
			wg.Wait()
			if err, _ := failed.Load().(error); err != nil {
				t.Fatalf("Take: %v", err)
			}
			if got := admitted.Load(); got != 300 {
				t.Fatalf("round %d: admitted %d (%d under the old limit), want exactly 300", round, got, admittedOld.Load())
			}
			if got := admittedOld.Load(); got > 100 {
				t.Fatalf("round %d: the old limit admitted %d, more than its burst 100", round, got)
			}
			d := e.take(core.Call{Rate: perMinute(300), Cost: 0})
			check(t, "remaining under the new limit", d.Remaining, int64(0))
			check(t, "reset after under the new limit", d.ResetAfter, time.Minute)
			d = e.take(core.Call{Rate: perMinute(100), Cost: 0})
			check(t, "reset after under the old limit", d.ResetAfter, 3*time.Minute)
		}
	})
}
