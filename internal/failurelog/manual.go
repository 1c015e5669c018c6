package failurelog

import (
	"sync"
	"time"
)

// ManualTimers is an AfterFunc (its After method) whose calls run only
// when Fire says: tests end a Log's intervals when they choose. The zero
// value is ready; it is safe for concurrent use.
type ManualTimers struct {
	mu      sync.Mutex
	pending []func()
	delays  []time.Duration
}

// After implements AfterFunc: it records f and d, and returns a stop
// function that cancels f if Fire has not run it.
func (m *ManualTimers) After(d time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := len(m.pending)
	m.pending, m.delays = append(m.pending, f), append(m.delays, d)
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		stopped := m.pending[i] != nil
		m.pending[i] = nil
		return stopped
	}
}

// Fire runs the functions scheduled and not stopped, and returns how many
// it ran.
func (m *ManualTimers) Fire() int {
	m.mu.Lock()
	fs := m.pending
	m.pending = make([]func(), len(fs)) // keep indexes for stop
	m.mu.Unlock()
	n := 0
	for _, f := range fs {
		if f != nil {
			f()
			n++
		}
	}
	return n
}

// Delays returns the delays of every After call so far, in order.
func (m *ManualTimers) Delays() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Duration(nil), m.delays...)
}
