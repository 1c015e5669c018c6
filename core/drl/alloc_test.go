package drl

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var lim1000 = KeyLimit{Rate: 1000, Burst: 100}

const kid = KeyID("k")

func reports(applied uint64, d map[string]float64) []Report {
	var out []Report
	for g, v := range d {
		out = append(out, Report{Gateway: g, Applied: applied, Keys: map[KeyID]KeyDemand{kid: {Limit: lim1000, Demand: v}}})
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-4 }

func wantShares(t *testing.T, tb *Table, want map[string]Share) {
	t.Helper()
	got := tb.Keys[kid].Shares
	if len(got) != len(want) {
		t.Fatalf("epoch %d shares %v, want %v", tb.Epoch, got, want)
	}
	for g, w := range want {
		if s := got[g]; !near(s.Rate, w.Rate) || s.Burst != w.Burst {
			t.Fatalf("epoch %d: %s's share %+v, want %+v (all: %v)", tb.Epoch, g, s, w, got)
		}
	}
}

// TestAllocatorSkewAndShrinkBeforeGrow: R = 1000/s, B = 100 over up to 32
// gateways (floor 31.25/s, burst 3), one floor reserved for joiners.
func TestAllocatorSkewAndShrinkBeforeGrow(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		a := NewAllocator(AllocatorOptions{unsafeGrowsBeforeShrinks: unsafe}, 7, nil)
		// Offered 1500/s split 70/10/10/10: wants 1071, 153, 153, 153;
		// water-filling gives "a" 968.75 − 3×153.
		tb, pub := a.Step(0, reports(0, map[string]float64{"a": 1050, "b": 150, "c": 150, "d": 150}), nil)
		if !pub || tb.Epoch != 1 || tb.Token != 7 {
			t.Fatalf("first step: published %v, epoch %d token %d", pub, tb.Epoch, tb.Token)
		}
		wantShares(t, tb, map[string]Share{"a": {509.75, 50}, "b": {153, 15}, "c": {153, 15}, "d": {153, 15}})
		if _, pub := a.Step(1, reports(1, map[string]float64{"a": 1050, "b": 150, "c": 150, "d": 150}), nil); pub {
			t.Fatal("same demand: published again")
		}
		// The load moves from a to b: a shrinks at once; b's grow needs
		// a's shrink acknowledged (all have applied epoch 1 so far).
		shift := map[string]float64{"a": 100, "b": 1050, "c": 150, "d": 150}
		tb, pub = a.Step(2, reports(1, shift), nil)
		if unsafe {
			wantShares(t, tb, map[string]Share{"a": {102, 10}, "b": {560.75, 56}, "c": {153, 15}, "d": {153, 15}})
			continue
		}
		wantShares(t, tb, map[string]Share{"a": {102, 10}, "b": {153, 15}, "c": {153, 15}, "d": {153, 15}})
		if !pub || tb.Epoch != 2 || !near(tb.Keys[kid].Bounds["a"].Rate, 509.75) || tb.Keys[kid].Bounds["a"].Burst != 50 {
			t.Fatalf("epoch %d bounds %v", tb.Epoch, tb.Keys[kid].Bounds)
		}
		// b, c, d acknowledge epoch 2; a not yet: no grow.
		if tb, pub = a.Step(3, reports(1, shift), map[string]uint64{"b": 2, "c": 2, "d": 2}); pub || tb.Epoch != 2 {
			t.Fatalf("grow before a's shrink is acknowledged: epoch %d", tb.Epoch)
		}
		tb, pub = a.Step(4, reports(1, shift), map[string]uint64{"a": 2, "b": 2, "c": 2, "d": 2})
		if !pub || tb.Epoch != 3 {
			t.Fatalf("after the ack: published %v epoch %d", pub, tb.Epoch)
		}
		wantShares(t, tb, map[string]Share{"a": {102, 10}, "b": {560.75, 56}, "c": {153, 15}, "d": {153, 15}})

		// Takeover from epoch 2's table (as stored before epoch 3), with
		// a's acknowledgement lost: the new allocator keeps a's bound.
		b := NewAllocator(AllocatorOptions{}, 8, a2(t))
		tb, pub = b.Step(10, reports(1, shift), map[string]uint64{"b": 2, "c": 2, "d": 2})
		if !pub || tb.Epoch != 3 || tb.Token != 8 {
			t.Fatalf("takeover: published %v epoch %d token %d", pub, tb.Epoch, tb.Token)
		}
		wantShares(t, tb, map[string]Share{"a": {102, 10}, "b": {153, 15}, "c": {153, 15}, "d": {153, 15}})
		tb, _ = b.Step(11, reports(3, shift), nil) // a reports it applied 3
		wantShares(t, tb, map[string]Share{"a": {102, 10}, "b": {560.75, 56}, "c": {153, 15}, "d": {153, 15}})
	}
}

// a2 is the table of epoch 2 of TestAllocatorSkewAndShrinkBeforeGrow.
func a2(t *testing.T) *Table {
	a := NewAllocator(AllocatorOptions{}, 7, nil)
	a.Step(0, reports(0, map[string]float64{"a": 1050, "b": 150, "c": 150, "d": 150}), nil)
	tb, _ := a.Step(2, reports(1, map[string]float64{"a": 100, "b": 1050, "c": 150, "d": 150}), nil)
	return tb
}

// TestAllocatorDepartedAndForget: a gateway whose report expired keeps its
// floor reserved for Forget (it may be partitioned, still serving).
func TestAllocatorDepartedAndForget(t *testing.T) {
	a := NewAllocator(AllocatorOptions{MaxGateways: 10, Forget: 30}, 1, nil) // floor 100/s, burst 10
	a.Step(0, reports(0, map[string]float64{"a": 1000, "b": 1000, "c": 1000}), nil)
	tb, _ := a.Step(1, reports(1, map[string]float64{"a": 1000, "b": 1000}), map[string]uint64{"a": 1, "b": 1})
	// c's report expired: it is at its floor by its own 2H rule, and its
	// floor stays reserved: 1000 − (1 join + 1 departed)×100 = 800.
	wantShares(t, tb, map[string]Share{"a": {400, 40}, "b": {400, 40}})
	tb, _ = a.Step(31, reports(1, map[string]float64{"a": 1000, "b": 1000}), map[string]uint64{"a": 2, "b": 2})
	wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {450, 45}})
	// Under-used capacity is split equally; a gateway with no demand still
	// gets its floor at least.
	tb, _ = a.Step(32, reports(1, map[string]float64{"a": 50, "b": 0}), map[string]uint64{"a": 3, "b": 3})
	wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {450, 45}})
}

// TestAllocatorTakeoverKeepsDepartedFloors: an allocator taking over from
// the stored table keeps the floors of the gateways the table counts as
// departed (cut off from Redis, perhaps serving at their floors) until
// Forget has passed since they were last live, as the allocator before it
// would have. It once learnt only the table's live gateways and gave the
// departed ones' floors away: a and b got 450/s each while c and d could
// still run 100/s each, 1100/s in all for a limit of 1000/s.
func TestAllocatorTakeoverKeepsDepartedFloors(t *testing.T) {
	o := AllocatorOptions{MaxGateways: 10, Forget: 30} // floor 100/s, burst 10; one floor kept for joiners
	a := NewAllocator(o, 1, nil)
	a.Step(0, reports(0, map[string]float64{"a": 1000, "b": 1000, "c": 1000, "d": 1000}), nil)
	live := map[string]float64{"a": 1000, "b": 1000}
	tb, _ := a.Step(10, reports(1, live), map[string]uint64{"a": 1, "b": 1})
	// 1000 − (1 join + 2 departed)×100 = 700 for a and b.
	wantShares(t, tb, map[string]Share{"a": {350, 35}, "b": {350, 35}})
	if len(tb.Departed) != 2 || tb.Departed["c"] != 10 || tb.Departed["d"] != 10 {
		t.Fatalf("table's departed gateways %v, want c and d, last live 10 ns before", tb.Departed)
	}

	// Taken over through Redis (the table as JSON), on another clock.
	j, err := json.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := decodeTable(string(j))
	if err != nil {
		t.Fatal(err)
	}
	b := NewAllocator(o, 2, stored)
	tb2, _ := b.Step(1000, reports(2, live), map[string]uint64{"a": 2, "b": 2})
	wantShares(t, tb2, map[string]Share{"a": {350, 35}, "b": {350, 35}})
	// c and d were last live 10 ns before the table: their floors go 20
	// ns after the takeover, and a and b grow (once they acknowledge).
	tb3, _ := b.Step(1019, reports(tb2.Epoch, live), map[string]uint64{"a": tb2.Epoch, "b": tb2.Epoch})
	wantShares(t, tb3, map[string]Share{"a": {350, 35}, "b": {350, 35}})
	tb4, _ := b.Step(1020, reports(tb3.Epoch, live), map[string]uint64{"a": tb3.Epoch, "b": tb3.Epoch})
	wantShares(t, tb4, map[string]Share{"a": {450, 45}, "b": {450, 45}})
	if len(tb4.Departed) != 0 {
		t.Fatalf("departed %v after Forget, want none", tb4.Departed)
	}
}

// TestAllocatorBoundProperty: over random demands, gateways joining and
// leaving, and acknowledgements arriving late, the shares each gateway may
// be running (any table from the one it acknowledged to the newest) plus
// the reserved floors never exceed the limit, rate or burst.
func TestAllocatorBoundProperty(t *testing.T) {
	for seed := range uint64(200) {
		if msg := boundProperty(seed, false); msg != "" {
			t.Fatal(msg)
		}
	}
	// The check has teeth: grows before shrinks break it.
	broken := 0
	for seed := range uint64(200) {
		if boundProperty(seed, true) != "" {
			broken++
		}
	}
	if broken < 150 {
		t.Fatalf("UnsafeGrowsBeforeShrinks broke the bound for %d of 200 seeds, want most", broken)
	}
	t.Logf("UnsafeGrowsBeforeShrinks broke the bound for %d of 200 seeds", broken)
}

// boundProperty runs one seed and returns the first violation, or "".
func boundProperty(seed uint64, unsafe bool) string {
	{
		rng := rand.New(rand.NewPCG(seed, 1))
		o := AllocatorOptions{MaxGateways: 8, Forget: 1 << 62, unsafeGrowsBeforeShrinks: unsafe}
		a := NewAllocator(o, 1, nil)
		floor := lim1000.Floor(8)
		var tables []*Table
		running := map[string]uint64{} // the epoch each gateway runs (≤ newest)
		runs := map[string]uint64{}    // each gateway's run (Report.Run)
		acked := map[string]uint64{}   // the epoch each gateway reports it applied (≤ running)
		live := map[string]bool{"g0": true, "g1": true}
		next := 2
		everLive := map[string]bool{}
		// A joiner runs its floor out of the join reserve until the shrinks
		// that make room for it are acknowledged: one join at a time
		// (JoinReserve 1) until every live gateway has applied the newest
		// table.
		pendingJoin := false
		for step := range 300 {
			if !pendingJoin && rng.IntN(10) == 0 && len(everLive) < 7 {
				live["g"+string(rune('0'+next))] = true
				next++
				pendingJoin = true
			}
			names := slices.Sorted(maps.Keys(live))
			if rng.IntN(15) == 0 && len(live) > 1 {
				delete(live, names[rng.IntN(len(names))]) // its report expires: at its floor
			}
			if gone := slices.Sorted(maps.Keys(everLive)); rng.IntN(15) == 0 {
				// A gateway whose report had expired reports again, on a
				// new run (it went stale first): it applies the newest
				// table, whose shares are not for its run, but reports and
				// acknowledges what it applied before.
				for _, g := range gone {
					if !live[g] && len(tables) > 0 {
						live[g] = true
						runs[g]++
						running[g] = tables[len(tables)-1].Epoch
						break
					}
				}
			}
			var reps []Report
			acks := map[string]uint64{}
			for _, g := range slices.Sorted(maps.Keys(live)) {
				everLive[g] = true
				if len(tables) > 0 && rng.IntN(2) == 0 {
					// apply some table at or after the one it runs
					lo := running[g]
					newest := tables[len(tables)-1].Epoch
					running[g] = lo + uint64(rng.IntN(int(newest-lo)+1))
					acked[g] = running[g]
				}
				acks[g] = acked[g]
				if runs[g] == 0 {
					runs[g] = 1<<runSeqBits + 1 // one gateway process each
				}
				reps = append(reps, Report{Gateway: g, Applied: acked[g], Run: runs[g], Keys: map[KeyID]KeyDemand{kid: {Limit: lim1000, Demand: rng.Float64() * 1500}}})
			}
			tb, pub := a.Step(int64(step), reps, acks)
			if pub {
				tables = append(tables, tb)
			}
			// Check: every gateway ever seen may run at most the max of its
			// shares from its acknowledged epoch on (floor if unlisted);
			// gateways no longer live run their floor; one joiner's floor.
			if pendingJoin && len(tables) > 0 {
				settled := true
				for g := range live {
					settled = settled && running[g] == tables[len(tables)-1].Epoch
				}
				pendingJoin = !settled
			}
			sumR, sumB := 0.0, int64(0)
			if !pendingJoin {
				sumR, sumB = floor.Rate, floor.Burst // room for one joiner
			}
			for g := range everLive {
				m := floor
				if live[g] {
					for _, tbl := range tables {
						if tbl.Epoch >= running[g] {
							if s, ok := tbl.Keys[kid].Shares[g]; ok && tbl.Runs[g] == runs[g] {
								m = maxShare(m, s)
							}
						}
					}
				}
				sumR += m.Rate
				sumB += m.Burst
			}
			if sumR > 1000+1e-6 || sumB > 100 {
				return fmt.Sprintf("seed %d step %d: gateways may run %.3f/s, burst %d: above 1000/s, 100", seed, step, sumR, sumB)
			}
		}
	}
	return ""
}

// TestAllocatorNewRunStartsAtFloor: a gateway on a new run (Report.Run)
// is at its floor whatever it acknowledged before: a gateway whose report
// expired went stale first and comes back on a new run, and gets no share
// for free from its old history while the others' shrinks are
// unacknowledged. A report of the old run (sent before it went stale,
// arriving late) keeps its history: it may still run that run's shares.
func TestAllocatorNewRunStartsAtFloor(t *testing.T) {
	for _, newRun := range []bool{true, false} {
		a := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil) // floor 100/s, burst 10
		tb, _ := a.Step(0, onRuns(reports(0, map[string]float64{"a": 1000, "b": 1000}), 1), nil)
		wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {450, 45}})
		if tb.Runs["a"] != 1 || tb.Runs["b"] != 1 || len(tb.Runs) != 2 {
			t.Fatalf("runs %v, want a and b on run 1", tb.Runs)
		}
		// b's report expired: a gets what b and a reserved floor leave.
		tb, _ = a.Step(1, onRuns(reports(1, map[string]float64{"a": 1000}), 1), map[string]uint64{"a": 1, "b": 1})
		wantShares(t, tb, map[string]Share{"a": {800, 80}})
		back := onRuns(reports(1, map[string]float64{"a": 1000, "b": 1000}), 1)
		if newRun {
			for i := range back {
				if back[i].Gateway == "b" {
					back[i].Run = 2
				}
			}
		}
		tb, _ = a.Step(2, back, map[string]uint64{"a": 1, "b": 1})
		if !newRun {
			// b may run epoch 1's 450 (its bound), a 800 until it applies
			// epoch 3: 1250 − 100 reserved − 450 − 800 leaves nothing.
			wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {450, 45}})
			if b := tb.Keys[kid].Bounds["b"]; !near(b.Rate, 450) || b.Burst != 45 {
				t.Fatalf("same run: b's bound %+v, want epoch 1's share", b)
			}
			continue
		}
		// b is back on run 2 (it last applied epoch 1), a has not applied
		// epoch 2's successor: a may run 800 until it does, so b stays at
		// its floor.
		wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {100, 10}})
		if b := tb.Keys[kid].Bounds["b"]; b != (Share{100, 10}) || tb.Runs["b"] != 2 {
			t.Fatalf("b's bound %+v on run %d, want its floor on run 2", b, tb.Runs["b"])
		}
		// a applies epoch 3: b grows.
		tb, _ = a.Step(3, onRuns(reports(3, map[string]float64{"a": 1000, "b": 1000}), 1, "b", 2), nil)
		wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {450, 45}})
	}
}

// TestAllocatorPublishesForNewRun: a gateway on a new run gets a table for
// it even when no share changes (it runs its floors until one lists its
// run), and only one.
func TestAllocatorPublishesForNewRun(t *testing.T) {
	a := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil)
	d := map[string]float64{"a": 100, "b": 100}
	tb, _ := a.Step(0, onRuns(reports(0, d), 1), nil)
	if _, pub := a.Step(1, onRuns(reports(1, d), 1), nil); pub {
		t.Fatal("published with nothing changed")
	}
	tb2, pub := a.Step(2, onRuns(reports(1, d), 1, "b", 7), nil)
	if !pub || tb2.Epoch != tb.Epoch+1 || tb2.Runs["b"] != 7 || tb2.Runs["a"] != 1 {
		t.Fatalf("b on run 7: published %v, epoch %d, runs %v; want epoch %d for b's run 7", pub, tb2.Epoch, tb2.Runs, tb.Epoch+1)
	}
	if _, pub := a.Step(3, onRuns(reports(2, d), 1, "b", 7), nil); pub {
		t.Fatal("published again for the same run")
	}
}

// onRuns sets every report's Run to run, then gateway g's to gr for each
// (g, gr) pair in more.
func onRuns(reps []Report, run uint64, more ...any) []Report {
	for i := range reps {
		reps[i].Run = run
		for j := 0; j+1 < len(more); j += 2 {
			if reps[i].Gateway == more[j].(string) {
				reps[i].Run = uint64(more[j+1].(int))
			}
		}
	}
	return reps
}

// TestAllocatorLine: an allocator that finds no table starts a new line;
// one taking over keeps the line of the table it takes over from.
func TestAllocatorLine(t *testing.T) {
	a := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil)
	t1, _ := a.Step(0, onRuns(reports(0, map[string]float64{"a": 100}), 1), nil)
	b := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil)
	u1, _ := b.Step(0, onRuns(reports(0, map[string]float64{"a": 100}), 1), nil)
	if t1.Line == 0 || u1.Line == 0 || t1.Line == u1.Line || t1.Epoch != u1.Epoch || t1.Token != u1.Token {
		t.Fatalf("two new lines: lines %x and %x, epochs %d %d, tokens %d %d; want two nonzero lines, the same epoch and token", t1.Line, u1.Line, t1.Epoch, u1.Epoch, t1.Token, u1.Token)
	}
	c := NewAllocator(AllocatorOptions{MaxGateways: 10}, 2, t1)
	t2, _ := c.Step(1, onRuns(reports(1, map[string]float64{"a": 100}), 1), nil)
	if t2.Line != t1.Line || t2.Epoch != 2 || t2.Token != 2 {
		t.Fatalf("taken over: line %x epoch %d token %d, want line %x epoch 2 token 2", t2.Line, t2.Epoch, t2.Token, t1.Line)
	}
}

// TestAllocatorRunZeroBackFromPartition: a gateway of an earlier release
// reports no run (0). Back after its report expired, it starts again from
// its floor, as before runs: it runs its floor (its 2H rule) and a may
// still run the 800 epoch 2 gave it.
func TestAllocatorRunZeroBackFromPartition(t *testing.T) {
	a := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil) // floor 100/s, burst 10
	a.Step(0, reports(0, map[string]float64{"a": 1000, "b": 1000}), nil)
	tb, _ := a.Step(1, reports(1, map[string]float64{"a": 1000}), map[string]uint64{"a": 1, "b": 1})
	wantShares(t, tb, map[string]Share{"a": {800, 80}})
	tb, _ = a.Step(2, reports(1, map[string]float64{"a": 1000, "b": 1000}), map[string]uint64{"a": 1, "b": 1})
	wantShares(t, tb, map[string]Share{"a": {450, 45}, "b": {100, 10}})
	if b := tb.Keys[kid].Bounds["b"]; b != (Share{100, 10}) {
		t.Fatalf("b's bound %+v, want its floor", b)
	}
}

// TestAllocatorOtherIncarnationKeepsBound: a report of another incarnation
// (a gateway process restarted with the same ID, or a late report of one
// gone) is not taken for a lapse: the allocator keeps what it knew of the
// gateway (the old process may have run epoch 1's 450 until it stopped),
// and lists the gateway on the new run.
func TestAllocatorOtherIncarnationKeepsBound(t *testing.T) {
	a := NewAllocator(AllocatorOptions{MaxGateways: 10}, 1, nil) // floor 100/s, burst 10
	inc1, inc2 := uint64(1)<<runSeqBits, uint64(2)<<runSeqBits
	a.Step(0, onRuns(reports(0, map[string]float64{"a": 1000, "b": 1000}), inc1+1), nil)
	tb, _ := a.Step(1, onRuns(reports(1, map[string]float64{"a": 1000, "b": 1000}), inc1+1, "b", int(inc2+1)), map[string]uint64{"a": 1})
	if b := tb.Keys[kid].Bounds["b"]; !near(b.Rate, 450) || b.Burst != 45 || tb.Runs["b"] != inc2+1 {
		t.Fatalf("b on another incarnation: bound %+v on run %x, want epoch 1's 450 on run %x", b, tb.Runs["b"], inc2+1)
	}
}
