package core

import (
	"sync"
	"sync/atomic"
	"time"
)

// SystemClock reads the monotonic clock of the time package. The zero value
// is not usable; use NewSystemClock.
type SystemClock struct{ origin time.Time }

// NewSystemClock returns a Clock whose origin is 1ns before the moment of
// the call. Each read costs one monotonic clock read (time.Since).
func NewSystemClock() SystemClock {
	// The origin is set 1ns back so that every reading is at least 1 (0
	// can mean "never" in stored state) without adding 1 to each reading.
	return SystemClock{origin: time.Now().Add(-1)}
}

// Nanotime returns the nanoseconds elapsed since the clock's origin: at
// least 1, so 0 can mean "never" in stored state.
func (c SystemClock) Nanotime() int64 { return int64(time.Since(c.origin)) }

// ManualClock is a Clock that only moves when told to: tests freeze it,
// step it and read exact results. It is safe for concurrent use.
type ManualClock struct{ ns atomic.Int64 }

// NewManualClock returns a ManualClock reading start (in ns; use a positive
// value, since 0 means "never" to stores).
func NewManualClock(start int64) *ManualClock {
	c := &ManualClock{}
	c.ns.Store(start)
	return c
}

// Nanotime returns the clock's current reading.
func (c *ManualClock) Nanotime() int64 { return c.ns.Load() }

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Set moves the clock to ns.
func (c *ManualClock) Set(ns int64) { c.ns.Store(ns) }

// CoarseClock is a Clock that returns a cached reading refreshed by one
// ticker goroutine every Resolution. A read is a single atomic load, which
// makes it the fastest clock; in exchange a reading may be up to one
// resolution old. Stop ends the goroutine; after Stop the clock keeps
// returning its last reading.
type CoarseClock struct {
	ns   atomic.Int64
	stop chan struct{}
	once sync.Once
	done chan struct{}
}

// NewCoarseClock starts a CoarseClock over base (NewSystemClock() when nil)
// that refreshes every resolution (1ms when resolution ≤ 0). Call Stop when
// done.
func NewCoarseClock(base Clock, resolution time.Duration) *CoarseClock {
	if base == nil {
		base = NewSystemClock()
	}
	if resolution <= 0 {
		resolution = time.Millisecond
	}
	c := &CoarseClock{stop: make(chan struct{}), done: make(chan struct{})}
	c.ns.Store(base.Nanotime())
	go func() {
		defer close(c.done)
		t := time.NewTicker(resolution)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				c.ns.Store(base.Nanotime())
			case <-c.stop:
				return
			}
		}
	}()
	return c
}

// Nanotime returns the cached reading.
func (c *CoarseClock) Nanotime() int64 { return c.ns.Load() }

// Stop ends the refreshing goroutine and waits for it. It is safe to call
// more than once.
func (c *CoarseClock) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
