package drl

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

const sec = int64(time.Second)

// hotSet is a distributed rate limit of 1000/s with burst 100, scope "api".
var hotSet = core.LimitSet{Scope: "api", Rate: core.Limit{Rate: 1000, Period: time.Second, Burst: 100}, Distributed: true}

// hot is a distributed request of cost 1 under hotSet.
func hot(consumer string) core.Request { return request(consumer, hotSet) }

// request is a request of cost 1 from consumer under ls, its rule made by
// core.NewRule: the Limiter reads the rule's limits only, so a Limiter is
// driven without a Store. It panics on an invalid ls.
func request(consumer string, ls core.LimitSet) core.Request {
	r, err := core.NewRule(ls, nil)
	if err != nil {
		panic(err)
	}
	return core.Request{Consumer: consumer, Rule: r, Cost: 1}
}

// withRate returns req with its rule's rate limit replaced by rate (a new
// rule, its other limits the same).
func withRate(req core.Request, rate core.Limit) core.Request {
	ls := req.Rule.Limits()
	ls.Rate = rate
	r := request(req.Consumer, ls)
	r.Cost = req.Cost
	return r
}

// lookup returns the key l holds for req, or nil.
func lookup(l *Limiter, req *core.Request) *key {
	if _, ok := l.compile(req.Rule); !ok {
		return nil
	}
	sh, f := l.locate(req)
	return sh.tab.Load().find(f)
}

// tableFor gives gateway g share s of req's key at epoch e.
func tableFor(req core.Request, e uint64, g string, s Share) *Table {
	id := MakeKeyID(req.Consumer, req.Rule.Scope(), req.Rule.Rate())
	return &Table{Epoch: e, Token: 1, Keys: map[KeyID]KeyShares{id: {Limit: LimitOf(req.Rule.Rate()), Shares: map[string]Share{g: s}}}}
}

// onRun returns tb listing g's share for l's current run (Report.Run): a
// Limiter that has reported runs only the shares of its run.
func onRun(l *Limiter, tb *Table) *Table {
	l.mu.Lock()
	defer l.mu.Unlock()
	tb.Runs = map[string]uint64{}
	for _, ks := range tb.Keys {
		for g := range ks.Shares {
			tb.Runs[g] = l.run
		}
	}
	return tb
}

// drain takes until refused at now and returns how many were admitted.
func drain(t *testing.T, l *Limiter, now int64, req *core.Request) int {
	t.Helper()
	n := 0
	var d core.Decision
	for {
		if !l.Take(now, req, &d) {
			t.Fatal("Take: not handled")
		}
		if !d.Allowed {
			return n
		}
		n++
	}
}

func TestKeyID(t *testing.T) {
	a := MakeKeyID("c", "s", core.Limit{Rate: 10, Period: time.Second})
	if len(a) != 32 || a != MakeKeyID("c", "s", core.Limit{Rate: 10, Period: time.Second, Burst: 10}) {
		t.Fatalf("KeyID %q: want 32 hex digits, Burst 0 the same as Burst = Rate", a)
	}
	// printf 'c\0s\00010\0001000000000\00010' | sha256sum | cut -c1-32
	if want := KeyID("f5f57bb98b783fecc68be280ed28f343"); a != want {
		t.Fatalf("KeyID = %s, want %s", a, want)
	}
	for _, b := range []KeyID{
		MakeKeyID("cs", "", core.Limit{Rate: 10, Period: time.Second}),
		MakeKeyID("c", "s", core.Limit{Rate: 10, Period: time.Minute}),
		MakeKeyID("c", "s", core.Limit{Rate: 10, Period: time.Second, Burst: 5}),
	} {
		if b == a {
			t.Fatalf("distinct keys share KeyID %s", a)
		}
	}
}

func TestLimiterFloorAtStart(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1"})
	req := hot("c")
	now := 10 * sec
	// Floor: 250/s, burst 25.
	if n := drain(t, l, now, &req); n != 25 {
		t.Fatalf("admitted %d at once, want the floor burst 25", n)
	}
	total := 25
	for i := 1; i <= 1000; i++ {
		total += drain(t, l, now+int64(i)*int64(time.Millisecond), &req)
	}
	if total != 25+250 {
		t.Fatalf("admitted %d over 1 s, want 25 + 250", total)
	}
}

func TestLimiterEligibility(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4})
	var d core.Decision
	base := hot("c")
	cases := map[string]func(ls *core.LimitSet, r *core.Request){
		"not distributed": func(ls *core.LimitSet, r *core.Request) { ls.Distributed = false },
		"quota":           func(ls *core.LimitSet, r *core.Request) { ls.Quota = core.Quota{Max: 10, Renewal: time.Hour} },
		"sliding window":  func(ls *core.LimitSet, r *core.Request) { ls.Rate.Algorithm = core.SlidingWindow },
		"unlimited":       func(ls *core.LimitSet, r *core.Request) { ls.Rate = core.Limit{Rate: core.Unlimited} },
		"burst below 4":   func(ls *core.LimitSet, r *core.Request) { ls.Rate.Burst = 3 },
		"rate floor < 1/s": func(ls *core.LimitSet, r *core.Request) {
			ls.Rate = core.Limit{Rate: 3, Period: time.Second, Burst: 100}
		},
		"negative cost":  func(ls *core.LimitSet, r *core.Request) { r.Cost = -1 },
		"cost above max": func(ls *core.LimitSet, r *core.Request) { r.Cost = core.MaxCost + 1 },
	}
	for name, f := range cases {
		ls := hotSet
		r := base
		f(&ls, &r)
		cost := r.Cost
		r = request("c", ls)
		r.Cost = cost
		if l.Take(sec, &r, &d) || l.Eligible(&r) {
			t.Errorf("%s: handled by DRL, want the exact store", name)
		}
	}
	if st := l.Stats(); st.HotKeys != 0 {
		t.Fatalf("%d keys held after ineligible requests, want 0", st.HotKeys)
	}
	// An invalid limit never reaches the Limiter: no rule holds it.
	ls := hotSet
	ls.Rate = core.Limit{Rate: 1 << 40, Period: time.Nanosecond, Burst: 100}
	if _, err := core.NewRule(ls, nil); !errors.Is(err, core.ErrInvalidLimit) {
		t.Errorf("invalid period: NewRule error %v, want ErrInvalidLimit", err)
	}
	// Tyk #1287: 10/s over the default 32 gateways: floor 0.3125/s.
	r := withRate(base, core.PerSecond(10))
	if NewLimiter(LimiterOptions{}).Take(sec, &r, &d) {
		t.Error("10/s over 32 gateways: handled by DRL, want the exact store")
	}
	r = withRate(base, core.Limit{Rate: 4, Period: time.Second, Burst: 4}) // floor exactly 1/s, burst 1
	if !l.Take(sec, &r, &d) || !l.Eligible(&r) {
		t.Fatal("4/s burst 4 over 4 gateways: want DRL")
	}
}

func TestLimiterDecisionFields(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4})
	req := hot("c")
	var d core.Decision
	now := 5 * sec
	l.Take(now, &req, &d)
	// Local floor 250/s burst 25: T = 4 ms. Global B = 100, T = 1 ms.
	want := core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 100, Remaining: 24, ResetAfter: 4 * time.Millisecond,
		Rate: core.Status{Limit: 100, Remaining: 24, ResetAfter: 4 * time.Millisecond, Window: 100 * time.Millisecond}}
	if d != want {
		t.Fatalf("decision %+v\nwant %+v", d, want)
	}
	for range 24 {
		l.Take(now, &req, &d)
	}
	l.Take(now, &req, &d)
	want = core.Decision{DecidedBy: core.KindRate, Limit: 100, Remaining: 0, ResetAfter: 100 * time.Millisecond, RetryAfter: 4 * time.Millisecond,
		Rate: core.Status{Limit: 100, Remaining: 0, ResetAfter: 100 * time.Millisecond, Window: 100 * time.Millisecond}}
	if d != want {
		t.Fatalf("refusal %+v\nwant %+v", d, want)
	}
	big := req
	big.Cost = 50 // above the local burst 25, within B
	l.Take(now+sec, &big, &d)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("cost 50 > local burst: %+v, want refused with RetryAfter H", d)
	}
	big.Cost = 101
	l.Take(now+sec, &big, &d)
	if d.Allowed || d.RetryAfter != -1 {
		t.Fatalf("cost 101 > B: %+v, want RetryAfter -1", d)
	}
}

func TestLimiterAppliesShareAndFallsBack(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	now := 10 * sec
	if n := drain(t, l, now, &req); n != 25 {
		t.Fatalf("floor burst: %d, want 25", n)
	}
	l.Apply(now, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	// A grow carries the tokens: the drained bucket stays drained.
	if n := drain(t, l, now, &req); n != 0 {
		t.Fatalf("right after a grow: %d admitted, want 0 (tokens carried)", n)
	}
	total := 0
	for i := 1; i <= 1000; i++ {
		total += drain(t, l, now+int64(i)*int64(time.Millisecond), &req)
	}
	if total != 500 {
		t.Fatalf("1 s at share 500/s: %d, want 500", total)
	}
	// Idle 1 s fills the share's burst.
	if n := drain(t, l, now+sec+sec-1, &req); n != 50 {
		t.Fatalf("after idling: %d, want burst 50", n)
	}
	if st := l.Stats(); st.Epoch != 1 || st.ShareRate != 500 || st.HotKeys != 1 || st.Tables != 1 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}
	// The table is fresh until now + 2 s; the first request after that
	// runs at the floor, counted from the moment the table went stale.
	later := now + 5*sec
	if n := drain(t, l, later, &req); n != 25 {
		t.Fatalf("stale: %d admitted at once, want the floor burst 25", n)
	}
	if st := l.Stats(); st.Fallbacks != 1 || st.ShareRate != 250 {
		t.Fatalf("after staleness: %+v, want 1 fallback, share 250", st)
	}
	// The same table again, from a later call: fresh again, at its share
	// (this Limiter never reported, so it has no run to lapse; see
	// TestLimiterRunLapses for one that has).
	l.Apply(later, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	if n := drain(t, l, later+sec, &req); n != 25 {
		t.Fatalf("refreshed: %d, want 25 (a grow counts from the switch: 1 s at the floor, capped at its burst)", n)
	}
	if n := drain(t, l, later+sec+100*int64(time.Millisecond), &req); n != 50 {
		t.Fatalf("100 ms at the share: %d, want 50", n)
	}
	// An older table is ignored while the current one is fresh.
	l.Apply(later, tableFor(req, 0, "g1", Share{Rate: 1000, Burst: 100}))
	if st := l.Stats(); st.Epoch != 1 {
		t.Fatalf("older table applied: epoch %d", st.Epoch)
	}
}

// TestLimiterShrinkCountsFromSentAt: a shrink applies from the moment it
// is applied (here the send time of the call that returned it), even when
// the key's next request comes later: the old share's refill after it is
// not kept.
func TestLimiterShrinkCountsFromSentAt(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1"})
	req := hot("c")
	now := 10 * sec
	l.Apply(now, tableFor(req, 1, "g1", Share{Rate: 800, Burst: 80}))
	drain(t, l, now, &req) // 25 carried from the floor
	// Shrink to 400/s burst 40, sent at now+10ms, first request at now+50ms.
	l.Apply(now+10*int64(time.Millisecond), tableFor(req, 2, "g1", Share{Rate: 400, Burst: 40}))
	// At now+10ms: 8 tokens (800/s × 10 ms) under the old share; from there
	// 400/s for 40 ms: 16 more.
	if n := drain(t, l, now+50*int64(time.Millisecond), &req); n != 8+16 {
		t.Fatalf("admitted %d, want 24", n)
	}
}

// TestLimiterExactUnderConcurrency: many goroutines on one key with a
// stepped clock admit exactly b + r·t per share, across share changes.
func TestLimiterExactUnderConcurrency(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 10, Gateway: "g1"}) // floor 100/s, burst 10
	req := hot("c")
	ms := int64(time.Millisecond)
	type seg struct {
		share Share
		steps int // of 1 ms
	}
	// Each segment's r·t is whole, so every switch meets a drained bucket
	// holding no fraction of a token.
	segs := []seg{{Share{100, 10}, 200}, {Share{500, 50}, 300}, {Share{200, 20}, 250}, {Share{1000, 100}, 200}, {Share{100, 10}, 400}, {Share{333, 33}, 300}}
	var admitted atomic.Int64
	take := func(now int64) {
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d core.Decision
				r := req
				for {
					if !l.Take(now, &r, &d) {
						panic("not handled")
					}
					if !d.Allowed {
						return
					}
					admitted.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	now := 100 * sec
	take(now) // the floor's burst: 10
	want := int64(10)
	for si, s := range segs {
		if si > 0 {
			l.Apply(now, tableFor(req, uint64(si), "g1", s.share))
			take(now) // switch now: a drained bucket carries 0 tokens
		}
		// T = ceil(1 s / r): 333/s runs at T = 3.003004 ms.
		want += int64(s.steps) * ms / shareParams(s.share).T
		for range s.steps {
			now += ms
			take(now)
		}
	}
	if got := admitted.Load(); got != want || want != 10+20+150+50+200+40+99 {
		t.Fatalf("admitted %d, want %d", got, want)
	}
}

// TestLimiterShrinkKeepsIdleRefill: a shrink applied at now with a table
// sent 500 ms earlier (by pub/sub: sentAt is the last report call's) does
// not charge the old share's idle time between sentAt and now as spent. A
// gateway offered 100/s at share 242/s (burst 24) that shrinks to 102/s
// (burst 10) admits every request of the next second at 100/s. Counting
// the shrink from sentAt admitted 55 of 100.
func TestLimiterShrinkKeepsIdleRefill(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 32, Gateway: "g1"}) // floor 31.25/s, burst 3
	req := hot("c")
	ms := int64(time.Millisecond)
	now := 10 * sec
	l.Apply(now, tableFor(req, 1, "g1", Share{Rate: 242, Burst: 24}))
	var d core.Decision
	for i := range 200 { // 2 s at 100/s
		if !l.Take(now+int64(i)*10*ms, &req, &d) || !d.Allowed {
			t.Fatalf("request %d at 100/s under share 242/s refused", i)
		}
	}
	now += 2 * sec
	l.ApplyAt(now, now-500*ms, tableFor(req, 2, "g1", Share{Rate: 102, Burst: 10}))
	admitted := 0
	for i := range 100 {
		if l.Take(now+int64(i)*10*ms, &req, &d) && d.Allowed {
			admitted++
		}
	}
	if admitted != 100 {
		t.Fatalf("after the shrink to 102/s: %d of 100 admitted at 100/s, want 100", admitted)
	}
}

// TestLimiterSwitchesWhileTaking: share changes published while 8
// goroutines take on a frozen clock lose or double-count nothing: at one
// instant the key admits exactly the tokens it held, whatever the shares
// switched meanwhile (each switch carries them, clamped to the new
// burst, and every burst here is at least the tokens held).
func TestLimiterSwitchesWhileTaking(t *testing.T) {
	for round := range 20 {
		l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1"})
		req := hot("c")
		now := 10 * sec
		l.Apply(now-sec, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
		var d core.Decision
		l.Take(now, &req, &d) // 49 left
		var admitted atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d core.Decision
				r := req
				for {
					select {
					case <-stop:
						return
					default:
					}
					if l.Take(now, &r, &d) && d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		for e := uint64(2); e < 40; e++ {
			l.Apply(now-sec, tableFor(req, e, "g1", Share{Rate: float64(500 + 10*e), Burst: int64(50 + e)}))
		}
		close(stop)
		wg.Wait()
		admitted.Add(int64(drain(t, l, now, &req)))
		if got := admitted.Load(); got != 49 {
			t.Fatalf("round %d: admitted %d at one instant, want the 49 tokens held", round, got)
		}
	}
}

func TestLimiterMaxKeysAndSweep(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, MaxKeys: 3})
	var d core.Decision
	now := 10 * sec
	for _, c := range []string{"a", "b", "c"} {
		r := hot(c)
		if !l.Take(now, &r, &d) || !d.Allowed {
			t.Fatalf("%s: not admitted", c)
		}
	}
	r := hot("d")
	if l.Take(now, &r, &d) {
		t.Fatal("a fourth key at MaxKeys 3: handled, want the exact store")
	}
	if st := l.Stats(); st.HotKeys != 3 || st.KeysRefused != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Keys stay while used; idle for 3 reports with full buckets, they go.
	rep := l.Report(now+sec, "g1")
	if len(rep.Keys) != 3 || rep.Keys[MakeKeyID("a", "api", hotSet.Rate)].Demand != 1 {
		t.Fatalf("report %+v", rep)
	}
	a := hot("a")
	for i := int64(2); i <= 4; i++ {
		l.Take(now+i*sec, &a, &d)
		l.Report(now+i*sec, "g1")
	}
	if st := l.Stats(); st.HotKeys != 1 {
		t.Fatalf("%d keys after b and c idled 3 reports, want 1", st.HotKeys)
	}
	if !l.Take(now+5*sec, &r, &d) || !d.Allowed {
		t.Fatal("d after the sweep: want admitted by DRL")
	}
}

func TestLimiterDemandSmoothing(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4})
	req := hot("c")
	req = withRate(req, core.Limit{Rate: 1000, Period: time.Second, Burst: 1000})
	var d core.Decision
	now := 10 * sec
	l.Take(now, &req, &d)
	l.Report(now, "g")
	id := MakeKeyID("c", "api", req.Rule.Rate())
	step := func(n int, want float64) {
		t.Helper()
		now += sec
		for range n {
			l.Take(now, &req, &d)
		}
		if got := l.Report(now, "g").Keys[id].Demand; got != want {
			t.Fatalf("demand %v, want %v", got, want)
		}
	}
	step(400, 400) // a rise is taken at once, refused requests included
	step(100, 250) // a fall halves the distance
	step(100, 175)
	step(1000, 1000)
}

// TestTakeUpToIsTakes: the simulator's batch call admits exactly what as
// many Take calls would, and counts the same demand.
func TestTakeUpToIsTakes(t *testing.T) {
	a := NewLimiter(LimiterOptions{MaxGateways: 10, Gateway: "g"})
	b := NewLimiter(LimiterOptions{MaxGateways: 10, Gateway: "g"})
	req := hot("c")
	now := 10 * sec
	var d core.Decision
	for i := range 500 {
		now += int64(i%7) * int64(time.Millisecond)
		if i == 100 || i == 300 {
			tb := tableFor(req, uint64(i), "g", Share{Rate: float64(100 + i), Burst: int64(10 + i/10)})
			a.Apply(now, tb)
			b.Apply(now, tb)
		}
		n := int64(i % 13)
		got := a.takeUpTo(now, &req, n)
		want := int64(0)
		for range n {
			b.Take(now, &req, &d)
			if d.Allowed {
				want++
			}
		}
		if got != want {
			t.Fatalf("step %d: takeUpTo(%d) admitted %d, Take %d", i, n, got, want)
		}
	}
	if ra, rb := a.Report(now, "g"), b.Report(now, "g"); ra.Keys[MakeKeyID("c", "api", req.Rule.Rate())] != rb.Keys[MakeKeyID("c", "api", req.Rule.Rate())] {
		t.Fatalf("demand %v vs %v", ra, rb)
	}
}

// TestLimiterStaleShrinkCountsFromFreshUntil: a key whose table went stale
// runs its floor from the moment it went stale, not from its next request.
func TestLimiterStaleShrinkCountsFromFreshUntil(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	ms := int64(time.Millisecond)
	sent := 10 * sec
	l.Apply(sent, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50})) // fresh until sent+2s
	stale := sent + 2*sec
	drain(t, l, stale-10*ms, &req)
	// Until stale: 10 ms at 500/s = 5 tokens; then 20 ms at the floor's
	// 250/s = 5 more. (From the request on, it would be 15.)
	if n := drain(t, l, stale+20*ms, &req); n != 10 {
		t.Fatalf("admitted %d, want 10", n)
	}
}

// TestLimiterOlderTableRefreshes: a report call that returns an older
// table than the one pub/sub brought still proves contact: the table in
// force stays fresh 2H from that call.
func TestLimiterOlderTableRefreshes(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	t0 := 10 * sec
	l.Apply(t0, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	l.Apply(t0, tableFor(req, 2, "g1", Share{Rate: 600, Burst: 60}))     // by pub/sub
	l.Apply(t0+sec, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50})) // the next report call
	if n := drain(t, l, t0+2*sec+sec/2, &req); n != 60 {
		t.Fatalf("at t0+2.5s: %d admitted, want 60 (epoch 2's burst, still fresh)", n)
	}
	if st := l.Stats(); st.Epoch != 2 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v, want epoch 2 and no fallback", st)
	}
}

// TestLimiterLimitChangeRenamesKey: a request under another limit switches
// the key to it, keeping the units spent from the gateway's share as spent
// from the share it runs under the new limit, which is the share the table
// gives the new limit's KeyID: the floor until the allocator lists it (it
// counts an unlisted gateway at its floor), never the old name's share.
// The key is reported under the new name only; a table that then lists it
// switches the key as any share change does (tokens held carried).
func TestLimiterLimitChangeRenamesKey(t *testing.T) {
	ms := int64(time.Millisecond)
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1"})
	req := hot("c") // 1000/s, B 100
	now := 10 * sec
	l.Apply(now, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	var d core.Decision
	for range 20 { // 20 of the share's 50 spent: 40 ms at T = 2 ms
		if !l.Take(now, &req, &d) || !d.Allowed || d.Limit != 100 {
			t.Fatalf("under 1000/s: %+v", d)
		}
	}
	// Raised to 2000/s, B 200: floor 500/s, B 50 (T = 2 ms): 30 left.
	up := withRate(req, core.Limit{Rate: 2000, Period: time.Second, Burst: 200})
	if !l.Take(now, &up, &d) || !d.Allowed || d.Limit != 200 || d.Remaining != 29 || d.Rate.Window != 100*time.Millisecond {
		t.Fatalf("first decision under 2000/s: %+v, want allowed, Limit 200, 29 left, window 100 ms", d)
	}
	if n := drain(t, l, now, &up); n != 29 {
		t.Fatalf("under 2000/s: %d more at once, want 29 (20 of 50 spent before the change)", n)
	}
	newID := MakeKeyID("c", "api", up.Rule.Rate())
	rep := l.Report(now, "g1")
	if len(rep.Keys) != 1 || rep.Keys[newID].Limit != (KeyLimit{Rate: 2000, Burst: 200}) || rep.Keys[newID].Demand != 51 {
		t.Fatalf("report %+v, want only %s, limit 2000/s B 200, demand 51 (20 + 30 admitted + 1 refused)", rep.Keys, newID)
	}
	if st := l.Stats(); st.HotKeys != 1 || st.ShareRate != 500 {
		t.Fatalf("stats %+v, want one key at the new floor 500/s", st)
	}
	// The allocator lists the new name: a grow to 1000/s, B 100, carries
	// the 0 tokens held; then 1 per ms.
	l.Apply(now, onRun(l, tableFor(up, 2, "g1", Share{Rate: 1000, Burst: 100})))
	if n := drain(t, l, now, &up); n != 0 {
		t.Fatalf("right after the grow: %d, want 0", n)
	}
	if n := drain(t, l, now+10*ms, &up); n != 10 {
		t.Fatalf("10 ms at 1000/s: %d, want 10", n)
	}

	// Lowered below what was spent: with the bucket empty (all 100 of the
	// share spent) the limit drops to 400/s, B 40, whose floor is 100/s,
	// B 10 (T = 10 ms): the 100 units stay spent, 1 s of debt against a
	// 100 ms window, so the next one passes after 910 ms.
	now += 10 * ms
	if n := drain(t, l, now+30*ms, &up); n != 30 {
		t.Fatalf("30 ms at 1000/s: %d, want 30", n)
	}
	now += 30 * ms
	down := withRate(req, core.Limit{Rate: 400, Period: time.Second, Burst: 40})
	if !l.Take(now, &down, &d) || d.Allowed || d.Limit != 40 || d.RetryAfter != 910*time.Millisecond {
		t.Fatalf("first decision under 400/s: %+v, want refused, Limit 40, retry after 910 ms (100 spent at 10 ms each, τ 100 ms)", d)
	}
	if n := drain(t, l, now+910*ms, &down); n != 1 {
		t.Fatalf("910 ms later: %d, want 1", n)
	}
}

// shareAt returns the share l runs req's key at now (a request of cost 0
// switches the key to it first).
func shareAt(t *testing.T, l *Limiter, now int64, req core.Request) Share {
	t.Helper()
	req.Cost = 0
	var d core.Decision
	if !l.Take(now, &req, &d) {
		t.Fatal("Take: not handled")
	}
	return lookup(l, &req).b.Load().share
}

// TestLimiterRunLapses: a gateway runs a table's shares only for its run
// (Report.Run). A table stale for less than H/2 past its 2H comes back
// with the next call, on the same run; once the run may have lapsed in
// Redis (its report expired: 2H + H/2 after the send of the latest call
// applied), a report or an answer starts a new run, and no table of the
// old run gives a share again.
func TestLimiterRunLapses(t *testing.T) {
	ms := int64(time.Millisecond)
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second}) // floor 250/s, 25
	req := hot("c")
	floor := Share{Rate: 250, Burst: 25}
	t0 := 10 * sec
	r1 := l.Report(t0, "g1").Run
	if r1 == 0 {
		t.Fatal("first report: run 0, want a run")
	}
	t1 := onRun(l, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	if t1.Runs["g1"] != r1 {
		t.Fatal("onRun")
	}
	l.Apply(t0, t1)
	if s := shareAt(t, l, t0, req); s != (Share{500, 50}) {
		t.Fatalf("run's table: %+v, want 500/s", s)
	}
	if r := l.Report(t0+sec, "g1").Run; r != r1 {
		t.Fatalf("fresh report: run %d, want %d", r, r1)
	}
	// Stale from t0+2s; the run lapses at t0+2.5s. A report at t0+2.25s
	// keeps the run, and its answer at t0+2.25s+1ms brings the table back.
	if s := shareAt(t, l, t0+2*sec+200*ms, req); s != floor {
		t.Fatalf("stale: %+v, want the floor", s)
	}
	sent := t0 + 2*sec + 250*ms
	if r := l.Report(sent, "g1").Run; r != r1 {
		t.Fatalf("report stale for 250 ms: run %d, want %d", r, r1)
	}
	l.ApplyAt(sent+ms, sent, t1)
	if s := shareAt(t, l, sent+2*ms, req); s != (Share{500, 50}) {
		t.Fatalf("answered before the run lapsed: %+v, want 500/s again", s)
	}
	// Fresh until t0+4.25s, lapsing at t0+4.75s. A report sent at t0+4.5s
	// keeps the run; its answer comes at t0+4.8s, too late: a new run,
	// fresh (the call proves contact) at the floor.
	sent = t0 + 4*sec + 500*ms
	if r := l.Report(sent, "g1").Run; r != r1 {
		t.Fatalf("report stale for 250 ms: run %d, want %d", r, r1)
	}
	l.ApplyAt(t0+4*sec+800*ms, sent, t1)
	if s := shareAt(t, l, t0+4*sec+900*ms, req); s != floor {
		t.Fatalf("answer after the run lapsed: %+v, want the floor", s)
	}
	if st := l.Stats(); st.Fallbacks != 1 || st.Runs != 2 {
		t.Fatalf("fallbacks %d, runs %d; want 1 (no request came while stale the second time; a floor while fresh is none) and 2 runs", st.Fallbacks, st.Runs)
	}
	r2 := l.Report(t0+5*sec, "g1").Run
	if r2 == r1 || r2 == 0 {
		t.Fatalf("report after a lapse: run %d, want a new run (was %d)", r2, r1)
	}
	l.Apply(t0+5*sec, onRun(l, tableFor(req, 2, "g1", Share{Rate: 600, Burst: 60})))
	if s := shareAt(t, l, t0+5*sec, req); s != (Share{600, 60}) {
		t.Fatalf("new run's table: %+v, want 600/s", s)
	}
	// Fresh until t0+7s, lapsing at t0+7.5s: a report at t0+10s starts
	// run 3; the answer brings epoch 2 again, for run 2: the floor.
	t2 := l.table
	r3 := l.Report(t0+10*sec, "g1").Run
	if r3 == r2 || r3 == r1 || r3 == 0 {
		t.Fatalf("report after the run lapsed: run %d, want a new one (had %d, %d)", r3, r1, r2)
	}
	l.ApplyAt(t0+10*sec+ms, t0+10*sec, t2)
	if s := shareAt(t, l, t0+10*sec+2*ms, req); s != floor {
		t.Fatalf("old run's table after a lapse: %+v, want the floor", s)
	}
	if st := l.Stats(); st.Runs != 3 {
		t.Fatalf("runs %d, want 3", st.Runs)
	}
}

// TestGatewayBackFromPartitionRunsNoOldShare: the allocator gives a
// partitioned gateway's share away once its report has expired. If the
// gateway's first report call after the partition reaches Redis between
// the allocator's read of the reports and its write of the new table,
// the call returns the table it ran before. Running it again would put
// the shares run at 750 + 500 = 1250/s for a limit of 1000/s. The
// gateway is on a new run, so it runs its floor until a table for that
// run reaches it.
func TestGatewayBackFromPartitionRunsNoOldShare(t *testing.T) {
	ms := int64(time.Millisecond)
	w := newTwoGateways()
	req, id, la, lb := w.req, w.id, w.la, w.lb
	report := func(l *Limiter, now int64, g string) Report { return w.report(l, now, g, 2000) }
	step := func(now int64, live ...Report) *Table { return w.step(now, nil, live...) }
	running := func(at int64) (a, b Share) {
		a, b = shareAt(t, la, at, req), shareAt(t, lb, at, req)
		if sum := a.Rate + b.Rate; sum > 1000 {
			t.Fatalf("at %v: a runs %v/s, b %v/s: %v/s for a limit of 1000/s", time.Duration(at), a.Rate, b.Rate, sum)
		}
		return a, b
	}
	t0 := 10 * sec
	rb := report(lb, t0, "b")
	t1 := step(t0, report(la, t0, "a"), rb)
	la.Apply(t0, t1)
	lb.Apply(t0, t1)
	if a, b := running(t0); !near(a.Rate, 500) || !near(b.Rate, 500) {
		t.Fatalf("epoch 1: a %v, b %v, want 500 each", a, b)
	}
	// b is cut off from Redis after t0: its report expires at t0+2.5s.
	step(t0+sec, report(la, t0+sec, "a"), rb)
	step(t0+2*sec, report(la, t0+2*sec, "a"), rb)
	t2 := step(t0+3*sec, report(la, t0+3*sec, "a"))
	if s := t2.Keys[id].Shares["a"]; !near(s.Rate, 750) || len(t2.Keys[id].Shares) != 1 {
		t.Fatalf("b expired: shares %v, want a at 750 (b's floor kept)", t2.Keys[id].Shares)
	}
	// b is back: its report call reaches Redis before epoch 2 is written
	// and returns epoch 1, the table b knows; a applies epoch 2.
	rb = report(lb, t0+3*sec, "b")
	lb.ApplyAt(t0+3*sec+2*ms, t0+3*sec, t1)
	la.ApplyAt(t0+3*sec+5*ms, t0+3*sec, t2)
	if a, b := running(t0 + 3*sec + 10*ms); !near(a.Rate, 750) || b.Rate != 250 {
		t.Fatalf("b back, before epoch 3: a %v, b %v, want 750 and b's floor 250", a, b)
	}
	// The allocator sees b on its new run: b at its floor until a has
	// applied its shrink, then 500 each.
	ra := report(la, t0+4*sec, "a")
	rb = report(lb, t0+4*sec, "b")
	t3 := step(t0+4*sec, ra, rb)
	if t3.Runs["b"] != rb.Run {
		t.Fatalf("epoch %d lists b on run %d, want its new run %d", t3.Epoch, t3.Runs["b"], rb.Run)
	}
	la.Apply(t0+4*sec, t3)
	lb.ApplyAt(t0+4*sec+ms, t0+4*sec, t3)
	if a, b := running(t0 + 4*sec + 10*ms); !near(a.Rate, 500) || b.Rate != 250 {
		t.Fatalf("epoch 3: a %v, b %v, want 500 and 250", a, b)
	}
	t4 := step(t0+5*sec, report(la, t0+5*sec, "a"), report(lb, t0+5*sec, "b"))
	la.Apply(t0+5*sec, t4)
	lb.Apply(t0+5*sec, t4)
	if a, b := running(t0 + 5*sec + 10*ms); !near(a.Rate, 500) || !near(b.Rate, 500) {
		t.Fatalf("epoch 4: a %v, b %v, want 500 each", a, b)
	}
}

// TestLimiterNewLineSameEpoch: a Redis that lost its data numbers epochs
// and tokens from 1 again; the new line's first table has the epoch and
// token of the table in force (here 1 and 1) and replaces it: the gateway
// runs the new allocator's share, not the old line's. A table of the same
// line, epoch and token only refreshes the one in force.
func TestLimiterNewLineSameEpoch(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	now := 10 * sec
	old := onRun(l, tableFor(req, 1, "g1", Share{Rate: 700, Burst: 70}))
	old.Line = 0xa
	l.Apply(now, old)
	if s := shareAt(t, l, now, req); s != (Share{700, 70}) {
		t.Fatalf("old line: %+v, want 700/s", s)
	}
	same := onRun(l, tableFor(req, 1, "g1", Share{Rate: 300, Burst: 30}))
	same.Line = 0xa
	l.Apply(now+sec, same)
	if s := shareAt(t, l, now+sec, req); s != (Share{700, 70}) {
		t.Fatalf("same line, epoch and token: %+v, want the table in force (700/s)", s)
	}
	// Redis lost its data; 3 s later (every table stale) the new line's
	// first table comes.
	later := now + 4*sec
	l.Report(later, "g1")
	nl := onRun(l, tableFor(req, 1, "g1", Share{Rate: 400, Burst: 40}))
	nl.Line = 0xb
	l.ApplyAt(later+1, later, nl)
	if s := shareAt(t, l, later+2, req); s != (Share{400, 40}) {
		t.Fatalf("new line, epoch 1 token 1: %+v, want its share 400/s", s)
	}
}

// TestLimiterRunsLegacyTable: a table without runs (an allocator of an
// earlier release, during a rolling upgrade) gives its shares whatever the
// gateway's run; a table with runs that lists another run gives none.
func TestLimiterRunsLegacyTable(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	now := 10 * sec
	l.Report(now, "g1")
	l.Apply(now, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	if s := shareAt(t, l, now, req); s != (Share{500, 50}) {
		t.Fatalf("table without runs: %+v, want its share 500/s", s)
	}
	run := l.Report(now, "g1").Run
	other := tableFor(req, 2, "g1", Share{Rate: 600, Burst: 60})
	other.Runs = map[string]uint64{"g1": run - 1} // an earlier run of this Limiter: the allocator lags
	l.Apply(now, other)
	if s := shareAt(t, l, now, req); s != (Share{250, 25}) {
		t.Fatalf("table for an earlier run: %+v, want the floor", s)
	}
	if r := l.Report(now, "g1").Run; r != run {
		t.Fatalf("after a table for an earlier run: run %d, want %d kept", r, run)
	}
}

// TestLimiterForeignRunStartsNewRun: a table that lists this gateway's ID
// on a run of another incarnation (a late report of a process gone, or a
// process sharing the ID) gives it its floor and starts a new run of its
// own, above the one it was on, so the allocator takes its next report
// for the gateway's latest run instead of listing the foreign one forever.
func TestLimiterForeignRunStartsNewRun(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	now := 10 * sec
	run := l.Report(now, "g1").Run
	foreign := run ^ 1<<62
	tb := tableFor(req, 1, "g1", Share{Rate: 600, Burst: 60})
	tb.Runs = map[string]uint64{"g1": foreign}
	l.Apply(now, tb)
	if s := shareAt(t, l, now, req); s != (Share{250, 25}) {
		t.Fatalf("table for a foreign run: %+v, want the floor", s)
	}
	if r := l.Report(now, "g1").Run; r != run+1 || l.Stats().Runs != 2 {
		t.Fatalf("after a table for a foreign run: run %d (%d runs), want %d (the next of this Limiter: 2 runs)", r, l.Stats().Runs, run+1)
	}
	l.Apply(now, onRun(l, tableFor(req, 2, "g1", Share{Rate: 600, Burst: 60})))
	if s := shareAt(t, l, now, req); s != (Share{600, 60}) {
		t.Fatalf("table for the new run: %+v, want 600/s", s)
	}
}

// TestLateReportOfOldRunKeepsBound: a report call of b's run W times out
// on b but reaches Redis long after (a connection that delivers it once
// the partition heals), when b is back on run X running 500/s. The
// allocator takes W for the run b has left: it keeps b on X and b's bound,
// so a does not grow into b's 500 before b has applied its shrink.
func TestLateReportOfOldRunKeepsBound(t *testing.T) {
	ms := int64(time.Millisecond)
	w := newTwoGateways()
	req, id, la, lb := w.req, w.id, w.la, w.lb
	rep, step := w.report, w.step
	t0 := 10 * sec
	rbW := rep(lb, t0, "b", 2000)
	t1 := step(t0, nil, rep(la, t0, "a", 2000), rbW)
	la.Apply(t0, t1)
	lb.Apply(t0, t1)
	// b is cut off after t0; at t0+2.25s (run W, not lapsed) it sends a
	// report (demand 300: the load balancer drained it) that is lost to b.
	late := rep(lb, t0+2250*ms, "b", 300)
	step(t0+sec, map[string]uint64{"a": 1, "b": 1}, rep(la, t0+sec, "a", 2000), rbW)
	t2 := step(t0+3*sec, map[string]uint64{"a": 1, "b": 1}, rep(la, t0+3*sec, "a", 2000))
	la.ApplyAt(t0+3*sec+ms, t0+3*sec, t2)
	// b is back, on run X.
	rbX := rep(lb, t0+3500*ms, "b", 2000)
	if rbX.Run == late.Run {
		t.Fatal("b back after its run lapsed: the same run")
	}
	lb.ApplyAt(t0+3500*ms+ms, t0+3500*ms, t2)
	t3 := step(t0+4*sec, map[string]uint64{"a": 2}, rep(la, t0+4*sec, "a", 2000), rbX)
	la.ApplyAt(t0+4*sec+ms, t0+4*sec, t3)
	lb.ApplyAt(t0+4*sec+ms, t0+3500*ms, t3)
	t4 := step(t0+5*sec, map[string]uint64{"a": 3, "b": 3}, rep(la, t0+5*sec, "a", 2000), rep(lb, t0+5*sec, "b", 2000))
	la.ApplyAt(t0+5*sec+ms, t0+5*sec, t4)
	lb.ApplyAt(t0+5*sec+ms, t0+5*sec, t4)
	if a, b := shareAt(t, la, t0+5*sec+2*ms, req), shareAt(t, lb, t0+5*sec+2*ms, req); !near(a.Rate, 500) || !near(b.Rate, 500) {
		t.Fatalf("epoch %d: a %v, b %v, want 500 each", t4.Epoch, a, b)
	}
	// The late report of run W lands and overwrites b's report.
	t5 := step(t0+5500*ms, map[string]uint64{"a": 4, "b": 4}, rep(la, t0+5500*ms, "a", 2000), late)
	if t5.Runs["b"] != rbX.Run {
		t.Fatalf("epoch %d lists b on run %d, want the run it is on (%d), not the late report's (%d)", t5.Epoch, t5.Runs["b"], rbX.Run, late.Run)
	}
	if s := t5.Keys[id].Shares; !near(s["a"].Rate, 500) || s["b"].Rate != 300 {
		t.Fatalf("epoch %d: shares %v, want a kept at 500 (b may run 500 until it applies its shrink to 300)", t5.Epoch, s)
	}
	la.ApplyAt(t0+5500*ms+ms, t0+5500*ms, t5) // b's delivery of epoch 5 is slower
	a, b := shareAt(t, la, t0+5500*ms+2*ms, req), shareAt(t, lb, t0+5500*ms+2*ms, req)
	if !near(a.Rate, 500) || !near(b.Rate, 500) {
		t.Fatalf("running: a %v, b %v; want 500 each", a, b)
	}
}

// TestLimiterOlderTableNeverReplacesNewer: while the table is stale, a
// report call's answer brings epoch 1 after pub/sub brought epoch 2 (a
// shrink, acknowledged): epoch 2 stays in force, fresh again from the
// call's send, and the gateway never runs epoch 1's larger share.
func TestLimiterOlderTableNeverReplacesNewer(t *testing.T) {
	ms := int64(time.Millisecond)
	l := NewLimiter(LimiterOptions{MaxGateways: 4, Gateway: "g1", Interval: time.Second})
	req := hot("c")
	t0 := 10 * sec
	l.Report(t0, "g1")
	t1 := onRun(l, tableFor(req, 1, "g1", Share{Rate: 500, Burst: 50}))
	l.Apply(t0, t1)
	sent := t0 + 2200*ms // stale, the run not lapsed
	l.Report(sent, "g1")
	l.ApplyAt(sent+5*ms, t0, onRun(l, tableFor(req, 2, "g1", Share{Rate: 300, Burst: 30}))) // pub/sub, with the last report call's send
	l.ApplyAt(sent+8*ms, sent, t1)                                                          // the call's answer
	if st := l.Stats(); st.Epoch != 2 {
		t.Fatalf("epoch %d in force, want 2", st.Epoch)
	}
	if s := shareAt(t, l, sent+9*ms, req); s != (Share{300, 30}) {
		t.Fatalf("after the older answer: %+v, want epoch 2's 300/s", s)
	}
	if s := shareAt(t, l, sent+2*sec-ms, req); s != (Share{300, 30}) {
		t.Fatalf("just before sent+2H: %+v, want epoch 2's 300/s (fresh from the call)", s)
	}
}
