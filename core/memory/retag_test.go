package memory

// Tests of a limit change on a held key (the retag of shard.put): the TAT
// is carried over in emission intervals, exactly under concurrency and
// resizes, with refunds following the key, and without carry-over for the
// intervals beyond the store's tags. The semantics every store shares are
// the conformance vectors' (core/storetest, LimitChange).

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestRescale: the debt in emission intervals carries over, rounded up,
// bounded, in 128-bit arithmetic; no debt, an unknown interval or the same
// interval keep the TAT.
func TestRescale(t *testing.T) {
	const now = int64(1000)
	for _, c := range []struct {
		tat, from, to, want int64
	}{
		{now + 60, 20, 10, now + 30},                    // 3 intervals of 20 → 3 of 10
		{now + 30, 10, 20, now + 60},                    // and back
		{now + 51, 6, 3, now + 26},                      // 25.5, rounded up
		{now, 20, 10, now},                              // no debt
		{now - 5, 20, 10, now - 5},                      // passed: kept as it is
		{now + 60, 0, 10, now + 60},                     // unknown interval: no carry-over
		{now + 60, 20, 0, now + 60},                     // unknown interval: no carry-over
		{now + 60, 20, 20, now + 60},                    // same interval
		{now + 1<<61, 1, 1 << 40, now + int64(maxDebt)}, // beyond the bound
		{now + 1<<40, 1 << 50, 1 << 60, now + 1<<50},    // d × to needs 128 bits
		{now + 1<<62, 3, 1, now + (1<<62+2)/3},          // the longest debt, shrunk
	} {
		if got := rescale(c.tat, now, c.from, c.to); got != c.want {
			t.Errorf("rescale(now%+d, %d → %d) = now%+d, want now%+d", c.tat-now, c.from, c.to, got-now, c.want-now)
		}
	}
}

// TestRetagMovesTheKey: a request under another interval moves the key to
// a slot of its own tag with the TAT rescaled and the quota period kept;
// the old slot is frozen (retagTo mark, tombstone) and deleted; a refund
// of a step stored before the move follows it and gives back the step in
// the new units.
func TestRetagMovesTheKey(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 1})
	sh := &s.shards[0]
	now := clock.Nanotime()
	q := core.Quota{Max: 10, Renewal: time.Hour}
	ra := prepare(t, s, core.LimitSet{Rate: core.PerMinute(3), Quota: q}).Data().(*rule) // T = 20s
	rb := prepare(t, s, core.LimitSet{Rate: core.PerMinute(6), Quota: q}).Data().(*rule) // T = 10s
	if ra.tag == 0 || rb.tag == 0 || ra.tag == rb.tag {
		t.Fatalf("tags %d and %d, want two distinct known tags", ra.tag, rb.tag)
	}
	_, f := s.locate("k", "")
	sh.holdPeriods()
	t0, e := sh.put(f, ra, now)
	p := &period{end: now + int64(time.Hour)}
	p.used.Store(3)
	e.quota.Store(p)
	e.tat.Store(now + int64(time.Minute)) // 3 intervals of 20s, the last one a step to refund
	t1, e2 := sh.put(f, rb, now)
	if e2 == e || t1 != t0 {
		t.Fatal("the retag did not move the key to another slot of the same table")
	}
	if got := e2.tat.Load() - now; got != int64(30*time.Second) {
		t.Fatalf("rescaled TAT now%+v, want now+30s", time.Duration(got))
	}
	if e2.quota.Load() != p {
		t.Fatal("the quota period did not move with the key")
	}
	if tat := e.tat.Load(); tat < retagTo || tat >= frozen || e.quota.Load() != tombstone {
		t.Fatalf("old slot: TAT %d, want a retagTo mark, and the tombstone", tat)
	}
	if sl := t1.findSlot(f); sl == nil || &sl.entry != e2 || sl.tag() != rb.tag {
		t.Fatal("lookup does not find the new slot under the new tag")
	}
	if t1.findWord(f.h, f.word(ra.tag)) != nil || t1.findWord(f.h, f.word(rb.tag)) != e2 {
		t.Fatal("findWord matches the old tag, or not the new one")
	}
	if s.Len() != 1 {
		t.Fatalf("Len %d after a retag, want 1", s.Len())
	}
	// The step stored under ra (20s) is 10s under rb.
	sh.refund(t0, e, ra.tag, ra.p, true, 1)
	if got := e2.tat.Load() - now; got != int64(20*time.Second) {
		t.Fatalf("TAT after the refund now%+v, want now+20s", time.Duration(got))
	}
	// Back under ra: 2 intervals of 10s are 2 of 20s.
	if _, e3 := sh.put(f, ra, now); e3.tat.Load()-now != int64(40*time.Second) || e3.quota.Load() != p {
		t.Fatalf("back under the first rule: TAT now%+v, want now+40s, and the same period", time.Duration(e3.tat.Load()-now))
	}
}

// TestUnknownIntervalKeepsTime: once the store has tagged maxIntervals
// emission intervals, a rule of a new one gets tag 0 and carries nothing
// over: its requests see the TAT as it is (time, not units).
func TestUnknownIntervalKeepsTime(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock})
	ctx := context.Background()
	three := core.Request{Consumer: "c", Rule: prepare(t, s, core.LimitSet{Rate: core.PerMinute(3)}), Cost: 1}
	for i := int64(0); s.tags.tagOf(int64(time.Hour)+i) != 0; i++ {
	}
	six := core.Request{Consumer: "c", Rule: prepare(t, s, core.LimitSet{Rate: core.PerMinute(6)}), Cost: 1}
	if tag := six.Rule.Data().(*rule).tag; tag != 0 {
		t.Fatalf("rule prepared past maxIntervals has tag %d, want 0", tag)
	}
	if n := len(s.tags.ns); n != maxIntervals {
		t.Fatalf("%d intervals tagged, want %d", n, maxIntervals)
	}
	for range 3 {
		if d, err := s.Take(ctx, three); err != nil || !d.Allowed {
			t.Fatalf("3 per minute: %+v, %v", d, err)
		}
	}
	// 60s of debt kept as 60s: 6 per minute (τ = 60s) has nothing left.
	d, err := s.Take(ctx, six)
	if err != nil || d.Allowed || d.RetryAfter != 10*time.Second || d.ResetAfter != time.Minute {
		t.Fatalf("6 per minute, unknown interval: %+v, %v; want denied, retry after 10s", d, err)
	}
	// And back: still 60s, the whole of 3 per minute.
	if d, err := s.Take(ctx, three); err != nil || d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("back to 3 per minute: %+v, %v; want denied, retry after 20s", d, err)
	}
}

// TestRetagExactUnderConcurrentGrowth: 8 goroutines spend 20 hot keys
// (frozen clock) under two rules at random, 1 per hour burst 50 (T = 72s)
// and 2 per hour burst 100 (T = 36s), through Take and TakeInto, so the
// keys move between the two intervals' units again and again, while
// another goroutine floods the shard with new keys (resizes, from the Go
// heap onto mapped memory) and a quota key under both rules moves the
// shard back to the heap. A unit of either rule is one interval of debt
// in its own units, so each hot key admits exactly 100 (the larger burst;
// every key gets more than 100 requests of that rule), the quota key
// exactly its Max.
func TestRetagExactUnderConcurrentGrowth(t *testing.T) {
	for round := range 3 {
		clock := core.NewManualClock(start)
		s := New(Options{Clock: clock, Shards: 1})
		ctx := context.Background()
		const hot, workers, per = 20, 8, 1200
		ra := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: 50}})
		rb := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 2, Period: time.Hour, Burst: 100}})
		q := core.Quota{Max: 100, Renewal: time.Hour}
		qa := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1000, Period: time.Second}, Quota: q})
		qb := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 3000, Period: time.Second}, Quota: q})
		flood := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1, Period: time.Hour}})
		admitted := make([]atomic.Int64, hot)
		var quotaAdmitted atomic.Int64
		var flooded atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer flooded.Store(true)
			for i := range 20000 {
				if _, err := s.Take(ctx, core.Request{Consumer: "new" + strconv.Itoa(i), Rule: flood, Cost: 1}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				var d core.Decision
				for i := 0; i < per || !flooded.Load(); i++ {
					if i >= per {
						// Past its share, a worker goes on only to overlap the
						// flood, and lets the flooder run between its calls:
						// eight spinning workers left it a ninth of the CPU
						// (54 s alone under -race, 7 min beside CI's other
						// packages).
						runtime.Gosched()
					}
					k := rng.IntN(hot)
					rule := ra
					if rng.IntN(2) == 0 {
						rule = rb
					}
					r := core.Request{Consumer: "hot" + strconv.Itoa(k), Rule: rule, Cost: 1}
					var err error
					if i%2 == 0 {
						d, err = s.Take(ctx, r)
					} else {
						err = s.TakeInto(ctx, &r, &d)
					}
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted[k].Add(1)
					}
					if i%10 == w%10 {
						qr := qa
						if rng.IntN(2) == 0 {
							qr = qb
						}
						if d, err := s.Take(ctx, core.Request{Consumer: "quota", Rule: qr, Cost: 1}); err != nil {
							t.Error(err)
							return
						} else if d.Allowed {
							quotaAdmitted.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		for k := range admitted {
			if got := admitted[k].Load(); got != 100 {
				t.Fatalf("round %d: hot key %d admitted %d, want exactly 100", round, k, got)
			}
		}
		if got := quotaAdmitted.Load(); got != 100 {
			t.Fatalf("round %d: quota key admitted %d, want exactly 100", round, got)
		}
		if !s.shards[0].periods {
			t.Fatalf("round %d: the quota key did not move the shard to the heap", round)
		}
		if n := s.Len(); n != 20000+hot+1 {
			t.Fatalf("round %d: Len %d, want %d", round, n, 20000+hot+1)
		}
	}
}
