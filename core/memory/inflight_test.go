package memory

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// inFlightEngine returns an engine over a fresh store with the policies.
func inFlightEngine(t *testing.T, ps ...core.Policy) (*core.Engine, *Store) {
	t.Helper()
	s := New(Options{Clock: core.NewManualClock(start)})
	e, err := core.NewEngine(s, core.Config{Policies: ps}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, s
}

// TestInFlightConcurrent: cap 5, 50 goroutines of one consumer deciding
// at once and holding what they get: exactly 5 are admitted, the others
// are denied by the in-flight limit with Limit 5 and RetryAfter 0; once
// released, 5 more are admitted.
func TestInFlightConcurrent(t *testing.T) {
	e, s := inFlightEngine(t, core.Policy{ID: "p", InFlight: 5})
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		var admitted, denied atomic.Int64
		holds := make(chan core.Hold, 50)
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := e.Decide(ctx, c, "api", 1)
				switch {
				case err != nil:
					t.Error(err)
				case d.Allowed:
					admitted.Add(1)
					if d.DecidedBy != core.KindInFlight || d.Policy != "p" || d.Limit != 5 || !d.Hold.Held() {
						t.Errorf("admitted: %+v", d)
					}
					holds <- d.Hold
				default:
					denied.Add(1)
					if d.DecidedBy != core.KindInFlight || d.Policy != "p" || d.Limit != 5 || d.Remaining != 0 || d.RetryAfter != 0 || d.Hold.Held() {
						t.Errorf("denied: %+v", d)
					}
				}
			}()
		}
		wg.Wait()
		close(holds)
		if admitted.Load() != 5 || denied.Load() != 45 {
			t.Fatalf("round %d: admitted %d, denied %d; want 5, 45", round, admitted.Load(), denied.Load())
		}
		if n := s.InFlight("k", ""); n != 5 {
			t.Fatalf("in flight %d, want 5", n)
		}
		for h := range holds {
			h.Release()
			h.Release() // idempotent
		}
		if n := s.InFlight("k", ""); n != 0 {
			t.Fatalf("in flight after release %d, want 0", n)
		}
	}
}

// TestInFlightWithRate: a slot is taken only when the rate limit allows
// too, and given back when it denies.
func TestInFlightWithRate(t *testing.T) {
	e, s := inFlightEngine(t, core.Policy{ID: "p", InFlight: 5, Rate: core.PerMinute(3)})
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	ctx := context.Background()
	var holds []core.Hold
	for i := 0; i < 3; i++ {
		d, err := e.Decide(ctx, c, "api", 1)
		if err != nil || !d.Allowed || d.DecidedBy != core.KindRate || d.Remaining != int64(2-i) || !d.Hold.Held() {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		holds = append(holds, d.Hold)
	}
	d, err := e.Decide(ctx, c, "api", 1)
	if err != nil || d.Allowed || d.DecidedBy != core.KindRate || d.RetryAfter != 20*time.Second || d.Hold.Held() {
		t.Fatalf("4th: %+v %v", d, err)
	}
	if n := s.InFlight("k", ""); n != 3 {
		t.Fatalf("in flight %d, want 3 (the denied request's slot given back)", n)
	}
	// Wait leaves the in-flight limit out: denied by rate, not in flight.
	// Its deadline is far enough off to outlast a loaded machine and well
	// before the 20 s the rate limit asks for, so Wait refuses at once.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := e.Wait(wctx, c, "api", 1); !errors.Is(err, core.ErrWaitExceedsDeadline) {
		t.Fatalf("Wait: %v, want ErrWaitExceedsDeadline", err)
	}
	for _, h := range holds {
		h.Release()
	}
	if n := s.InFlight("k", ""); n != 0 {
		t.Fatalf("in flight %d, want 0", n)
	}
}

// TestInFlightWithoutInFlight: WithoutInFlight takes no slot; cost 0
// peeks.
func TestInFlightWithoutInFlight(t *testing.T) {
	e, s := inFlightEngine(t, core.Policy{ID: "p", InFlight: 1})
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	ctx := context.Background()
	d, err := e.Decide(ctx, c, "api", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	defer d.Hold.Release()
	for i := 0; i < 3; i++ {
		d2, err := e.Decide(core.WithoutInFlight(ctx), c, "api", 1)
		if err != nil || !d2.Allowed || d2.Hold.Held() || d2.DecidedBy != core.KindNone {
			t.Fatalf("without in flight: %+v %v", d2, err)
		}
	}
	if d3, err := e.Decide(ctx, c, "api", 0); err != nil || d3.Allowed || d3.DecidedBy != core.KindInFlight {
		t.Fatalf("peek at the cap: %+v %v", d3, err)
	}
	if n := s.InFlight("k", ""); n != 1 {
		t.Fatalf("in flight %d, want 1", n)
	}
}

// TestInFlightMerge: the largest cap among a consumer's policies wins,
// with the rate of another policy; the denial names the cap's policy.
func TestInFlightMerge(t *testing.T) {
	e, s := inFlightEngine(t,
		core.Policy{ID: "rate", Rate: core.PerMinute(100)},
		core.Policy{ID: "two", InFlight: 2},
		core.Policy{ID: "four", InFlight: 4},
	)
	c := &core.Consumer{ID: "k", Policies: []string{"rate", "two", "four"}}
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		d, err := e.Decide(ctx, c, "api", 1)
		if err != nil || !d.Allowed || d.DecidedBy != core.KindRate || d.Policy != "rate" {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	d, err := e.Decide(ctx, c, "api", 1)
	if err != nil || d.Allowed || d.DecidedBy != core.KindInFlight || d.Policy != "four" || d.Limit != 4 {
		t.Fatalf("5th: %+v %v", d, err)
	}
	if n := s.InFlight("k", ""); n != 4 {
		t.Fatalf("in flight %d, want 4", n)
	}
	if err := (&core.Policy{ID: "neg", InFlight: -1}).Validate(); !errors.Is(err, core.ErrInvalidLimit) {
		t.Fatalf("negative in flight: %v", err)
	}
}

// TestInFlightSweepsExact: goroutines taking and releasing slots of one
// key under cap 3 while others churn through new keys (so the counters'
// map is swept of zeros again and again): never more than 3 held at once,
// none left, and the map stays bounded.
func TestInFlightSweepsExact(t *testing.T) {
	e, s := inFlightEngine(t, core.Policy{ID: "p", InFlight: 3})
	hot := &core.Consumer{ID: "hot", Policies: []string{"p"}}
	ctx := context.Background()
	var inside, most, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				d, err := e.Decide(ctx, hot, "api", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				runtime.Gosched() // let others try while this holds its slot
				inside.Add(-1)
				d.Hold.Release()
			}
		}()
	}
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20000; i++ {
				c := &core.Consumer{ID: "churn-" + strconv.Itoa(g) + "-" + strconv.Itoa(i), Policies: []string{"p"}}
				d, err := e.Decide(ctx, c, "api", 1)
				if err != nil || !d.Allowed {
					t.Errorf("churn: %+v %v", d, err)
					return
				}
				d.Hold.Release()
			}
		}()
	}
	wg.Wait()
	if most.Load() > 3 || admitted.Load() == 0 {
		t.Fatalf("most held at once %d (cap 3), admitted %d", most.Load(), admitted.Load())
	}
	if n := s.InFlight("hot", ""); n != 0 {
		t.Fatalf("hot key holds %d after all releases", n)
	}
	total := 0
	for i := range s.flights.shards {
		sh := &s.flights.shards[i]
		sh.mu.RLock()
		total += len(sh.m)
		sh.mu.RUnlock()
	}
	// 40,000 keys came and went; a shard sweeps at 64 counters (then at
	// twice what a sweep leaves), so at most 64 per shard are kept.
	if max := len(s.flights.shards) * minFlightSweep; total > max {
		t.Fatalf("%d counters kept, want at most %d", total, max)
	}
	t.Logf("admitted %d on the hot key, most at once %d, %d counters kept of 40,001 keys", admitted.Load(), most.Load(), total)
}
