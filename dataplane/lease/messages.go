package lease

import (
	"encoding/json"
	"fmt"
	"time"
)

// Mode says what a data plane may spend when it holds no lease budget,
// most often because it is cut off from the control plane.
type Mode uint8

const (
	// Strict spends leases only: Σ admitted ≤ Q always; a data plane cut
	// off from the control plane refuses once its leases run out.
	Strict Mode = iota
	// Reserved gives each known data plane a floor that the ledger debits
	// at the start of the period: the data plane may spend it whenever its
	// leases are spent, connected or not, and Σ admitted ≤ Q still holds.
	Reserved
	// Optimistic gives each known data plane a floor that is not debited
	// in advance: a data plane spends it only while cut off, and reports it
	// afterwards (the ledger then debits it). Σ admitted ≤ Q + Σ floors of
	// the data planes that spent floor; the ledger reports that bound.
	Optimistic
)

// String returns strict, reserved or optimistic.
func (m Mode) String() string {
	switch m {
	case Strict:
		return "strict"
	case Reserved:
		return "reserved"
	case Optimistic:
		return "optimistic"
	}
	return fmt.Sprintf("mode(%d)", m)
}

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Strict, Reserved, Optimistic} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("lease: unknown quota mode %q (want strict, reserved or optimistic)", s)
}

// MarshalJSON writes the mode's name.
func (m Mode) MarshalJSON() ([]byte, error) { return json.Marshal(m.String()) }

// UnmarshalJSON reads a mode's name.
func (m *Mode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("lease: mode: %w", err)
	}
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// EntryKey names one ledger entry: one global quota of one consumer on one
// scope (an API, or the key's quota across APIs) in one quota period and
// one quota epoch. A reset raises the epoch, and a new period has a new
// start: either gives a new entry, and nothing carries over.
//
// Consumer is the consumer as the data plane's engine names it (a key's
// hash for API keys); Scope the counters' scope (an API's ID, or "" for a
// key's quota across APIs); Policy the ID of the policy whose quota is
// global, or "" for a key's own per-API limit (then Scope names the API).
// The control plane finds the quota, its mode and floors from Policy (or
// from the key and Scope) when it opens the entry.
//
// A GrantRequest may leave PeriodStart zero: "the period in force now".
// The control plane keeps each (consumer, scope, policy, epoch)'s first
// period start (the time of its first grant request anywhere, so a quota's
// period starts at its first request as everywhere in limitplane); periods
// follow it back to back. Its Grant names the entry with its PeriodStart,
// and reports name that.
type EntryKey struct {
	Consumer    string    `json:"consumer"`
	Scope       string    `json:"scope"`
	Policy      string    `json:"policy,omitempty"`
	PeriodStart time.Time `json:"period_start"`
	Epoch       uint64    `json:"epoch"`
}

// EntryID is an EntryKey in a comparable form, for map keys (time.Time's
// == compares locations too, so EntryKey itself is not one).
type EntryID struct {
	Consumer, Scope, Policy string
	PeriodStart             int64 // Unix nanoseconds
	Epoch                   uint64
}

// SlotID names an entry apart from its period: the consumer's quota under
// one scope, policy and epoch, whose entries follow each other period
// after period. A data plane keeps one slot (and holder) per SlotID.
type SlotID struct {
	Consumer, Scope, Policy string
	Epoch                   uint64
}

// Slot returns the slot the entry belongs to.
func (k EntryKey) Slot() SlotID {
	return SlotID{Consumer: k.Consumer, Scope: k.Scope, Policy: k.Policy, Epoch: k.Epoch}
}

// ID returns the key's comparable form.
func (k EntryKey) ID() EntryID {
	return EntryID{Consumer: k.Consumer, Scope: k.Scope, Policy: k.Policy, PeriodStart: k.PeriodStart.UnixNano(), Epoch: k.Epoch}
}

// String is "consumer|scope|policy|period start (Unix ns)|epoch".
func (k EntryKey) String() string {
	return fmt.Sprintf("%s|%s|%s|%d|%d", k.Consumer, k.Scope, k.Policy, k.PeriodStart.UnixNano(), k.Epoch)
}

// RequestID identifies one grant request: the data plane, the fencing
// token of the lease holder that sent it, and the holder's sequence
// number. It is also the ID of the lease the request produced, so a
// retried request finds its lease instead of making another.
type RequestID struct {
	DataPlane string `json:"data_plane"`
	Token     uint64 `json:"token"`
	Seq       uint64 `json:"seq"`
}

// String is "dataplane/token/seq".
func (id RequestID) String() string { return fmt.Sprintf("%s/%d/%d", id.DataPlane, id.Token, id.Seq) }

// GrantRequest asks the ledger for Want units of the entry's quota.
type GrantRequest struct {
	Entry EntryKey  `json:"entry"`
	ID    RequestID `json:"id"`
	Want  int64     `json:"want"`
	// SentAt is the holder's clock when it sent this copy of the request
	// (a retry carries a later one); the ledger echoes it in the Grant,
	// which tells the holder which send an answer is to, so the answer's
	// relative times are counted from no later than the ledger's moment
	// of answering. Zero from a holder that does not set it.
	SentAt time.Time `json:"sent_at,omitzero"`
	// After, for a request that names no period (Entry.PeriodStart zero),
	// is the start of a period the holder has finished with: the ledger
	// answers only from a later period, and refuses the request as
	// RefusedUnknownEntry while that period is still in force (the
	// holder sends it again). Zero: any period in force.
	After time.Time `json:"after,omitzero"`
}

// Grant is the ledger's answer to a GrantRequest. The same request always
// gets the same lease (ID, Amount, and the same end of spending and of the
// period), with Duration and PeriodLeft counted from the moment of each
// answer.
type Grant struct {
	Entry EntryKey  `json:"entry"`
	ID    RequestID `json:"id"`
	// Amount is the units granted, 0 ≤ Amount ≤ Want; 0 when the quota is
	// committed (or the period is over).
	Amount int64 `json:"amount"`
	// Duration is how long the lease may still be spent, counted from
	// when the ledger answered. A holder counts it from when it sent the
	// request answered (SentAt), or, without it, from its first send,
	// either of which is earlier, so only clock rate (not offset)
	// matters.
	Duration time.Duration `json:"duration"`
	// PeriodLeft is the time from the answer to the period's end, counted
	// by the holder as Duration is.
	PeriodLeft time.Duration `json:"period_left"`
	// SentAt is the request's SentAt, echoed.
	SentAt time.Time `json:"sent_at,omitzero"`
	// Remaining is Q − committed after this grant (as first answered), a
	// hint for sizing the next request.
	Remaining int64 `json:"remaining"`
	// Floor is the data plane's floor in this entry (reserved and
	// optimistic modes), Mode the entry's mode.
	Floor int64 `json:"floor"`
	Mode  Mode  `json:"mode"`
}

// LeaseSpend is a holder's cumulative spend on one lease.
type LeaseSpend struct {
	Lease RequestID `json:"lease"`
	// Spent is cumulative: the ledger keeps the maximum it has seen, so a
	// lost, repeated or reordered report changes nothing wrong.
	Spent int64 `json:"spent"`
	// Final says the holder no longer spends the lease (it expired, or was
	// returned): Spent is its final spend, and Amount − Spent goes back to
	// the pool.
	Final bool `json:"final"`
}

// Report carries a lease holder's cumulative spend for one entry.
type Report struct {
	Entry     EntryKey `json:"entry"`
	DataPlane string   `json:"data_plane"`
	Token     uint64   `json:"token"`
	// Seq grows with every report the holder sends under Token; the ledger
	// ignores a report whose Seq is not above the last it applied.
	Seq    uint64       `json:"seq"`
	Leases []LeaseSpend `json:"leases"`
	// FloorSpent, Admitted and Refused are cumulative over the holder's
	// life in this entry (units of the floor spent; requests admitted and
	// refused), kept by maximum.
	FloorSpent int64 `json:"floor_spent"`
	Admitted   int64 `json:"admitted"`
	Refused    int64 `json:"refused"`
}

// ReportAck acknowledges the report (DataPlane, Token, Seq): everything in
// it, final spends included, is in the ledger's persisted state.
type ReportAck struct {
	Entry     EntryKey `json:"entry"`
	DataPlane string   `json:"data_plane"`
	Token     uint64   `json:"token"`
	Seq       uint64   `json:"seq"`
}

// Batch is what a lease holder sends in one QuotaService.Lease call
// (dataplane/syncpb), as JSON: grant requests and reports of any number of
// entries. Every request's ID.DataPlane and every report's DataPlane must
// be the call's group.
type Batch struct {
	Grants  []GrantRequest `json:"grants,omitempty"`
	Reports []Report       `json:"reports,omitempty"`
	// Thresholds are quota thresholds the data plane's requests reached
	// (issue 23's threshold events, package dataplane/threshold), for the
	// control plane's usage; each is kept once by ID, so a repeat
	// changes nothing.
	Thresholds []ThresholdEvent `json:"thresholds,omitempty"`
}

// ThresholdEvent is one quota threshold reached: the request of
// Consumer whose spend reached Threshold percent of Policy's quota on
// API, in the period [PeriodStart, PeriodEnd) of quota epoch Epoch.
type ThresholdEvent struct {
	// ID is the event's deterministic id (threshold.EventID).
	ID string `json:"id"`
	// DataPlane is the data plane whose request reached it; the control
	// plane sets it to the call's group.
	DataPlane string `json:"data_plane"`
	Consumer  string `json:"consumer"`
	API       string `json:"api"`
	// Endpoint is the endpoint's method and canonical path for an
	// endpoint's quota ("POST /orders"); "" for the API's own.
	Endpoint    string    `json:"endpoint,omitempty"`
	Policy      string    `json:"policy"`
	Threshold   int64     `json:"threshold"`
	Epoch       uint64    `json:"epoch"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	At          time.Time `json:"at"`
}

// BatchAnswer answers a Batch: for each grant request a Grant or a
// Refused, for each report a ReportAck or a Refused, in no set order.
type BatchAnswer struct {
	Grants   []Grant     `json:"grants,omitempty"`
	Acks     []ReportAck `json:"acks,omitempty"`
	Refusals []Refused   `json:"refusals,omitempty"`
	// Thresholds is how many of the batch's Thresholds are kept (all of
	// them, or none when the call fails).
	Thresholds int `json:"thresholds,omitempty"`
}

// Refused is the ledger's refusal of one grant request (Request set) or
// one report (Report set).
type Refused struct {
	Entry   EntryKey   `json:"entry"`
	Request *RequestID `json:"request,omitempty"`
	Report  *ReportRef `json:"report,omitempty"`
	Why     Refusal    `json:"why"`
	// Error says why, for people.
	Error string `json:"error,omitempty"`
}

// ReportRef names one report: its holder's token and sequence number.
type ReportRef struct {
	Token uint64 `json:"token"`
	Seq   uint64 `json:"seq"`
}

// String returns stale_token or unknown_entry.
func (r Refusal) String() string {
	switch r {
	case RefusedStaleToken:
		return "stale_token"
	case RefusedUnknownEntry:
		return "unknown_entry"
	}
	return fmt.Sprintf("refusal(%d)", r)
}

// MarshalJSON writes the refusal's name.
func (r Refusal) MarshalJSON() ([]byte, error) { return json.Marshal(r.String()) }

// UnmarshalJSON reads a refusal's name.
func (r *Refusal) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("lease: refusal: %w", err)
	}
	for _, v := range []Refusal{RefusedStaleToken, RefusedUnknownEntry} {
		if v.String() == s {
			*r = v
			return nil
		}
	}
	return fmt.Errorf("lease: unknown refusal %q", s)
}
