package core

import (
	"context"
	"time"
)

// WaitFakeTimer is e.Wait whose timers fire at once, after moving clock
// forward by their duration and appending it to slept: Engine.Wait is
// tested over a real store and a ManualClock without sleeping.
func WaitFakeTimer(ctx context.Context, e *Engine, c *Consumer, api string, cost int64, clock *ManualClock, slept *[]time.Duration) (Decision, error) {
	newTimer := func(d time.Duration) timer {
		*slept = append(*slept, d)
		clock.Advance(d)
		ch := make(chan time.Time, 1)
		ch <- time.Time{}
		return fakeTimer{ch}
	}
	return e.wait(ctx, c, api, cost, time.Now, newTimer)
}
