package quotaledger

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

// Ledger holds the open entries, one per (consumer, scope, period start,
// epoch), and routes requests to them. A new period or a quota reset (a new
// epoch) is a new entry opened beside the old one: nothing carries over,
// and the old entry still takes the final reports of its leases.
type Ledger struct {
	entries map[lease.EntryID]*Entry
}

// New returns an empty ledger.
func New() *Ledger { return &Ledger{entries: map[lease.EntryID]*Entry{}} }

// Open opens an entry. Opening a key that is open already changes
// nothing and returns the open entry (opening is idempotent, as a reset
// replayed from the change log must be).
func (l *Ledger) Open(c Config) (*Entry, error) {
	if e, ok := l.entries[c.Key.ID()]; ok {
		return e, nil
	}
	e, err := Open(c)
	if err != nil {
		return nil, err
	}
	l.entries[c.Key.ID()] = e
	return e, nil
}

// Entry returns the open entry for key, or nil.
func (l *Ledger) Entry(key lease.EntryKey) *Entry { return l.entries[key.ID()] }

// Close drops an entry (once its period is over and its usage is kept
// elsewhere).
func (l *Ledger) Close(key lease.EntryKey) { delete(l.entries, key.ID()) }

// Grant routes req to its entry (ErrUnknownEntry if none is open).
func (l *Ledger) Grant(now time.Time, req lease.GrantRequest) (lease.Grant, error) {
	e := l.entries[req.Entry.ID()]
	if e == nil {
		return lease.Grant{}, fmt.Errorf("%w: %s", ErrUnknownEntry, req.Entry)
	}
	return e.Grant(now, req)
}

// Report routes rep to its entry (ErrUnknownEntry if none is open).
func (l *Ledger) Report(now time.Time, rep lease.Report) (lease.ReportAck, error) {
	e := l.entries[rep.Entry.ID()]
	if e == nil {
		return lease.ReportAck{}, fmt.Errorf("%w: %s", ErrUnknownEntry, rep.Entry)
	}
	return e.Report(now, rep)
}

// Audit runs Entry.Audit on every entry and returns the first error.
func (l *Ledger) Audit() error {
	for _, e := range l.entries {
		if err := e.Audit(); err != nil {
			return err
		}
	}
	return nil
}

// State returns every entry's state, ordered by key.
func (l *Ledger) State() []State {
	out := make([]State, 0, len(l.entries))
	for _, e := range l.entries {
		out = append(out, e.State())
	}
	slices.SortFunc(out, func(a, b State) int { return strings.Compare(a.Config.Key.String(), b.Config.Key.String()) })
	return out
}

// RestoreLedger makes a ledger from the states State returned.
func RestoreLedger(states []State) (*Ledger, error) {
	l := New()
	for _, s := range states {
		e, err := Restore(s)
		if err != nil {
			return nil, err
		}
		k := s.Config.Key.ID()
		if _, dup := l.entries[k]; dup {
			return nil, fmt.Errorf("quotaledger: restore: entry %s twice", s.Config.Key)
		}
		l.entries[k] = e
	}
	return l, nil
}
