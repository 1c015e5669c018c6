package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

// gcraKey is the rate key of consumer's key-wide GCRA limit under prefix.
func gcraKey(prefix, consumer string) string {
	h := sha256.Sum256([]byte(consumer))
	return prefix + "{" + hex.EncodeToString(h[:16]) + "}:gcra:"
}

// gcraState reads a GCRA key's value "<TAT>:<T>" and returns TAT − now
// and T (−1 when the value carries none), both in ns.
func gcraState(t *testing.T, c redis.UniversalClient, key string, now int64) (debt, T int64) {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	tv, tsuf, found := strings.Cut(v, ":")
	tat, err := strconv.ParseInt(tv, 10, 64)
	if err != nil {
		t.Fatalf("%s = %q: %v", key, v, err)
	}
	T = -1
	if found {
		if T, err = strconv.ParseInt(tsuf, 10, 64); err != nil {
			t.Fatalf("%s = %q: %v", key, v, err)
		}
	}
	return tat - now, T
}

// pttl returns key's PTTL.
func pttl(t *testing.T, c redis.UniversalClient, key string) time.Duration {
	t.Helper()
	d, err := c.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPenalizeExact: Penalize(d) moves a key's TAT to exactly now + d +
// τ − T, under the manual clock: the next unit request is denied with
// RetryAfter d, passes d later with nothing left, and the rate resumes
// one T after. The key's TTL is ceil(TAT − now) plus the margin, as a
// Take sets it.
func TestPenalizeExact(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5} // T = 100ms, τ = 500ms
	req := prepare(t, s, core.Call{Consumer: "p", Rate: l, Cost: 1})
	key := gcraKey("lp:", "p")
	t0 := time.Now()
	if err := s.Penalize(ctx, req, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if debt, T := gcraState(t, c, key, clock.Nanotime()); debt != int64(2400*time.Millisecond) || T != int64(100*time.Millisecond) {
		t.Fatalf("after Penalize(2s): TAT − now %v, T %v; want 2.4s, 100ms", time.Duration(debt), time.Duration(T))
	}
	if ttl, hi := pttl(t, c, key), 2400*time.Millisecond+time.Minute; ttl > hi || ttl < hi-time.Since(t0)-time.Millisecond {
		t.Fatalf("PTTL %v, want %v less the time since", ttl, hi)
	}
	d, _ := s.Take(ctx, req)
	if d.Allowed || d.RetryAfter != 2*time.Second || d.Remaining != 0 || d.ResetAfter != 2400*time.Millisecond {
		t.Fatalf("Take after Penalize(2s): %+v; want denied, RetryAfter 2s, ResetAfter 2.4s", d)
	}
	clock.Advance(2*time.Second - time.Microsecond)
	if d, _ := s.Take(ctx, req); d.Allowed || d.RetryAfter != time.Microsecond {
		t.Fatalf("1µs before: %+v; want denied with RetryAfter 1µs", d)
	}
	clock.Advance(time.Microsecond)
	if d, _ := s.Take(ctx, req); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("2s after Penalize: %+v; want allowed with 0 remaining", d)
	}
	if d, _ := s.Take(ctx, req); d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("right after: %+v; want denied with RetryAfter T = 100ms", d)
	}
	clock.Advance(100 * time.Millisecond)
	if d, _ := s.Take(ctx, req); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("T later: %+v; want allowed", d)
	}
}

// TestPenalizeNeverBackwards: a penalty that ends before the key's TAT
// would let requests pass changes nothing (not the value, not the TTL);
// a longer one moves it.
func TestPenalizeNeverBackwards(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
	spend := prepare(t, s, core.Call{Consumer: "b", Rate: l, Cost: 5})
	if d, _ := s.Take(ctx, spend); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("spending the burst: %+v", d)
	}
	key := gcraKey("lp:", "b")
	before, _ := c.Get(ctx, key).Result()
	if err := c.PExpire(ctx, key, time.Hour).Err(); err != nil { // a mark: a write would reset it
		t.Fatal(err)
	}
	// TAT = now + 500ms; Penalize(100ms) asks for now + 100 + 400ms: the
	// same; 50ms asks for less.
	for _, d := range []time.Duration{100 * time.Millisecond, 50 * time.Millisecond, time.Nanosecond} {
		if err := s.Penalize(ctx, spend, d); err != nil {
			t.Fatal(err)
		}
		if v, _ := c.Get(ctx, key).Result(); v != before {
			t.Fatalf("Penalize(%v) moved the key: %q -> %q", d, before, v)
		}
		if ttl := pttl(t, c, key); ttl <= time.Hour-time.Minute {
			t.Fatalf("Penalize(%v) rewrote the key: PTTL %v", d, ttl)
		}
	}
	if err := s.Penalize(ctx, spend, 100*time.Millisecond+time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if debt, _ := gcraState(t, c, key, clock.Nanotime()); debt != int64(500*time.Millisecond+1) {
		t.Fatalf("Penalize(100ms+1ns): TAT − now %v, want 500ms+1ns", time.Duration(debt))
	}
	if ttl := pttl(t, c, key); ttl > 501*time.Millisecond+time.Minute {
		t.Fatalf("moved key's PTTL %v, want ceil(500ms+1ns) + 1m", ttl)
	}
	// The longest penalty is core.MaxReservation.
	if err := s.Penalize(ctx, spend, time.Duration(1<<62)); err != nil {
		t.Fatal(err)
	}
	if debt, _ := gcraState(t, c, key, clock.Nanotime()); debt != int64(core.MaxReservation)+int64(400*time.Millisecond) {
		t.Fatalf("Penalize(2^62 ns): TAT − now %d, want 2^61 ns + 400ms", debt)
	}
}

// TestPenalizeNothingToHold: d ≤ 0, no rate limit, a window algorithm
// write nothing and answer nil; a nil or foreign rule is refused.
func TestPenalizeNothingToHold(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	s := newStore(t, c, redisstore.Options{})
	gcra := prepare(t, s, core.Call{Consumer: "n", Rate: core.PerSecond(10), Cost: 1})
	for _, d := range []time.Duration{0, -time.Second} {
		if err := s.Penalize(ctx, gcra, d); err != nil {
			t.Fatalf("Penalize(%v): %v", d, err)
		}
	}
	for _, call := range []core.Call{
		{Consumer: "n", Quota: core.Quota{Max: 3, Renewal: time.Hour}},
		{Consumer: "n", Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.FixedWindow}},
		{Consumer: "n", Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.SlidingWindow}},
		{Consumer: "n", Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.SlidingLog}},
		{Consumer: "n", Rate: core.Limit{Rate: core.Unlimited}},
	} {
		if err := s.Penalize(ctx, prepare(t, s, call), time.Minute); err != nil {
			t.Fatalf("Penalize under %+v: %v", call.Limits(), err)
		}
	}
	if n, _ := c.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("%d keys written, want none", n)
	}
	mem := memory.New(memory.Options{})
	foreign, err := mem.Prepare(core.LimitSet{Rate: core.PerSecond(10)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*core.Rule{nil, foreign} {
		if err := s.Penalize(ctx, core.Request{Consumer: "n", Rule: r}, time.Second); !errors.Is(err, core.ErrForeignRule) {
			t.Fatalf("Penalize with rule %v: %v, want ErrForeignRule", r, err)
		}
	}
}

// TestPenaltySharedAcrossStores: a penalty from one store holds back
// another store on its own client (another process's, as far as Redis can
// tell), exactly under a shared manual clock; and a Throttle's Backoff on
// one store holds back a Throttle of the same key on another, on Redis
// TIME.
func TestPenaltySharedAcrossStores(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	l := core.Limit{Rate: 100, Period: time.Second, Burst: 10} // T = 10ms, τ = 100ms
	a := newStore(t, srv.Client(t, nil), redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	b := newStore(t, srv.Client(t, nil), redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute, Pipeline: -1})
	ra := prepare(t, a, core.Call{Consumer: "shared", Rate: l, Cost: 1})
	rb := prepare(t, b, core.Call{Consumer: "shared", Rate: l, Cost: 1})
	if d, _ := b.Take(ctx, rb); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("b before the penalty: %+v", d)
	}
	if err := a.Penalize(ctx, ra, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Take(ctx, rb); d.Allowed || d.RetryAfter != 3*time.Second {
		t.Fatalf("b after a's Penalize(3s): %+v; want denied, RetryAfter 3s", d)
	}
	clock.Advance(3 * time.Second)
	if d, _ := b.Take(ctx, rb); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("b 3s later: %+v; want allowed, 0 remaining", d)
	}

	// Throttles on Redis TIME: a's Backoff(400ms) holds b's Wait back.
	ta, err := core.NewThrottle(core.ThrottleOptions{Store: newStore(t, srv.Client(t, nil), redisstore.Options{}), Key: "api.example.com", Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := core.NewThrottle(core.ThrottleOptions{Store: newStore(t, srv.Client(t, nil), redisstore.Options{}), Key: "api.example.com", Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Wait(ctx, 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ta.Backoff(ctx, 400*time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tb.Wait(wctx, 1); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 400*time.Millisecond-time.Millisecond {
		t.Fatalf("b's Wait returned %v after a's Backoff(400ms), want ≥ 400ms less Redis TIME's µs", el)
	}
}

// TestPenalizeSeedsFallback: with Options.Seed, the penalty reaches the
// in-process fallback too: it denies for exactly the penalty.
func TestPenalizeSeedsFallback(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	fb := memory.New(memory.Options{Clock: clock})
	s := newStore(t, srv.Client(t, nil), redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute, Seed: fb})
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
	if err := s.Penalize(ctx, prepare(t, s, core.Call{Consumer: "f", Rate: l}), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	d, err := core.TakeCall(ctx, fb, core.Call{Consumer: "f", Rate: l, Cost: 1})
	if err != nil || d.Allowed || d.RetryAfter != 2*time.Second {
		t.Fatalf("fallback after Penalize(2s): %+v, %v; want denied, RetryAfter 2s", d, err)
	}
}

// TestPenalizeCluster: on a 3-node Cluster the penalty goes to the node of
// the key's slot and holds back a second store on its own client, exactly.
func TestPenalizeCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
	a := newStore(t, cl.Client(t, nil), redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	b := newStore(t, cl.Client(t, nil), redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	for i := range 20 { // consumers spread over the slots of all three nodes
		id := fmt.Sprint("cluster-", i)
		if err := a.Penalize(ctx, prepare(t, a, core.Call{Consumer: id, Rate: l}), time.Duration(i+1)*time.Second); err != nil {
			t.Fatal(err)
		}
		if d, _ := b.Take(ctx, prepare(t, b, core.Call{Consumer: id, Rate: l, Cost: 1})); d.Allowed || d.RetryAfter != time.Duration(i+1)*time.Second {
			t.Fatalf("%s after Penalize(%ds): %+v; want denied for that long", id, i+1, d)
		}
	}
}
