package memory

// Tests of the store's memory bounds, of exactness under concurrency with a
// real clock, and of the shard table's edge cases. The conformance vectors,
// including 64 goroutines on one key with a frozen clock, are in
// memory_test.go (core/storetest).

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// start is every manual clock's first reading: far from 0, which means
// "never" to the store.
const start = int64(1_000_000 * time.Hour)

// request prepares c's limits on s and returns c as a Request under that
// rule (core.Call's fields are Request's and LimitSet's).
func request(tb testing.TB, s *Store, c core.Call) core.Request {
	tb.Helper()
	r, err := s.Prepare(c.Limits())
	if err != nil {
		tb.Fatalf("Prepare(%+v): %v", c.Limits(), err)
	}
	return c.Request(r)
}

// prepare returns ls's rule on s.
func prepare(tb testing.TB, s *Store, ls core.LimitSet) *core.Rule {
	tb.Helper()
	r, err := s.Prepare(ls)
	if err != nil {
		tb.Fatalf("Prepare(%+v): %v", ls, err)
	}
	return r
}

func take(t *testing.T, s *Store, r core.Request) core.Decision {
	t.Helper()
	d, err := s.Take(context.Background(), r)
	if err != nil {
		t.Fatalf("Take(%+v): %v", r, err)
	}
	return d
}

// slotsHeld returns the total size of the shards' tables.
func slotsHeld(s *Store) int {
	n := 0
	for i := range s.shards {
		n += len(s.shards[i].tab.Load().slots)
	}
	return n
}

func TestMillionOneOffKeysSweptToZero(t *testing.T) {
	const keys = 1_000_000
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock})
	l := core.Limit{Rate: 10, Period: time.Second} // T = 100ms
	rule := prepare(t, s, core.LimitSet{Rate: l})
	ctx := context.Background()
	buf := []byte("one-off-")
	for i := range keys {
		consumer := string(strconv.AppendInt(buf[:8], int64(i), 10))
		d, err := s.Take(ctx, core.Request{Consumer: consumer, Rule: rule, Cost: 1})
		if err != nil || !d.Allowed || d.Remaining != 9 {
			t.Fatalf("key %d: %+v, %v; want allowed with 9 remaining", i, d, err)
		}
	}
	if n := s.Len(); n != keys {
		t.Fatalf("Len after the flood = %d, want %d (a frozen clock expires nothing)", n, keys)
	}

	// One nanosecond before the refill time every key is still limited.
	clock.Advance(100*time.Millisecond - 1)
	s.Sweep()
	if n := s.Len(); n != keys {
		t.Fatalf("Len 1ns before refill = %d, want %d", n, keys)
	}
	clock.Advance(1)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after refill and Sweep = %d, want 0", n)
	}
	// The tables shrink back too: memory follows the live keys.
	if got, want := slotsHeld(s), len(s.shards)*minSlots; got != want {
		t.Fatalf("table slots after Sweep = %d, want %d", got, want)
	}
	// A dropped key starts over with a full bucket (lossless).
	if d := take(t, s, request(t, s, core.Call{Consumer: "one-off-0", Rate: l, Cost: 1})); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("dropped key after sweep: %+v, want allowed with 9 remaining", d)
	}
}

// flood exhausts key K (1 per hour), then inserts 20,000 new keys of
// 1 per ms, stepping the clock 1ms per key so every earlier flood key has
// expired when the next is inserted and the amortised sweeps drop them.
func flood(t *testing.T, s *Store, clock *core.ManualClock) {
	t.Helper()
	kl := core.Limit{Rate: 1, Period: time.Hour}
	if d := take(t, s, request(t, s, core.Call{Consumer: "K", Rate: kl, Cost: 1})); !d.Allowed {
		t.Fatalf("K first request denied: %+v", d)
	}
	if d := take(t, s, request(t, s, core.Call{Consumer: "K", Rate: kl, Cost: 1})); d.Allowed {
		t.Fatalf("K not exhausted: %+v", d)
	}
	fl := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1000, Period: time.Second, Burst: 1}})
	for i := range 20_000 {
		clock.Advance(time.Millisecond)
		if d := take(t, s, core.Request{Consumer: "flood-" + strconv.Itoa(i), Rule: fl, Cost: 1}); !d.Allowed {
			t.Fatalf("flood key %d denied: %+v", i, d)
		}
	}
	d := take(t, s, request(t, s, core.Call{Consumer: "K", Rate: kl, Cost: 1}))
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != time.Hour-20*time.Second || d.DecidedBy != core.KindRate {
		t.Fatalf("K after the flood: %+v; want denied, 0 remaining, retry after 59m40s", d)
	}
}

func TestExhaustedKeySurvivesFlood(t *testing.T) {
	t.Run("OneShard", func(t *testing.T) {
		clock := core.NewManualClock(start)
		s := New(Options{Clock: clock, Shards: 1})
		flood(t, s, clock)
		// Model of the amortised sweep: an insert into a shard holding
		// nextSweep entries sweeps first; here a sweep leaves only K.
		live, next := 1, minSweepAt
		for range 20_000 {
			if live >= next {
				live = 1
				next = max(2*live, minSweepAt)
			}
			live++
		}
		if n := s.Len(); n != live {
			t.Fatalf("Len after the flood = %d, want %d (amortised sweeps)", n, live)
		}
	})
	t.Run("DefaultShards", func(t *testing.T) {
		clock := core.NewManualClock(start)
		s := New(Options{Clock: clock})
		flood(t, s, clock)
		if n := s.Len(); n >= 20_001 {
			t.Fatalf("Len after the flood = %d: no amortised sweep ran", n)
		}
		clock.Advance(time.Millisecond) // the last flood key expires too
		s.Sweep()
		if n := s.Len(); n != 1 {
			t.Fatalf("Len after Sweep = %d, want 1 (K alone)", n)
		}
	})
}

// TestRealClockNeverExceedsBound runs 16 goroutines against one key at 100/s
// with burst 10 for 2s of the store's own clock. GCRA admits at most
// burst + floor(elapsed/T) in any span of elapsed that contains every
// decision: elapsed is read from the same clock before the first and after
// the last request.
func TestRealClockNeverExceedsBound(t *testing.T) {
	l := core.Limit{Rate: 100, Period: time.Second, Burst: 10}
	T := int64(l.EmissionInterval())
	const run = int64(2 * time.Second)

	check := func(t *testing.T, clock core.Clock, allow func() (bool, error)) {
		var admitted atomic.Int64
		var failed atomic.Value
		var wg sync.WaitGroup
		t0 := clock.Nanotime()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for clock.Nanotime()-t0 < run {
					ok, err := allow()
					if err != nil {
						failed.Store(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed := clock.Nanotime() - t0
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
		bound := l.Burst + elapsed/T
		n := admitted.Load()
		t.Logf("admitted %d in %v; bound %d", n, time.Duration(elapsed), bound)
		if n > bound {
			t.Fatalf("admitted %d > burst + elapsed/T = %d (elapsed %v)", n, bound, time.Duration(elapsed))
		}
		if n < l.Burst {
			t.Fatalf("admitted %d < burst %d: the first burst always passes", n, l.Burst)
		}
	}

	t.Run("Store", func(t *testing.T) {
		clock := core.NewSystemClock()
		s := New(Options{Clock: clock})
		req := request(t, s, core.Call{Consumer: "real", Scope: "api", Rate: l, Cost: 1})
		check(t, clock, func() (bool, error) {
			d, err := s.Take(context.Background(), req)
			return d.Allowed, err
		})
	})
	t.Run("Bucket", func(t *testing.T) {
		clock := core.NewSystemClock()
		b, err := NewBucket(l, clock)
		if err != nil {
			t.Fatal(err)
		}
		check(t, clock, func() (bool, error) { return b.Allow(), nil })
	})
}

// TestHashCollisions forces keys onto one table hash: keys whose
// fingerprints differ only in the check hash stay distinct, a swept one
// leaves the others reachable past its deleted mark, and resizes keep them
// all with their state.
func TestHashCollisions(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 1})
	sh := &s.shards[0]
	const h = 12345
	fa, fb, fc, fd := fingerprint{h, 1}, fingerprint{h, 2}, fingerprint{h, 3}, fingerprint{h, 4}
	now := clock.Nanotime()
	_, a := sh.put(fa, nil, now)
	_, b := sh.put(fb, nil, now)
	_, c := sh.put(fc, nil, now)
	if a == b || a == c || b == c {
		t.Fatal("colliding keys share an entry")
	}
	if sh.get(fa) != a || sh.get(fb) != b || sh.get(fc) != c || sh.get(fd) != nil {
		t.Fatal("lookup under a shared hash returned the wrong entry")
	}
	if _, e := sh.put(fb, nil, now); e != b {
		t.Fatal("put of a present key made a new entry")
	}
	// Keep b and c limited; a's zero TAT is idle and is swept.
	b.tat.Store(now + 2)
	c.tat.Store(now + 3)
	s.Sweep()
	if s.Len() != 2 || sh.get(fa) != nil || sh.get(fb) != b || sh.get(fc) != c {
		t.Fatalf("after sweeping a: Len %d, lookups wrong", s.Len())
	}
	if a.tat.Load() != dead {
		t.Fatal("swept entry not marked dead")
	}
	// Grow the table past several resizes; the colliding pair stays, with
	// its state, and the entries left behind are frozen.
	for i := range 1000 {
		_, e := sh.put(fingerprint{uint64(i) + firstHash, 7}, nil, now)
		e.tat.Store(now + 1)
	}
	// Growth at 3/4 doubles: 8, 16, ..., 1024 holds 768, 2048 holds 1536.
	if got := len(sh.tab.Load().slots); got != 2048 {
		t.Fatalf("table size for 1002 keys = %d, want 2048", got)
	}
	if s.Len() != 1002 {
		t.Fatalf("Len = %d, want 1002", s.Len())
	}
	nb, nc := sh.get(fb), sh.get(fc)
	if nb == nil || nc == nil || nb.tat.Load() != now+2 || nc.tat.Load() != now+3 {
		t.Fatal("colliding keys or their TATs lost in a resize")
	}
	if tb := b.tat.Load(); tb < movedTo || tb >= frozen || c.quota.Load() != tombstone {
		t.Fatalf("old entry after a resize: TAT %d, want a movedTo mark, and quota tombstone", tb)
	}
}

// TestRefundFollowsMove: a request whose rate step is stored, then loses
// the race for the quota's last unit, gives the step back even when a
// resize moved its key in between.
func TestRefundFollowsMove(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 1})
	sh := &s.shards[0]
	now := clock.Nanotime()
	p := core.GCRAParams{T: 10, Tau: 100, Burst: 10}
	f := fingerprint{firstHash + 99, 5}
	t0, e := sh.put(f, nil, now)
	e.tat.Store(now + 40) // as if this request's step of 1×T had been stored
	// Two resizes move the key twice.
	sh.mu.Lock()
	sh.resize(100)
	sh.resize(1000)
	sh.mu.Unlock()
	sh.refund(t0, e, 0, p, true, 1)
	if got := sh.get(f).tat.Load(); got != now+30 {
		t.Fatalf("TAT after refund = now%+d, want now+30", got-now)
	}
	// A swept entry has nothing to give back, and refund returns.
	clock.Advance(time.Second)
	s.Sweep()
	if s.Len() != 0 {
		t.Fatalf("Len = %d after the sweep, want 0", s.Len())
	}
	sh.refund(t0, e, 0, p, true, 1) // follows both moves to the dead slot
}

// TestQuotaExactUnderResizes spends one quota from 8 goroutines while
// another floods new keys into the same shard (resizes, sweeps): exactly
// Max requests are admitted, whatever moved under them.
func TestQuotaExactUnderResizes(t *testing.T) {
	for round := range 20 {
		clock := core.NewManualClock(start)
		s := New(Options{Clock: clock, Shards: 1})
		ctx := context.Background()
		const max = 300
		req := request(t, s, core.Call{
			Consumer: "q",
			Rate:     core.Limit{Rate: 1000, Period: time.Millisecond, Burst: 1000},
			Quota:    core.Quota{Max: max, Renewal: time.Hour},
			Cost:     1,
		})
		flRule := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1, Period: time.Hour}})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		var stop atomic.Bool
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				fl := core.Request{Consumer: "f" + strconv.Itoa(round) + "-" + strconv.Itoa(i), Rule: flRule, Cost: 1}
				if _, err := s.Take(ctx, fl); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		var workers sync.WaitGroup
		for range 8 {
			workers.Add(1)
			go func() {
				defer workers.Done()
				for range 100 {
					d, err := s.Take(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		workers.Wait()
		stop.Store(true)
		wg.Wait()
		if got := admitted.Load(); got != max {
			t.Fatalf("round %d: admitted %d, want exactly %d", round, got, max)
		}
		// The rate steps of the 500 requests the quota denied were all given
		// back: the TAT holds exactly the 300 admitted steps.
		_, f := s.locate("q", "")
		if got, want := s.shards[0].get(f).tat.Load(), clock.Nanotime()+max*int64(time.Microsecond); got != want {
			t.Fatalf("round %d: TAT = now%+d ns, want now+%d", round, got-clock.Nanotime(), want-clock.Nanotime())
		}
	}
}

// TestConcurrentSweepsAndResizes hammers 8 hot keys from 4 goroutines while
// another goroutine floods new keys (inserts, resizes, amortised sweeps) and
// steps the clock, and a third sweeps explicitly. The stepping goroutine
// drains every hot key before each 1ms step, so no refill is lost to a full
// bucket, and the main goroutine drains them at the end: each hot key must
// then have admitted exactly burst + steps (T = 1ms), no more (an entry
// lost or doubled under a resize would reset or split its bucket) and no
// less.
func TestConcurrentSweepsAndResizes(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, Shards: 4})
	l := core.Limit{Rate: 1000, Period: time.Second, Burst: 5} // T = 1ms
	const hot, steps = 8, 500
	var admitted [hot]atomic.Int64
	ctx := context.Background()
	hotRule := prepare(t, s, core.LimitSet{Rate: l})
	hotReq := func(k int) core.Request {
		return core.Request{Consumer: "hot-" + strconv.Itoa(k), Rule: hotRule, Cost: 1}
	}
	drain := func() {
		for k := range hot {
			for {
				d, err := s.Take(ctx, hotReq(k))
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					break
				}
				admitted[k].Add(1)
			}
		}
	}
	floodRule := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1000, Period: time.Second, Burst: 1}})
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for !stopped.Load() {
				k := rng.IntN(hot)
				d, err := s.Take(ctx, hotReq(k))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer stopped.Store(true)
		for i := range steps {
			for j := range 10 {
				if _, err := s.Take(ctx, core.Request{Consumer: "flood-" + strconv.Itoa(i*10+j), Rule: floodRule, Cost: 1}); err != nil {
					t.Error(err)
					return
				}
			}
			drain()
			clock.Advance(time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for !stopped.Load() {
			s.Sweep()
			runtime.Gosched()
		}
	}()
	wg.Wait()
	drain()
	want := l.Burst + steps
	for k := range hot {
		if got := admitted[k].Load(); got != want {
			t.Errorf("hot-%d admitted %d, want exactly %d", k, got, want)
		}
	}
}

// TestBucketMatchesStep checks Bucket.AllowN/TakeN against the GCRA oracle
// over random costs and clock steps, including peeks and costs above the
// burst.
func TestBucketMatchesStep(t *testing.T) {
	l := core.Limit{Rate: 7, Period: time.Second, Burst: 4}
	p := l.GCRA()
	b, err := NewBucket(l, core.NewManualClock(start))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	now, tat := start, int64(0)
	for i := range 100_000 {
		now += rng.Int64N(int64(300 * time.Millisecond))
		n := rng.Int64N(6)
		want := p.Step(tat, now, n)
		var got bool
		if i%2 == 0 {
			got = b.AllowN(now, n)
		} else {
			r := b.TakeN(now, n)
			if r != want {
				t.Fatalf("step %d: TakeN = %+v, want %+v", i, r, want)
			}
			got = r.Allowed
		}
		if got != want.Allowed {
			t.Fatalf("step %d (n=%d): AllowN = %v, want %v", i, n, got, want.Allowed)
		}
		if want.Store {
			tat = want.TAT
		}
		if b.tat.Load() != tat {
			t.Fatalf("step %d: stored TAT %d, want %d", i, b.tat.Load(), tat)
		}
	}
}

// TestBucketNegativeN: a negative n is never allowed and gives nothing
// back: after it, the exhausted bucket is still exhausted.
func TestBucketNegativeN(t *testing.T) {
	clock := core.NewManualClock(start)
	b, err := NewBucket(core.Limit{Rate: 1, Period: time.Hour, Burst: 2}, clock)
	if err != nil {
		t.Fatal(err)
	}
	now := clock.Nanotime()
	if !b.AllowN(now, 2) || b.AllowN(now, 1) {
		t.Fatal("burst of 2 not spent exactly")
	}
	tat := b.tat.Load()
	if b.AllowN(now, -100) {
		t.Error("AllowN(-100) allowed")
	}
	if r := b.TakeN(now, -5); r.Allowed || r.Store || r.RetryAfter != -1 || r.Remaining != 0 {
		t.Errorf("TakeN(-5) = %+v, want denied, nothing stored, RetryAfter -1, Remaining 0", r)
	}
	if got := b.tat.Load(); got != tat {
		t.Errorf("TAT moved from %d to %d by negative costs", tat, got)
	}
	if b.AllowN(now, 1) {
		t.Error("exhausted bucket admitted after negative costs")
	}
}

// TestPenalizeHugeDuration: a penalty too large to add to the clock is
// capped at core.MaxReservation instead of overflowing into no penalty.
func TestPenalizeHugeDuration(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock})
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 1} // T = τ = 100ms
	if err := s.Penalize(context.Background(), request(t, s, core.Call{Consumer: "k", Rate: l}), time.Duration(math.MaxInt64)); err != nil {
		t.Fatal(err)
	}
	d := take(t, s, request(t, s, core.Call{Consumer: "k", Rate: l, Cost: 1}))
	if d.Allowed || d.RetryAfter != core.MaxReservation {
		t.Fatalf("after a huge penalty: allowed %v, RetryAfter %v; want denied for %v", d.Allowed, d.RetryAfter, core.MaxReservation)
	}
}

// TestNoLimitsNoState: a request with neither a rate limit nor a quota is
// allowed and creates no entry.
func TestNoLimitsNoState(t *testing.T) {
	s := New(Options{Clock: core.NewManualClock(start)})
	for i := range 1000 {
		d := take(t, s, request(t, s, core.Call{Consumer: "c" + strconv.Itoa(i), Cost: 1}))
		if !d.Allowed {
			t.Fatal("unlimited request denied")
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after 1000 unlimited requests, want 0", n)
	}
}
