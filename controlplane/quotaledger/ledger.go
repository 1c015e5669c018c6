// Package quotaledger is the control plane's side of a global quota shared
// by several data planes: a ledger of leased budgets. Each data plane's
// lease holder (package dataplane/lease) asks for chunks of the quota and
// reports what it spent; the ledger never grants more than is left, so the
// sum admitted over all data planes stays within the quota Q without any
// request waiting on the control plane.
//
// The idea of leasing capacity to clients for a bounded time, and of
// letting them run on what they hold while the server is away, comes from
// Google's Doorman (github.com/youtube/doorman). Doorman loses its state on
// a master election and publishes 106 % of capacity at worst; this ledger
// keeps a serializable state (State, Restore) that the control plane
// persists before it answers, so a restart or failover honours every lease
// granted and grants none twice. Lease holders are fenced with tokens
// (Martin Kleppmann, "How to do distributed locking", 2016): a holder whose
// token is below the highest the ledger has seen for its data plane is
// refused.
//
// # Invariants (per entry)
//
//   - committed = Σ over leases of (Amount if not released, else Spent)
//   - Σ floors (reserved mode) + Σ floor spent reported (optimistic mode).
//   - A grant is min(want, Q − committed), never negative, and raises
//     committed by itself: committed ≤ Q after every grant.
//   - A lease's debit falls from Amount to Spent only on a final report,
//     which the holder sends only after it stopped spending the lease; an
//     expired lease that was never reported stays debited at Amount.
//   - A request ID names at most one lease, and a repeated request is
//     answered from the ledger (never granted again).
//
// Since a holder never spends more than a lease's Amount, each lease's
// debit bounds what was spent on it, so Σ spent on leases ≤ committed ≤ Q.
// Reserved floors are inside committed (Σ ≤ Q); optimistic floor spent is
// outside it until reported, hence the bound Q + Σ floors of the data
// planes that spent floor (Entry.Bound).
//
// Time is an argument (now time.Time), as in golang.org/x/time/rate: the
// ledger reads no clock and starts no goroutine. It is not safe for
// concurrent use; the control plane serialises calls per entry.
package quotaledger

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

// DefaultLeaseDuration is the lease duration when Config.LeaseDuration is 0.
const DefaultLeaseDuration = 10 * time.Second

// ErrStaleToken is wrapped by the error of a request from a lease holder
// whose fencing token is below the highest seen for its data plane.
var ErrStaleToken = errors.New("quotaledger: stale fencing token")

// ErrUnknownEntry is returned for a request naming an entry the ledger has
// not opened.
var ErrUnknownEntry = errors.New("quotaledger: unknown entry")

// StaleTokenError is a refusal for a fenced-off lease holder. It wraps
// ErrStaleToken.
type StaleTokenError struct {
	DataPlane string
	Token     uint64 // the request's
	Highest   uint64 // the highest seen for DataPlane
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("quotaledger: data plane %q: fencing token %d is below %d", e.DataPlane, e.Token, e.Highest)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// Config opens an entry.
type Config struct {
	Key lease.EntryKey `json:"key"`
	// Quota is Q, the units admitted over all data planes in the period.
	Quota int64 `json:"quota"`
	// Period is the quota period; the entry grants nothing from
	// Key.PeriodStart + Period on.
	Period time.Duration `json:"period"`
	Mode   lease.Mode    `json:"mode"`
	// Floors are the known data planes' floors (units) in reserved and
	// optimistic modes; ignored in strict mode. A data plane not listed
	// has none.
	Floors map[string]int64 `json:"floors,omitempty"`
	// LeaseDuration is how long a grant may be spent (DefaultLeaseDuration
	// when 0), cut to the period's end.
	LeaseDuration time.Duration `json:"lease_duration"`
}

// LeaseState is one lease in the ledger.
type LeaseState struct {
	// ID is the request that produced the lease.
	ID     lease.RequestID `json:"id"`
	Amount int64           `json:"amount"`
	// Granted and Expiry are in the ledger's clock.
	Granted time.Time `json:"granted"`
	Expiry  time.Time `json:"expiry"`
	// PeriodLeft and Remaining are as first answered. A repeat answers
	// Remaining as it was and counts the period left (and the lease's
	// duration) from its own moment.
	PeriodLeft time.Duration `json:"period_left"`
	Remaining  int64         `json:"remaining"`
	// Spent is the largest cumulative spend reported.
	Spent int64 `json:"spent"`
	// Released is set by a final report: the debit is Spent from then on.
	Released bool `json:"released"`
}

// Debit is what the lease holds of the quota: Amount until it is
// released, then the final Spent.
func (l LeaseState) Debit() int64 {
	if l.Released {
		return l.Spent
	}
	return l.Amount
}

// DataPlaneState is the ledger's record of one data plane in an entry.
type DataPlaneState struct {
	// Token is the highest fencing token seen; GrantSeq and ReportSeq the
	// highest grant request and applied report under it.
	Token     uint64 `json:"token"`
	GrantSeq  uint64 `json:"grant_seq"`
	ReportSeq uint64 `json:"report_seq"`
	// FloorSpent, Admitted and Refused are the largest reported.
	FloorSpent int64 `json:"floor_spent"`
	Admitted   int64 `json:"admitted"`
	Refused    int64 `json:"refused"`
}

// State is an entry's whole state: plain data with JSON tags, to be stored
// (bbolt, PostgreSQL) before the answers it produced are sent.
type State struct {
	Config     Config                    `json:"config"`
	Committed  int64                     `json:"committed"`
	Leases     []LeaseState              `json:"leases"`
	DataPlanes map[string]DataPlaneState `json:"data_planes"`
}

// Entry is one ledger entry. Make it with Open or Restore.
type Entry struct {
	st    State
	index map[lease.RequestID]int // into st.Leases
}

// Open starts an entry. In reserved mode the floors are debited now.
func Open(c Config) (*Entry, error) {
	if c.Quota < 0 {
		return nil, fmt.Errorf("quotaledger: quota %d is negative", c.Quota)
	}
	if c.Period <= 0 {
		return nil, fmt.Errorf("quotaledger: period %v is not positive", c.Period)
	}
	if c.LeaseDuration < 0 {
		return nil, fmt.Errorf("quotaledger: lease duration %v is negative", c.LeaseDuration)
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	var floors int64
	for dp, f := range c.Floors {
		if f < 0 {
			return nil, fmt.Errorf("quotaledger: data plane %q: floor %d is negative", dp, f)
		}
		floors += f
	}
	if c.Mode == lease.Strict {
		c.Floors = nil
		floors = 0
	}
	if c.Mode == lease.Reserved && floors > c.Quota {
		return nil, fmt.Errorf("quotaledger: reserved floors %d exceed the quota %d", floors, c.Quota)
	}
	c.Floors = copyMap(c.Floors)
	e := &Entry{st: State{Config: c, DataPlanes: map[string]DataPlaneState{}}, index: map[lease.RequestID]int{}}
	if c.Mode == lease.Reserved {
		e.st.Committed = floors
	}
	return e, nil
}

// Restore makes an entry from a State (a copy is kept). It checks the
// invariant committed = Σ debits first.
func Restore(s State) (*Entry, error) {
	e := &Entry{st: copyState(s), index: make(map[lease.RequestID]int, len(s.Leases))}
	if e.st.DataPlanes == nil {
		e.st.DataPlanes = map[string]DataPlaneState{}
	}
	for i, l := range e.st.Leases {
		if _, dup := e.index[l.ID]; dup {
			return nil, fmt.Errorf("quotaledger: restore: lease %s twice", l.ID)
		}
		e.index[l.ID] = i
	}
	// The negative control's ledger (undebitedLeases) breaks the audit's
	// invariant on purpose; it must still restore, so that it goes on
	// granting and the harness sees the overshoot.
	if err := e.Audit(); err != nil && !undebitedLeases {
		return nil, fmt.Errorf("quotaledger: restore: %w", err)
	}
	return e, nil
}

// State returns a deep copy of the entry's state.
func (e *Entry) State() State { return copyState(e.st) }

// Key is the entry's key.
func (e *Entry) Key() lease.EntryKey { return e.st.Config.Key }

// Config is the configuration the entry was opened with.
func (e *Entry) Config() Config {
	c := e.st.Config
	c.Floors = copyMap(c.Floors)
	return c
}

// Committed is the units of Q debited: leases, and floors by mode.
func (e *Entry) Committed() int64 { return e.st.Committed }

// Remaining is Q − committed, at least 0.
func (e *Entry) Remaining() int64 { return max(0, e.st.Config.Quota-e.st.Committed) }

// Leases returns a copy of the entry's leases in the order granted.
func (e *Entry) Leases() []LeaseState { return slices.Clone(e.st.Leases) }

// Bound is the most the entry guarantees admitting over all data planes:
// Q in strict and reserved modes, Q + Σ floors in optimistic mode.
func (e *Entry) Bound() int64 {
	c := e.st.Config
	if c.Mode != lease.Optimistic {
		return c.Quota
	}
	b := c.Quota
	for _, f := range c.Floors {
		b += f
	}
	return b
}

// ObservedBound is Q plus the floors of the data planes that have reported
// floor spent (optimistic mode): the bound once every data plane that
// spent floor has reported it.
func (e *Entry) ObservedBound() int64 {
	c := e.st.Config
	if c.Mode != lease.Optimistic {
		return c.Quota
	}
	b := c.Quota
	for dp, s := range e.st.DataPlanes {
		if s.FloorSpent > 0 {
			b += c.Floors[dp]
		}
	}
	return b
}

func (e *Entry) floorDebit() int64 {
	c := e.st.Config
	var d int64
	switch c.Mode {
	case lease.Reserved:
		for _, f := range c.Floors {
			d += f
		}
	case lease.Optimistic:
		for _, s := range e.st.DataPlanes {
			d += s.FloorSpent
		}
	}
	return d
}

// Audit recomputes committed from the leases and floors and reports a
// difference as an error: no budget granted twice, none lost.
func (e *Entry) Audit() error {
	sum := e.floorDebit()
	for _, l := range e.st.Leases {
		sum += l.Debit()
	}
	if sum != e.st.Committed {
		return fmt.Errorf("quotaledger: entry %s: committed %d, leases and floors sum to %d", e.st.Config.Key, e.st.Committed, sum)
	}
	return nil
}

// grantOf is lease l's grant answered at now to a request sent at sentAt
// (the holder's clock, echoed): its duration and the period left are
// counted from now, so a repeat answered long after the grant does not
// lengthen them.
func (e *Entry) grantOf(l LeaseState, now, sentAt time.Time) lease.Grant {
	end := e.st.Config.Key.PeriodStart.Add(e.st.Config.Period)
	if now.Before(l.Granted) {
		now = l.Granted // a clock stepped back: never lengthen the lease
	}
	return lease.Grant{
		Entry:      e.st.Config.Key,
		ID:         l.ID,
		Amount:     l.Amount,
		Duration:   max(0, l.Expiry.Sub(now)),
		PeriodLeft: max(0, end.Sub(now)),
		Remaining:  l.Remaining,
		Floor:      e.st.Config.Floors[l.ID.DataPlane],
		Mode:       e.st.Config.Mode,
		SentAt:     sentAt,
	}
}

// Grant answers a request for budget at now: min(req.Want, Q − committed)
// units, for the lease duration cut to the period's end. A request the
// entry has answered before gets the same answer and changes nothing: the
// lease it produced, or nothing when it produced none (the grant's
// Duration and PeriodLeft counted from now, and req.SentAt echoed, as in
// every answer). A request from a
// token below the data plane's highest is refused with a
// *StaleTokenError, unless it is the repeat of a request that produced a
// lease (a new holder taking over its predecessor's last request, which
// grants nothing new).
func (e *Entry) Grant(now time.Time, req lease.GrantRequest) (lease.Grant, error) {
	c := e.st.Config
	if req.Entry.ID() != c.Key.ID() {
		return lease.Grant{}, fmt.Errorf("%w: %s (this entry is %s)", ErrUnknownEntry, req.Entry, c.Key)
	}
	if i, ok := e.index[req.ID]; ok {
		return e.grantOf(e.st.Leases[i], now, req.SentAt), nil
	}
	dp := e.st.DataPlanes[req.ID.DataPlane]
	if req.ID.Token < dp.Token {
		return lease.Grant{}, &StaleTokenError{DataPlane: req.ID.DataPlane, Token: req.ID.Token, Highest: dp.Token}
	}
	end := c.Key.PeriodStart.Add(c.Period)
	periodLeft := max(0, end.Sub(now))
	zero := lease.Grant{Entry: c.Key, ID: req.ID, PeriodLeft: periodLeft, Remaining: e.Remaining(),
		Floor: c.Floors[req.ID.DataPlane], Mode: c.Mode, SentAt: req.SentAt}
	if req.ID.Token == dp.Token && req.ID.Seq <= dp.GrantSeq {
		// Answered before with nothing (a lease would be in the index).
		return zero, nil
	}
	if req.ID.Token > dp.Token {
		dp = DataPlaneState{Token: req.ID.Token, FloorSpent: dp.FloorSpent, Admitted: dp.Admitted, Refused: dp.Refused}
	}
	dp.GrantSeq = req.ID.Seq
	e.st.DataPlanes[req.ID.DataPlane] = dp
	amount := min(max(req.Want, 0), e.Remaining())
	if periodLeft <= 0 || amount == 0 {
		return zero, nil
	}
	if !undebitedLeases {
		e.st.Committed += amount
	}
	l := LeaseState{
		ID:         req.ID,
		Amount:     amount,
		Granted:    now,
		Expiry:     now.Add(min(c.LeaseDuration, periodLeft)),
		PeriodLeft: periodLeft,
		Remaining:  e.Remaining(),
	}
	e.index[l.ID] = len(e.st.Leases)
	e.st.Leases = append(e.st.Leases, l)
	return e.grantOf(l, now, req.SentAt), nil
}

// Report applies a holder's cumulative report at now and returns its
// acknowledgement. Every figure is kept by maximum, so a report that is
// lost, repeated or arrives out of order changes nothing wrong; one whose
// Seq is not above the last applied under its token is acknowledged and
// ignored. A final lease spend releases the lease: Amount − Spent returns
// to the pool. Spends on leases the entry does not have, or that belong to
// another data plane, are ignored; a spend above a lease's amount, or a
// floor spent above the data plane's floor, counts as that amount or
// floor. A report from a stale token is refused with a *StaleTokenError.
func (e *Entry) Report(now time.Time, rep lease.Report) (lease.ReportAck, error) {
	c := e.st.Config
	if rep.Entry.ID() != c.Key.ID() {
		return lease.ReportAck{}, fmt.Errorf("%w: %s (this entry is %s)", ErrUnknownEntry, rep.Entry, c.Key)
	}
	ack := lease.ReportAck{Entry: c.Key, DataPlane: rep.DataPlane, Token: rep.Token, Seq: rep.Seq}
	dp := e.st.DataPlanes[rep.DataPlane]
	switch {
	case rep.Token < dp.Token:
		return lease.ReportAck{}, &StaleTokenError{DataPlane: rep.DataPlane, Token: rep.Token, Highest: dp.Token}
	case rep.Token > dp.Token:
		dp = DataPlaneState{Token: rep.Token, FloorSpent: dp.FloorSpent, Admitted: dp.Admitted, Refused: dp.Refused}
	case rep.Seq <= dp.ReportSeq:
		return ack, nil
	}
	dp.ReportSeq = rep.Seq
	for _, s := range rep.Leases {
		i, ok := e.index[s.Lease]
		if !ok || s.Lease.DataPlane != rep.DataPlane {
			continue
		}
		l := &e.st.Leases[i]
		before := l.Debit()
		// A lease admits at most its amount: more reported is a faulty
		// or hostile data plane's number, not units spent.
		l.Spent = max(l.Spent, min(s.Spent, l.Amount))
		if s.Final {
			l.Released = true
		}
		e.st.Committed += l.Debit() - before
	}
	// Likewise a floor admits at most the data plane's floor.
	floorSpent := min(rep.FloorSpent, c.Floors[rep.DataPlane])
	if c.Mode == lease.Optimistic && floorSpent > dp.FloorSpent {
		e.st.Committed += floorSpent - dp.FloorSpent
	}
	dp.FloorSpent = max(dp.FloorSpent, floorSpent)
	dp.Admitted = max(dp.Admitted, rep.Admitted)
	dp.Refused = max(dp.Refused, rep.Refused)
	e.st.DataPlanes[rep.DataPlane] = dp
	return ack, nil
}

// Usage is one data plane's use of an entry, from its reports.
type Usage struct {
	DataPlane string `json:"data_plane"`
	// Spent is Σ reported spend on the data plane's leases plus its floor
	// spent: the units admitted that the ledger knows of.
	Spent int64 `json:"spent"`
	// Leased is Σ Amount of its leases; Outstanding the leases not yet
	// released.
	Leased      int64 `json:"leased"`
	Outstanding int   `json:"outstanding"`
	FloorSpent  int64 `json:"floor_spent"`
	// Admitted and Refused are the request counts the holder reported.
	Admitted int64 `json:"admitted"`
	Refused  int64 `json:"refused"`
}

// Usage returns one Usage per data plane that has asked or reported,
// sorted by name.
func (e *Entry) Usage() []Usage {
	by := map[string]*Usage{}
	get := func(dp string) *Usage {
		u := by[dp]
		if u == nil {
			u = &Usage{DataPlane: dp}
			by[dp] = u
		}
		return u
	}
	for dp, s := range e.st.DataPlanes {
		u := get(dp)
		u.FloorSpent, u.Admitted, u.Refused = s.FloorSpent, s.Admitted, s.Refused
		u.Spent += s.FloorSpent
	}
	for _, l := range e.st.Leases {
		u := get(l.ID.DataPlane)
		u.Spent += l.Spent
		u.Leased += l.Amount
		if !l.Released {
			u.Outstanding++
		}
	}
	out := make([]Usage, 0, len(by))
	for _, u := range by {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b Usage) int {
		switch {
		case a.DataPlane < b.DataPlane:
			return -1
		case a.DataPlane > b.DataPlane:
			return 1
		}
		return 0
	})
	return out
}

func copyMap[V any](m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func copyState(s State) State {
	s.Config.Floors = copyMap(s.Config.Floors)
	s.Leases = slices.Clone(s.Leases)
	s.DataPlanes = copyMap(s.DataPlanes)
	return s
}

// Lease returns the lease made by request id, if any.
func (e *Entry) Lease(id lease.RequestID) (LeaseState, bool) {
	i, ok := e.index[id]
	if !ok {
		return LeaseState{}, false
	}
	return e.st.Leases[i], true
}
