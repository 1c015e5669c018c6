package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// The limits whose decisions hold something until the response: a quota
// that settles after it (LimitSet.Settle: Hold.Settle charges or refunds
// the difference from the estimate, in the period the estimate went to)
// and an in-flight cap (LimitSet.InFlight: Hold.Release gives the slot
// back). Every store runs the same vectors; the stores' own tests keep
// what only their state can show (a count lowered under a hold, a slot
// map swept, a lease).

func runSettle(t *testing.T, s Suite) {
	q := core.Quota{Max: 10_000, Renewal: time.Minute}
	settle := func(cost int64) core.Call { return core.Call{Quota: q, Settle: true, Cost: cost} }
	// remaining peeks at the quota: what a later decision sees, so every
	// settle made before it.
	remaining := func(e *env) int64 {
		e.t.Helper()
		return e.take(settle(0)).Quota.Remaining
	}

	// ChargesAndRefunds: estimate 100; actual 1,000 charges 900 more,
	// actual 10 refunds 90, none (Release) keeps the estimate; only the
	// first of Settle and Release on a hold does anything; a negative
	// actual is 0.
	t.Run("ChargesAndRefunds", func(t *testing.T) {
		e := newEnv(t, s)
		d := e.take(settle(100))
		check(t, "allowed", d.Allowed, true)
		check(t, "estimate charged", d.Quota.Remaining, int64(9900))
		check(t, "held", d.Hold.Held(), true)
		d.Hold.Settle(1000)
		check(t, "held after settle", d.Hold.Held(), false)
		check(t, "after actual 1000", remaining(e), int64(9000))
		d.Hold.Settle(5000)
		d.Hold.Release()
		check(t, "after a second settle", remaining(e), int64(9000))

		d = e.take(settle(100))
		d.Hold.Settle(10)
		check(t, "after actual 10", remaining(e), int64(8990))

		d = e.take(settle(100))
		d.Hold.Release()
		d.Hold.Settle(0)
		check(t, "after none", remaining(e), int64(8890))

		d = e.take(settle(100))
		d.Hold.Settle(-50)
		check(t, "after actual −50", remaining(e), int64(8890))
	})

	// OnlyItsPeriod: a settle changes the period its estimate went to
	// and no other: not the next one after a renewal, not the new one
	// after a reset (begun at least Granularity later).
	t.Run("OnlyItsPeriod", func(t *testing.T) {
		e := newEnv(t, s)
		old := e.take(settle(100))
		e.clock.Advance(time.Minute)
		d := e.take(settle(100))
		check(t, "new period", d.Quota.Remaining, int64(9900))
		old.Hold.Settle(5000)
		check(t, "after a late charge", remaining(e), int64(9900))
		d.Hold.Release()

		before := e.take(settle(200))
		check(t, "before the reset", before.Quota.Remaining, int64(9700))
		// A store may know a period by when it began, at its
		// Granularity (the Redis store: its end, in µs): a period
		// begun after a reset begins later.
		e.clock.Advance(s.Granularity)
		if err := e.store.ResetQuota(context.Background(), e.id, "", 0); err != nil {
			t.Fatal(err)
		}
		d = e.take(settle(100))
		check(t, "after the reset", d.Quota.Remaining, int64(9900))
		before.Hold.Settle(0)
		check(t, "after a refund across the reset", remaining(e), int64(9900))
		d.Hold.Settle(300)
		check(t, "after the new period's own settle", remaining(e), int64(9700))
	})

	// ConcurrentExact: Concurrency goroutines, 10 requests each,
	// estimate 100, actual 1,000, 10 or none in turn: the period's count
	// is exactly the sum of the actual costs (100 where none).
	t.Run("ConcurrentExact", func(t *testing.T) {
		e := newEnv(t, s)
		big := core.Call{Quota: core.Quota{Max: 1_000_000, Renewal: time.Minute}, Settle: true, Cost: 100}
		r, err := e.store.Prepare(big.Limits())
		if err != nil {
			t.Fatal(err)
		}
		var sum atomic.Int64
		var wg sync.WaitGroup
		for g := range s.Concurrency {
			wg.Go(func() {
				for i := range 10 {
					d, err := e.store.Take(context.Background(), core.Request{Consumer: e.id, Rule: r, Cost: 100})
					if err != nil || !d.Allowed {
						t.Errorf("take: %+v %v", d, err)
						return
					}
					switch a := [3]int64{1000, 10, -1}[(g+i)%3]; a {
					case -1:
						sum.Add(100)
						d.Hold.Release()
					default:
						sum.Add(a)
						d.Hold.Settle(a)
					}
				}
			})
		}
		wg.Wait()
		d := e.take(core.Call{Quota: big.Quota, Settle: true})
		check(t, "count", 1_000_000-d.Quota.Remaining, sum.Load())
	})
}

func runInFlight(t *testing.T, s Suite) {
	// ConcurrentExact: cap 5, Concurrency goroutines of one consumer
	// deciding at once and holding what they get: exactly 5 admitted,
	// the others denied by the cap (Limit 5, Remaining 0, no RetryAfter,
	// nothing held); once all are released, exactly 5 again.
	t.Run("ConcurrentExact", func(t *testing.T) {
		e := newEnv(t, s)
		call := core.Call{InFlight: 5, Cost: 1}
		r, err := e.store.Prepare(call.Limits())
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			var admitted, denied atomic.Int64
			holds := make(chan core.Hold, s.Concurrency)
			var wg sync.WaitGroup
			for range s.Concurrency {
				wg.Go(func() {
					d, err := e.store.Take(context.Background(), core.Request{Consumer: e.id, Rule: r, Cost: 1})
					switch {
					case err != nil:
						t.Error(err)
					case d.Allowed:
						admitted.Add(1)
						if d.DecidedBy != core.KindInFlight || d.Limit != 5 || !d.Hold.Held() {
							t.Errorf("admitted: %+v", d)
						}
						holds <- d.Hold
					default:
						denied.Add(1)
						if d.DecidedBy != core.KindInFlight || d.Limit != 5 || d.Remaining != 0 || d.RetryAfter != 0 || d.Hold.Held() {
							t.Errorf("denied: %+v", d)
						}
					}
				})
			}
			wg.Wait()
			close(holds)
			if admitted.Load() != 5 || denied.Load() != int64(s.Concurrency-5) {
				t.Fatalf("round %d: admitted %d, denied %d; want 5, %d", round, admitted.Load(), denied.Load(), s.Concurrency-5)
			}
			for h := range holds {
				h.Release()
				h.Release() // only the first does anything
			}
		}
	})

	// WithRate: cap 2 and 1 request per second: a request the rate
	// denies takes no slot (or gives it back), so after it two more are
	// admitted, one per second, and the third is denied by the cap.
	t.Run("WithRate", func(t *testing.T) {
		e := newEnv(t, s)
		call := core.Call{InFlight: 2, Rate: core.Limit{Rate: 1, Period: time.Second}, Cost: 1}
		h1 := e.take(call)
		check(t, "first", h1.Allowed, true)
		check(t, "first held", h1.Hold.Held(), true)
		d := e.take(call)
		check(t, "second, too soon", d.Allowed, false)
		check(t, "second decided by", d.DecidedBy, core.KindRate)
		check(t, "second held", d.Hold.Held(), false)
		e.clock.Advance(time.Second)
		h2 := e.take(call)
		check(t, "after a second", h2.Allowed, true)
		e.clock.Advance(time.Second)
		d = e.take(call)
		check(t, "at the cap", d.Allowed, false)
		check(t, "at the cap decided by", d.DecidedBy, core.KindInFlight)
		check(t, "at the cap retry", d.RetryAfter, time.Duration(0))
		h1.Hold.Release()
		d = e.take(call)
		check(t, "after a release", d.Allowed, true)
		d.Hold.Release()
		h2.Hold.Release()
	})

	// WithoutInFlight: under core.WithoutInFlight a request takes no
	// slot and is not refused by a full cap; a peek (cost 0) at the cap
	// says denied.
	t.Run("WithoutInFlight", func(t *testing.T) {
		e := newEnv(t, s)
		call := core.Call{Consumer: e.id, InFlight: 1, Cost: 1}
		h := e.take(call)
		check(t, "first", h.Allowed, true)
		for range 3 {
			d, err := core.TakeCall(core.WithoutInFlight(context.Background()), e.store, call)
			if err != nil || !d.Allowed || d.Hold.Held() || d.DecidedBy != core.KindNone {
				t.Fatalf("without in flight: %+v %v", d, err)
			}
		}
		peek := call
		peek.Cost = 0
		d := e.take(peek)
		check(t, "peek at the cap", d.Allowed, false)
		check(t, "peek decided by", d.DecidedBy, core.KindInFlight)
		h.Hold.Release()
		check(t, "peek after the release", e.take(peek).Allowed, true)
	})
}
