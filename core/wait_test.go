package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// stepStore is a one-key GCRA store over a ManualClock, built from Step, so
// Wait can be tested inside package core without sleeping.
type stepStore struct {
	mu    sync.Mutex
	tat   int64
	clock *ManualClock
}

func (s *stepStore) Take(_ context.Context, r Request) (Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := r.Rule.GCRA().Step(s.tat, s.clock.Nanotime(), r.Cost)
	if res.Store {
		s.tat = res.TAT
	}
	return Decision{Allowed: res.Allowed, DecidedBy: KindRate, RetryAfter: time.Duration(res.RetryAfter)}, nil
}
func (s *stepStore) Prepare(ls LimitSet) (*Rule, error)                       { return NewRule(ls, nil) }
func (s *stepStore) ResetQuota(context.Context, string, string, uint64) error { return nil }
func (s *stepStore) Penalize(context.Context, Request, time.Duration) error   { return nil }

// rateRule is the Rule of a rate limit alone, for the test stores of this
// package (whose Prepare is NewRule).
func rateRule(t *testing.T, l Limit) *Rule {
	t.Helper()
	r, err := NewRule(LimitSet{Rate: l}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fakeTimer fires at once and advances the clock by its duration.
type fakeTimer struct{ c chan time.Time }

func (f fakeTimer) C() <-chan time.Time { return f.c }
func (f fakeTimer) Stop() bool          { return true }

func TestWaitSleepsExactlyRetryAfter(t *testing.T) {
	clock := NewManualClock(int64(time.Hour))
	s := &stepStore{clock: clock}
	var slept []time.Duration
	newTimer := func(d time.Duration) timer {
		slept = append(slept, d)
		clock.Advance(d)
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return fakeTimer{c}
	}
	req := Request{Consumer: "w", Rule: rateRule(t, Limit{Rate: 4, Period: time.Second, Burst: 1}), Cost: 1}
	for i := 0; i < 3; i++ {
		if _, err := wait(context.Background(), s.Take, req, true, time.Now, newTimer); err != nil {
			t.Fatal(err)
		}
	}
	if len(slept) != 2 || slept[0] != 250*time.Millisecond || slept[1] != 250*time.Millisecond {
		t.Fatalf("slept %v, want [250ms 250ms]", slept)
	}
}

func TestWaitErrors(t *testing.T) {
	clock := NewManualClock(int64(time.Hour))
	s := &stepStore{clock: clock}
	noTimer := func(time.Duration) timer { t.Fatal("Wait slept"); return nil }
	req := Request{Consumer: "w", Rule: rateRule(t, Limit{Rate: 1, Period: time.Minute, Burst: 2}), Cost: 3}
	if _, err := wait(context.Background(), s.Take, req, true, time.Now, noTimer); !errors.Is(err, ErrCostExceedsBurst) {
		t.Fatalf("cost > burst: %v", err)
	}
	req.Cost = 2
	if _, err := wait(context.Background(), s.Take, req, true, time.Now, noTimer); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := wait(ctx, s.Take, req, true, time.Now, noTimer) // needs 2 minutes
	if !errors.Is(err, ErrWaitExceedsDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := wait(cctx, s.Take, req, true, time.Now, noTimer); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestWaitRealClock(t *testing.T) {
	// 20/s burst 1 on the real clock: 5 waits take at least 4 emission
	// intervals (200ms); the bound below is generous for a loaded machine.
	s := &stepStore{clock: NewManualClock(0)}
	sys := NewSystemClock()
	req := Request{Consumer: "w", Rule: rateRule(t, Limit{Rate: 20, Period: time.Second, Burst: 1}), Cost: 1}
	stepped := &realClockStore{s, sys}
	start := time.Now()
	for i := 0; i < 5; i++ {
		if _, err := Wait(context.Background(), stepped, req); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("5 waits at 20/s took %v, want >= 200ms", el)
	}
}

// realClockStore refreshes the step store's clock from the system clock on
// every Take.
type realClockStore struct {
	s   *stepStore
	sys SystemClock
}

func (r *realClockStore) Take(ctx context.Context, q Request) (Decision, error) {
	r.s.clock.Set(r.sys.Nanotime())
	return r.s.Take(ctx, q)
}
func (r *realClockStore) Prepare(ls LimitSet) (*Rule, error) { return r.s.Prepare(ls) }
func (r *realClockStore) ResetQuota(context.Context, string, string, uint64) error {
	return nil
}
func (r *realClockStore) Penalize(context.Context, Request, time.Duration) error { return nil }

func TestCoarseClock(t *testing.T) {
	base := NewManualClock(5)
	c := NewCoarseClock(base, time.Millisecond)
	if got := c.Nanotime(); got != 5 {
		t.Fatalf("initial reading %d, want 5", got)
	}
	base.Set(99)
	deadline := time.Now().Add(5 * time.Second)
	for c.Nanotime() != 99 {
		if time.Now().After(deadline) {
			t.Fatal("coarse clock never refreshed")
		}
		time.Sleep(time.Millisecond)
	}
	c.Stop()
	c.Stop() // idempotent
	base.Set(200)
	time.Sleep(5 * time.Millisecond)
	if got := c.Nanotime(); got != 99 {
		t.Fatalf("after Stop reading %d, want 99", got)
	}
}

// TestCoarseClockNilBase: a nil base means the system clock, as elsewhere
// (memory.Options.Clock), rather than a panic in the constructor.
func TestCoarseClockNilBase(t *testing.T) {
	c := NewCoarseClock(nil, time.Millisecond)
	defer c.Stop()
	before := c.Nanotime()
	if before <= 0 {
		t.Fatalf("initial reading %d, want > 0", before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Nanotime() == before {
		if time.Now().After(deadline) {
			t.Fatal("coarse clock over the system clock never refreshed")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSystemClockStartsAtOne: readings are at least 1 from the first one
// on (0 means "never" to stores) and never go backwards.
func TestSystemClockStartsAtOne(t *testing.T) {
	for range 1000 {
		c := NewSystemClock()
		first := c.Nanotime()
		if first < 1 {
			t.Fatalf("first reading %d, want ≥ 1", first)
		}
		if next := c.Nanotime(); next < first {
			t.Fatalf("reading went back from %d to %d", first, next)
		}
	}
}
