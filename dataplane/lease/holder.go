// Package lease is the data plane's side of a global quota shared by
// several data planes: the messages a lease holder exchanges with the
// control plane's ledger (controlplane/quotaledger), and the Holder that
// asks for budget, spends it exactly and reports what it spent.
//
// The design follows Google's Doorman (github.com/youtube/doorman): clients
// hold leases of capacity for a bounded time, ask for more before they run
// out and keep spending what they hold when the server is away, so no
// request waits on the server. The holder's fencing token (Martin
// Kleppmann, "How to do distributed locking", 2016; the data plane elects
// one holder, as it elects the DRL allocator) lets the ledger refuse a
// holder that has been replaced.
//
// A Holder is for one ledger entry (consumer, scope, period, epoch). Time is
// an argument (now time.Time, the data plane's clock); a holder counts a
// lease's duration from when it first sent the request, which is before
// the ledger granted it, so a clock offset between the data plane and the
// control plane does not matter and SkewMargin covers the clocks' rate
// difference. A Holder keeps its spend in memory and is not safe for
// concurrent use; the data plane keeps the same state in its Redis.
package lease

import (
	"math"
	"slices"
	"time"
)

// Options configure a Holder. Zero durations and sizes take the defaults
// named on each field.
type Options struct {
	// DataPlane is the data plane's name, Token the holder's fencing token
	// (higher than every earlier holder's of the same data plane).
	DataPlane string
	Token     uint64
	// Entry is the ledger entry the holder spends.
	Entry EntryKey
	// Mode and Floor (units) are the quota's mode and this data plane's
	// floor, from the configuration; a grant's Floor replaces Floor.
	Mode  Mode
	Floor int64
	// Horizon is how much demand one request covers: it asks for the
	// smoothed rate × Horizon (default 10 s), cut to the period's end.
	Horizon time.Duration
	// MinRequest and MaxRequest clamp a request (units; defaults 10 and
	// no maximum).
	MinRequest, MaxRequest int64
	// LowWater: the holder asks for more when what it holds would last
	// less than LowWater at the smoothed rate (default 2 s).
	LowWater time.Duration
	// SkewMargin is cut from each lease's end (default 250 ms).
	SkewMargin time.Duration
	// ReportInterval is the time between reports (default 1 s).
	ReportInterval time.Duration
	// RetryInterval is how long an unanswered request waits before it is
	// sent again, with the same ID (default 300 ms).
	RetryInterval time.Duration
	// CutOffAfter: with no answer from the control plane for this long the
	// holder counts as cut off (optimistic floors are spent; default 3 s).
	CutOffAfter time.Duration
	// ExhaustedBackoff is the wait after a grant of nothing before the
	// holder asks again (default 1 s): budget comes back as leases end.
	ExhaustedBackoff time.Duration
	// Smoothing is the time constant of the demand rate's exponentially
	// weighted average (default 2 s).
	Smoothing time.Duration
	// Quota is the quota's max (units; 0 unknown) and LeaseDuration how
	// long a grant lasts (default 10 s, quotaledger's): a request asks for
	// no more than the smoothed rate × min(Horizon, LeaseDuration), which
	// is what the lease can be spent on, and, before the ledger has said
	// what remains, no more than half of Quota, so that the first data
	// plane to ask does not take every unit of a quota the others need.
	Quota         int64
	LeaseDuration time.Duration
	// After is the start of the period the holder follows (the runner's
	// previous holder's): while Entry.PeriodStart is zero its requests
	// carry it (GrantRequest.After), so the ledger never answers them from
	// that period. Zero for a holder that follows none.
	After time.Time
	// SeqBase is where a new holder's grant and report sequence numbers
	// start (above it): a holder that follows another of the same token on
	// the next period (the data plane's runner) starts above its
	// predecessor's, so the two never share a number.
	SeqBase uint64
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Horizon, 10*time.Second)
	def(&o.LowWater, 2*time.Second)
	def(&o.SkewMargin, 250*time.Millisecond)
	def(&o.ReportInterval, time.Second)
	def(&o.RetryInterval, 300*time.Millisecond)
	def(&o.CutOffAfter, 3*time.Second)
	def(&o.ExhaustedBackoff, time.Second)
	def(&o.Smoothing, 2*time.Second)
	def(&o.LeaseDuration, 10*time.Second)
	if o.MinRequest <= 0 {
		o.MinRequest = 10
	}
	if o.MaxRequest <= 0 {
		o.MaxRequest = math.MaxInt64
	}
	return o
}

// HeldLease is a lease the holder spends.
type HeldLease struct {
	ID     RequestID `json:"id"`
	Amount int64     `json:"amount"`
	Spent  int64     `json:"spent"`
	// StopAt (holder's clock) is when spending stops: the send of the
	// request the grant answered (its first send, for a grant that does
	// not echo GrantRequest.SentAt) + the grant's Duration − SkewMargin.
	StopAt time.Time `json:"stop_at"`
	// FinalSeq is the first report (under the current token) that carried
	// the lease as final; 0 before. Its ack drops the lease.
	FinalSeq uint64 `json:"final_seq"`
}

// PendingRequest is the grant request in flight.
type PendingRequest struct {
	Request     GrantRequest `json:"request"`
	FirstSentAt time.Time    `json:"first_sent_at"`
	SentAt      time.Time    `json:"sent_at"`
}

// State is what a holder keeps (the data plane's Redis, later): a new
// holder restored from it carries on where the old one stopped.
type State struct {
	Leases     []HeldLease     `json:"leases"`
	Pending    *PendingRequest `json:"pending,omitempty"`
	GrantSeq   uint64          `json:"grant_seq"`
	ReportSeq  uint64          `json:"report_seq"`
	FloorSpent int64           `json:"floor_spent"`
	Admitted   int64           `json:"admitted"`
	Refused    int64           `json:"refused"`
	// Rate is the smoothed demand (units per second), RateAt when it was
	// last updated, Offered the units offered since.
	Rate    float64   `json:"rate"`
	RateAt  time.Time `json:"rate_at"`
	Offered int64     `json:"offered"`
	// LastContact is the last answer from the control plane; LastReport
	// the last report sent; PeriodEnd the period's end if known (zero
	// before the first grant); Remaining the ledger's last hint (−1
	// unknown); ExhaustedUntil the end of a backoff after a zero grant.
	LastContact    time.Time `json:"last_contact"`
	LastReport     time.Time `json:"last_report"`
	PeriodEnd      time.Time `json:"period_end"`
	Remaining      int64     `json:"remaining"`
	ExhaustedUntil time.Time `json:"exhausted_until"`
	// Fenced is set when the ledger refused this holder's token.
	Fenced bool `json:"fenced"`
	// Entry is the entry the holder spends once a grant named it (a
	// request for "the period in force", PeriodStart zero, is answered
	// with the entry's PeriodStart, which the holder adopts); the zero
	// EntryKey until then (Options.Entry holds).
	Entry EntryKey `json:"entry"`
	// SeenOffered is the cumulative offered count of the last Observe.
	SeenOffered int64 `json:"seen_offered"`
	// SentSeq and the Sent* counters are the last report sent; Acked*
	// those of the last one acknowledged.
	SentSeq       uint64 `json:"sent_seq"`
	SentAdmitted  int64  `json:"sent_admitted"`
	SentRefused   int64  `json:"sent_refused"`
	SentFloor     int64  `json:"sent_floor"`
	AckedAdmitted int64  `json:"acked_admitted"`
	AckedRefused  int64  `json:"acked_refused"`
	AckFloor      int64  `json:"acked_floor"`
}

// Holder holds one data plane's leases of one ledger entry.
type Holder struct {
	o  Options
	st State
}

// NewHolder starts a holder at now with nothing held.
func NewHolder(now time.Time, o Options) *Holder {
	return &Holder{o: o.withDefaults(), st: State{LastContact: now, RateAt: now, Remaining: -1, LastReport: now, GrantSeq: o.SeqBase, ReportSeq: o.SeqBase}}
}

// Restore makes a holder from another's State, typically with a higher
// o.Token (a new holder elected in the data plane). A request its
// predecessor left unanswered is sent again under the predecessor's ID: the
// ledger answers it with the lease it made, if it made one, so no budget
// granted to the predecessor is stranded.
func Restore(o Options, s State) *Holder {
	h := &Holder{o: o.withDefaults(), st: s}
	if !s.Entry.PeriodStart.IsZero() {
		h.o.Entry = s.Entry
	}
	h.st.Leases = slices.Clone(s.Leases)
	if s.Pending != nil {
		p := *s.Pending
		h.st.Pending = &p
	}
	h.st.Fenced = false
	for i := range h.st.Leases {
		h.st.Leases[i].FinalSeq = 0 // acks of the old token's reports do not count
	}
	h.st.SentSeq = 0
	h.st.AckedAdmitted, h.st.AckedRefused, h.st.AckFloor = -1, -1, -1
	return h
}

// State returns a copy of the holder's state.
func (h *Holder) State() State {
	s := h.st
	s.Leases = slices.Clone(h.st.Leases)
	if h.st.Pending != nil {
		p := *h.st.Pending
		s.Pending = &p
	}
	return s
}

// Token is the holder's fencing token.
func (h *Holder) Token() uint64 { return h.o.Token }

// Fenced reports whether the ledger refused the holder's token: it asks
// and reports no more, and spends only what it held.
func (h *Holder) Fenced() bool { return h.st.Fenced }

// Admitted and Refused are the units the holder admitted and refused.
func (h *Holder) Admitted() int64 { return h.st.Admitted }

// Refused is the units the holder refused.
func (h *Holder) Refused() int64 { return h.st.Refused }

// FloorSpent is the units of the floor spent.
func (h *Holder) FloorSpent() int64 { return h.st.FloorSpent }

// Leases returns a copy of the leases held.
func (h *Holder) Leases() []HeldLease { return slices.Clone(h.st.Leases) }

// Done reports whether the holder has nothing left to tell the ledger: no
// lease held, no request in flight and its counters acknowledged.
func (h *Holder) Done() bool {
	return len(h.st.Leases) == 0 && h.st.Pending == nil && !h.dirty()
}

func (h *Holder) dirty() bool {
	return h.st.Admitted != h.st.AckedAdmitted || h.st.Refused != h.st.AckedRefused || h.st.FloorSpent != h.st.AckFloor
}

// CutOff reports whether the control plane has not answered for
// CutOffAfter.
func (h *Holder) CutOff(now time.Time) bool { return now.Sub(h.st.LastContact) >= h.o.CutOffAfter }

// Available is the unspent budget of the leases still live at now.
func (h *Holder) Available(now time.Time) int64 {
	var a int64
	for _, l := range h.st.Leases {
		if now.Before(l.StopAt) {
			a += l.Amount - l.Spent
		}
	}
	return a
}

func (h *Holder) floorUsable(now time.Time) bool {
	switch h.o.Mode {
	case Reserved:
		return true
	case Optimistic:
		return h.CutOff(now)
	}
	return false
}

// Take admits up to n units at now and returns how many it admitted
// (each unit one request of cost 1, batched). It spends the live lease
// that ends first, then the next; with no lease budget left it spends the
// floor when the mode allows (reserved: always; optimistic: while cut
// off; strict: never). Spending is exact: never more than a lease holds.
func (h *Holder) Take(now time.Time, n int64) int64 {
	if n <= 0 {
		return 0
	}
	h.st.Offered += n
	slices.SortStableFunc(h.st.Leases, func(a, b HeldLease) int { return a.StopAt.Compare(b.StopAt) })
	var got int64
	for i := range h.st.Leases {
		l := &h.st.Leases[i]
		if got == n {
			break
		}
		if !now.Before(l.StopAt) {
			continue
		}
		t := min(n-got, l.Amount-l.Spent)
		l.Spent += t
		got += t
	}
	if got < n && h.floorUsable(now) {
		t := min(n-got, max(0, h.o.Floor-h.st.FloorSpent))
		h.st.FloorSpent += t
		got += t
	}
	h.st.Admitted += got
	h.st.Refused += n - got
	return got
}

func (h *Holder) updateRate(now time.Time) {
	dt := now.Sub(h.st.RateAt)
	if dt < 500*time.Millisecond {
		return
	}
	inst := float64(h.st.Offered) / dt.Seconds()
	alpha := 1 - math.Exp(-dt.Seconds()/h.o.Smoothing.Seconds())
	h.st.Rate += alpha * (inst - h.st.Rate)
	h.st.RateAt, h.st.Offered = now, 0
}

// Poll returns what the holder sends at now: a grant request (new, or the
// one in flight again after RetryInterval) and a report, each nil when
// there is none. Call it often (every 10–100 ms).
func (h *Holder) Poll(now time.Time) (*GrantRequest, *Report) {
	h.updateRate(now)
	if h.st.Fenced {
		return nil, nil
	}
	return h.request(now), h.report(now)
}

func (h *Holder) request(now time.Time) *GrantRequest {
	if p := h.st.Pending; p != nil {
		if now.Sub(p.SentAt) < h.o.RetryInterval {
			return nil
		}
		p.SentAt = now
		p.Request.SentAt = now
		r := p.Request
		return &r
	}
	// A rate that has decayed below half a unit per Horizon is no demand
	// (an exponential average never reaches 0 by itself).
	if now.Before(h.st.ExhaustedUntil) || h.st.Rate*h.o.Horizon.Seconds() < 0.5 {
		return nil
	}
	horizon := min(h.o.Horizon, h.o.LeaseDuration)
	if !h.st.PeriodEnd.IsZero() {
		left := h.st.PeriodEnd.Sub(now) - h.o.SkewMargin
		if left <= 0 {
			return nil
		}
		horizon = min(horizon, left)
	}
	avail := h.Available(now)
	if float64(avail) >= h.st.Rate*h.o.LowWater.Seconds() && avail >= h.o.MinRequest {
		return nil
	}
	want := int64(math.Ceil(h.st.Rate * horizon.Seconds()))
	if left := h.st.Remaining; left >= 0 || h.o.Quota > 0 {
		// Near the end of Q ask for half of what is left, so that the
		// other data planes find some too; before the ledger has said
		// what is left, half of Q.
		if left < 0 {
			left = h.o.Quota
		}
		want = min(want, left/2)
	}
	want = min(max(want, h.o.MinRequest), h.o.MaxRequest)
	h.st.GrantSeq++
	r := GrantRequest{Entry: h.o.Entry, ID: RequestID{DataPlane: h.o.DataPlane, Token: h.o.Token, Seq: h.st.GrantSeq}, Want: want, SentAt: now}
	if h.o.Entry.PeriodStart.IsZero() {
		r.After = h.o.After
	}
	h.st.Pending = &PendingRequest{Request: r, FirstSentAt: now, SentAt: now}
	return &r
}

func (h *Holder) report(now time.Time) *Report {
	if h.o.Entry.PeriodStart.IsZero() {
		// No grant has named the entry yet: nothing to report to.
		return nil
	}
	newlyFinal := false
	for _, l := range h.st.Leases {
		if l.FinalSeq == 0 && !now.Before(l.StopAt) {
			newlyFinal = true
		}
	}
	due := now.Sub(h.st.LastReport) >= h.o.ReportInterval && (len(h.st.Leases) > 0 || h.dirty())
	if !due && !newlyFinal {
		return nil
	}
	h.st.ReportSeq++
	h.st.LastReport = now
	r := &Report{Entry: h.o.Entry, DataPlane: h.o.DataPlane, Token: h.o.Token, Seq: h.st.ReportSeq,
		FloorSpent: h.st.FloorSpent, Admitted: h.st.Admitted, Refused: h.st.Refused}
	for i := range h.st.Leases {
		l := &h.st.Leases[i]
		final := !now.Before(l.StopAt)
		if final && l.FinalSeq == 0 {
			l.FinalSeq = h.st.ReportSeq
		}
		r.Leases = append(r.Leases, LeaseSpend{Lease: l.ID, Spent: l.Spent, Final: final})
	}
	h.st.SentSeq = h.st.ReportSeq
	h.st.SentAdmitted, h.st.SentRefused, h.st.SentFloor = h.st.Admitted, h.st.Refused, h.st.FloorSpent
	return r
}

// HandleGrant takes the ledger's answer at now. An answer to anything but
// the request in flight (a duplicate), or for another slot's entry (whose
// holder may have a request of the same ID), is ignored.
func (h *Holder) HandleGrant(now time.Time, g Grant) {
	p := h.st.Pending
	if p == nil || g.ID != p.Request.ID || !sameSlot(h.o.Entry, g.Entry) {
		return
	}
	h.st.LastContact = now
	h.st.Pending = nil
	if h.o.Entry.PeriodStart.IsZero() && sameSlot(h.o.Entry, g.Entry) && !g.Entry.PeriodStart.IsZero() {
		h.o.Entry = g.Entry
		h.st.Entry = g.Entry
	}
	// The answer's times count from the ledger's moment of answering,
	// which is no earlier than the send it answers: from that send (the
	// echo, when it is one of this request's), else from the first. A
	// retry after a long cut must not count from before the cut, which
	// would put the period's end (and the lease's) in the past.
	from := p.FirstSentAt
	if !g.SentAt.IsZero() && !g.SentAt.Before(p.FirstSentAt) && !g.SentAt.After(p.SentAt) {
		from = g.SentAt
	}
	h.st.PeriodEnd = from.Add(g.PeriodLeft)
	h.st.Remaining = g.Remaining
	h.o.Floor = g.Floor
	if g.Amount <= 0 {
		h.st.ExhaustedUntil = now.Add(h.o.ExhaustedBackoff)
		return
	}
	h.st.Leases = append(h.st.Leases, HeldLease{ID: g.ID, Amount: g.Amount, StopAt: from.Add(g.Duration - h.o.SkewMargin)})
}

// Refusal is a ledger's refusal of a request or report.
type Refusal uint8

const (
	// RefusedStaleToken: the token is below the data plane's highest.
	RefusedStaleToken Refusal = iota + 1
	// RefusedUnknownEntry: the ledger has no such entry (yet), or the
	// entry's policy or key has no global quota (any more).
	RefusedUnknownEntry
)

// HandleGrantRefusal takes a refusal of grant request id at now. A stale
// token on the predecessor's request drops it (the ledger made no lease
// from it, and will not); on the holder's own token it fences the holder.
// An unknown entry leaves the request to be sent again.
func (h *Holder) HandleGrantRefusal(now time.Time, id RequestID, why Refusal) {
	p := h.st.Pending
	if p == nil || id != p.Request.ID {
		return
	}
	h.st.LastContact = now
	if why == RefusedStaleToken {
		h.st.Pending = nil
		if id.Token >= h.o.Token {
			h.st.Fenced = true
		}
	}
}

// HandleReportRefusal takes a refusal of the holder's report at now.
func (h *Holder) HandleReportRefusal(now time.Time, token uint64, why Refusal) {
	if token != h.o.Token {
		return
	}
	h.st.LastContact = now
	if why == RefusedStaleToken {
		h.st.Fenced = true
	}
}

// HandleAck takes a report's acknowledgement at now: leases whose final
// spend it covers are dropped.
func (h *Holder) HandleAck(now time.Time, a ReportAck) {
	if a.Token != h.o.Token || a.DataPlane != h.o.DataPlane {
		return
	}
	h.st.LastContact = now
	h.st.Leases = slices.DeleteFunc(h.st.Leases, func(l HeldLease) bool { return l.FinalSeq != 0 && a.Seq >= l.FinalSeq })
	if a.Seq == h.st.SentSeq {
		h.st.AckedAdmitted, h.st.AckedRefused, h.st.AckFloor = h.st.SentAdmitted, h.st.SentRefused, h.st.SentFloor
	}
}

// sameSlot reports whether a and b name the same quota apart from the
// period start.
func sameSlot(a, b EntryKey) bool { return a.Slot() == b.Slot() }

// Entry is the entry the holder spends: Options.Entry, or the one a grant
// named when Options.Entry left PeriodStart zero.
func (h *Holder) Entry() EntryKey { return h.o.Entry }

// Observed is spending done outside the holder (the data plane's Redis,
// where every gateway spends the leases): cumulative counts in the
// holder's entry.
type Observed struct {
	// Spent is the units spent per lease; a lease not listed keeps its
	// count.
	Spent map[RequestID]int64
	// Admitted, Refused, FloorSpent and Offered are cumulative units.
	Admitted, Refused, FloorSpent, Offered int64
}

// Observe takes spending done outside the holder, in place of
// Take: the leases' Spent and the counters become o's (never lower than
// the holder's), and the offered units since the last Observe feed the
// demand rate. The caller must never spend more of a lease than its
// Amount (the Redis script stops at it); Observe clamps to it anyway.
func (h *Holder) Observe(o Observed) {
	for i := range h.st.Leases {
		l := &h.st.Leases[i]
		if v, ok := o.Spent[l.ID]; ok {
			l.Spent = max(l.Spent, min(v, l.Amount))
		}
	}
	h.st.Admitted = max(h.st.Admitted, o.Admitted)
	h.st.Refused = max(h.st.Refused, o.Refused)
	h.st.FloorSpent = max(h.st.FloorSpent, o.FloorSpent)
	if d := o.Offered - h.st.SeenOffered; d > 0 {
		h.st.Offered += d
	}
	h.st.SeenOffered = max(h.st.SeenOffered, o.Offered)
}

// Floor is the data plane's floor in the entry: Options.Floor until a
// grant names the ledger's.
func (h *Holder) Floor() int64 { return h.o.Floor }

// Mode is the holder's mode (Options.Mode).
func (h *Holder) Mode() Mode { return h.o.Mode }

// CutOffAfter is Options.CutOffAfter with its default.
func (h *Holder) CutOffAfter() time.Duration { return h.o.CutOffAfter }
