package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// newSeeded starts a redis-server and returns it with a Redis store
// (100 ms timeout, breaker after 2 failures, 200 ms cooldown) seeding an
// in-process fallback, an Engine over both under FailFallback with a
// quota policy "q" (300 an hour) and a rate policy "r" (10 per 10
// minutes: one a minute, so a burst cannot refill while a test runs), and
// the count of store failures the engine saw.
func newSeeded(t *testing.T) (*redistest.Server, *redisstore.Store, *core.Engine, *atomic.Int64) {
	t.Helper()
	srv := redistest.Start(t)
	client, err := redisstore.NewClientFromURL("redis://" + srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	fb := memory.New(memory.Options{})
	store := newStore(t, client, redisstore.Options{Timeout: 100 * time.Millisecond, BreakerFailures: 2, BreakerCooldown: 200 * time.Millisecond, Seed: fb})
	var failures atomic.Int64
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "q", Quota: core.Quota{Max: 300, Renewal: time.Hour}},
		// 10 per 10 minutes: one every minute, so the burst cannot refill
		// while the test runs.
		{ID: "r", Rate: core.Limit{Rate: 10, Period: 10 * time.Minute}},
	}}, core.Options{FailurePolicy: core.FailFallback, Fallback: fb, OnStoreError: func(error) { failures.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	return srv, store, eng, &failures
}

// decideN decides n requests of cost 1 for c on API "api" and returns how
// many were allowed and the last decision.
func decideN(t *testing.T, eng *core.Engine, c *core.Consumer, n int) (allowed int, last core.Decision) {
	t.Helper()
	for range n {
		d, err := eng.Decide(context.Background(), c, "api", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		last = d
	}
	return allowed, last
}

// waitAnswers polls store until Redis answers (10 s at most).
func waitAnswers(t *testing.T, store *redisstore.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := core.TakeCall(context.Background(), store, core.Call{Consumer: "probe", Rate: core.Limit{Rate: 1, Period: time.Hour}})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis does not answer 10 s after SIGCONT: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFallbackCarriesOnFromRedis: an Engine under FailFallback over the
// Redis store, whose decisions seed the in-process fallback
// (Options.Seed). redis-server is paused (SIGSTOP) mid-run, so calls time
// out and the breaker opens; the fallback then continues from what Redis
// last said: a key that spent 300 of its 300 gets 0 more, one that spent
// 100 gets exactly 200 more, a rate limit 6 into a burst of 10 gets
// exactly 4, and a quota epoch raised during the outage starts a fresh
// period. Resumed, Redis is authoritative again: the key the fallback let
// spend its whole quota gets what Redis has left of it (200, less any
// request that tried the paused Redis).
func TestFallbackCarriesOnFromRedis(t *testing.T) {
	srv, store, eng, failures := newSeeded(t)
	spent := &core.Consumer{ID: "spent", Policies: []string{"q"}}
	part := &core.Consumer{ID: "part", Policies: []string{"q"}}
	burst := &core.Consumer{ID: "burst", Policies: []string{"r"}}
	reset := &core.Consumer{ID: "reset", Policies: []string{"q"}, QuotaEpoch: 1}
	send := func(c *core.Consumer, n int) (int, core.Decision) { t.Helper(); return decideN(t, eng, c, n) }
	for _, s := range []struct {
		c          *core.Consumer
		n, allowed int
	}{{spent, 301, 300}, {part, 100, 100}, {burst, 6, 6}, {reset, 300, 300}} {
		if got, _ := send(s.c, s.n); got != s.allowed {
			t.Fatalf("%s through Redis: %d of %d allowed, want %d", s.c.ID, got, s.n, s.allowed)
		}
	}
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d store failures with Redis up", n)
	}

	srv.Pause()
	got, d := send(spent, 50)
	if got != 0 || d.DecidedBy != core.KindQuota || d.RetryAfter <= 59*time.Minute || d.RetryAfter > time.Hour {
		t.Errorf("spent key while Redis is paused: %d of 50 allowed, last %+v; want 0, denied by the quota until its period (under an hour) ends", got, d)
	}
	if failures.Load() == 0 {
		t.Fatal("no store failure while Redis is paused: the decisions above were not the fallback's")
	}
	if got, _ := send(part, 300); got != 200 {
		t.Errorf("key that spent 100 of 300: %d more allowed while Redis is paused, want exactly 200", got)
	}
	if got, _ := send(burst, 10); got != 4 {
		t.Errorf("rate limit 6 into a burst of 10: %d of 10 allowed while Redis is paused, want exactly 4", got)
	}
	raised := *reset
	raised.QuotaEpoch = 2
	if got, _ := send(reset, 5); got != 0 {
		t.Errorf("spent quota before its reset: %d allowed, want 0", got)
	}
	if got, _ := send(&raised, 301); got != 300 {
		t.Errorf("quota reset (epoch 1 → 2) during the outage: %d of 301 allowed, want a fresh 300", got)
	}

	srv.Resume()
	waitAnswers(t, store)
	// Redis's own count: 100, plus any request that tried the paused
	// Redis (a breaker probe), which Redis ran when it resumed.
	peek, err := core.TakeCall(context.Background(), store, core.Call{Consumer: "part", Quota: core.Quota{Max: 300, Renewal: time.Hour}})
	if err != nil || peek.Quota.Remaining > 200 || peek.Quota.Remaining < 190 {
		t.Fatalf("Redis's state of the key that spent 100: %+v, %v; want about 200 left", peek, err)
	}
	before := failures.Load()
	if got, _ := send(part, 300); int64(got) != peek.Quota.Remaining {
		t.Errorf("key that spent 100 of 300 in Redis (and 200 more in the fallback): %d of 300 allowed after Redis is back, want %d (Redis's count)", got, peek.Quota.Remaining)
	}
	if got, _ := send(spent, 5); got != 0 {
		t.Errorf("spent key after Redis is back: %d allowed, want 0", got)
	}
	if n := failures.Load() - before; n != 0 {
		t.Errorf("%d store failures after Redis answered again", n)
	}
}

// TestResetQuotaResetsSeededFallback: Engine.ResetQuota resets the seeded
// fallback too. A key that spent its 300 in Redis and was reset there
// (Redis up) has a fresh 300 in the fallback during a later outage, where
// the fallback would otherwise still hold the 300 it saw; a reset made
// while Redis is paused fails (the store's error) but takes effect in the
// fallback.
func TestResetQuotaResetsSeededFallback(t *testing.T) {
	srv, _, eng, _ := newSeeded(t)
	ctx := context.Background()
	early := &core.Consumer{ID: "early", Policies: []string{"q"}}
	late := &core.Consumer{ID: "late", Policies: []string{"q"}}
	for _, c := range []*core.Consumer{early, late} {
		if got, _ := decideN(t, eng, c, 300); got != 300 {
			t.Fatalf("%s through Redis: %d of 300 allowed", c.ID, got)
		}
	}
	if err := eng.ResetQuota(ctx, early, "api"); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	if got, _ := decideN(t, eng, early, 301); got != 300 {
		t.Errorf("key reset before the outage: %d of 301 allowed in the fallback, want 300", got)
	}
	if got, _ := decideN(t, eng, late, 5); got != 0 {
		t.Errorf("spent key before its reset: %d allowed, want 0", got)
	}
	if err := eng.ResetQuota(ctx, late, "api"); err == nil {
		t.Error("ResetQuota with Redis paused succeeded")
	}
	if got, _ := decideN(t, eng, late, 301); got != 300 {
		t.Errorf("key reset during the outage: %d of 301 allowed in the fallback, want 300", got)
	}
}
