package quotaledger_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/dataplane/lease"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func key(epoch uint64) lease.EntryKey {
	return lease.EntryKey{Consumer: "c", Scope: "api", PeriodStart: start, Epoch: epoch}
}

func open(t *testing.T, mode lease.Mode, floors map[string]int64) *quotaledger.Entry {
	t.Helper()
	e, err := quotaledger.Open(quotaledger.Config{Key: key(1), Quota: 1000, Period: time.Minute, Mode: mode, Floors: floors, LeaseDuration: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func req(dp string, token, seq uint64, want int64) lease.GrantRequest {
	return lease.GrantRequest{Entry: key(1), ID: lease.RequestID{DataPlane: dp, Token: token, Seq: seq}, Want: want}
}

func grant(t *testing.T, e *quotaledger.Entry, at time.Duration, r lease.GrantRequest) lease.Grant {
	t.Helper()
	g, err := e.Grant(start.Add(at), r)
	if err != nil {
		t.Fatalf("grant %s: %v", r.ID, err)
	}
	if err := e.Audit(); err != nil {
		t.Fatal(err)
	}
	return g
}

func report(t *testing.T, e *quotaledger.Entry, r lease.Report) {
	t.Helper()
	r.Entry = key(1)
	a, err := e.Report(start, r)
	if err != nil {
		t.Fatalf("report %d: %v", r.Seq, err)
	}
	if a.Seq != r.Seq || a.Token != r.Token || a.DataPlane != r.DataPlane {
		t.Fatalf("ack %+v for report %d", a, r.Seq)
	}
	if err := e.Audit(); err != nil {
		t.Fatal(err)
	}
}

func TestGrantIsBoundedAndIdempotent(t *testing.T) {
	e := open(t, lease.Strict, nil)
	g1 := grant(t, e, time.Second, req("a", 1, 1, 600))
	if g1.Amount != 600 || g1.Duration != 10*time.Second || g1.PeriodLeft != 59*time.Second || g1.Remaining != 400 {
		t.Fatalf("first grant %+v", g1)
	}
	g2 := grant(t, e, 2*time.Second, req("b", 1, 1, 600))
	if g2.Amount != 400 || g2.Remaining != 0 {
		t.Fatalf("second grant %+v, want the 400 left", g2)
	}
	// A retry (lost answer) gets the same lease and debits nothing; its
	// duration and the period left count from the retry's answer (2 s
	// later), and the retry's send time is echoed.
	r1 := req("a", 1, 1, 600)
	r1.SentAt = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // the holder's clock: any offset
	want := g1
	want.Duration, want.PeriodLeft, want.SentAt = 8*time.Second, 57*time.Second, r1.SentAt
	if again := grant(t, e, 3*time.Second, r1); again != want {
		t.Fatalf("repeat %+v, want %+v", again, want)
	}
	if e.Committed() != 1000 {
		t.Fatalf("committed %d, want 1000", e.Committed())
	}
	z := grant(t, e, 4*time.Second, req("a", 1, 2, 50))
	if z.Amount != 0 {
		t.Fatalf("grant beyond Q: %+v", z)
	}
	// b returns 300 of its 400: the zero answer stays zero when repeated,
	// and a new request gets the budget.
	report(t, e, lease.Report{DataPlane: "b", Token: 1, Seq: 1, Leases: []lease.LeaseSpend{{Lease: g2.ID, Spent: 100, Final: true}}})
	if e.Committed() != 700 {
		t.Fatalf("committed %d after release, want 700", e.Committed())
	}
	if again := grant(t, e, 5*time.Second, req("a", 1, 2, 50)); again.Amount != 0 {
		t.Fatalf("repeat of a zero answer granted %d", again.Amount)
	}
	if g := grant(t, e, 5*time.Second, req("a", 1, 3, 500)); g.Amount != 300 {
		t.Fatalf("after release: %+v, want 300", g)
	}
	if n := len(e.Leases()); n != 3 {
		t.Fatalf("%d leases, want 3", n)
	}
}

func TestLeaseEndsWithPeriod(t *testing.T) {
	e := open(t, lease.Strict, nil)
	g := grant(t, e, 55*time.Second, req("a", 1, 1, 10))
	if g.Duration != 5*time.Second || g.PeriodLeft != 5*time.Second {
		t.Fatalf("near the end: %+v", g)
	}
	if g := grant(t, e, 60*time.Second, req("a", 1, 2, 10)); g.Amount != 0 {
		t.Fatalf("after the period: %+v", g)
	}
}

func TestFencing(t *testing.T) {
	e := open(t, lease.Strict, nil)
	old := grant(t, e, 0, req("a", 1, 1, 100))
	pendingOld := req("a", 1, 2, 100) // the old holder's request, answer lost
	grant(t, e, 0, pendingOld)
	grant(t, e, time.Second, req("a", 2, 1, 100)) // the new holder
	// The new holder takes over the old holder's last request: same lease.
	if g := grant(t, e, time.Second, pendingOld); g.Amount != 100 || g.ID != pendingOld.ID {
		t.Fatalf("takeover: %+v", g)
	}
	_, err := e.Grant(start.Add(time.Second), req("a", 1, 3, 100))
	var st *quotaledger.StaleTokenError
	if !errors.Is(err, quotaledger.ErrStaleToken) || !errors.As(err, &st) || st.Token != 1 || st.Highest != 2 || st.DataPlane != "a" {
		t.Fatalf("old token's new request: %v", err)
	}
	_, err = e.Report(start, lease.Report{Entry: key(1), DataPlane: "a", Token: 1, Seq: 9, Leases: []lease.LeaseSpend{{Lease: old.ID, Spent: 0, Final: true}}})
	if !errors.Is(err, quotaledger.ErrStaleToken) {
		t.Fatalf("old token's report: %v", err)
	}
	if e.Committed() != 300 {
		t.Fatalf("committed %d, want 300 (nothing released by the fenced report)", e.Committed())
	}
	// Another data plane is not affected by a's tokens.
	grant(t, e, time.Second, req("b", 1, 1, 10))
}

func TestReportsAreCumulative(t *testing.T) {
	e := open(t, lease.Strict, nil)
	g := grant(t, e, 0, req("a", 1, 1, 500))
	g2 := grant(t, e, 0, req("a", 1, 2, 100))
	rep := func(seq uint64, spent int64, final bool) lease.Report {
		return lease.Report{DataPlane: "a", Token: 1, Seq: seq, Admitted: spent, Refused: int64(seq),
			Leases: []lease.LeaseSpend{{Lease: g.ID, Spent: spent, Final: final}, {Lease: g2.ID, Spent: 100, Final: true}}}
	}
	report(t, e, rep(2, 300, false))
	report(t, e, rep(1, 100, false)) // late, older
	report(t, e, rep(2, 300, false)) // duplicate
	l, _ := e.Lease(g.ID)
	if l.Spent != 300 || l.Released || e.Committed() != 600 {
		t.Fatalf("lease %+v committed %d, want spent 300 unreleased, committed 600", l, e.Committed())
	}
	report(t, e, rep(3, 420, true))
	report(t, e, rep(3, 420, true))
	if e.Committed() != 520 {
		t.Fatalf("committed %d after final, want 420 + 100", e.Committed())
	}
	u := e.Usage()
	if len(u) != 1 || u[0] != (quotaledger.Usage{DataPlane: "a", Spent: 520, Leased: 600, Outstanding: 0, Admitted: 420, Refused: 3}) {
		t.Fatalf("usage %+v", u)
	}
	// A report for someone else's lease, or one that does not exist, is ignored.
	report(t, e, lease.Report{DataPlane: "b", Token: 1, Seq: 1, Leases: []lease.LeaseSpend{{Lease: g.ID, Spent: 999, Final: true}, {Lease: lease.RequestID{DataPlane: "b", Token: 1, Seq: 7}, Spent: 5}}})
	if l, _ := e.Lease(g.ID); l.Spent != 420 {
		t.Fatalf("b's report changed a's lease: %+v", l)
	}
}

func TestReservedFloors(t *testing.T) {
	if _, err := quotaledger.Open(quotaledger.Config{Key: key(1), Quota: 100, Period: time.Minute, Mode: lease.Reserved, Floors: map[string]int64{"a": 60, "b": 60}}); err == nil {
		t.Fatal("floors above Q accepted")
	}
	e := open(t, lease.Reserved, map[string]int64{"a": 100, "b": 100})
	if e.Committed() != 200 || e.Bound() != 1000 {
		t.Fatalf("committed %d bound %d, want 200 and 1000", e.Committed(), e.Bound())
	}
	g := grant(t, e, 0, req("a", 1, 1, 5000))
	if g.Amount != 800 || g.Floor != 100 || g.Mode != lease.Reserved {
		t.Fatalf("grant %+v, want 800 (Q − floors) with floor 100", g)
	}
	report(t, e, lease.Report{DataPlane: "a", Token: 1, Seq: 1, FloorSpent: 100})
	if e.Committed() != 1000 {
		t.Fatalf("floor spend changed committed: %d", e.Committed())
	}
}

func TestOptimisticFloors(t *testing.T) {
	e := open(t, lease.Optimistic, map[string]int64{"a": 100, "b": 100, "c": 50})
	if e.Committed() != 0 || e.Bound() != 1250 || e.ObservedBound() != 1000 {
		t.Fatalf("committed %d bound %d observed %d", e.Committed(), e.Bound(), e.ObservedBound())
	}
	report(t, e, lease.Report{DataPlane: "b", Token: 1, Seq: 1, FloorSpent: 70})
	report(t, e, lease.Report{DataPlane: "b", Token: 1, Seq: 2, FloorSpent: 40}) // lower: kept by max
	if e.Committed() != 70 || e.ObservedBound() != 1100 {
		t.Fatalf("committed %d observed bound %d, want 70 and 1100", e.Committed(), e.ObservedBound())
	}
	if g := grant(t, e, 0, req("a", 1, 1, 5000)); g.Amount != 930 {
		t.Fatalf("grant %+v, want 930", g)
	}
}

// TestReportsAreClamped: a data plane that reports more spent than a
// lease's amount, or more floor spent than its floor (a faulty or hostile
// one: it can only have admitted that much), is counted at the amount and
// the floor. Two such reports near 2^63 once overflowed Committed to a
// negative number, and Remaining read as more than the quota.
func TestReportsAreClamped(t *testing.T) {
	e := open(t, lease.Optimistic, map[string]int64{"a": 100})
	g := grant(t, e, 0, req("a", 1, 1, 300))
	huge := int64(1<<63 - 1)
	report(t, e, lease.Report{DataPlane: "a", Token: 1, Seq: 1, FloorSpent: huge, Leases: []lease.LeaseSpend{{Lease: g.ID, Spent: huge}}})
	report(t, e, lease.Report{DataPlane: "a", Token: 1, Seq: 2, FloorSpent: huge, Leases: []lease.LeaseSpend{{Lease: g.ID, Spent: huge, Final: true}}})
	l, _ := e.Lease(g.ID)
	if l.Spent != 300 || !l.Released || e.Committed() != 400 || e.Remaining() != 600 {
		t.Fatalf("lease %+v, committed %d, remaining %d; want spent 300 released, committed 400 (lease 300 + floor 100), remaining 600", l, e.Committed(), e.Remaining())
	}
	// A data plane without a floor spends none.
	report(t, e, lease.Report{DataPlane: "z", Token: 1, Seq: 1, FloorSpent: 50})
	if e.Committed() != 400 {
		t.Fatalf("committed %d after a data plane without a floor reported floor spent, want 400", e.Committed())
	}
}

func TestStateRoundTrip(t *testing.T) {
	e := open(t, lease.Optimistic, map[string]int64{"a": 10})
	g := grant(t, e, 0, req("a", 1, 1, 300))
	report(t, e, lease.Report{DataPlane: "a", Token: 1, Seq: 1, FloorSpent: 5, Leases: []lease.LeaseSpend{{Lease: g.ID, Spent: 20}}})
	b, err := json.Marshal(e.State())
	if err != nil {
		t.Fatal(err)
	}
	var st quotaledger.State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	r, err := quotaledger.Restore(st)
	if err != nil {
		t.Fatal(err)
	}
	want := g
	want.Duration, want.PeriodLeft = 9*time.Second, 59*time.Second // answered 1 s later
	if again := grant(t, r, time.Second, req("a", 1, 1, 300)); again != want {
		t.Fatalf("restored ledger answers %+v, want %+v", again, want)
	}
	if r.Committed() != 305 || r.Remaining() != 695 {
		t.Fatalf("restored committed %d remaining %d", r.Committed(), r.Remaining())
	}
	st.Committed--
	if _, err := quotaledger.Restore(st); err == nil {
		t.Fatal("restore accepted a committed that is not Σ debits")
	}
}

func TestLedgerEntries(t *testing.T) {
	l := quotaledger.New()
	c := quotaledger.Config{Key: key(1), Quota: 10, Period: time.Minute}
	if _, err := l.Open(c); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Grant(start, req("a", 1, 1, 10)); err != nil {
		t.Fatal(err)
	}
	if e, _ := l.Open(c); e.Committed() != 10 {
		t.Fatal("opening again replaced the entry")
	}
	c.Key = key(2) // a reset: a new epoch, a fresh entry
	if _, err := l.Open(c); err != nil {
		t.Fatal(err)
	}
	r := req("a", 1, 1, 10)
	r.Entry = key(2)
	if g, err := l.Grant(start, r); err != nil || g.Amount != 10 {
		t.Fatalf("new epoch: %+v %v", g, err)
	}
	r.Entry = key(3)
	if _, err := l.Grant(start, r); !errors.Is(err, quotaledger.ErrUnknownEntry) {
		t.Fatalf("unknown entry: %v", err)
	}
	if _, err := l.Report(start, lease.Report{Entry: key(3)}); !errors.Is(err, quotaledger.ErrUnknownEntry) {
		t.Fatalf("unknown entry: %v", err)
	}
	l2, err := quotaledger.RestoreLedger(l.State())
	if err != nil || len(l2.State()) != 2 || l2.Entry(key(1)).Committed() != 10 {
		t.Fatalf("restore: %v", err)
	}
}
