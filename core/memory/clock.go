package memory

import "github.com/limitplane/limitplane/core"

// clock reads a core.Clock, calling the two production clocks directly
// rather than through the interface: direct calls inline, which matters
// when a whole decision costs a few nanoseconds.
type clock struct {
	coarse *core.CoarseClock // the clock, if it is one
	system core.SystemClock  // the clock, if isSystem
	// isSystem reports whether the clock is a core.SystemClock.
	isSystem bool
	any      core.Clock
}

// newClock wraps c (core.NewSystemClock() when nil).
func newClock(c core.Clock) clock {
	if c == nil {
		c = core.NewSystemClock()
	}
	r := clock{any: c}
	switch c := c.(type) {
	case *core.CoarseClock:
		r.coarse = c
	case core.SystemClock:
		r.system, r.isSystem = c, true
	}
	return r
}

// now returns the clock's reading. It is too big to inline, so the two
// hottest callers (Bucket.Allow, Store.Take) repeat its body.
func (c *clock) now() int64 {
	if c.coarse != nil {
		return c.coarse.Nanotime()
	}
	if c.isSystem {
		return c.system.Nanotime()
	}
	return c.any.Nanotime()
}
