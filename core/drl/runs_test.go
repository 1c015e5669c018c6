package drl

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestLateReportOfUnseenRunKeepsBound: b is on run V; cut off, it lapses
// to W (its W report calls time out but stay buffered on closed
// connections), then to Y. Y lands first; a buffered W report lands after.
// The allocator never saw W; runs of one gateway are ordered, so it takes
// W for a late report of a run b has left: it keeps b's bound (a does not
// grow into b's 500 while b runs it) and keeps b on Y, where b gets its
// share (before ordered runs: 700 + 500 = 1200/s, then b at its floor for
// good).
func TestLateReportOfUnseenRunKeepsBound(t *testing.T) {
	ms := int64(time.Millisecond)
	w := newTwoGateways()
	req, la, lb, kl := w.req, w.la, w.lb, w.kl
	rep := w.report
	step := func(now int64, live ...Report) *Table { return w.step(now, nil, live...) }
	t0 := 10 * sec
	tb := step(t0, rep(la, t0, "a", 2000), rep(lb, t0, "b", 2000)) // run V
	la.Apply(t0, tb)
	lb.Apply(t0, tb)
	// b cut off after t0: run W from t0+3s (lapsed at t0+2.5s), all lost.
	lateW := rep(lb, t0+3*sec, "b", 300)
	rep(lb, t0+4*sec, "b", 2000)
	w.rounds(t0, 1, 5, false)
	// Back at t0+6s on run Y (W lapsed at t0+5.5s); answered.
	tb, y := w.rounds(t0, 6, 12, true)
	if y == lateW.Run {
		t.Fatal("same run")
	}
	a0, b0 := shareAt(t, la, t0+12*sec+ms, req), shareAt(t, lb, t0+12*sec+ms, req)
	t.Logf("settled on Y: a %.0f, b %.0f (table runs b=%d, Y=%d)", a0.Rate, b0.Rate, tb.Runs["b"], y)
	// The buffered W report lands; a gets its table first.
	now := t0 + 12*sec + 500*ms
	tb = step(now, rep(la, now, "a", 2000), lateW)
	la.ApplyAt(now+ms, now, tb)
	a1, b1 := shareAt(t, la, now+2*ms, req), shareAt(t, lb, now+2*ms, req)
	t.Logf("after late W: table runs b=%d (W=%d); a runs %.0f, b runs %.0f: sum %.0f", tb.Runs["b"], lateW.Run, a1.Rate, b1.Rate, a1.Rate+b1.Rate)
	if a1.Rate+b1.Rate > kl.Rate*(1+1e-6) || tb.Runs["b"] != y {
		t.Errorf("bound broken: %.0f + %.0f > %.0f, or b listed on run %d, not its run %d", a1.Rate, b1.Rate, kl.Rate, tb.Runs["b"], y)
	}
	lb.ApplyAt(now+3*ms, now, tb)
	// b is healthy and reports Y every H from now on.
	tb, _ = w.rounds(t0, 13, 40, true)
	b2 := shareAt(t, lb, t0+40*sec+ms, req)
	if tb.Runs["b"] != y || !near(b2.Rate, 500) {
		t.Errorf("28 s later, healthy: table lists b on run %d (b is on %d), b runs %.0f/s, want 500", tb.Runs["b"], y, b2.Rate)
	}
}

// TestLateReportAfterTakeoverKeepsBound: the same late report after a
// takeover (the allocator that took over never saw any run of b's but
// the one in the table).
func TestLateReportAfterTakeoverKeepsBound(t *testing.T) {
	ms := int64(time.Millisecond)
	w := newTwoGateways()
	req, la, lb, kl, ao := w.req, w.la, w.lb, w.kl, w.ao
	rep := w.report
	step := func(now int64, live ...Report) *Table { return w.step(now, nil, live...) }
	t0 := 10 * sec
	tb := step(t0, rep(la, t0, "a", 2000), rep(lb, t0, "b", 2000)) // run W
	la.Apply(t0, tb)
	lb.Apply(t0, tb)
	lateW := rep(lb, t0+2250*ms, "b", 300) // cut off; lost, buffered
	w.rounds(t0, 1, 2, false)
	tb, y := w.rounds(t0, 3, 8, true) // back on run X (W, sent at 2.25 s, lapsed at 4.75 s)
	// Failover: a new allocator takes over from the stored table.
	w.alloc = NewAllocator(ao, 2, tb)
	now := t0 + 8*sec + 500*ms
	tb = step(now, rep(la, now, "a", 2000), lateW)
	la.ApplyAt(now+ms, now, tb)
	a1, b1 := shareAt(t, la, now+2*ms, req), shareAt(t, lb, now+2*ms, req)
	t.Logf("after takeover + late W: runs b=%d (W=%d, b on %d); a %.0f + b %.0f = %.0f", tb.Runs["b"], lateW.Run, y, a1.Rate, b1.Rate, a1.Rate+b1.Rate)
	if a1.Rate+b1.Rate > kl.Rate*(1+1e-6) {
		t.Errorf("bound broken: %.0f + %.0f > %.0f", a1.Rate, b1.Rate, kl.Rate)
	}
	lb.ApplyAt(now+3*ms, now, tb)
	tb, _ = w.rounds(t0, 9, 30, true)
	if b2 := shareAt(t, lb, t0+30*sec+ms, req); tb.Runs["b"] != y || !near(b2.Rate, 500) {
		t.Errorf("healthy for 21 s: table lists b on %d (b on %d), b runs %.0f, want 500", tb.Runs["b"], y, b2.Rate)
	}
}

// twoGateways is the scene of the runs tests: an allocator and the
// Limiters of gateways a and b sharing hot("c") (1000/s, B 100;
// MaxGateways 4: floor 250/s, 25), with no join reserve and no headroom.
type twoGateways struct {
	ao     AllocatorOptions
	alloc  *Allocator
	la, lb *Limiter
	req    core.Request
	id     KeyID
	kl     KeyLimit
}

func newTwoGateways() *twoGateways {
	w := &twoGateways{ao: AllocatorOptions{MaxGateways: 4, JoinReserve: -1, Headroom: -1, Interval: time.Second}, req: hot("c")}
	w.alloc = NewAllocator(w.ao, 1, nil)
	lo := LimiterOptions{MaxGateways: 4, Interval: time.Second}
	w.la, w.lb = NewLimiter(lo), NewLimiter(lo)
	w.id, w.kl = MakeKeyID("c", "api", w.req.Rule.Rate()), LimitOf(w.req.Rule.Rate())
	return w
}

// report is l's Report at now as gateway g, with demand d on the key.
func (w *twoGateways) report(l *Limiter, now int64, g string, d float64) Report {
	r := l.Report(now, g)
	r.Keys = map[KeyID]KeyDemand{w.id: {Limit: w.kl, Demand: d}}
	return r
}

// rounds runs the seconds t0+from … t0+to: each second a, and b when
// withB, report a demand of 2000/s, the allocator steps, and each of them
// applies the table. It returns the last table and b's run.
func (w *twoGateways) rounds(t0, from, to int64, withB bool) (tb *Table, bRun uint64) {
	for s := from; s <= to; s++ {
		now := t0 + s*sec
		live := []Report{w.report(w.la, now, "a", 2000)}
		if withB {
			live = append(live, w.report(w.lb, now, "b", 2000))
			bRun = live[1].Run
		}
		tb = w.step(now, nil, live...)
		w.la.Apply(now, tb)
		if withB {
			w.lb.Apply(now, tb)
		}
	}
	return tb, bRun
}

// step runs the allocator at now on live; acks nil: each report's Applied.
func (w *twoGateways) step(now int64, acks map[string]uint64, live ...Report) *Table {
	if acks == nil {
		acks = map[string]uint64{}
		for _, r := range live {
			acks[r.Gateway] = r.Applied
		}
	}
	tb, _ := w.alloc.Step(now, live, acks)
	return tb
}
