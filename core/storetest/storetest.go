// Package storetest is the conformance suite every core.Store must pass. A
// store's own tests call Run with a constructor; every vector asserts exact
// values derived from DESIGN.md and checked against core.GCRAParams.Step.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
)

// Suite describes the store under test.
type Suite struct {
	// New returns a fresh, empty store that reads time from clock. The
	// store must stay usable until the test ends; cleanup is the
	// constructor's business (t.Cleanup).
	New func(t *testing.T, clock core.Clock) core.Store
	// Algorithms lists the algorithms the store implements besides GCRA,
	// which every store must implement. Each one listed runs its vectors.
	Algorithms []core.Algorithm
	// Granularity is the store's time resolution; the suite only steps the
	// clock in multiples of it. Default 1ns. (The Redis store works in
	// microseconds.)
	Granularity time.Duration
	// Concurrency is the number of goroutines in the concurrency vectors
	// (default 64).
	Concurrency int

	viaTakeInto bool // set for the rerun through TakeInto
}

// dwStore is a Store that also writes decisions in place, as
// memory.Store.TakeInto does: every vector runs through it too.
type dwStore interface {
	core.Store
	TakeInto(ctx context.Context, req *core.Request, d *core.Decision) error
}

// intoStore answers Take through TakeInto, into a Decision filled with
// garbage first, so a field TakeInto forgets to set shows up.
type intoStore struct{ dwStore }

func (s intoStore) Take(ctx context.Context, r core.Request) (core.Decision, error) {
	var d core.Decision
	dirty(reflect.ValueOf(&d).Elem())
	err := s.TakeInto(ctx, &r, &d)
	if err != nil {
		return core.Decision{}, err
	}
	return d, nil
}

// dirty sets every field of v, a settable struct, to a value no store
// writes: fields added to core.Decision later are covered too.
func dirty(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Field(i)
			if !f.CanSet() { // an unexported field (core.Hold's)
				f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
			}
			dirty(f)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem())) // a Hold no store made
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(-7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(0xee)
	case reflect.String:
		v.SetString("junk")
	default:
		panic("storetest: dirty cannot fill a " + v.Kind().String())
	}
}

// start is the initial reading of every manual clock: well above 0, which
// stores may treat as "never".
const start = int64(1_000_000 * time.Hour)

// Run runs every vector as a subtest of t.
func Run(t *testing.T, s Suite) {
	if s.Granularity <= 0 {
		s.Granularity = time.Nanosecond
	}
	if s.Concurrency <= 0 {
		s.Concurrency = 64
	}
	if !s.viaTakeInto {
		probe := s.New(t, core.NewManualClock(start))
		if _, ok := probe.(dwStore); ok {
			// Every vector again through TakeInto, starting from a dirty
			// Decision each time: it must equal Take's answer in full.
			into := s
			into.viaTakeInto = true
			into.New = func(t *testing.T, clock core.Clock) core.Store {
				return intoStore{s.New(t, clock).(dwStore)}
			}
			t.Run("TakeInto", func(t *testing.T) { Run(t, into) })
		}
	}
	t.Run("GCRA", func(t *testing.T) { runGCRA(t, s) })
	t.Run("Quota", func(t *testing.T) { runQuota(t, s) })
	t.Run("QuotaEpoch", func(t *testing.T) { runQuotaEpoch(t, s) })
	t.Run("Errors", func(t *testing.T) { runErrors(t, s) })
	t.Run("Counts", func(t *testing.T) { runCounts(t, s) })
	t.Run("LimitChange", func(t *testing.T) { runLimitChange(t, s) })
	t.Run("Settle", func(t *testing.T) { runSettle(t, s) })
	t.Run("InFlight", func(t *testing.T) { runInFlight(t, s) })
	for _, a := range s.Algorithms {
		switch a {
		case core.FixedWindow:
			t.Run("FixedWindow", func(t *testing.T) { runFixedWindow(t, s) })
		case core.SlidingWindow:
			t.Run("SlidingWindow", func(t *testing.T) { runSlidingWindow(t, s) })
		case core.SlidingLog:
			t.Run("SlidingLog", func(t *testing.T) { runSlidingLog(t, s) })
		default:
			t.Fatalf("storetest has no vectors for algorithm %v", a)
		}
	}
}

// env is one test's store, clock and unique consumer.
type env struct {
	t     *testing.T
	store core.Store
	clock *core.ManualClock
	id    string
}

func newEnv(t *testing.T, s Suite) *env {
	t.Helper()
	c := core.NewManualClock(start)
	return &env{t: t, store: s.New(t, c), clock: c, id: fmt.Sprintf("consumer-%s-%d", t.Name(), rand.Int64())}
}

func (e *env) take(r core.Call) core.Decision {
	e.t.Helper()
	if r.Consumer == "" {
		r.Consumer = e.id
	}
	d, err := core.TakeCall(context.Background(), e.store, r)
	if err != nil {
		e.t.Fatalf("Take(%+v): %v", r, err)
	}
	invariants(e.t, r, d)
	return d
}

// invariants checks what holds for every decision a bare store makes: no
// policy names or shadowing (those are the engine's), no quota status
// without a quota, no rate status without a rate limit, no delay without a
// reservation, and no retry time on an allowed request.
func invariants(t *testing.T, r core.Call, d core.Decision) {
	t.Helper()
	bad := func(what string) { t.Fatalf("decision %+v for %+v: %s", d, r, what) }
	switch {
	case d.Policy != "" || d.Rate.Policy != "" || d.Quota.Policy != "":
		bad("a store set a policy name")
	case d.Shadowed:
		bad("a store set Shadowed")
	case !r.Quota.Enforced() && d.Quota != core.Status{}:
		bad("quota status without a quota")
	case !r.Rate.Enforced() && d.Rate != core.Status{}:
		bad("rate status without a rate limit")
	case d.Delay != 0 && (r.MaxDelay <= 0 || !d.Allowed):
		bad("a delay without a reservation")
	case d.Allowed && d.RetryAfter != 0:
		bad("retry time on an allowed request")
	}
}

func check(t *testing.T, what string, got, want any) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// expectRate checks d against the oracle result r for limit l.
func expectRate(t *testing.T, step int, d core.Decision, l core.Limit, r core.GCRAResult) {
	t.Helper()
	p := l.GCRA()
	want := core.Status{Limit: p.Burst, Remaining: r.Remaining, ResetAfter: time.Duration(r.ResetAfter), Window: time.Duration(p.Tau)}
	if d.Allowed != r.Allowed || d.Rate != want || d.RetryAfter != time.Duration(r.RetryAfter) || d.DecidedBy != core.KindRate {
		t.Fatalf("step %d: got allowed=%v rate=%+v retry=%v by=%v; want allowed=%v rate=%+v retry=%v by=rate",
			step, d.Allowed, d.Rate, d.RetryAfter, d.DecidedBy, r.Allowed, want, time.Duration(r.RetryAfter))
	}
	if d.Limit != want.Limit || d.Remaining != want.Remaining || d.ResetAfter != want.ResetAfter {
		t.Fatalf("step %d: top-level fields %d/%d/%v differ from rate status %+v", step, d.Limit, d.Remaining, d.ResetAfter, want)
	}
}

func runGCRA(t *testing.T, s Suite) {
	g := s.Granularity
	// 10 per second, burst 5: T = 100ms, τ = 500ms.
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}

	t.Run("BurstThenDeny", func(t *testing.T) {
		e := newEnv(t, s)
		for i := int64(0); i < 5; i++ {
			d := e.take(core.Call{Rate: l, Cost: 1})
			check(t, "allowed", d.Allowed, true)
			check(t, "remaining", d.Remaining, 4-i)
			check(t, "reset after", d.ResetAfter, time.Duration(i+1)*100*time.Millisecond)
			check(t, "retry after", d.RetryAfter, time.Duration(0))
			check(t, "limit", d.Limit, int64(5))
			check(t, "window", d.Rate.Window, 500*time.Millisecond)
		}
		d := e.take(core.Call{Rate: l, Cost: 1})
		check(t, "6th allowed", d.Allowed, false)
		check(t, "6th decided by", d.DecidedBy, core.KindRate)
		check(t, "6th remaining", d.Remaining, int64(0))
		check(t, "6th retry after", d.RetryAfter, 100*time.Millisecond)
		check(t, "6th reset after", d.ResetAfter, 500*time.Millisecond)
		// One emission interval later exactly one more passes.
		e.clock.Advance(100 * time.Millisecond)
		check(t, "after T", e.take(core.Call{Rate: l, Cost: 1}).Allowed, true)
		check(t, "after T, again", e.take(core.Call{Rate: l, Cost: 1}).Allowed, false)
	})

	t.Run("DeniedChangesNoState", func(t *testing.T) {
		e := newEnv(t, s)
		for i := 0; i < 5; i++ {
			e.take(core.Call{Rate: l, Cost: 1})
		}
		for i := 0; i < 20; i++ { // a client that keeps retrying is not locked out
			check(t, "denied", e.take(core.Call{Rate: l, Cost: 1}).Allowed, false)
		}
		e.clock.Advance(100 * time.Millisecond)
		d := e.take(core.Call{Rate: l, Cost: 1})
		check(t, "allowed after T", d.Allowed, true)
		check(t, "remaining", d.Remaining, int64(0))
	})

	t.Run("CostExceedsBurst", func(t *testing.T) {
		e := newEnv(t, s)
		d := e.take(core.Call{Rate: l, Cost: 6})
		check(t, "allowed", d.Allowed, false)
		check(t, "retry after", d.RetryAfter, time.Duration(-1))
		check(t, "remaining", d.Remaining, int64(5))
		d = e.take(core.Call{Rate: l, Cost: 5})
		check(t, "full burst still there", d.Allowed, true)
		check(t, "remaining", d.Remaining, int64(0))
		d = e.take(core.Call{Rate: l, Cost: 6})
		check(t, "retry after when empty", d.RetryAfter, time.Duration(-1))
	})

	t.Run("CostN", func(t *testing.T) {
		e := newEnv(t, s)
		d := e.take(core.Call{Rate: l, Cost: 3})
		check(t, "allowed", d.Allowed, true)
		check(t, "remaining", d.Remaining, int64(2))
		d = e.take(core.Call{Rate: l, Cost: 3})
		check(t, "denied", d.Allowed, false)
		check(t, "retry after", d.RetryAfter, 100*time.Millisecond)
		e.clock.Advance(100 * time.Millisecond)
		check(t, "allowed after", e.take(core.Call{Rate: l, Cost: 3}).Allowed, true)
	})

	t.Run("PeekChangesNothing", func(t *testing.T) {
		e := newEnv(t, s)
		d := e.take(core.Call{Rate: l, Cost: 0})
		check(t, "peek empty allowed", d.Allowed, true)
		check(t, "peek empty remaining", d.Remaining, int64(5))
		e.take(core.Call{Rate: l, Cost: 2})
		for i := 0; i < 3; i++ {
			d = e.take(core.Call{Rate: l, Cost: 0})
			check(t, "peek remaining", d.Remaining, int64(3))
			check(t, "peek reset", d.ResetAfter, 200*time.Millisecond)
		}
	})

	t.Run("OnePerHourAfterIdleHour", func(t *testing.T) {
		e := newEnv(t, s)
		h := core.Limit{Rate: 1, Period: time.Hour}
		check(t, "first", e.take(core.Call{Rate: h, Cost: 1}).Allowed, true)
		d := e.take(core.Call{Rate: h, Cost: 1})
		check(t, "second", d.Allowed, false)
		check(t, "retry after", d.RetryAfter, time.Hour)
		e.clock.Advance(time.Hour - g)
		check(t, "one granule early", e.take(core.Call{Rate: h, Cost: 1}).Allowed, false)
		e.clock.Advance(g)
		check(t, "after exactly one hour", e.take(core.Call{Rate: h, Cost: 1}).Allowed, true)
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		e := newEnv(t, s)
		ids := []string{e.id, e.id + "x", e.id + "{x}", e.id + ":rate:", e.id + "\n", e.id + "\x00"}
		for _, id := range ids {
			for _, scope := range []string{"", "a", "a:b", "{a}"} {
				d := e.take(core.Call{Consumer: id, Scope: scope, Rate: l, Cost: 5})
				check(t, fmt.Sprintf("first burst of %q/%q", id, scope), d.Allowed, true)
			}
		}
	})

	t.Run("MatchesOracle", func(t *testing.T) {
		e := newEnv(t, s)
		rng := rand.New(rand.NewPCG(1, 2))
		l := core.Limit{Rate: 7, Period: 700 * time.Millisecond, Burst: 4} // T = 100ms
		p := l.GCRA()
		tat := int64(0)
		for i := 0; i < 400; i++ {
			e.clock.Advance(time.Duration(rng.IntN(60)) * 5 * time.Millisecond)
			n := int64(rng.IntN(6)) // 0..5: peeks, normal, and over-burst
			r := p.Step(tat, e.clock.Nanotime(), n)
			if r.Store {
				tat = r.TAT
			}
			expectRate(t, i, e.take(core.Call{Rate: l, Cost: n}), l, r)
		}
	})

	t.Run("Reservation", func(t *testing.T) {
		// 10/s burst 1: T = τ = 100ms. With MaxDelay 1s the first request
		// conforms now and the next 10 are scheduled 100ms apart; the 12th
		// would need 1.1s and is denied, changing nothing.
		e := newEnv(t, s)
		l := core.Limit{Rate: 10, Period: time.Second, Burst: 1}
		for i := 0; i <= 10; i++ {
			d := e.take(core.Call{Rate: l, Cost: 1, MaxDelay: time.Second})
			check(t, fmt.Sprintf("#%d allowed", i), d.Allowed, true)
			check(t, fmt.Sprintf("#%d delay", i), d.Delay, time.Duration(i)*100*time.Millisecond)
			check(t, fmt.Sprintf("#%d retry after", i), d.RetryAfter, time.Duration(0))
			check(t, fmt.Sprintf("#%d remaining", i), d.Remaining, int64(0))
			check(t, fmt.Sprintf("#%d reset after", i), d.ResetAfter, time.Duration(i+1)*100*time.Millisecond)
		}
		d := e.take(core.Call{Rate: l, Cost: 1, MaxDelay: time.Second})
		check(t, "12th allowed", d.Allowed, false)
		check(t, "12th retry after", d.RetryAfter, 1100*time.Millisecond)
		check(t, "12th delay", d.Delay, time.Duration(0))
		d = e.take(core.Call{Rate: l, Cost: 1})
		check(t, "without reservation", d.Allowed, false)
		check(t, "reset after unchanged", d.ResetAfter, 1100*time.Millisecond)
		// Time passes: the schedule drains at exactly T.
		e.clock.Advance(1050 * time.Millisecond)
		d = e.take(core.Call{Rate: l, Cost: 1, MaxDelay: 100 * time.Millisecond})
		check(t, "after 1.05s allowed", d.Allowed, true)
		check(t, "after 1.05s delay", d.Delay, 50*time.Millisecond)
	})

	t.Run("ReservationConcurrentExact", func(t *testing.T) {
		// 64 goroutines reserve with MaxDelay 1s at 10/s burst 2 on a
		// frozen clock: exactly burst + 10 are admitted (the slots up to
		// τ + 1s), every delay distinct.
		e := newEnv(t, s)
		l := core.Limit{Rate: 10, Period: time.Second, Burst: 2}
		admitted := hammer(t, e, s.Concurrency, 3, core.Call{Rate: l, Cost: 1, MaxDelay: time.Second})
		check(t, "admitted", admitted, int64(12))
	})

	t.Run("ConcurrentFrozenClock", func(t *testing.T) {
		e := newEnv(t, s)
		cl := core.Limit{Rate: 100, Period: time.Minute, Burst: 37}
		admitted := hammer(t, e, s.Concurrency, 20, core.Call{Rate: cl, Cost: 1})
		check(t, "admitted", admitted, int64(37))
	})
}

// hammer sends per requests from each of g goroutines and counts admissions.
func hammer(t *testing.T, e *env, g, per int, r core.Call) int64 {
	t.Helper()
	if r.Consumer == "" {
		r.Consumer = e.id
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	startGun := make(chan struct{})
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGun
			for j := 0; j < per; j++ {
				d, err := core.TakeCall(context.Background(), e.store, r)
				if err != nil {
					failed.Store(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	close(startGun)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("Take: %v", err)
	}
	return admitted.Load()
}

func runQuota(t *testing.T, s Suite) {
	q := core.Quota{Max: 3, Renewal: time.Hour}

	t.Run("PeriodStartsAtFirstRequest", func(t *testing.T) {
		e := newEnv(t, s)
		e.clock.Advance(17 * time.Minute) // not on any calendar boundary
		for i := int64(0); i < 3; i++ {
			d := e.take(core.Call{Quota: q, Cost: 1})
			check(t, "allowed", d.Allowed, true)
			check(t, "decided by", d.DecidedBy, core.KindQuota)
			check(t, "remaining", d.Remaining, 2-i)
			check(t, "limit", d.Limit, int64(3))
			check(t, "reset after", d.ResetAfter, time.Hour-time.Duration(i)*time.Minute)
			e.clock.Advance(time.Minute)
		}
		d := e.take(core.Call{Quota: q, Cost: 1})
		check(t, "4th allowed", d.Allowed, false)
		check(t, "4th decided by", d.DecidedBy, core.KindQuota)
		check(t, "4th retry after", d.RetryAfter, 57*time.Minute)
		check(t, "4th window", d.Quota.Window, time.Hour)
		e.clock.Advance(57*time.Minute - s.Granularity)
		check(t, "just before renewal", e.take(core.Call{Quota: q, Cost: 1}).Allowed, false)
		e.clock.Advance(s.Granularity)
		d = e.take(core.Call{Quota: q, Cost: 1})
		check(t, "after renewal", d.Allowed, true)
		check(t, "after renewal remaining", d.Remaining, int64(2))
		check(t, "new period reset", d.ResetAfter, time.Hour)
	})

	// HugeCost: a valid cost far above Max, after units were spent (so
	// used + cost would overflow int64 if computed), is denied for good
	// (RetryAfter −1) and spends nothing; the quota then admits exactly
	// what is left.
	t.Run("HugeCost", func(t *testing.T) {
		e := newEnv(t, s)
		q := core.Quota{Max: 10, Renewal: time.Hour}
		check(t, "first", e.take(core.Call{Quota: q, Cost: 1}).Allowed, true)
		d := e.take(core.Call{Quota: q, Cost: core.MaxCost})
		check(t, "huge allowed", d.Allowed, false)
		check(t, "huge retry after", d.RetryAfter, time.Duration(-1))
		check(t, "huge remaining", d.Remaining, int64(9))
		for i := int64(8); i >= 0; i-- {
			d = e.take(core.Call{Quota: q, Cost: 1})
			check(t, "allowed", d.Allowed, true)
			check(t, "remaining", d.Remaining, i)
		}
		check(t, "11th", e.take(core.Call{Quota: q, Cost: 1}).Allowed, false)
	})

	t.Run("Unlimited", func(t *testing.T) {
		e := newEnv(t, s)
		for i := 0; i < 50; i++ {
			check(t, "allowed", e.take(core.Call{Quota: core.Quota{Max: core.Unlimited}, Cost: 1}).Allowed, true)
		}
	})

	t.Run("Reset", func(t *testing.T) {
		e := newEnv(t, s)
		for i := 0; i < 3; i++ {
			e.take(core.Call{Quota: q, Cost: 1})
		}
		check(t, "exhausted", e.take(core.Call{Quota: q, Cost: 1}).Allowed, false)
		if err := e.store.ResetQuota(context.Background(), e.id, "", 0); err != nil {
			t.Fatal(err)
		}
		d := e.take(core.Call{Quota: q, Cost: 1})
		check(t, "after reset", d.Allowed, true)
		check(t, "after reset remaining", d.Remaining, int64(2))
		check(t, "after reset period", d.ResetAfter, time.Hour)
		// Resetting one scope leaves the others.
		for i := 0; i < 3; i++ {
			e.take(core.Call{Scope: "api", Quota: q, Cost: 1})
		}
		if err := e.store.ResetQuota(context.Background(), e.id, "", 0); err != nil {
			t.Fatal(err)
		}
		check(t, "other scope untouched", e.take(core.Call{Scope: "api", Quota: q, Cost: 1}).Allowed, false)
		if err := e.store.ResetQuota(context.Background(), "never-seen", "", 0); err != nil {
			t.Fatalf("reset of unknown consumer: %v", err)
		}
	})

	t.Run("SpentOnlyWhenRateAllows", func(t *testing.T) {
		e := newEnv(t, s)
		l := core.Limit{Rate: 2, Period: time.Second}
		q := core.Quota{Max: 5, Renewal: time.Hour}
		for i := 0; i < 10; i++ {
			e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		}
		d := e.take(core.Call{Rate: l, Quota: q, Cost: 0})
		check(t, "quota remaining after 2 allowed of 10", d.Quota.Remaining, int64(3))
		d = e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		check(t, "rate denial", d.DecidedBy, core.KindRate)
		check(t, "rate retry", d.RetryAfter, 500*time.Millisecond)
		check(t, "quota status on rate denial", d.Quota.Remaining, int64(3))
	})

	t.Run("QuotaDenialLeavesRate", func(t *testing.T) {
		e := newEnv(t, s)
		l := core.Limit{Rate: 10, Period: time.Second}
		q := core.Quota{Max: 2, Renewal: time.Hour}
		e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		e.take(core.Call{Rate: l, Quota: q, Cost: 1})
		for i := 0; i < 5; i++ {
			d := e.take(core.Call{Rate: l, Quota: q, Cost: 1})
			check(t, "denied", d.Allowed, false)
			check(t, "by quota", d.DecidedBy, core.KindQuota)
			check(t, "rate remaining untouched", d.Rate.Remaining, int64(8))
		}
	})

	t.Run("ConcurrentExact", func(t *testing.T) {
		e := newEnv(t, s)
		r := core.Call{Rate: core.Limit{Rate: 1000, Period: time.Minute, Burst: 100}, Quota: core.Quota{Max: 41, Renewal: time.Hour}, Cost: 1}
		check(t, "admitted", hammer(t, e, s.Concurrency, 10, r), int64(41))
		d := e.take(core.Call{Rate: r.Rate, Quota: r.Quota, Cost: 0})
		check(t, "rate spent only for admitted", d.Rate.Remaining, int64(100-41))
	})
}

func runErrors(t *testing.T, s Suite) {
	e := newEnv(t, s)
	bad := []core.Call{
		{Consumer: "x", Rate: core.Limit{Rate: 0, Period: time.Second, Burst: 1}, Cost: 1},
		{Consumer: "x", Rate: core.Limit{Rate: -5, Period: time.Second}, Cost: 1},
		{Consumer: "x", Rate: core.Limit{Rate: 1, Period: -time.Second}, Cost: 1},
		{Consumer: "x", Rate: core.Limit{Rate: 1, Period: time.Second, Burst: -1}, Cost: 1},
		{Consumer: "x", Rate: core.Limit{Rate: 2, Period: 1}, Cost: 1},
		{Consumer: "x", Rate: core.Limit{Rate: 1, Period: 1 << 62, Burst: 4}, Cost: 1},
		{Consumer: "x", Quota: core.Quota{Max: 0, Renewal: time.Hour}, Cost: 1},
		{Consumer: "x", Quota: core.Quota{Max: 5, Renewal: 0}, Cost: 1},
		{Consumer: "x", Rate: core.PerSecond(1), Cost: -1},
	}
	for i, r := range bad {
		if _, err := core.TakeCall(context.Background(), e.store, r); err == nil {
			t.Errorf("bad request %d (%+v): no error", i, r)
		}
	}
	// Costs outside [0, MaxCost] are refused as such, whatever the limits.
	for _, n := range []int64{-1, core.MaxCost + 1, math.MaxInt64, math.MinInt64} {
		for _, r := range []core.Call{
			{Consumer: "x", Rate: core.PerSecond(1), Cost: n},
			{Consumer: "x", Quota: core.Quota{Max: 10, Renewal: time.Hour}, Cost: n},
			{Consumer: "x", Cost: n},
		} {
			if _, err := core.TakeCall(context.Background(), e.store, r); !errors.Is(err, core.ErrInvalidCost) {
				t.Errorf("cost %d (%+v): error %v, want ErrInvalidCost", n, r, err)
			}
		}
	}

	// A request without a rule, or with a rule only core.NewRule made (no
	// store prepared it), is refused as foreign, never decided or panicked
	// on; so is a penalty under one.
	for _, r := range []*core.Rule{nil, mustRule(t, core.LimitSet{Rate: core.PerSecond(1)})} {
		req := core.Request{Consumer: "x", Rule: r, Cost: 1}
		if _, err := e.store.Take(context.Background(), req); !errors.Is(err, core.ErrForeignRule) {
			t.Errorf("Take with rule %v: error %v, want ErrForeignRule", r, err)
		}
		if err := e.store.Penalize(context.Background(), req, time.Second); !errors.Is(err, core.ErrForeignRule) {
			t.Errorf("Penalize with rule %v: error %v, want ErrForeignRule", r, err)
		}
	}

	// The same on a key the store already holds (a store may decide held
	// keys on a faster path, which must refuse exactly what the general
	// path refuses), and limits at the edges of core.Limit.Validate.
	ctx := context.Background()
	if d, err := core.TakeCall(ctx, e.store, core.Call{Consumer: "held", Rate: core.PerSecond(1000), Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("first request of the held key: %+v, %v; want allowed", d, err)
	}
	for i, r := range bad {
		r.Consumer = "held"
		if _, err := core.TakeCall(ctx, e.store, r); err == nil {
			t.Errorf("bad request %d on a held key (%+v): no error", i, r)
		}
	}
	for _, n := range []int64{-1, core.MaxCost + 1, math.MaxInt64, math.MinInt64} {
		if _, err := core.TakeCall(ctx, e.store, core.Call{Consumer: "held", Rate: core.PerSecond(1000), Cost: n}); !errors.Is(err, core.ErrInvalidCost) {
			t.Errorf("cost %d on a held key: error %v, want ErrInvalidCost", n, err)
		}
	}
	for _, l := range []core.Limit{
		{Rate: 1, Period: time.Duration(core.MaxTolerance), Burst: 1},     // τ = MaxTolerance, the bound
		{Rate: 1, Period: time.Duration(core.MaxTolerance) + 1, Burst: 1}, // τ just above it
		{Rate: 1, Period: 1 << 40, Burst: 1 << 22},                        // τ = 2^62
		{Rate: 1, Period: 1 << 40, Burst: 1<<21 + 1},                      // τ just above 2^61
		{Rate: 1000, Period: time.Second, Burst: 1 << 40},                 // τ = 2^40 ms
		{Rate: core.MaxCount, Period: core.MaxCount},                      // T = 1ns
		{Rate: core.MaxCount + 1, Period: 1 << 62},                        // rate above MaxCount
		{Rate: 1, Period: time.Second, Burst: core.MaxCount + 1},
		{Rate: 3, Period: 2}, // T = 0
	} {
		want := l.Validate()
		_, err := core.TakeCall(ctx, e.store, core.Call{Consumer: "held", Rate: l, Cost: 0})
		if (err != nil) != (want != nil) || (want != nil && !errors.Is(err, core.ErrInvalidLimit)) {
			t.Errorf("limit %+v on a held key: error %v; Validate says %v", l, err, want)
		}
	}
}

// mustRule is core.NewRule(ls, nil): a rule no store prepared.
func mustRule(t *testing.T, ls core.LimitSet) *core.Rule {
	t.Helper()
	r, err := core.NewRule(ls, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
