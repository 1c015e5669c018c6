package redisstore_test

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

// limitChangeCases are issue 20's: a limit change keeps the tokens spent,
// not the time, through both GCRA scripts (rate alone, and with a quota).
func limitChangeCases(t *testing.T, c redis.UniversalClient, s *redisstore.Store, clock *core.ManualClock, prefix string) {
	ctx := context.Background()
	for _, withQuota := range []bool{false, true} {
		q := core.Quota{}
		if withQuota {
			q = core.Quota{Max: 100, Renewal: time.Hour}
		}
		t.Run(fmt.Sprintf("quota=%v", withQuota), func(t *testing.T) {
			id := fmt.Sprintf("raise-%v", withQuota)
			// 3 of 3 per minute spent, raised to 6 per minute: exactly 3
			// more at once, then one per new emission interval (10s).
			r3 := prepare(t, s, core.Call{Consumer: id, Rate: core.PerMinute(3), Quota: q, Cost: 1})
			r6 := prepare(t, s, core.Call{Consumer: id, Rate: core.PerMinute(6), Quota: q, Cost: 1})
			for i := int64(0); i < 3; i++ {
				if d, _ := s.Take(ctx, r3); !d.Allowed || d.Rate.Remaining != 2-i {
					t.Fatalf("3/min request %d: %+v", i, d)
				}
			}
			if d, _ := s.Take(ctx, r3); d.Allowed || d.RetryAfter != 20*time.Second {
				t.Fatalf("4th at 3/min: %+v; want denied for 20s", d)
			}
			for i := int64(0); i < 3; i++ {
				if d, _ := s.Take(ctx, r6); !d.Allowed || d.Rate.Remaining != 2-i || d.Rate.Limit != 6 {
					t.Fatalf("raised to 6/min, request %d: %+v; want allowed, %d remaining of 6", i, d, 2-i)
				}
			}
			if d, _ := s.Take(ctx, r6); d.Allowed || d.RetryAfter != 10*time.Second || d.Rate.ResetAfter != time.Minute {
				t.Fatalf("4th after the raise: %+v; want denied for 10s, full in 1m", d)
			}
			if debt, T := gcraState(t, c, gcraKey(prefix, id), clock.Nanotime()); debt != int64(time.Minute) || T != int64(10*time.Second) {
				t.Fatalf("key after the raise: TAT − now %v, T %v; want 1m, 10s", time.Duration(debt), time.Duration(T))
			}
			if withQuota {
				if d, _ := s.Take(ctx, core.Request{Consumer: id, Rule: r6.Rule}); d.Quota.Remaining != 94 {
					t.Fatalf("quota after 6 allowed: %+v; want 94 remaining (counts kept)", d.Quota)
				}
			}

			// 3 of 6 per minute spent, lowered to 3 per minute: none more at
			// once (the first answer, a denial, converts the key), the next
			// one new emission interval (20s) later, then none.
			id = fmt.Sprintf("lower-%v", withQuota)
			r6 = prepare(t, s, core.Call{Consumer: id, Rate: core.PerMinute(6), Quota: q, Cost: 1})
			r3 = prepare(t, s, core.Call{Consumer: id, Rate: core.PerMinute(3), Quota: q, Cost: 1})
			for i := int64(0); i < 3; i++ {
				if d, _ := s.Take(ctx, r6); !d.Allowed || d.Rate.Remaining != 5-i {
					t.Fatalf("6/min request %d: %+v", i, d)
				}
			}
			if d, _ := s.Take(ctx, r3); d.Allowed || d.RetryAfter != 20*time.Second || d.Rate.ResetAfter != time.Minute {
				t.Fatalf("lowered to 3/min: %+v; want denied for 20s, full in 1m", d)
			}
			if debt, T := gcraState(t, c, gcraKey(prefix, id), clock.Nanotime()); debt != int64(time.Minute) || T != int64(20*time.Second) {
				t.Fatalf("key after the denial: TAT − now %v, T %v; want 1m, 20s (converted)", time.Duration(debt), time.Duration(T))
			}
			clock.Advance(20*time.Second - time.Microsecond)
			if d, _ := s.Take(ctx, r3); d.Allowed || d.RetryAfter != time.Microsecond {
				t.Fatalf("1µs before the new interval: %+v; want denied for 1µs", d)
			}
			clock.Advance(time.Microsecond)
			if d, _ := s.Take(ctx, r3); !d.Allowed || d.Rate.Remaining != 0 {
				t.Fatalf("one new interval later: %+v; want allowed, 0 remaining", d)
			}
			if d, _ := s.Take(ctx, r3); d.Allowed || d.RetryAfter != 20*time.Second {
				t.Fatalf("right after: %+v; want denied for 20s", d)
			}

			// A peek under a new limit converts too, and answers the
			// converted state: 2 of 4 per second spent (T = 250ms), peeked at
			// 8 per second (T = 125ms): 6 of 8 remaining.
			id = fmt.Sprintf("peek-%v", withQuota)
			r4 := prepare(t, s, core.Call{Consumer: id, Rate: core.PerSecond(4), Quota: q, Cost: 2})
			if d, _ := s.Take(ctx, r4); !d.Allowed || d.Rate.Remaining != 2 {
				t.Fatalf("4/s cost 2: %+v", d)
			}
			peek := prepare(t, s, core.Call{Consumer: id, Rate: core.PerSecond(8), Quota: q})
			if d, _ := s.Take(ctx, peek); !d.Allowed || d.Rate.Remaining != 6 || d.Rate.ResetAfter != 250*time.Millisecond {
				t.Fatalf("peek at 8/s: %+v; want 6 remaining, full in 250ms", d)
			}
			if debt, T := gcraState(t, c, gcraKey(prefix, id), clock.Nanotime()); debt != int64(250*time.Millisecond) || T != int64(125*time.Millisecond) {
				t.Fatalf("key after the peek: TAT − now %v, T %v; want 250ms, 125ms", time.Duration(debt), time.Duration(T))
			}
		})
	}
}

func TestLimitChangeStandalone(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	for _, pipeline := range []int{-1, 0} {
		t.Run(fmt.Sprintf("pipeline=%d", pipeline), func(t *testing.T) {
			c.FlushAll(context.Background())
			clock := core.NewManualClock(int64(1000 * time.Hour))
			s := newStore(t, c, redisstore.Options{KeyPrefix: "lc:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute, Pipeline: pipeline})
			t.Cleanup(func() { s.Close() })
			limitChangeCases(t, c, s, clock, "lc:")
		})
	}
}

func TestLimitChangeCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t, nil)
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lc:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	t.Cleanup(func() { s.Close() })
	limitChangeCases(t, c, s, clock, "lc:")
}

// TestLimitChangeOldKey: a key written by the previous release holds the
// TAT alone; it is read as it is (T unknown: no rescale), under the old
// limit and a new one, and the next write adds T.
func TestLimitChangeOldKey(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	now := clock.Nanotime()
	for _, id := range []string{"old-same", "old-raised"} {
		// 3 of 3 per minute spent, as the previous release stored it.
		if err := c.Set(ctx, gcraKey("lp:", id), fmt.Sprint(now+int64(time.Minute)), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	same := prepare(t, s, core.Call{Consumer: "old-same", Rate: core.PerMinute(3), Cost: 1})
	if d, _ := s.Take(ctx, same); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("old key, same limit: %+v; want denied for 20s", d)
	}
	raised := prepare(t, s, core.Call{Consumer: "old-raised", Rate: core.PerMinute(6), Cost: 1})
	if d, _ := s.Take(ctx, raised); d.Allowed || d.RetryAfter != 10*time.Second {
		t.Fatalf("old key, raised limit: %+v; want denied for 10s (TAT kept)", d)
	}
	if v, _ := c.Get(ctx, gcraKey("lp:", "old-raised")).Result(); v != fmt.Sprint(now+int64(time.Minute)) {
		t.Fatalf("old key after a denial: %q, want it unchanged", v)
	}
	clock.Advance(10 * time.Second)
	if d, _ := s.Take(ctx, raised); !d.Allowed || d.Rate.Remaining != 0 {
		t.Fatalf("old key 10s later: %+v; want allowed", d)
	}
	if debt, T := gcraState(t, c, gcraKey("lp:", "old-raised"), clock.Nanotime()); debt != int64(time.Minute) || T != int64(10*time.Second) {
		t.Fatalf("old key after a write: TAT − now %v, T %v; want 1m, 10s", time.Duration(debt), time.Duration(T))
	}
}

// TestRescaleExact checks the script's rescale against exact integer
// arithmetic: a key holding TAT = now + debt written under T_old, peeked
// under a limit of T_new, holds now + min(⌈debt × T_new / T_old⌉, 2^62)
// afterwards, to the nanosecond, for debts and intervals up to core's
// bounds (products up to 2^123), as core/memory rescales.
func TestRescaleExact(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000*time.Hour) + 123) // not whole µs
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:", Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	now := clock.Nanotime()
	maxDebt := new(big.Int).Lsh(big.NewInt(1), 62)
	want := func(debt, from, to int64) int64 {
		p := new(big.Int).Mul(big.NewInt(debt), big.NewInt(to))
		q, r := new(big.Int).QuoRem(p, big.NewInt(from), new(big.Int))
		if r.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		if q.Cmp(maxDebt) > 0 {
			q = maxDebt
		}
		return q.Int64()
	}
	rng := rand.New(rand.NewPCG(20, 3))
	mag := func(bits int) int64 { return rng.Int64N(int64(1)<<bits) + 1 }
	type tc struct{ debt, from, to int64 }
	cases := []tc{
		{int64(time.Minute), int64(20 * time.Second), int64(10 * time.Second)},
		{int64(30 * time.Second), int64(10 * time.Second), int64(20 * time.Second)},
		{1, 3, 1},                           // ⌈1/3⌉ = 1
		{1, 1 << 61, 1},                     // tiny: 1
		{1 << 62, 1, 1 << 61},               // clamped at 2^62
		{1<<62 - 1, 1<<61 - 1, 1<<61 - 3},   // a product near 2^123
		{1 << 61, 1 << 61, 1<<61 - 1},       // exact below the clamp
		{999_999_999_999, 333_333_333, 999}, // sub-µs T
		{1<<62 - 1, 1 << 61, 1 << 61 >> 1},
		{1<<62 - 1, 1<<48 - 1, 1<<61 - 1}, // limbs of all ones
		{1<<48 + 1, 1<<24 + 1, 1<<48 - 1}, // divisor just over a limb
		{1<<62 - 1, 16777215, 16777216},   // quotient limbs at the estimate's edge
		{1 << 40, 1<<61 - 1, 1<<61 - 2},   // a ratio just under 1
	}
	for range 600 {
		cases = append(cases, tc{mag(1 + rng.IntN(62)), mag(1 + rng.IntN(61)), mag(1 + rng.IntN(61))})
	}
	for i, k := range cases {
		if k.from == k.to {
			continue
		}
		id := fmt.Sprint("rescale-", i)
		key := gcraKey("lp:", id)
		if err := c.Set(ctx, key, fmt.Sprintf("%d:%d", now+k.debt, k.from), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		// Rate 1 per T_new, burst 1: T = τ = T_new ≤ 2^61.
		peek := prepare(t, s, core.Call{Consumer: id, Rate: core.Limit{Rate: 1, Period: time.Duration(k.to), Burst: 1}})
		d, err := s.Take(ctx, peek)
		if err != nil {
			t.Fatal(err)
		}
		w := want(k.debt, k.from, k.to)
		debt, T := gcraState(t, c, key, now)
		if debt != w || T != k.to || d.Rate.ResetAfter != time.Duration(w) {
			t.Fatalf("case %d %+v: TAT − now %d, T %d, ResetAfter %d; want %d, %d, %d", i, k, debt, T, d.Rate.ResetAfter, w, k.to, w)
		}
	}
}
