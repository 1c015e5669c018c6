package core

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ThrottleOptions configure a Throttle.
type ThrottleOptions struct {
	// Store keeps the shared budget: an in-process store shares it within
	// one process, a Redis store across every process using the same Key.
	Store Store
	// Key names the budget (e.g. "api.example.com"); every Throttle with
	// the same Store and Key draws on one limit.
	Key string
	// Limit is the third party's rate limit. Required.
	Limit Limit
	// MaxBackoff caps how long one Backoff holds calls back; default one
	// minute.
	MaxBackoff time.Duration
}

// Throttle holds outbound work — calls to a third-party API, jobs — under
// a limit shared through a Store. Wait admits each call (a reservation, see
// Wait); Backoff records the third party's own "slow down" (HTTP 429 with
// Retry-After, gRPC RetryInfo), after which every Wait of this Throttle, and
// of every process sharing the Store (Store.Penalize), holds back
// that long. nethttp.Transport and the gRPC client interceptors are built
// on it. It is safe for concurrent use.
type Throttle struct {
	o         ThrottleOptions
	req       Request
	notBefore atomic.Int64 // Unix ns before which Wait admits nothing

	// now and newTimer are the test seam, as for Wait (see wait) and in
	// golang.org/x/time/rate: time.Now and time.NewTimer outside tests,
	// which in this package set them to a stepped clock and timers that
	// fire at once.
	now      func() time.Time
	newTimer func(time.Duration) timer
}

// NewThrottle returns a Throttle for o. It fails when Store or Key is
// missing or Limit is not a valid, limited Limit the Store can enforce
// (its Prepare's error).
func NewThrottle(o ThrottleOptions) (*Throttle, error) {
	if o.Store == nil || o.Key == "" {
		return nil, errors.New("core: NewThrottle: Store and Key are required")
	}
	if !o.Limit.Enforced() {
		return nil, errors.New("core: NewThrottle: a Limit is required")
	}
	rule, err := o.Store.Prepare(LimitSet{Rate: o.Limit})
	if err != nil {
		return nil, fmt.Errorf("core: NewThrottle: %w", err)
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	return &Throttle{o: o, req: Request{Consumer: o.Key, Rule: rule, Cost: 1}, now: time.Now, newTimer: newStdTimer}, nil
}

// Key returns the budget's name.
func (t *Throttle) Key() string { return t.o.Key }

// Wait blocks until a call of cost units may start: first until any
// Backoff has passed, then until the shared limit admits it (core.Wait).
// Errors are those of core.Wait: an error matching ErrWaitExceedsDeadline
// (and context.DeadlineExceeded) at once when the wait would pass ctx's
// deadline, ctx.Err() when ctx ends while waiting, ErrCostExceedsBurst,
// or the store's error.
//
// A Backoff recorded while a call waits for the slot it reserved holds
// that call back too: its slot goes unused (the limit only gets
// stricter), and it waits for the Backoff to pass and for a new slot, so
// that no call of this Throttle starts inside a Backoff. Calls of other
// processes sharing the Store that had reserved their slots before the
// Backoff reached the Store (Store.Penalize) still start at those slots.
func (t *Throttle) Wait(ctx context.Context, cost int64) error {
	req := t.req
	req.Cost = cost
	for {
		now := t.now()
		if d := time.Duration(t.notBefore.Load() - now.UnixNano()); d > 0 {
			if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
				return fmt.Errorf("core: throttle %q backing off for %v: %w (%w)", t.o.Key, d, ErrWaitExceedsDeadline, context.DeadlineExceeded)
			}
			tm := t.newTimer(d)
			select {
			case <-tm.C():
			case <-ctx.Done():
				tm.Stop()
				return ctx.Err()
			}
		}
		d, err := wait(ctx, t.o.Store.Take, req, true, t.now, t.newTimer)
		if err != nil || d.Delay <= 0 || t.notBefore.Load() <= t.now().UnixNano() {
			return err
		}
		// A Backoff came while this call slept until its slot.
	}
}

// Backoff holds every later Wait back for d (at most MaxBackoff), and,
// through Store.Penalize, every process sharing the Store (best effort: a
// store error is ignored, the local hold stays).
func (t *Throttle) Backoff(ctx context.Context, d time.Duration) {
	d = min(max(d, 0), t.o.MaxBackoff)
	if d == 0 {
		return
	}
	until := t.now().Add(d).UnixNano()
	for {
		cur := t.notBefore.Load()
		if cur >= until || t.notBefore.CompareAndSwap(cur, until) {
			break
		}
	}
	_ = t.o.Store.Penalize(ctx, t.req, d)
}
