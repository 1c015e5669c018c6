// Package failurelog logs repeated failures without a line per failure:
// the gateway's limit-store and go-redis failures, the control plane's
// refused sync streams and admin calls.
package failurelog

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is how often, at most, a Log writes a line after the
// first one of a run of failures, when Options.Interval is 0.
const DefaultInterval = 5 * time.Second

// AfterFunc has time.AfterFunc's contract: it calls f in its own goroutine
// once d has passed, and returns a function that cancels that call if it
// has not started (reporting whether it cancelled it). Tests pass their
// own to fire the interval's end when they choose.
type AfterFunc func(d time.Duration, f func()) (stop func() bool)

// stdAfterFunc is AfterFunc on the system clock.
func stdAfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// Log logs repeated failures (of the limit store, of go-redis's dials, of
// callers without credentials) without writing a line per failure: a
// Redis outage under load fails every request, and a flood of
// unauthenticated calls would flood the log. The first failure after a quiet interval is logged at
// once; the failures after it are counted, and at the end of each
// interval one line gives their number and the last error, until an
// interval passes with none (then the next failure is logged at once
// again). Every line carries failures (how many failures it stands for)
// and total (failures since start). It is safe for concurrent use.
type Log struct {
	log      *slog.Logger
	msg      string
	attrs    []any // after err, failures and total
	interval time.Duration
	after    AfterFunc

	mu         sync.Mutex
	total      int64
	pending    int64  // failures since the last line, not yet logged
	lastErr    error  // the last of them
	inInterval bool   // a line was written and its interval has not ended
	run        uint64 // counts runs of failures; a tick of an earlier run does nothing
	stop       func() bool
	closed     bool
}

// Options configure New.
type Options struct {
	// Msg is every line's message.
	Msg string
	// Attrs follow err, failures and total on every line (slog's
	// key-value pairs).
	Attrs []any
	// Interval is the shortest time between two lines after the first;
	// DefaultInterval if 0.
	Interval time.Duration
	// AfterFunc times the intervals; time.AfterFunc if nil.
	AfterFunc AfterFunc
}

// New returns a Log writing WARN lines to log. Its timer runs only
// within an interval that follows a line; Close stops it.
func New(log *slog.Logger, o Options) *Log {
	if o.AfterFunc == nil {
		o.AfterFunc = stdAfterFunc
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	return &Log{log: log, msg: o.Msg, attrs: o.Attrs, interval: o.Interval, after: o.AfterFunc}
}

// Failed records one failure; it has core.Options.OnStoreError's
// signature. After Close it only counts.
func (f *Log) Failed(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total++
	if f.inInterval || f.closed {
		f.pending++
		f.lastErr = err
		return
	}
	f.log.Warn(f.msg, append([]any{"err", err, "failures", 1, "total", f.total}, f.attrs...)...)
	f.inInterval = true
	f.run++
	f.startInterval()
}

// startInterval starts the timer that ends the interval of the current
// run; f.mu is held.
func (f *Log) startInterval() {
	run := f.run
	f.stop = f.after(f.interval, func() { f.tick(run) })
}

// tick ends an interval of run: it logs the failures counted in it, if
// any, and starts another, or else lets the next failure be logged at
// once. A tick of a run that has ended (Recovered) does nothing.
func (f *Log) tick(run uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || run != f.run {
		return
	}
	if f.pending == 0 {
		f.inInterval = false
		return
	}
	f.flush()
	f.startInterval()
}

// Recovered ends a run of failures when what failed works again: the
// failures counted since the last line, if any, are logged at once (not
// an interval later, after the recovery, where the line would read as a
// new failure), the interval's timer is stopped, and the next failure is
// logged at once.
func (f *Log) Recovered() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || !f.inInterval {
		return
	}
	if f.stop != nil {
		f.stop()
	}
	if f.pending > 0 {
		f.flush()
	}
	f.inInterval = false
	f.run++
}

// flush logs the pending failures; f.mu is held and f.pending > 0.
func (f *Log) flush() {
	f.log.Warn(f.msg, append([]any{"err", f.lastErr, "failures", f.pending, "total", f.total}, f.attrs...)...)
	f.pending, f.lastErr = 0, nil
}

// Close stops the interval timer and logs the failures counted since the
// last line, if any, so none goes unreported at shutdown. It returns nil.
func (f *Log) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.stop != nil {
		f.stop()
	}
	if f.pending > 0 {
		f.flush()
	}
	return nil
}

// Total returns the number of failures recorded since start.
func (f *Log) Total() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
