package core

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrWaitExceedsDeadline is returned by Wait when the context's deadline
// comes before the request is allowed: the time until the next try passes
// it, or it passed while the store was deciding (the store's error is
// wrapped too). The error also matches context.DeadlineExceeded.
var ErrWaitExceedsDeadline = errors.New("wait would exceed context deadline")

// Wait applies req to s as a reservation (Request.MaxDelay up to ctx's
// deadline) and sleeps until the reserved time; stores or algorithms that
// cannot reserve deny instead, and then Wait sleeps for the decision's
// RetryAfter and tries again, until it is allowed or ctx ends. It returns
// at once, without sleeping,
//   - with ErrCostExceedsBurst when req.Cost can never pass;
//   - with an error matching ErrWaitExceedsDeadline and
//     context.DeadlineExceeded when the next retry lies beyond ctx's
//     deadline;
//   - with the store's error when the store fails before ctx's deadline.
//     A store's own timeout may match context.DeadlineExceeded while ctx
//     is still live: test ErrWaitExceedsDeadline (or ctx.Err()) to tell
//     "my time is up" from "the store failed". A store call that fails at
//     or after ctx's deadline (a Redis client's read deadline is ctx's:
//     its "i/o timeout" can come before ctx.Err() is set) is "my time is
//     up": its error matches ErrWaitExceedsDeadline and
//     context.DeadlineExceeded, and wraps the store's.
//
// It returns ctx.Err() when ctx is cancelled while sleeping (a reserved
// slot then goes unused). With GCRA, concurrent waiters on one key, in one
// process or many sharing a Redis store, are served in reservation order at
// exactly the limit's pace; the limit itself is never exceeded. This is how
// worker processes share one rate.
//
// Wait leaves req's in-flight limit out (WithoutInFlight): no response
// would give a slot back, so none is taken and the Decision holds nothing.
func Wait(ctx context.Context, s Store, req Request) (Decision, error) {
	if req.Rule.InFlight() > 0 {
		ctx = WithoutInFlight(ctx)
	}
	return wait(ctx, s.Take, req, true, time.Now, newStdTimer)
}

// timer is the test seam for Wait, as in golang.org/x/time/rate.
type timer interface {
	C() <-chan time.Time
	Stop() bool
}

type stdTimer struct{ t *time.Timer }

func (s stdTimer) C() <-chan time.Time { return s.t.C }
func (s stdTimer) Stop() bool          { return s.t.Stop() }

func newStdTimer(d time.Duration) timer { return stdTimer{time.NewTimer(d)} }

// wait is Wait over take, with the clock (now, for the deadline) and the
// timer as parameters. When reserve is false it asks for no reservation
// (MaxDelay 0) and sleeps only on denials: Engine.Wait does so for a
// shadowed rate limit, whose denials are allowed at once.
func wait(ctx context.Context, take func(context.Context, Request) (Decision, error), req Request, reserve bool, now func() time.Time, newTimer func(time.Duration) timer) (Decision, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		// Reserve the earliest slot the deadline allows: one store call,
		// and waiters are served at exactly the limit's pace.
		if reserve {
			req.MaxDelay = MaxReservation
			if dl, ok := ctx.Deadline(); ok {
				req.MaxDelay = max(dl.Sub(now()), 0)
			}
		}
		d, err := take(ctx, req)
		if err != nil {
			if dl, ok := ctx.Deadline(); ok && !now().Before(dl) {
				return d, fmt.Errorf("core: Wait(cost=%d): the deadline passed during the store call: %w (%w): %w", req.Cost, ErrWaitExceedsDeadline, context.DeadlineExceeded, err)
			}
			return d, err
		}
		if d.Allowed {
			if d.Delay <= 0 {
				return d, nil
			}
			t := newTimer(d.Delay)
			select {
			case <-t.C():
				return d, nil
			case <-ctx.Done():
				// The reserved slot goes unused: the limit only gets
				// stricter, never looser.
				t.Stop()
				return d, ctx.Err()
			}
		}
		if d.RetryAfter < 0 {
			return d, fmt.Errorf("core: Wait(cost=%d): %w", req.Cost, ErrCostExceedsBurst)
		}
		delay := d.RetryAfter
		if delay <= 0 {
			delay = time.Microsecond // a racing peer took the slot; try again promptly
		}
		if dl, ok := ctx.Deadline(); ok && now().Add(delay).After(dl) {
			return d, fmt.Errorf("core: Wait(cost=%d) needs %v: %w (%w)", req.Cost, delay, ErrWaitExceedsDeadline, context.DeadlineExceeded)
		}
		t := newTimer(delay)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return d, ctx.Err()
		}
	}
}
