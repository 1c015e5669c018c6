package main

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestRedisFallbackWindowPolicy: a sliding_window policy with
// failure_policy fallback starts (the fallback store converts window
// limits to GCRA, so the engine must not see the in-process store's
// "GCRA only"). Through Redis the key gets the sliding window's 3 a
// minute; with Redis killed the same key is decided in memory as GCRA with
// 3 a minute and a burst of 3: exactly 3 of 10 requests pass, with GCRA's
// RateLimit values, and the 4th on waits 20 s, one emission interval.
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
	for i := 2; i >= 0; i-- {
		r := get(t, nil, gw.base+"/echo/", "X-API-Key", "a")
		if r.status != 200 || r.header.Get("RateLimit") != fmt.Sprintf(`"w";r=%d;t=120`, i) {
			t.Fatalf("through Redis: %d RateLimit %q, want 200 and r=%d", r.status, r.header.Get("RateLimit"), i)
		}
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
			want["RateLimit"] = fmt.Sprintf(`"w";r=%d;t=%d`, 3-allowed, allowed*20)
		case 429:
			want["RateLimit"], want["Retry-After"] = `"w";r=0;t=20`, strconv.Itoa(20)
		default:
			t.Fatalf("request %d while Redis is down: status %d %s", i, r.status, r.body)
		}
		checkHeaders(t, fmt.Sprintf("request %d while Redis is down", i), r.header, want)
	}
	if allowed != 3 {
		t.Errorf("%d of 10 requests allowed while Redis is down, want exactly 3 (GCRA, 3 a minute, burst 3)", allowed)
	}
}
