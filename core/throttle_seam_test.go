package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// reserveStore is a one-key GCRA store over a ManualClock that reserves
// (Request.MaxDelay) and penalizes as the real stores do, built from
// GCRAParams.Reserve, so a Throttle can be tested inside package core.
type reserveStore struct {
	mu    sync.Mutex
	tat   int64
	clock *ManualClock
}

func (s *reserveStore) Take(_ context.Context, r Request) (Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := r.Rule.GCRA().Reserve(s.tat, s.clock.Nanotime(), r.Cost, r.Reservation())
	if res.Store {
		s.tat = res.TAT
	}
	return Decision{Allowed: res.Allowed, DecidedBy: KindRate, RetryAfter: time.Duration(res.RetryAfter), Delay: time.Duration(res.Delay)}, nil
}

func (s *reserveStore) Prepare(ls LimitSet) (*Rule, error) { return NewRule(ls, nil) }

func (s *reserveStore) ResetQuota(context.Context, string, string, uint64) error { return nil }

// Penalize moves the TAT as memory.Store.Penalize does.
func (s *reserveStore) Penalize(_ context.Context, r Request, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := r.Rule.GCRA()
	s.tat = max(s.tat, s.clock.Nanotime()+int64(d)+p.Tau-p.T)
	return nil
}

// plainStore hides reserveStore's Penalize: a store whose Penalize does
// nothing (as for a rule it cannot hold back), so only the Throttle's own
// hold applies.
type plainStore struct{ s *reserveStore }

func (p plainStore) Prepare(ls LimitSet) (*Rule, error)                       { return p.s.Prepare(ls) }
func (p plainStore) Take(ctx context.Context, r Request) (Decision, error)    { return p.s.Take(ctx, r) }
func (p plainStore) ResetQuota(context.Context, string, string, uint64) error { return nil }
func (p plainStore) Penalize(context.Context, Request, time.Duration) error   { return nil }

// fakeTime is a stepped clock whose timers fire at once, moving the clock
// by their duration, and record what they were asked to sleep.
type fakeTime struct {
	mu    sync.Mutex
	start time.Time
	clock *ManualClock
	slept []time.Duration
	never bool // timers never fire (a Wait cut short by its context)
	// during, when set, runs (once) inside the next timer, before the
	// clock moves: what happens while a call sleeps.
	during func()
}

func newFakeTime() *fakeTime {
	return &fakeTime{start: time.Now(), clock: NewManualClock(int64(time.Hour))}
}

func (f *fakeTime) now() time.Time { return f.start.Add(time.Duration(f.clock.Nanotime())) }

func (f *fakeTime) newTimer(d time.Duration) timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, d)
	if during := f.during; during != nil {
		f.during = nil
		f.mu.Unlock()
		during()
		f.mu.Lock()
	}
	c := make(chan time.Time, 1)
	if !f.never {
		f.clock.Advance(d)
		c <- f.now()
	}
	return fakeTimer{c}
}

func (f *fakeTime) sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.slept...)
}

func (f *fakeTime) throttle(t *testing.T, o ThrottleOptions) *Throttle {
	t.Helper()
	th, err := NewThrottle(o)
	if err != nil {
		t.Fatal(err)
	}
	th.now, th.newTimer = f.now, f.newTimer
	return th
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestThrottlePacesAtTheLimit: calls held at 20/s, burst 1, start exactly
// one emission interval (50ms) apart.
func TestThrottlePacesAtTheLimit(t *testing.T) {
	ft := newFakeTime()
	th := ft.throttle(t, ThrottleOptions{Store: &reserveStore{clock: ft.clock}, Key: "api", Limit: Limit{Rate: 20, Period: time.Second, Burst: 1}})
	for range 5 {
		if err := th.Wait(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	want := []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	if got := ft.sleeps(); !equalDurations(got, want) {
		t.Fatalf("slept %v, want %v", got, want)
	}
}

// TestThrottleBackoffHoldsExactly: Backoff holds this Throttle's calls for
// exactly d (capped at MaxBackoff), a deadline inside the hold fails at once
// without sleeping, and a store that penalizes holds a second Throttle sharing it
// for the same time.
func TestThrottleBackoffHoldsExactly(t *testing.T) {
	ctx := context.Background()
	limit := Limit{Rate: 10, Period: time.Second} // T = 100ms, burst 10
	t.Run("local", func(t *testing.T) {
		ft := newFakeTime()
		th := ft.throttle(t, ThrottleOptions{Store: plainStore{&reserveStore{clock: ft.clock}}, Key: "api", Limit: limit, MaxBackoff: 300 * time.Millisecond})
		th.Backoff(ctx, time.Hour)
		dl, cancel := context.WithDeadline(ctx, ft.now().Add(299*time.Millisecond))
		defer cancel()
		err := th.Wait(dl, 1)
		if !errors.Is(err, ErrWaitExceedsDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("deadline inside the hold: %v", err)
		}
		if want := `core: throttle "api" backing off for 300ms: wait would exceed context deadline (context deadline exceeded)`; err.Error() != want {
			t.Fatalf("error %q, want %q", err, want)
		}
		if got := ft.sleeps(); len(got) != 0 {
			t.Fatalf("slept %v before failing", got)
		}
		if err := th.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if got, want := ft.sleeps(), []time.Duration{300 * time.Millisecond}; !equalDurations(got, want) {
			t.Fatalf("slept %v, want %v", got, want)
		}
		// The hold is over: the next call passes at once.
		if err := th.Wait(ctx, 1); err != nil || len(ft.sleeps()) != 1 {
			t.Fatalf("after the hold: %v, slept %v", err, ft.sleeps())
		}
	})
	t.Run("shared", func(t *testing.T) {
		ft := newFakeTime()
		store := &reserveStore{clock: ft.clock}
		a := ft.throttle(t, ThrottleOptions{Store: store, Key: "api", Limit: limit})
		b := ft.throttle(t, ThrottleOptions{Store: store, Key: "api", Limit: limit})
		a.Backoff(ctx, 700*time.Millisecond)
		if err := b.Wait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if got, want := ft.sleeps(), []time.Duration{700 * time.Millisecond}; !equalDurations(got, want) {
			t.Fatalf("the sharing throttle slept %v, want %v", got, want)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ft := newFakeTime()
		ft.never = true
		th := ft.throttle(t, ThrottleOptions{Store: plainStore{&reserveStore{clock: ft.clock}}, Key: "api", Limit: limit})
		th.Backoff(ctx, time.Second)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- th.Wait(cctx, 1) }()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled during the hold: %v", err)
		}
	})
}

// TestThrottleBackoffHoldsReservedCalls: a call sleeping until the slot it
// reserved when a Backoff comes (the 429 of an earlier call) does not start
// inside the Backoff: at 20/s, burst 1, the second call reserves the slot
// 50ms away; a Backoff of 1s arrives meanwhile; the call wakes, sleeps the
// rest of the Backoff (950ms) and takes a new slot, free at once (the
// store's penalty ends with the Backoff). It once started at 50ms.
func TestThrottleBackoffHoldsReservedCalls(t *testing.T) {
	ctx := context.Background()
	ft := newFakeTime()
	th := ft.throttle(t, ThrottleOptions{Store: &reserveStore{clock: ft.clock}, Key: "api", Limit: Limit{Rate: 20, Period: time.Second, Burst: 1}})
	if err := th.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ft.during = func() { th.Backoff(ctx, time.Second) }
	start := ft.now()
	if err := th.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, want := ft.sleeps(), []time.Duration{50 * time.Millisecond, 950 * time.Millisecond}; !equalDurations(got, want) {
		t.Fatalf("slept %v, want %v", got, want)
	}
	if got := ft.now().Sub(start); got != time.Second {
		t.Fatalf("the call started %v after it asked, want 1s (when the Backoff ends)", got)
	}
}
