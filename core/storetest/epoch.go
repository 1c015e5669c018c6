package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// runQuotaEpoch checks quota resets carried as data (core.Request.QuotaEpoch):
// a raised epoch is a fresh quota period, the same epoch again changes
// nothing, the rate limit's state ignores the epoch, and each scope's epoch
// is its own. What a store does with a lower epoch than it holds is the
// store's to document and test.
func runQuotaEpoch(t *testing.T, s Suite) {
	q := core.Quota{Max: 3, Renewal: time.Hour}

	// spend takes n unit requests at epoch and checks each is admitted.
	spend := func(e *env, r core.Call, n int) {
		e.t.Helper()
		for i := 0; i < n; i++ {
			if d := e.take(r); !d.Allowed {
				e.t.Fatalf("request %d of %d at epoch %d: denied %+v", i+1, n, r.QuotaEpoch, d)
			}
		}
	}

	// RaiseResetsExactly: an exhausted quota at epoch 0; the first request
	// at epoch 1 starts a fresh period at that moment (remaining Max−1,
	// the whole renewal ahead), which then admits exactly Max.
	t.Run("RaiseResetsExactly", func(t *testing.T) {
		e := newEnv(t, s)
		r := core.Call{Quota: q, Cost: 1}
		spend(e, r, 3)
		e.clock.Advance(10 * time.Minute)
		d := e.take(r)
		check(t, "exhausted at epoch 0", d.Allowed, false)
		check(t, "epoch 0 retry after", d.RetryAfter, 50*time.Minute)
		r.QuotaEpoch = 1
		for i := int64(0); i < 3; i++ {
			d = e.take(r)
			check(t, "allowed at epoch 1", d.Allowed, true)
			check(t, "decided by", d.DecidedBy, core.KindQuota)
			check(t, "remaining at epoch 1", d.Remaining, 2-i)
			check(t, "epoch 1 period", d.ResetAfter, time.Hour)
		}
		d = e.take(r)
		check(t, "4th at epoch 1", d.Allowed, false)
		check(t, "4th at epoch 1 retry after", d.RetryAfter, time.Hour)
	})

	// SameEpochChangesNothing: applying the same epoch again, or replaying
	// it after requests, is not a reset.
	t.Run("SameEpochChangesNothing", func(t *testing.T) {
		e := newEnv(t, s)
		r := core.Call{Quota: q, Cost: 1, QuotaEpoch: 7}
		d := e.take(r)
		check(t, "first at epoch 7 remaining", d.Remaining, int64(2))
		e.clock.Advance(time.Minute)
		d = e.take(r)
		check(t, "second at epoch 7 remaining", d.Remaining, int64(1))
		check(t, "second at epoch 7 reset after", d.ResetAfter, 59*time.Minute)
		spend(e, r, 1)
		for i := 0; i < 3; i++ {
			d = e.take(r)
			check(t, "epoch 7 again", d.Allowed, false)
			check(t, "epoch 7 again retry after", d.RetryAfter, 59*time.Minute)
		}
		d = e.take(core.Call{Quota: q, Cost: 0, QuotaEpoch: 7})
		check(t, "peek at epoch 7 remaining", d.Quota.Remaining, int64(0))
	})

	// PeekDoesNotReset: a peek at a raised epoch reports the fresh period
	// without starting it; the reset happens with the next spend.
	t.Run("PeekAtRaisedEpoch", func(t *testing.T) {
		e := newEnv(t, s)
		spend(e, core.Call{Quota: q, Cost: 1}, 3)
		d := e.take(core.Call{Quota: q, Cost: 0, QuotaEpoch: 1})
		check(t, "peek allowed", d.Allowed, true)
		check(t, "peek remaining", d.Quota.Remaining, int64(3))
		check(t, "peek reset after", d.Quota.ResetAfter, time.Hour)
		e.clock.Advance(time.Minute)
		d = e.take(core.Call{Quota: q, Cost: 1, QuotaEpoch: 1})
		check(t, "spend after peek remaining", d.Remaining, int64(2))
		check(t, "spend after peek period", d.ResetAfter, time.Hour)
	})

	// RateUntouched: an epoch change resets the quota only; the GCRA TAT
	// goes on as if the epoch were not there.
	t.Run("RateUntouched", func(t *testing.T) {
		e := newEnv(t, s)
		l := core.Limit{Rate: 10, Period: time.Second}
		r := core.Call{Rate: l, Quota: q, Cost: 1}
		spend(e, r, 3)
		d := e.take(r)
		check(t, "quota denial", d.DecidedBy, core.KindQuota)
		check(t, "rate remaining after 3", d.Rate.Remaining, int64(7))
		r.QuotaEpoch = 1
		d = e.take(r)
		check(t, "allowed at epoch 1", d.Allowed, true)
		check(t, "rate decides", d.DecidedBy, core.KindRate)
		check(t, "rate remaining after 4", d.Rate.Remaining, int64(6))
		check(t, "quota remaining at epoch 1", d.Quota.Remaining, int64(2))
		// A rate limit alone: the same state whatever the epoch says.
		rr := core.Call{Scope: "rate-only", Rate: core.Limit{Rate: 2, Period: time.Second}, Cost: 1}
		check(t, "rate-only first", e.take(rr).Rate.Remaining, int64(1))
		rr.QuotaEpoch = 9
		check(t, "rate-only second at epoch 9", e.take(rr).Rate.Remaining, int64(0))
		rr.QuotaEpoch = 10
		d = e.take(rr)
		check(t, "rate-only third at epoch 10", d.Allowed, false)
		check(t, "rate-only retry", d.RetryAfter, 500*time.Millisecond)
	})

	// ScopesIndependent: a key's per-API counters have epochs of their own:
	// raising the key-wide epoch leaves a scope's quota, and raising a
	// scope's leaves the key-wide one and other scopes.
	t.Run("ScopesIndependent", func(t *testing.T) {
		e := newEnv(t, s)
		wide := core.Call{Quota: q, Cost: 1}
		a := core.Call{Scope: "orders", Quota: q, Cost: 1}
		b := core.Call{Scope: "billing", Quota: q, Cost: 1}
		spend(e, wide, 3)
		spend(e, a, 3)
		spend(e, b, 3)
		wide.QuotaEpoch = 1
		check(t, "key-wide at epoch 1 remaining", e.take(wide).Remaining, int64(2))
		check(t, "orders still at epoch 0", e.take(a).Allowed, false)
		a.QuotaEpoch = 1
		check(t, "orders at epoch 1 remaining", e.take(a).Remaining, int64(2))
		check(t, "billing untouched", e.take(b).Allowed, false)
		check(t, "key-wide not reset again", e.take(wide).Remaining, int64(1))
		a.QuotaEpoch = 2
		check(t, "orders at epoch 2 remaining", e.take(a).Remaining, int64(2))
		check(t, "key-wide after orders' raise", e.take(wide).Remaining, int64(0))
	})

	// RenewalWithinEpoch: a period at a raised epoch renews like any other.
	t.Run("RenewalWithinEpoch", func(t *testing.T) {
		e := newEnv(t, s)
		r := core.Call{Quota: q, Cost: 1, QuotaEpoch: 3}
		spend(e, r, 3)
		e.clock.Advance(time.Hour - s.Granularity)
		check(t, "just before renewal", e.take(r).Allowed, false)
		e.clock.Advance(s.Granularity)
		d := e.take(r)
		check(t, "renewed at epoch 3", d.Remaining, int64(2))
		check(t, "renewed period", d.ResetAfter, time.Hour)
	})

	// EngineResetAtEpoch: core.Engine.ResetQuota resets the counter of the
	// consumer's current epoch, key-wide and per API.
	t.Run("EngineResetAtEpoch", func(t *testing.T) {
		e := newEnv(t, s)
		eng, err := core.NewEngine(e.store, core.Config{Policies: []core.Policy{{ID: "p", Quota: q}}}, core.Options{FailurePolicy: core.FailClosed})
		if err != nil {
			t.Fatal(err)
		}
		c := &core.Consumer{ID: e.id, Policies: []string{"p"}, QuotaEpoch: 4,
			APILimits: map[string]core.Limits{"orders": {Quota: q, QuotaEpoch: 2}}}
		ctx := context.Background()
		decide := func(api string) core.Decision {
			t.Helper()
			d, err := eng.Decide(ctx, c, api, 1)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		for _, api := range []string{"any", "orders"} {
			for i := 0; i < 3; i++ {
				check(t, api+" allowed", decide(api).Allowed, true)
			}
			check(t, api+" exhausted", decide(api).Allowed, false)
		}
		if err := eng.ResetQuota(ctx, c, "any"); err != nil {
			t.Fatal(err)
		}
		check(t, "key-wide after reset", decide("any").Remaining, int64(2))
		check(t, "orders not reset", decide("orders").Allowed, false)
		if err := eng.ResetQuota(ctx, c, "orders"); err != nil {
			t.Fatal(err)
		}
		check(t, "orders after reset", decide("orders").Remaining, int64(2))
		check(t, "key-wide after orders' reset", decide("any").Remaining, int64(1))
	})

	// ConcurrentRaiseExact: concurrent requests that all carry a raised
	// epoch over an exhausted quota start one fresh period between them
	// and admit exactly Max.
	t.Run("ConcurrentRaiseExact", func(t *testing.T) {
		e := newEnv(t, s)
		q := core.Quota{Max: 41, Renewal: time.Hour}
		r := core.Call{Rate: core.Limit{Rate: 1000, Period: time.Minute, Burst: 200}, Quota: q, Cost: 1}
		check(t, "admitted at epoch 0", hammer(t, e, s.Concurrency, 2, r), int64(41))
		r.QuotaEpoch = 1
		check(t, "admitted at epoch 1", hammer(t, e, s.Concurrency, 2, r), int64(41))
		d := e.take(core.Call{Rate: r.Rate, Quota: q, Cost: 0, QuotaEpoch: 1})
		check(t, "rate spent only for admitted", d.Rate.Remaining, int64(200-82))
	})
}
