package quotaledger

import (
	"fmt"
	"slices"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

// Ledger holds the open entries, one per (consumer, scope, period start,
// epoch), and routes requests to them. A new period or a quota reset (a new
// epoch) is a new entry opened beside the old one: nothing carries over,
// and the old entry still takes the final reports of its leases.
type Ledger struct {
	entries map[string]*Entry
}

// New returns an empty ledger.
func New() *Ledger { return &Ledger{entries: map[string]*Entry{}} }

// Open opens an entry. Opening a key that is open already changes
// nothing and returns the open entry (opening is idempotent, as a reset
// replayed from the change log must be).
func (l *Ledger) Open(c Config) (*Entry, error) {
	if e, ok := l.entries[c.Key.String()]; ok {
		return e, nil
	}
	e, err := Open(c)
	if err != nil {
		return nil, err
	}
	l.entries[c.Key.String()] = e
	return e, nil
}

// Entry returns the open entry for key, or nil.
func (l *Ledger) Entry(key lease.EntryKey) *Entry { return l.entries[key.String()] }

// Close drops an entry (once its period is over and its usage is kept
// elsewhere).
func (l *Ledger) Close(key lease.EntryKey) { delete(l.entries, key.String()) }

// Grant routes req to its entry (ErrUnknownEntry if none is open).
func (l *Ledger) Grant(now time.Time, req lease.GrantRequest) (lease.Grant, error) {
	e := l.entries[req.Entry.String()]
	if e == nil {
		return lease.Grant{}, fmt.Errorf("%w: %s", ErrUnknownEntry, req.Entry)
	}
	return e.Grant(now, req)
}

// Report routes rep to its entry (ErrUnknownEntry if none is open).
func (l *Ledger) Report(now time.Time, rep lease.Report) (lease.ReportAck, error) {
	e := l.entries[rep.Entry.String()]
	if e == nil {
		return lease.ReportAck{}, fmt.Errorf("%w: %s", ErrUnknownEntry, rep.Entry)
	}
	return e.Report(now, rep)
}

// State returns every entry's state, ordered by key.
func (l *Ledger) State() []State {
	keys := make([]string, 0, len(l.entries))
	for k := range l.entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]State, 0, len(keys))
	for _, k := range keys {
		out = append(out, l.entries[k].State())
	}
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
		k := s.Config.Key.String()
		if _, dup := l.entries[k]; dup {
			return nil, fmt.Errorf("quotaledger: restore: entry %s twice", k)
		}
		l.entries[k] = e
	}
	return l, nil
}
