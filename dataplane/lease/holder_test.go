package lease_test

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

var entry = lease.EntryKey{Consumer: "c", Scope: "api", PeriodStart: t0, Epoch: 1}

func opts(mode lease.Mode, floor int64) lease.Options {
	return lease.Options{DataPlane: "dp1", Token: 1, Entry: entry, Mode: mode, Floor: floor}
}

// demand offers rate units per second for d in steps of 100 ms and polls,
// returning the last request the holder sent.
func demand(h *lease.Holder, from, d time.Duration, perStep int64) *lease.GrantRequest {
	var last *lease.GrantRequest
	for t := from; t < from+d; t += 100 * time.Millisecond {
		h.Take(at(t), perStep)
		if r, _ := h.Poll(at(t)); r != nil {
			last = r
		}
	}
	return last
}

func grantFor(r *lease.GrantRequest, amount int64, dur, left time.Duration, remaining int64) lease.Grant {
	return lease.Grant{Entry: r.Entry, ID: r.ID, Amount: amount, Duration: dur, PeriodLeft: left, Remaining: remaining}
}

func TestSizesToDemand(t *testing.T) {
	h := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r := demand(h, 0, 3*time.Second, 10) // 100 units per second offered
	if r == nil || r.ID != (lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}) {
		t.Fatalf("first request %+v", r)
	}
	// The first request goes out at the first rate update, at 0.5 s: six
	// steps of 10 offered in 0.5 s (120/s) weighted 1 − e^(−0.5/2) give
	// 26.5/s, × the 10 s horizon.
	if r.Want != 266 {
		t.Fatalf("want %d, want 266", r.Want)
	}
	// No second request while the first is unanswered and young; again
	// with the same ID after RetryInterval.
	if again, _ := h.Poll(at(3300 * time.Millisecond)); again == nil || again.ID != r.ID || again.Want != r.Want {
		t.Fatalf("retry %+v", again)
	}
	h.HandleGrant(at(3100*time.Millisecond), grantFor(r, 266, 10*time.Second, 50*time.Second, 5000))
	h.HandleGrant(at(3200*time.Millisecond), grantFor(r, 266, 10*time.Second, 50*time.Second, 5000)) // duplicate
	if n := len(h.Leases()); n != 1 {
		t.Fatalf("%d leases after a duplicate answer, want 1", n)
	}
	// The lease ends at first send (0.5 s) + 10 s − 250 ms, whatever the retry.
	if l := h.Leases()[0]; !l.StopAt.Equal(at(10250 * time.Millisecond)) {
		t.Fatalf("stop at %v", l.StopAt.Sub(t0))
	}
}

func TestSpendsExactlyAndStops(t *testing.T) {
	h := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r := demand(h, 0, time.Second, 10)
	h.HandleGrant(at(time.Second), grantFor(r, 25, 2*time.Second, time.Minute, 100))
	// Spend 25 exactly, then refuse.
	if got := h.Take(at(1100*time.Millisecond), 20); got != 20 {
		t.Fatalf("took %d of 20", got)
	}
	if got := h.Take(at(1200*time.Millisecond), 20); got != 5 {
		t.Fatalf("took %d, want the 5 left", got)
	}
	h2 := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r2 := demand(h2, 0, time.Second, 10)
	h2.HandleGrant(at(time.Second), grantFor(r2, 1000, 2*time.Second, time.Minute, 100))
	stop := h2.Leases()[0].StopAt
	if got := h2.Take(stop.Add(-time.Nanosecond), 1); got != 1 {
		t.Fatal("refused before the stop")
	}
	if got := h2.Take(stop, 1); got != 0 {
		t.Fatal("spent at the stop")
	}
	if h2.Admitted() != 1 || h2.Refused() != 101 { // 100 offered before the grant
		t.Fatalf("admitted %d refused %d", h2.Admitted(), h2.Refused())
	}
}

func TestReportsAndRelease(t *testing.T) {
	h := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r := demand(h, 0, time.Second, 1)
	h.HandleGrant(at(time.Second), grantFor(r, 50, 2*time.Second, time.Minute, 100))
	h.Take(at(1100*time.Millisecond), 7)
	_, rep := h.Poll(at(1500 * time.Millisecond))
	if rep == nil || rep.Seq != 1 || len(rep.Leases) != 1 || rep.Leases[0] != (lease.LeaseSpend{Lease: r.ID, Spent: 7}) {
		t.Fatalf("report %+v", rep)
	}
	stop := h.Leases()[0].StopAt
	_, fin := h.Poll(stop)
	if fin == nil || fin.Seq != 2 || !fin.Leases[0].Final || fin.Leases[0].Spent != 7 || fin.Admitted != 7 || fin.Refused != 10 {
		t.Fatalf("final report %+v", fin)
	}
	h.HandleAck(stop, lease.ReportAck{Entry: entry, DataPlane: "dp1", Token: 1, Seq: 1}) // the older report
	if len(h.Leases()) != 1 {
		t.Fatal("an ack of a report before the final one dropped the lease")
	}
	h.HandleAck(stop, lease.ReportAck{Entry: entry, DataPlane: "dp1", Token: 1, Seq: 2})
	if len(h.Leases()) != 0 {
		t.Fatalf("after the final ack: leases %v", h.Leases())
	}
	// Not Done: the demand goes on, so a request for more is in flight.
	if h.Done() {
		t.Fatal("done with a request in flight")
	}
	if !lease.NewHolder(at(0), opts(lease.Strict, 0)).Done() {
		t.Fatal("a new holder is not done")
	}
}

func TestFloorsByMode(t *testing.T) {
	for _, c := range []struct {
		mode              lease.Mode
		connected, cutOff int64
	}{
		{lease.Strict, 0, 0},
		{lease.Reserved, 30, 0},   // the floor is the data plane's: spent first time round
		{lease.Optimistic, 0, 30}, // only once cut off (3 s without an answer)
	} {
		h := lease.NewHolder(at(0), opts(c.mode, 30))
		if got := h.Take(at(time.Second), 100); got != c.connected {
			t.Errorf("%v connected: took %d, want %d", c.mode, got, c.connected)
		}
		if got := h.Take(at(4*time.Second), 100); got != c.cutOff {
			t.Errorf("%v cut off: took %d, want %d", c.mode, got, c.cutOff)
		}
		if h.FloorSpent() != c.connected+c.cutOff {
			t.Errorf("%v: floor spent %d", c.mode, h.FloorSpent())
		}
	}
}

func TestTakeOverAndFencing(t *testing.T) {
	h := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r := demand(h, 0, time.Second, 10)
	o := opts(lease.Strict, 0)
	o.Token = 2
	n := lease.Restore(o, h.State())
	// The new holder sends its predecessor's request again, same ID.
	again, _ := n.Poll(at(2 * time.Second))
	if again == nil || again.ID != r.ID {
		t.Fatalf("takeover resend %+v, want %s", again, r.ID)
	}
	n.HandleGrantRefusal(at(2100*time.Millisecond), r.ID, lease.RefusedStaleToken)
	if n.Fenced() {
		t.Fatal("a refusal of the predecessor's request fenced the new holder")
	}
	next := demand(n, 2200*time.Millisecond, time.Second, 10)
	if next == nil || next.ID.Token != 2 || next.ID.Seq != 2 {
		t.Fatalf("new holder's request %+v", next)
	}
	n.HandleGrantRefusal(at(3300*time.Millisecond), next.ID, lease.RefusedStaleToken)
	if !n.Fenced() {
		t.Fatal("a refusal of the holder's own token did not fence it")
	}
	if r, rep := n.Poll(at(5 * time.Second)); r != nil || rep != nil {
		t.Fatal("a fenced holder still sends")
	}
}

func TestModeJSON(t *testing.T) {
	for _, m := range []lease.Mode{lease.Strict, lease.Reserved, lease.Optimistic} {
		b, err := m.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var back lease.Mode
		if err := back.UnmarshalJSON(b); err != nil || back != m {
			t.Fatalf("%s: %s → %v %v", m, b, back, err)
		}
	}
	if _, err := lease.ParseMode("loose"); err == nil {
		t.Fatal("unknown mode accepted")
	}
}

// TestGrantCountsFromTheAnsweredSend: a request first sent at 0.5 s is
// sent again through a cut and answered after it, at 12 s. The answer
// echoes the send it answers (SentAt), and the holder counts the period
// left and the lease's duration from that send, not from the first,
// which would put both 11.5 s early. An echo that is none of this
// request's sends falls back to the first send (safe: earlier).
func TestGrantCountsFromTheAnsweredSend(t *testing.T) {
	h := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r := demand(h, 0, time.Second, 10) // first sent at 0.5 s, again at 0.8 s
	if r == nil || !r.SentAt.Equal(at(800*time.Millisecond)) || !h.State().Pending.FirstSentAt.Equal(at(500*time.Millisecond)) {
		t.Fatalf("request %+v (pending %+v), want sent at 0.5 s and again at 0.8 s", r, h.State().Pending)
	}
	var last *lease.GrantRequest
	for d := 900 * time.Millisecond; d <= 12*time.Second; d += 100 * time.Millisecond {
		if again, _ := h.Poll(at(d)); again != nil {
			last = again
		}
	}
	if last == nil || last.ID != r.ID || !last.SentAt.Equal(at(11900*time.Millisecond)) {
		t.Fatalf("last retry %+v, want the same ID sent at 11.9 s", last)
	}
	g := grantFor(last, 100, 5*time.Second, 8*time.Second, 900)
	g.SentAt = last.SentAt
	h.HandleGrant(at(12*time.Second), g)
	if pe := h.State().PeriodEnd; !pe.Equal(at(19900 * time.Millisecond)) {
		t.Fatalf("period end %v, want 19.9 s (11.9 s + 8 s)", pe.Sub(t0))
	}
	if l := h.Leases(); len(l) != 1 || !l[0].StopAt.Equal(at(16650*time.Millisecond)) {
		t.Fatalf("leases %+v, want one stopping at 16.65 s (11.9 s + 5 s − 250 ms)", l)
	}

	h2 := lease.NewHolder(at(0), opts(lease.Strict, 0))
	r2 := demand(h2, 0, time.Second, 10)
	g2 := grantFor(r2, 100, 5*time.Second, 8*time.Second, 900)
	g2.SentAt = at(30 * time.Second) // not a send of this request
	h2.HandleGrant(at(time.Second), g2)
	if pe := h2.State().PeriodEnd; !pe.Equal(at(8500 * time.Millisecond)) {
		t.Fatalf("period end %v with a foreign echo, want 8.5 s (first send + 8 s)", pe.Sub(t0))
	}
}

// TestAfterOnlyWithoutPeriod: a holder that follows a finished period
// (Options.After) names it in requests for "the period in force"; once it
// spends a named entry its requests carry no After.
func TestAfterOnlyWithoutPeriod(t *testing.T) {
	o := opts(lease.Strict, 0)
	o.Entry.PeriodStart = time.Time{}
	o.After = at(-time.Minute)
	h := lease.NewHolder(at(0), o)
	r := demand(h, 0, time.Second, 10)
	if r == nil || !r.After.Equal(at(-time.Minute)) {
		t.Fatalf("request %+v, want After = the finished period's start", r)
	}
	named := entry
	g := grantFor(r, 100, 5*time.Second, 50*time.Second, 900)
	g.Entry, g.SentAt = named, r.SentAt
	h.HandleGrant(at(time.Second), g)
	r2 := demand(h, time.Second, 20*time.Second, 10)
	if r2 == nil || !r2.After.IsZero() || !r2.Entry.PeriodStart.Equal(t0) {
		t.Fatalf("request after the entry was named %+v, want the entry and no After", r2)
	}
}
