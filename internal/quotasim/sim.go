// Package quotasim is a deterministic simulator of a global quota leased
// to several data planes (issue 22): the control plane's ledger
// (controlplane/quotaledger), one lease holder per data plane
// (dataplane/lease), and between them a network with delay, loss,
// duplication and partitions, a control plane that crashes and restarts
// from its last persisted state, and data planes whose holder is replaced
// by one with a higher fencing token. A virtual clock and a seeded RNG make
// every run a function of (Case, seed); the simulator is single-threaded.
//
// Run checks the invariants as it goes (Result.Violations) and measures
// what was admitted per period; the tests assert the bounds.
package quotasim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/dataplane/lease"
)

// Cut partitions data plane DataPlane (index) from the control plane from
// From to To (virtual time since the start): messages either way are lost.
type Cut struct {
	DataPlane int
	From, To  time.Duration
}

// Crash stops the control plane at At for Down. The first message it
// handles from At on is applied but its answer is lost; half the time
// (by the RNG) the state it made was persisted first. It restarts from its
// last persisted state, read back through JSON.
type Crash struct {
	At, Down time.Duration
}

// Churn replaces data plane DataPlane's holders at At by new ones with the
// next fencing token, restored from their state (what the data plane's
// Redis keeps). Messages the old holders sent are still delivered.
type Churn struct {
	DataPlane int
	At        time.Duration
}

// Case is one scenario.
type Case struct {
	Name string
	// Quota is Q per Period; Periods periods are run.
	Quota   int64
	Period  time.Duration
	Periods int
	// Offered is the units offered per period over all data planes, split
	// by Split (percent, one per data plane); with Rotate the split moves
	// by one data plane every period.
	Offered int64
	Split   []int
	Rotate  bool
	Mode    lease.Mode
	// Floor is every data plane's floor (reserved, optimistic).
	Floor int64
	// Delay of a message is uniform in [DelayMin, DelayMax]; each message
	// is lost with probability Loss, else duplicated with probability Dup
	// (the copy with its own delay, so copies reorder).
	DelayMin, DelayMax time.Duration
	Loss, Dup          float64
	Cuts               []Cut
	Crashes            []Crash
	Churns             []Churn
	// NoDebit is the negative control: the ledger's state is put back after
	// every grant, so grants are not debited.
	NoDebit bool
	// Step is the virtual time step (default 200 ms; a message is
	// delivered at the first step at or after its arrival); Drain the time
	// run after the last period, with no cut, for final reports (default
	// 20 s).
	Step, Drain time.Duration
}

// PeriodResult is what one period admitted.
type PeriodResult struct {
	// Admitted is Σ over data planes, PerDataPlane each one's.
	Admitted     int64
	PerDataPlane []int64
	// Bound is the entry's Bound (Q, or Q + Σ floors when optimistic);
	// SpentFloorBound is Q + Σ floors of the data planes that spent floor
	// (Q when not optimistic).
	Bound, SpentFloorBound int64
	// LedgerSpent is Σ the ledger's usage after the drain.
	LedgerSpent int64
}

// Result is one run.
type Result struct {
	Periods []PeriodResult
	// Violations lists every invariant found broken during the run: the
	// ledger's committed ≠ Σ debits, a lease a holder spends that the
	// ledger does not have (or has with another amount).
	Violations []string
	// Mismatches lists, after the drain, every difference between the
	// ledger's usage and the data planes' true spend and counts, and
	// every lease left unreleased.
	Mismatches []string
	// Grants, Reports and Fenced count messages the ledger handled and
	// refusals for stale tokens.
	Grants, Reports, Fenced int
	// Restarts counts the control plane's restarts from its stored state.
	Restarts int
}

// t0 is the virtual clock's start (the control plane's clock).
func t0() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

type grantRefusal struct {
	id  lease.RequestID
	why lease.Refusal
}

type reportRefusal struct {
	entry lease.EntryKey
	token uint64
	why   lease.Refusal
}

type message struct {
	due     time.Duration
	seq     uint64
	toCP    bool
	dp      int
	payload any
}

type dataPlane struct {
	name    string
	token   uint64
	offset  time.Duration
	drift   float64
	holders map[int]*lease.Holder // by period
}

type sim struct {
	c      Case
	rng    *rand.Rand
	now    time.Duration
	seq    uint64
	queue  []message
	ledger *quotaledger.Ledger // nil while down
	// store is the ledger's persisted state while the control plane is
	// down (nil while it is up). The control plane persists every entry it
	// changed before it answers, so while it is up the stored state is the
	// live ledger's, and the simulator copies it only at a crash: the state
	// after the crashing message if that was persisted, else before it.
	store     []quotaledger.State
	downUntil time.Duration
	crashNext bool
	crashes   []Crash
	dps       []*dataPlane
	opened    map[int]bool
	admitted  [][]int64
	floor     [][]int64
	refused   [][]int64
	res       Result
}

func (s *sim) key(k int) lease.EntryKey {
	return lease.EntryKey{Consumer: "consumer", Scope: "api", PeriodStart: t0().Add(time.Duration(k) * s.c.Period), Epoch: 1}
}

func (s *sim) local(d *dataPlane) time.Time {
	return t0().Add(d.offset + time.Duration(float64(s.now)*(1+d.drift)))
}

func (s *sim) cut(dp int) bool {
	for _, c := range s.c.Cuts {
		if c.DataPlane == dp && s.now >= c.From && s.now < c.To && s.now < time.Duration(s.c.Periods)*s.c.Period {
			return true
		}
	}
	return false
}

func (s *sim) send(toCP bool, dp int, payload any) {
	if s.cut(dp) || s.rng.Float64() < s.c.Loss {
		return
	}
	copies := 1
	if s.rng.Float64() < s.c.Dup {
		copies = 2
	}
	for range copies {
		d := s.c.DelayMin
		if s.c.DelayMax > s.c.DelayMin {
			d += time.Duration(s.rng.Int64N(int64(s.c.DelayMax - s.c.DelayMin)))
		}
		s.seq++
		s.queue = append(s.queue, message{due: s.now + d, seq: s.seq, toCP: toCP, dp: dp, payload: payload})
	}
}

func (s *sim) floors() map[string]int64 {
	if s.c.Mode == lease.Strict {
		return nil
	}
	f := map[string]int64{}
	for _, d := range s.dps {
		f[d.name] = s.c.Floor
	}
	return f
}

func (s *sim) openEntries() {
	if s.ledger == nil {
		return
	}
	for k := 0; k < s.c.Periods && time.Duration(k)*s.c.Period <= s.now; k++ {
		if s.opened[k] {
			continue
		}
		if _, err := s.ledger.Open(quotaledger.Config{Key: s.key(k), Quota: s.c.Quota, Period: s.c.Period, Mode: s.c.Mode, Floors: s.floors()}); err != nil {
			s.res.Violations = append(s.res.Violations, fmt.Sprintf("open period %d: %v", k, err))
		}
		s.opened[k] = true
	}
}

func refusalOf(err error) lease.Refusal {
	if err == nil {
		return 0
	}
	if errors.Is(err, quotaledger.ErrStaleToken) {
		return lease.RefusedStaleToken
	}
	return lease.RefusedUnknownEntry
}

func (s *sim) handleCP(m message) {
	var reply any
	var before []quotaledger.State
	if s.crashNext || s.c.NoDebit {
		before = s.ledger.State()
	}
	switch p := m.payload.(type) {
	case lease.GrantRequest:
		s.res.Grants++
		g, err := s.ledger.Grant(t0().Add(s.now), p)
		if s.c.NoDebit {
			l, rerr := quotaledger.RestoreLedger(before)
			if rerr != nil {
				panic(rerr)
			}
			s.ledger = l
		}
		if err != nil {
			if refusalOf(err) == lease.RefusedStaleToken {
				s.res.Fenced++
			}
			reply = grantRefusal{id: p.ID, why: refusalOf(err)}
		} else {
			reply = g
		}
	case lease.Report:
		s.res.Reports++
		a, err := s.ledger.Report(t0().Add(s.now), p)
		if err != nil {
			if refusalOf(err) == lease.RefusedStaleToken {
				s.res.Fenced++
			}
			reply = reportRefusal{entry: p.Entry, token: p.Token, why: refusalOf(err)}
		} else {
			reply = a
		}
	}
	if s.crashNext {
		// Crash while answering: the answer is lost, and the state it made
		// reached the store or not.
		s.crashNext = false
		s.store = before
		if s.rng.IntN(2) == 0 {
			s.store = s.ledger.State()
		}
		s.ledger = nil
		return
	}
	// Here the real control plane persists the entry, then answers.
	s.send(false, m.dp, reply)
}

func (s *sim) handleDP(m message) {
	d := s.dps[m.dp]
	local := s.local(d)
	switch p := m.payload.(type) {
	case lease.Grant:
		if h := d.holders[s.period(p.Entry)]; h != nil {
			h.HandleGrant(local, p)
		}
	case grantRefusal:
		for _, h := range d.holders {
			h.HandleGrantRefusal(local, p.id, p.why)
		}
	case lease.ReportAck:
		if h := d.holders[s.period(p.Entry)]; h != nil {
			h.HandleAck(local, p)
		}
	case reportRefusal:
		if h := d.holders[s.period(p.entry)]; h != nil {
			h.HandleReportRefusal(local, p.token, p.why)
		}
	}
}

// period is the period of entry key.
func (s *sim) period(key lease.EntryKey) int {
	return int(key.PeriodStart.Sub(t0()) / s.c.Period)
}

func (s *sim) options(d *dataPlane, k int) lease.Options {
	o := lease.Options{DataPlane: d.name, Token: d.token, Entry: s.key(k), Mode: s.c.Mode}
	if s.c.Mode != lease.Strict {
		o.Floor = s.c.Floor
	}
	return o
}

func poisson(r *rand.Rand, lambda float64) int64 {
	if lambda <= 0 {
		return 0
	}
	if lambda > 30 {
		return max(0, int64(math.Round(lambda+math.Sqrt(lambda)*r.NormFloat64())))
	}
	l, k, p := math.Exp(-lambda), int64(0), 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// audit checks that the ledger's committed equals Σ debits in every entry
// and that every lease a holder spends is in the persisted ledger with the
// amount the holder spends.
func (s *sim) audit() {
	if s.ledger == nil {
		return // down: checked at its restart (Restore audits)
	}
	l := s.ledger
	if err := l.Audit(); err != nil {
		s.res.Violations = append(s.res.Violations, fmt.Sprintf("t=%v: %v", s.now, err))
	}
	if s.c.NoDebit {
		return
	}
	for _, d := range s.dps {
		for ks, h := range d.holders {
			e := l.Entry(s.key(ks))
			if e == nil {
				continue // the entry's opening was not persisted yet: the holder holds nothing
			}
			for _, hl := range h.Leases() {
				ll, ok := e.Lease(hl.ID)
				if !ok || ll.Amount != hl.Amount {
					s.res.Violations = append(s.res.Violations, fmt.Sprintf("t=%v: %s spends lease %s of %d, the ledger has %v %d", s.now, d.name, hl.ID, hl.Amount, ok, ll.Amount))
				}
			}
		}
	}
}

// Run runs one case with one seed.
func Run(c Case, seed uint64) Result {
	if c.Step <= 0 {
		c.Step = 200 * time.Millisecond
	}
	if c.Drain <= 0 {
		c.Drain = 20 * time.Second
	}
	s := &sim{c: c, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), ledger: quotaledger.New(), opened: map[int]bool{}}
	s.crashes = slices.Clone(c.Crashes)
	n := len(c.Split)
	for i := range n {
		s.dps = append(s.dps, &dataPlane{
			name:    fmt.Sprintf("dp%d", i+1),
			token:   1,
			offset:  time.Duration(s.rng.Int64N(int64(4*time.Second))) - 2*time.Second,
			drift:   (s.rng.Float64()*2 - 1) * 1e-4,
			holders: map[int]*lease.Holder{},
		})
	}
	for range c.Periods {
		s.admitted = append(s.admitted, make([]int64, n))
		s.floor = append(s.floor, make([]int64, n))
		s.refused = append(s.refused, make([]int64, n))
	}
	end := time.Duration(c.Periods)*c.Period + c.Drain
	churns := slices.Clone(c.Churns)
	for s.now = 0; s.now <= end; s.now += c.Step {
		// The control plane: crash, restart, open the period's entry.
		if len(s.crashes) > 0 && s.now >= s.crashes[0].At && s.ledger != nil && !s.crashNext {
			s.crashNext = true
			s.downUntil = s.now + s.crashes[0].Down
			s.crashes = s.crashes[1:]
		}
		if s.ledger == nil && s.now >= s.downUntil {
			b, err := json.Marshal(s.store)
			var st []quotaledger.State
			if err == nil {
				err = json.Unmarshal(b, &st)
			}
			if err == nil {
				s.ledger, err = quotaledger.RestoreLedger(st)
			}
			if err != nil {
				panic(fmt.Sprintf("quotasim: restart: %v", err))
			}
			s.store = nil
			s.res.Restarts++
		}
		s.openEntries()
		// Data-plane churn.
		for len(churns) > 0 && s.now >= churns[0].At {
			d := s.dps[churns[0].DataPlane]
			churns = churns[1:]
			d.token++
			for ks, h := range d.holders {
				d.holders[ks] = lease.Restore(s.options(d, ks), h.State())
			}
		}
		// The network.
		slices.SortFunc(s.queue, func(a, b message) int {
			if a.due != b.due {
				return int(a.due - b.due)
			}
			return int(a.seq - b.seq)
		})
		due := 0
		for due < len(s.queue) && s.queue[due].due <= s.now {
			due++
		}
		batch := slices.Clone(s.queue[:due])
		s.queue = s.queue[due:]
		for _, m := range batch {
			if s.cut(m.dp) {
				continue
			}
			if m.toCP {
				if s.ledger != nil {
					s.handleCP(m)
				}
				continue
			}
			s.handleDP(m)
		}
		// The data planes: demand, then what the holders send.
		k := int(s.now / c.Period)
		for i, d := range s.dps {
			local := s.local(d)
			if k < c.Periods {
				h := d.holders[k]
				if h == nil {
					h = lease.NewHolder(local, s.options(d, k))
					d.holders[k] = h
				}
				share := c.Split[(i+k)%n]
				if !c.Rotate {
					share = c.Split[i]
				}
				rate := float64(c.Offered) * float64(share) / 100 / c.Period.Seconds()
				offered := poisson(s.rng, rate*c.Step.Seconds())
				got := h.Take(local, offered)
				s.admitted[k][i] += got
				s.refused[k][i] += offered - got
				s.floor[k][i] = h.FloorSpent()
			}
			for p := range c.Periods {
				h := d.holders[p]
				if h == nil {
					continue
				}
				if p < k && h.Done() {
					delete(d.holders, p) // its period is over and the ledger has all it knows
					continue
				}
				req, rep := h.Poll(local)
				if req != nil {
					s.send(true, i, *req)
				}
				if rep != nil {
					s.send(true, i, *rep)
				}
			}
		}
		if s.now%time.Second == 0 {
			s.audit()
		}
	}
	s.audit()
	s.finish()
	return s.res
}

func (s *sim) finish() {
	l := s.ledger
	if l == nil {
		s.res.Violations = append(s.res.Violations, "the control plane is down at the end of the drain")
		return
	}
	for k := range s.c.Periods {
		pr := PeriodResult{PerDataPlane: slices.Clone(s.admitted[k]), Bound: s.c.Quota, SpentFloorBound: s.c.Quota}
		for i := range s.dps {
			pr.Admitted += s.admitted[k][i]
			if s.c.Mode == lease.Optimistic && s.floor[k][i] > 0 {
				pr.SpentFloorBound += s.c.Floor
			}
		}
		e := l.Entry(s.key(k))
		if e == nil {
			s.res.Mismatches = append(s.res.Mismatches, fmt.Sprintf("period %d: no entry", k))
			s.res.Periods = append(s.res.Periods, pr)
			continue
		}
		pr.Bound = e.Bound()
		usage := map[string]quotaledger.Usage{}
		for _, u := range e.Usage() {
			usage[u.DataPlane] = u
			pr.LedgerSpent += u.Spent
		}
		for i, d := range s.dps {
			u := usage[d.name]
			if u.Spent != s.admitted[k][i] || u.Admitted != s.admitted[k][i] || u.Refused != s.refused[k][i] || u.FloorSpent != s.floor[k][i] || u.Outstanding != 0 {
				s.res.Mismatches = append(s.res.Mismatches, fmt.Sprintf("period %d %s: ledger spent %d admitted %d refused %d floor %d outstanding %d; true admitted %d refused %d floor %d",
					k, d.name, u.Spent, u.Admitted, u.Refused, u.FloorSpent, u.Outstanding, s.admitted[k][i], s.refused[k][i], s.floor[k][i]))
			}
		}
		s.res.Periods = append(s.res.Periods, pr)
	}
}
