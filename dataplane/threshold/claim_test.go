package threshold_test

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/threshold"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestMemoryClaimer: an id is claimed once until its expiry, again after
// it or after Release; the set holds at most its bound (expired ids go
// first).
func TestMemoryClaimer(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := threshold.NewMemoryClaimer(2, func() time.Time { return now })
	ctx := context.Background()
	claim := func(id string, until time.Time) bool {
		ok, err := m.Claim(ctx, id, until)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim("a", now.Add(time.Hour)) || claim("a", now.Add(time.Hour)) {
		t.Fatal("a: want claimed once")
	}
	if !claim("b", now.Add(time.Minute)) {
		t.Fatal("b")
	}
	now = now.Add(2 * time.Minute) // b expired
	if !claim("c", now.Add(time.Hour)) || m.Len() != 2 || claim("a", now.Add(time.Hour)) {
		t.Fatalf("c: %d held; a must still be held", m.Len())
	}
	if !claim("b", now.Add(time.Hour)) || m.Len() != 2 {
		t.Fatalf("b again: %d held, want 2 (the bound)", m.Len())
	}
	m.Release(ctx, "b")
	if !claim("b", now.Add(time.Hour)) {
		t.Fatal("b after Release")
	}
}

// TestRedisClaimer: SET NX with an expiry at the period's end; Release
// deletes the claim.
func TestRedisClaimer(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	r := threshold.NewRedisClaimer(c, "lp:")
	ctx := context.Background()
	if ok, err := r.Claim(ctx, "x", time.Now().Add(time.Hour)); !ok || err != nil {
		t.Fatalf("first claim: %v %v", ok, err)
	}
	if ok, err := r.Claim(ctx, "x", time.Now().Add(time.Hour)); ok || err != nil {
		t.Fatalf("second claim: %v %v", ok, err)
	}
	if ttl := c.TTL(ctx, "lp:threshold:x").Val(); ttl < 59*time.Minute || ttl > time.Hour {
		t.Fatalf("TTL %s, want about an hour", ttl)
	}
	if err := r.Release(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := r.Claim(ctx, "x", time.Now()); !ok {
		t.Fatal("claim after Release")
	}
	if ttl := c.TTL(ctx, "lp:threshold:x").Val(); ttl <= 0 || ttl > time.Second {
		t.Fatalf("a period already over: TTL %s, want 1s", ttl)
	}
}
