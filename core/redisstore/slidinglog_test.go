package redisstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

// commandCalls returns how many times Redis ran each command since the last
// CONFIG RESETSTAT, from INFO commandstats (commands a script runs count).
func commandCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, m := range regexp.MustCompile(`cmdstat_(\w+):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		calls[m[1]] = n
	}
	return calls
}

// logKey returns the one sliding-log key on the server.
func logKey(t *testing.T, c *redis.Client) string {
	t.Helper()
	keys, err := c.Keys(context.Background(), "*:sl:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("sliding log keys %q (%v), want one", keys, err)
	}
	return keys[0]
}

// TestSlidingLogWorkBounded: a sliding log's work and memory per request do
// not grow with the request's cost (issue 9: one request of cost 200,000
// used to add 200,000 members, 23 MB, and hold Redis for 278 ms). The
// largest cost allowed, 2^53 − 2 against a Rate of 2^53 − 1, adds one
// member of a few dozen bytes with one ZADD; requests in one microsecond
// share a member; each admitted request removes at most 16 expired members.
func TestSlidingLogWorkBounded(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := newStore(t, c, redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})

	for _, tc := range []struct {
		rate, cost int64
	}{{1_000_000, 200_000}, {core.MaxCount, core.MaxCount - 1}} {
		t.Run(fmt.Sprintf("cost %d", tc.cost), func(t *testing.T) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			l := core.Limit{Rate: tc.rate, Period: time.Duration(1e16), Algorithm: core.SlidingLog}
			d := take(t, s, core.Call{Consumer: "big", Rate: l, Cost: tc.cost})
			if !d.Allowed || d.Remaining != tc.rate-tc.cost {
				t.Fatalf("decision %+v, want allowed with %d remaining", d, tc.rate-tc.cost)
			}
			k := logKey(t, c)
			if n := c.ZCard(ctx, k).Val(); n != 1 {
				t.Fatalf("ZCARD %d, want 1 member for one request", n)
			}
			if b := c.MemoryUsage(ctx, k).Val(); b > 256 {
				t.Fatalf("MEMORY USAGE %d bytes, want at most 256", b)
			}
			calls := commandCalls(t, c)
			if calls["zadd"] != 1 || calls["zrem"] != 0 || calls["zremrangebyrank"] != 0 {
				t.Fatalf("commands run: %v, want one ZADD and no removal", calls)
			}
		})
	}

	t.Run("same microsecond shares a member", func(t *testing.T) {
		c.FlushAll(ctx)
		l := core.Limit{Rate: 1_000_000, Period: time.Second, Algorithm: core.SlidingLog}
		for i := int64(1); i <= 100; i++ {
			if d := take(t, s, core.Call{Consumer: "burst", Rate: l, Cost: 1000}); !d.Allowed || d.Remaining != 1_000_000-1000*i {
				t.Fatalf("request %d: %+v", i, d)
			}
		}
		if n := c.ZCard(ctx, logKey(t, c)).Val(); n != 1 {
			t.Fatalf("ZCARD %d, want 1", n)
		}
	})

	t.Run("expired members removed 16 per request", func(t *testing.T) {
		c.FlushAll(ctx)
		l := core.Limit{Rate: 1000, Period: time.Second, Algorithm: core.SlidingLog}
		r := core.Call{Consumer: "many", Rate: l, Cost: 1}
		for range 40 {
			take(t, s, r)
			clock.Advance(time.Microsecond)
		}
		k := logKey(t, c)
		card := func() int64 { return c.ZCard(ctx, k).Val() }
		if n := card(); n != 40 {
			t.Fatalf("ZCARD %d, want 40 (one member per microsecond)", n)
		}
		clock.Advance(time.Second)
		// A denied request and a peek change nothing, expired members
		// included.
		if d := take(t, s, core.Call{Consumer: "many", Rate: l, Cost: 1001}); d.Allowed {
			t.Fatalf("cost above rate allowed: %+v", d)
		}
		take(t, s, core.Call{Consumer: "many", Rate: l, Cost: 0})
		if n := card(); n != 40 {
			t.Fatalf("ZCARD %d after a denial and a peek, want 40", n)
		}
		for i, want := range []int64{40 - 16 + 1, 24 - 16 + 2, 3, 4} {
			if d := take(t, s, r); !d.Allowed || d.Remaining != 1000-int64(i)-1 {
				t.Fatalf("request %d: %+v", i, d)
			}
			if n := card(); n != want {
				t.Fatalf("after request %d: ZCARD %d, want %d", i, n, want)
			}
			clock.Advance(time.Microsecond)
		}
	})
}
