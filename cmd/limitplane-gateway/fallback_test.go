package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestRedisFallbackWindowPolicy: a sliding_window policy with
// failure_policy fallback starts (the fallback store converts window
// limits to GCRA, so the engine must not see the in-process store's
// "GCRA only"). Through Redis the key spends 1 of the sliding window's 3
// a minute; with Redis killed the same key is decided in memory as GCRA
// with 3 a minute and a burst of 3, carrying on from the window's state
// (2 left: a bucket one emission interval, 20 s, from full): exactly 2 of
// 10 requests pass, with GCRA's RateLimit values, and the 3rd on waits
// 20 s.
func TestRedisFallbackWindowPolicy(t *testing.T) {
	srv := redistest.Start(t)
	gw := start(t, frozen(), "-config", writeConfig(t, "store: redis://"+srv.Addr+"\n"+`
failure_policy: fallback
redis: {timeout: 10s, breaker_failures: 3, breaker_cooldown: 1m}
policies:
  - {id: w, rate: {requests: 3, per: 1m, algorithm: sliding_window}}
keys:
  - {key: a, policies: [w]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`))
	// Through Redis: the sliding window (see TestRedisWindowAlgorithms).
	if r := get(t, nil, gw.base+"/echo/", "X-API-Key", "a"); r.status != 200 || r.header.Get("RateLimit") != `"w";r=2;t=120` {
		t.Fatalf("through Redis: %d RateLimit %q, want 200 and r=2", r.status, r.header.Get("RateLimit"))
	}
	checkKeys(t, srv.Client(t, nil), redisKey("limitplane:", keyConsumer("a"), "sw"))

	srv.Kill()
	allowed := 0
	for i := 0; i < 10; i++ {
		r := get(t, nil, gw.base+"/echo/", "X-API-Key", "a")
		want := map[string]string{"RateLimit-Policy": `"w";q=3;w=60`}
		switch r.status {
		case 200:
			allowed++
			want["RateLimit"] = fmt.Sprintf(`"w";r=%d;t=%d`, 2-allowed, (1+allowed)*20)
		case 429:
			want["RateLimit"], want["Retry-After"] = `"w";r=0;t=20`, strconv.Itoa(20)
		default:
			t.Fatalf("request %d while Redis is down: status %d %s", i, r.status, r.body)
		}
		checkHeaders(t, fmt.Sprintf("request %d while Redis is down", i), r.header, want)
	}
	if allowed != 2 {
		t.Errorf("%d of 10 requests allowed while Redis is down, want exactly 2 (GCRA, 3 a minute, burst 3, one spent through Redis)", allowed)
	}
}

// TestRedisFallbackCarriesOnTwoGateways reproduces issue 18's row 12 with
// two gateway processes sharing one redis-server under failure_policy
// fallback, and pauses the server (SIGSTOP) mid-run. Each gateway carries
// on from the counts of its own last Redis replies, so the excess over a
// quota is what one gateway spent that the other had not seen:
//
//   - spent: 300 of its 300 spent, and both gateways saw it spent: 0 more
//     on either (before the fix, each counted from zero: the issue saw 145
//     and 136 more in 5 s);
//   - part: 100 spent through gateway A only: exactly 200 more on A, and
//     300 on B, which never saw the key (the documented bound);
//   - split: 100 through A, then 100 through B: exactly 200 more on A
//     (it saw 100), 100 on B (it saw 200);
//   - burst: a rate limit of 10 per 10 minutes, 6 spent through A:
//     exactly 4 more there.
//
// Resumed (SIGCONT), Redis decides again: "part", which both fallbacks
// hold spent, is allowed on both gateways, with the remaining count Redis
// holds.
func TestRedisFallbackCarriesOnTwoGateways(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	// The first request to the paused Redis opens the breaker, and the
	// cooldown keeps others from trying it for a while. Each that does is
	// decided by the fallback but stays queued in Redis, which runs its
	// script when it resumes: the check after the outage compares with the
	// count Redis holds.
	cfg := writeConfig(t, "store: redis://"+srv.Addr+"\n"+`
failure_policy: fallback
redis: {timeout: 300ms, breaker_failures: 1, breaker_cooldown: 2s}
policies:
  - {id: q, quota: {max: 300, renewal: 1h}}
  - {id: r, rate: {requests: 10, per: 10m}}
keys:
  - {key: spent, policies: [q]}
  - {key: part, policies: [q]}
  - {key: split, policies: [q]}
  - {key: burst, policies: [r]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`)
	_, _, stderrA, a := startProcess(t, "-config", cfg)
	_, _, stderrB, b := startProcess(t, "-config", cfg)
	send := func(base, key string, n int) (allowed int) {
		t.Helper()
		for range n {
			switch r := get(t, nil, base+"/echo/", "X-API-Key", key); r.status {
			case 200:
				allowed++
			case 429:
			default:
				t.Fatalf("%s key %s: status %d %s\nA: %s\nB: %s", base, key, r.status, r.body, stderrA, stderrB)
			}
		}
		return allowed
	}
	for _, s := range []struct {
		gw, key    string
		n, allowed int
	}{
		{a, "spent", 150, 150}, {b, "spent", 151, 150}, {a, "spent", 1, 0}, // both see 300 spent
		{a, "part", 100, 100},
		{a, "split", 100, 100}, {b, "split", 100, 100},
		{a, "burst", 6, 6},
	} {
		if got := send(s.gw, s.key, s.n); got != s.allowed {
			t.Fatalf("through Redis, key %s: %d of %d allowed, want %d", s.key, got, s.n, s.allowed)
		}
	}

	srv.Pause()
	for _, s := range []struct {
		name, gw, key string
		n, allowed    int
	}{
		{"A", a, "spent", 150, 0}, {"B", b, "spent", 150, 0},
		{"A", a, "part", 300, 200}, {"B", b, "part", 301, 300},
		{"A", a, "split", 300, 200}, {"B", b, "split", 300, 100},
		{"A", a, "burst", 10, 4},
	} {
		if got := send(s.gw, s.key, s.n); got != s.allowed {
			t.Errorf("Redis paused, gateway %s, key %s: %d of %d allowed, want exactly %d", s.name, s.key, got, s.n, s.allowed)
		}
	}
	if !strings.Contains(stderrA.String(), "redis circuit breaker opened") || !strings.Contains(stderrB.String(), "redis circuit breaker opened") {
		t.Fatalf("a gateway did not fall back:\nA: %s\nB: %s", stderrA, stderrB)
	}

	srv.Resume()
	quotaKey := redisKey("limitplane:", keyConsumer("part"), "quota")
	for _, gw := range []struct{ name, base string }{{"A", a}, {"B", b}} {
		deadline := time.Now().Add(15 * time.Second)
		for {
			r := get(t, nil, gw.base+"/echo/", "X-API-Key", "part")
			if r.status == 200 {
				used, err := rc.HGet(context.Background(), quotaKey, "used").Int64()
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf(`"q/quota";r=%d;`, 300-used); !strings.HasPrefix(r.header.Get("RateLimit"), want) {
					t.Errorf("gateway %s after Redis is back: RateLimit %q, want %s… (Redis counts %d used)", gw.name, r.header.Get("RateLimit"), want, used)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %s still denies key part 15 s after Redis resumed (its fallback holds it spent): %d %s", gw.name, r.status, r.body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
