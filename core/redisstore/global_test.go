package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
)

// TestGlobalQuotaSpend drives the global quota script with leases written
// by hand (as the data plane's QuotaRunner writes them), on a frozen
// clock, on one Redis and on a 3-node Cluster: the lease that stops first
// is spent first, then the next, exactly; then the floor by mode; nothing
// after the period's end; the slot is marked active; without
// FollowsControlPlane the same quota is a plain one.
func TestGlobalQuotaSpend(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testGlobalSpend(t, redistest.Start(t).Client(t, nil)) })
	t.Run("cluster", func(t *testing.T) { testGlobalSpend(t, redistest.StartCluster(t, 3).Client(t, nil)) })
}

func testGlobalSpend(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	const nowNs = int64(1e15) // 1e12 µs
	nowUs := nowNs / 1000
	clock := core.NewManualClock(nowNs)
	s := newStore(t, c, redisstore.Options{FollowsControlPlane: true, Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute, GlobalCutOff: time.Second})
	plain := newStore(t, c, redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	for i, mode := range []core.GlobalMode{core.GlobalStrict, core.GlobalReserved, core.GlobalOptimistic} {
		clock.Set(nowNs)
		consumer := fmt.Sprintf("consumer-%d", i)
		q := core.Quota{Max: 100, Renewal: time.Hour, Global: core.GlobalQuota{Mode: mode, Floor: 2, Policy: "gold"}}
		if mode == core.GlobalStrict {
			q.Global.Floor = 0
		}
		rule, err := s.Prepare(core.LimitSet{Quota: q, Rate: core.Limit{Rate: 1000, Period: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		key := redisstore.GlobalSlotKey("", consumer, "", "gold", 0)
		tk := func() bool {
			t.Helper()
			d, err := s.Take(ctx, core.Request{Consumer: consumer, Rule: rule, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			return d.Allowed
		}
		// Lease a stops later than lease b; both live.
		if err := c.HSet(ctx, key, "L", fmt.Sprintf("a %d 3\nb %d 2\n", nowUs+2e6, nowUs+1e6), "ct", nowUs, "pe", nowUs+3e6).Err(); err != nil {
			t.Fatal(err)
		}
		for j := range 5 {
			if !tk() {
				t.Fatalf("%v: take %d refused with 5 leased", mode, j)
			}
			if j == 1 {
				if v := c.HMGet(ctx, key, "s:a", "s:b").Val(); v[0] != nil || v[1] != "2" {
					t.Fatalf("%v: after 2 takes s:a, s:b = %v, want the lease that stops first spent first", mode, v)
				}
			}
		}
		floorWanted := int64(0)
		if mode == core.GlobalReserved {
			// A reserved floor is spent only once a grant of the period
			// has said the ledger debited it (fa, which the runner writes
			// from the grant's floor): before that, nothing.
			if tk() {
				t.Fatalf("reserved: the floor was spent before the ledger debited it")
			}
			if err := c.HSet(ctx, key, "fa", 2).Err(); err != nil {
				t.Fatal(err)
			}
			floorWanted = 2
		}
		for range floorWanted {
			if !tk() {
				t.Fatalf("%v: the floor refused", mode)
			}
		}
		if tk() {
			t.Fatalf("%v: admitted beyond leases and floor", mode)
		}
		if mode == core.GlobalOptimistic {
			// Cut off: the last contact is older than the cut-off.
			clock.Advance(1500 * time.Millisecond)
			if !tk() || !tk() || tk() {
				t.Fatalf("optimistic: cut off, the floor is 2")
			}
		}
		v := c.HMGet(ctx, key, "s:a", "s:b", "a", "x", "fl", "c", "p").Val()
		wantFloor := fmt.Sprint(floorWanted)
		if mode == core.GlobalOptimistic {
			wantFloor = "2"
		}
		if v[0] != "3" || v[1] != "2" || v[4] != wantFloorOrNil(wantFloor) || v[5] != consumer || v[6] != "gold" {
			t.Fatalf("%v: s:a, s:b, a, x, fl, c, p = %v", mode, v)
		}
		// Marked at the first take, and again at most once a second.
		wantMark := nowUs
		if mode == core.GlobalOptimistic {
			wantMark = nowUs + 1500000
		}
		// (The marker writes the active set off the request path: wait
		// for it.)
		for deadline := time.Now().Add(10 * time.Second); ; {
			n, err := c.ZScore(ctx, redisstore.GlobalActiveKey(""), key).Result()
			if err == nil && int64(n) == wantMark {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: active score %v, %v; want %d", mode, n, err, wantMark)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// After the period's end nothing is spent, leases or floor.
		cur := clock.Nanotime() / 1000
		if err := c.HSet(ctx, key, "L", fmt.Sprintf("c %d 10\n", cur+1e9), "pe", cur-1, "fl", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if tk() {
			t.Fatalf("%v: admitted after the period's end", mode)
		}
		// The same limits on a store that does not follow a control plane
		// are a plain quota of 100.
		pr, err := plain.Prepare(core.LimitSet{Quota: q})
		if err != nil {
			t.Fatal(err)
		}
		d, err := plain.Take(ctx, core.Request{Consumer: consumer, Rule: pr, Cost: 100})
		if err != nil || !d.Allowed {
			t.Fatalf("%v: plain quota: %+v, %v", mode, d, err)
		}
	}
	// A floor above max is refused by Prepare.
	if _, err := s.Prepare(core.LimitSet{Quota: core.Quota{Max: 1, Renewal: time.Hour, Global: core.GlobalQuota{Mode: core.GlobalReserved, Floor: 2}}}); err == nil {
		t.Fatal("Prepare accepted a floor above max")
	}
}

func wantFloorOrNil(s string) any {
	if s == "0" {
		return nil
	}
	return s
}
