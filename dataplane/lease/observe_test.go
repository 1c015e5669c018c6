package lease_test

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

// TestObserveAndAdopt: a holder fed from outside (Observe, as the data
// plane's runner feeds it from Redis) sizes its request to the offered
// rate, asks for "the period in force" (PeriodStart zero) and reports
// nothing until a grant names the entry, which it then adopts (and keeps
// through Restore); spends are cumulative and never above a lease's
// Amount; SeqBase starts its numbers above it; a demand decayed to
// nothing asks for nothing.
func TestObserveAndAdopt(t *testing.T) {
	slot := entry
	slot.PeriodStart = time.Time{}
	h := lease.NewHolder(at(0), lease.Options{DataPlane: "dp1", Token: 3, Entry: slot, SeqBase: 100})
	var req *lease.GrantRequest
	for i := range 10 {
		ti := at(time.Duration(i) * 100 * time.Millisecond)
		h.Observe(lease.Observed{Offered: int64(i+1) * 10, Refused: int64(i+1) * 10})
		g, rep := h.Poll(ti)
		if rep != nil {
			t.Fatalf("report %+v before the entry is known", rep)
		}
		if g != nil {
			req = g
		}
	}
	// The first rate: 60 units offered in 0.5 s, 120/s, weighted by
	// 1 − e^(−0.5/2) = 0.2212: 26.54/s, × 10 s = 266 units.
	if req == nil || req.ID.Seq != 101 || !req.Entry.PeriodStart.IsZero() || req.Want != 266 {
		t.Fatalf("request %+v, want seq 101, period start zero, 266 units", req)
	}
	g := grantFor(req, 50, 5*time.Second, time.Minute, 950)
	g.Entry = entry // the ledger names the period
	h.HandleGrant(at(time.Second), g)
	if h.Entry() != entry {
		t.Fatalf("entry %+v, want the grant's %+v", h.Entry(), entry)
	}
	h.Observe(lease.Observed{Spent: map[lease.RequestID]int64{req.ID: 70}, Admitted: 70, Refused: 100, Offered: 170})
	if l := h.Leases(); len(l) != 1 || l[0].Spent != 50 {
		t.Fatalf("leases %+v, want the spend capped at 50", l)
	}
	h.Observe(lease.Observed{Spent: map[lease.RequestID]int64{req.ID: 10}, Admitted: 10})
	if l := h.Leases(); l[0].Spent != 50 || h.Admitted() != 70 {
		t.Fatalf("a lower observation moved the counts back: %+v, admitted %d", l, h.Admitted())
	}
	_, rep := h.Poll(at(2 * time.Second))
	if rep == nil || rep.Entry != entry || rep.Seq != 101 || rep.Admitted != 70 || rep.Refused != 100 {
		t.Fatalf("report %+v", rep)
	}
	r := lease.Restore(lease.Options{DataPlane: "dp1", Token: 4, Entry: slot}, h.State())
	if r.Entry() != entry {
		t.Fatalf("restored entry %+v", r.Entry())
	}
	// No more demand: the smoothed rate decays (time constant 2 s) and,
	// once below half a unit per horizon, no request is sent (40 s on).
	for i := range 100 {
		ti := at(3*time.Second + time.Duration(i)*500*time.Millisecond)
		h.HandleAck(ti, lease.ReportAck{Entry: entry, DataPlane: "dp1", Token: 3, Seq: 1 << 40})
		g, _ := h.Poll(ti)
		if g == nil {
			continue
		}
		if i >= 80 {
			t.Fatalf("request %+v at %v with no demand for %v", g, ti, ti.Sub(at(3*time.Second)))
		}
		h.HandleGrant(ti, grantFor(g, 0, time.Second, time.Minute, 0))
	}
}
