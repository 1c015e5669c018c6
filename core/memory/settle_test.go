package memory

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// usedNow returns the count of the key's current quota period (0 when
// none), read from the store's state.
func usedNow(t *testing.T, s *Store, consumer string) int64 {
	t.Helper()
	sh, f := s.locate(consumer, "")
	e := sh.get(f)
	if e == nil {
		return 0
	}
	if q := e.quota.Load(); q != nil && q.end > s.clock.now() {
		return q.used.Load()
	}
	return 0
}

// settleEngine: budget 10,000 units per minute, settled after the
// response, on a store with a manual clock.
func settleEngine(t *testing.T) (*core.Engine, *Store, *core.ManualClock) {
	t.Helper()
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock})
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "tokens", Quota: core.Quota{Max: 10_000, Renewal: time.Minute}, Settle: true}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, s, clock
}

// actuals are the upstream's answers: 1,000, 10, or none (-1: the
// estimate stands).
var actuals = []int64{1000, 10, -1}

// TestSettleConcurrent: estimate 100, actual 1,000 / 10 / absent, 16
// concurrent clients: the period's count is exactly the sum of the
// actual costs of the admitted requests (100 where absent); the consumer,
// over budget after settling, is refused with Retry-After from the real
// state (the period's end).
func TestSettleConcurrent(t *testing.T) {
	e, s, _ := settleEngine(t)
	c := &core.Consumer{ID: "k", Policies: []string{"tokens"}}
	ctx := context.Background()
	var sum, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				d, err := e.Decide(ctx, c, "api", 100)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				switch a := actuals[(g+i)%3]; a {
				case -1:
					sum.Add(100)
					d.Hold.Release()
				default:
					sum.Add(a)
					d.Hold.Settle(a)
				}
				d.Hold.Settle(5000) // only the first ends the hold
			}
		}()
	}
	wg.Wait()
	if got := usedNow(t, s, "k"); got != sum.Load() {
		t.Fatalf("count %d, want the sum of actual costs %d (%d admitted)", got, sum.Load(), admitted.Load())
	}
	// Spend what is left, each request settling above its estimate, until
	// one is refused: the count is over the budget after settling.
	for {
		d, err := e.Decide(ctx, c, "api", 100)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		d.Hold.Settle(1000)
		sum.Add(1000)
	}
	if got := usedNow(t, s, "k"); got != sum.Load() || got <= 10_000-100 {
		t.Fatalf("count %d, want the sum of actual costs %d, above 9,900", got, sum.Load())
	}
	d, err := e.Decide(ctx, c, "api", 100)
	if err != nil || d.Allowed || d.DecidedBy != core.KindQuota || d.RetryAfter != time.Minute || d.Quota.Remaining != max(10_000-sum.Load(), 0) {
		t.Fatalf("over budget: %+v %v", d, err)
	}
	t.Logf("%d admitted, count %d = sum of actual costs", admitted.Load(), sum.Load())
}

// TestSettleBounds: a refund never takes the count below zero; a settle
// after the period rolled over credits and charges nothing to the new
// period; a reset's new period is left alone too.
func TestSettleBounds(t *testing.T) {
	e, s, clock := settleEngine(t)
	c := &core.Consumer{ID: "k", Policies: []string{"tokens"}}
	ctx := context.Background()
	d1, _ := e.Decide(ctx, c, "api", 100)
	d2, _ := e.Decide(ctx, c, "api", 100)
	if got := usedNow(t, s, "k"); got != 200 {
		t.Fatalf("count %d, want 200", got)
	}
	// Below zero: the period's count is lowered under the holds (as by
	// a seeding fallback); a refund of 100 stops at 0.
	sh, f := s.locate("k", "")
	sh.get(f).quota.Load().used.Store(50)
	d1.Hold.Settle(0)
	if got := usedNow(t, s, "k"); got != 0 {
		t.Fatalf("count %d after a refund past zero, want 0", got)
	}
	// Rolled over: d2's period ends; a new one has 100; d2's settle (a
	// refund, then a charge by a copy) changes nothing there.
	clock.Advance(time.Minute)
	d3, _ := e.Decide(ctx, c, "api", 100)
	if !d3.Allowed || usedNow(t, s, "k") != 100 {
		t.Fatalf("new period: %+v, count %d", d3, usedNow(t, s, "k"))
	}
	d2.Hold.Settle(0)
	if got := usedNow(t, s, "k"); got != 100 {
		t.Fatalf("count %d after a late refund, want 100", got)
	}
	d3.Hold.Settle(1000)
	if got := usedNow(t, s, "k"); got != 1000 {
		t.Fatalf("count %d, want 1000", got)
	}
	// A reset starts a new period; an old hold's settle misses it.
	d4, _ := e.Decide(ctx, c, "api", 100)
	if err := e.ResetQuota(ctx, c, "api"); err != nil {
		t.Fatal(err)
	}
	d5, _ := e.Decide(ctx, c, "api", 100)
	d4.Hold.Settle(5000)
	d5.Hold.Release()
	if got := usedNow(t, s, "k"); got != 100 {
		t.Fatalf("count %d after a settle across a reset, want 100", got)
	}
}
