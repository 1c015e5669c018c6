package core_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

func TestThrottle(t *testing.T) {
	for _, o := range []core.ThrottleOptions{{}, {Store: memory.New(memory.Options{})}, {Store: memory.New(memory.Options{}), Key: "k"}, {Store: memory.New(memory.Options{}), Key: "k", Limit: core.Limit{Rate: -4, Period: time.Second}}} {
		if _, err := core.NewThrottle(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	store := memory.New(memory.Options{})
	o := core.ThrottleOptions{Store: store, Key: "api", Limit: core.PerSecond(1000), MaxBackoff: 300 * time.Millisecond}
	a, _ := core.NewThrottle(o)
	b, _ := core.NewThrottle(o) // another process's view of the same budget
	ctx := context.Background()
	if err := a.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Timed from the backoff: nothing may pass before 300 ms from it (a
	// stall of this goroutine after it can only shorten b's own wait).
	start := time.Now()
	a.Backoff(ctx, time.Hour) // capped at MaxBackoff
	// A deadline inside the 300ms backoff, far enough off that a loaded
	// machine does not pass it before Wait looks.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := a.Wait(short, 1); !errors.Is(err, core.ErrWaitExceedsDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past the deadline: %v", err)
	}
	if err := b.Wait(ctx, 1); err != nil { // held by the store's penalty, not b's own state
		t.Fatal(err)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("a throttle sharing the store passed %v after a 300ms backoff", el)
	}
	if err := a.Wait(ctx, 5000); !errors.Is(err, core.ErrCostExceedsBurst) {
		t.Fatalf("cost above burst: %v", err)
	}
}
