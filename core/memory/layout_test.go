package memory

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
)

// TestSlotLayout: a slot is 32 bytes, two to a cache line (mapped tables
// hold no Go pointer but the tombstone), and its check word packs the
// fingerprint's 32-bit check with the tag of the interval its TAT is in.
func TestSlotLayout(t *testing.T) {
	if n := unsafe.Sizeof(slot{}); n != 32 {
		t.Fatalf("unsafe.Sizeof(slot{}) = %d, want 32", n)
	}
	f := fingerprint{h: 5, check: 0xdeadbeef}
	if w := f.word(7); w != 7<<32|0xdeadbeef {
		t.Fatalf("word(7) = %#x, want 0x7deadbeef", w)
	}
	var sl slot
	sl.check.Store(f.word(0xffff))
	if sl.tag() != 0xffff || uint32(sl.check.Load()) != f.check {
		t.Fatalf("slot tag %#x, check %#x", sl.tag(), uint32(sl.check.Load()))
	}
}

// TestProbeStartsAtLine: a key's probe starts at the first slot of its
// cache line (two slots of 32 bytes), so keys whose hashes differ only in
// the lowest bit share the line, and a third such key goes to the next
// line, where a lookup still finds all three.
func TestProbeStartsAtLine(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 1})
	sh := &s.shards[0]
	now := clock.Nanotime()
	// The first table has 8 slots: hashes 5, 4 and 13 all fall in the
	// line of slots 4 and 5 (h & 7 &^ 1 = 4).
	fs := []fingerprint{{5, 1}, {4, 2}, {13, 3}}
	want := []uint64{4, 5, 6}
	slotOf := func(tab *table, e *entry) uint64 {
		for i := range tab.slots {
			if &tab.slots[i].entry == e {
				return uint64(i)
			}
		}
		return 99
	}
	for i, f := range fs {
		tab, e := sh.put(f, nil, now)
		if got := slotOf(tab, e); got != want[i] {
			t.Errorf("key %d (hash %d) in slot %d, want %d", i, f.h, got, want[i])
		}
	}
	for i, f := range fs {
		tab := sh.tab.Load()
		if e := tab.find(f); e == nil || e != &tab.slots[want[i]].entry {
			t.Errorf("find of key %d (hash %d) did not return slot %d", i, f.h, want[i])
		}
	}
}

// TestLargeTablesOffHeap: a shard's table grows past mmapMinBytes onto
// memory outside the Go heap with every key's TAT intact; the first quota
// period moves the shard, for good, to a Go heap table (periods set),
// again with every TAT intact, and later growth keeps it there.
func TestLargeTablesOffHeap(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 1})
	ctx := context.Background()
	rate := core.Limit{Rate: 1, Period: time.Hour, Burst: 5}
	const n = 1500 // 1500 keys: 2048 slots, 64 KiB
	for i := range n {
		if d, err := s.Take(ctx, request(t, s, core.Call{Consumer: "k" + strconv.Itoa(i), Rate: rate, Cost: 2})); err != nil || !d.Allowed {
			t.Fatalf("key %d: %+v, %v", i, d, err)
		}
	}
	sh := &s.shards[0]
	tab := sh.tab.Load()
	if len(tab.slots) != 2048 || tab.periods || sh.periods || tab.mapped != mapsSlots {
		t.Fatalf("table of %d slots, periods %v (shard %v), mapped %v; want 2048 slots off the heap", len(tab.slots), tab.periods, sh.periods, tab.mapped)
	}
	remaining := func(i int) int64 {
		d, err := s.Take(ctx, request(t, s, core.Call{Consumer: "k" + strconv.Itoa(i), Rate: rate, Cost: 0}))
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	for _, i := range []int{0, 700, n - 1} {
		if got := remaining(i); got != 3 {
			t.Fatalf("key %d remaining %d, want 3", i, got)
		}
	}
	q := request(t, s, core.Call{Consumer: "quota", Rate: rate, Quota: core.Quota{Max: 2, Renewal: time.Hour}, Cost: 1})
	for i, want := range []bool{true, true, false} {
		d, err := s.Take(ctx, q)
		if err != nil || d.Allowed != want {
			t.Fatalf("quota request %d: allowed %v, %v; want %v", i, d.Allowed, err, want)
		}
	}
	// The denied third request's rate step was refunded: 5 - 2 = 3 left.
	if d, _ := s.Take(ctx, request(t, s, core.Call{Consumer: "quota", Rate: rate})); d.Remaining != 3 {
		t.Fatalf("quota key's rate remaining %d, want 3", d.Remaining)
	}
	if tab := sh.tab.Load(); !tab.periods || !sh.periods || tab.mapped {
		t.Fatal("a quota period went into a table off the heap")
	}
	for _, i := range []int{0, 700, n - 1} {
		if got := remaining(i); got != 3 {
			t.Fatalf("after the move, key %d remaining %d, want 3", i, got)
		}
	}
	for i := n; i < 2*n; i++ {
		if _, err := s.Take(ctx, request(t, s, core.Call{Consumer: "k" + strconv.Itoa(i), Rate: rate, Cost: 2})); err != nil {
			t.Fatal(err)
		}
	}
	if tab := sh.tab.Load(); len(tab.slots) != 4096 || !tab.periods || tab.mapped {
		t.Fatalf("after growth: %d slots, periods %v, mapped %v; want 4096 on the heap", len(tab.slots), tab.periods, tab.mapped)
	}
	if s.Len() != 2*n+1 {
		t.Fatalf("Len %d, want %d", s.Len(), 2*n+1)
	}
}

// TestExactUnderConcurrentGrowth: 16 goroutines spend 40 hot keys (burst
// 50 each, a frozen clock) through Take and TakeInto while another floods
// the same shard with new keys, so the table is resized again and again,
// from the Go heap onto mapped memory; midway a quota key moves the shard
// back to the heap. Each hot key admits exactly its burst, the quota key
// exactly its Max, whatever moved under them.
func TestExactUnderConcurrentGrowth(t *testing.T) {
	for round := range 3 {
		clock := core.NewManualClock(start)
		s := New(Options{Clock: clock, Shards: 1})
		ctx := context.Background()
		const hot, burst, workers, per = 40, 50, 16, 400
		rate := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: burst}})
		quota := request(t, s, core.Call{Consumer: "quota", Rate: core.Limit{Rate: 1000, Period: time.Second}, Quota: core.Quota{Max: 100, Renewal: time.Hour}, Cost: 1})
		admitted := make([]atomic.Int64, hot)
		var quotaAdmitted atomic.Int64
		var flooded atomic.Bool
		var flood sync.WaitGroup
		flood.Add(1)
		go func() {
			defer flood.Done()
			defer flooded.Store(true)
			for i := range 20000 {
				r := core.Request{Consumer: "new" + strconv.Itoa(i), Rule: rate, Cost: 1}
				if _, err := s.Take(ctx, r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d core.Decision
				// At least per requests each, and on until the flood ends,
				// so resizes happen under them.
				for i := 0; i < per || !flooded.Load(); i++ {
					if i >= per {
						runtime.Gosched() // past its share: let the flooder run (see TestRetagExactUnderConcurrentGrowth)
					}
					k := (w*7 + i) % hot
					r := core.Request{Consumer: "hot" + strconv.Itoa(k), Rule: rate, Cost: 1}
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
					if i%20 == w%20 {
						if d, err := s.Take(ctx, quota); err != nil {
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
		flood.Wait()
		for k := range admitted {
			if got := admitted[k].Load(); got != burst {
				t.Fatalf("round %d: hot key %d admitted %d, want exactly %d", round, k, got, burst)
			}
		}
		if got := quotaAdmitted.Load(); got != 100 {
			t.Fatalf("round %d: quota key admitted %d, want exactly 100", round, got)
		}
		if !s.shards[0].periods {
			t.Fatalf("round %d: the quota key did not move the shard to the heap", round)
		}
		if n := len(s.shards[0].tab.Load().slots); n != 32768 {
			t.Fatalf("round %d: final table of %d slots, want 32768", round, n)
		}
	}
}
