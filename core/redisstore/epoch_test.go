package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestQuotaEpochKeys: quota epoch 0 keeps the quota key's name from before
// epochs (so counters survive an upgrade); epoch N is "quota.N", with the
// renewal as its TTL like any quota key; the rate key is one for all
// epochs. ResetQuota deletes the named epoch's key only.
func TestQuotaEpochKeys(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:"})
	const tag = "2bb80d537b1da3e38bd30361aa855686" // first 32 hex digits of SHA-256("secret")
	r := core.Call{Consumer: "secret", Scope: "orders", Rate: core.Limit{Rate: 10, Period: time.Second}, Quota: core.Quota{Max: 5, Renewal: time.Hour}, Cost: 1}
	take(t, s, r)
	r.QuotaEpoch = 12
	take(t, s, r)
	keys, err := c.Keys(ctx, "lp:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{"lp:{" + tag + "}:gcra:orders", "lp:{" + tag + "}:quota.12:orders", "lp:{" + tag + "}:quota:orders"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys = %q, want %q", keys, want)
	}
	for _, k := range want[1:] {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= time.Hour-time.Minute || ttl > time.Hour {
			t.Fatalf("PTTL %s = %v, %v; want the renewal, 1h", k, ttl, err)
		}
		if used, err := c.HGet(ctx, k, "used").Result(); err != nil || used != "1" {
			t.Fatalf("%s count = %q, %v; want 1", k, used, err)
		}
	}
	if err := s.ResetQuota(ctx, "secret", "orders", 12); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, want[1]).Result(); n != 0 {
		t.Fatal("ResetQuota(12) left epoch 12's key")
	}
	if n, _ := c.Exists(ctx, want[2]).Result(); n != 1 {
		t.Fatal("ResetQuota(12) deleted epoch 0's key")
	}
	if err := s.ResetQuota(ctx, "secret", "orders", 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, want[2]).Result(); n != 0 {
		t.Fatal("ResetQuota(0) left epoch 0's key")
	}
}

// TestQuotaEpochLowerSpendsItsOwnCounter documents the Redis store's answer
// to a lower epoch than the newest (a gateway that has not yet applied a
// raise): it spends the lower epoch's own counter, exactly as it would
// have without the raise, and the raised epoch's counter is untouched.
func TestQuotaEpochLowerSpendsItsOwnCounter(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.Client(t, nil), redisstore.Options{})
	q := core.Quota{Max: 3, Renewal: time.Hour}
	old := core.Call{Consumer: "c", Quota: q, Cost: 1, QuotaEpoch: 1}
	raised := old
	raised.QuotaEpoch = 2
	take(t, s, old)
	take(t, s, old)
	if d := take(t, s, raised); d.Remaining != 2 {
		t.Fatalf("first at epoch 2: remaining %d, want 2", d.Remaining)
	}
	if d := take(t, s, old); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("third at epoch 1: %+v, want allowed with 0 remaining", d)
	}
	if d := take(t, s, old); d.Allowed {
		t.Fatalf("fourth at epoch 1: %+v, want denied", d)
	}
	if d := take(t, s, raised); d.Remaining != 1 {
		t.Fatalf("second at epoch 2: remaining %d, want 1", d.Remaining)
	}
}
