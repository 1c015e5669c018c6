package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestSettleGatewayRedis: a gateway on Redis charges an estimate of 100
// (an endpoint's cost) against 10,000 tokens per minute and settles it to
// the upstream's X-Usage-Tokens (1,000 / 10 / absent): under 16
// concurrent clients the quota's count in Redis is exactly the sum of the
// actual costs, and the key, over budget after settling, is refused with
// Retry-After from the period's real end.
func TestSettleGatewayRedis(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.URL.Query().Get("u"); u != "" {
			w.Header().Set("X-Usage-Tokens", u)
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	gw := start(t, env{}, "-config", writeConfig(t, fmt.Sprintf(`store: redis://%s/0
redis: {timeout: 10s}
policies:
  - {id: tokens, quota: {max: 10000, renewal: 1m}, settle: true}
keys:
  - {key: k-tok, policies: [tokens]}
apis:
  - id: llm
    listen_path: /llm/
    target: "%s"
    auth: api_key
    settle_header: X-Usage-Tokens
    endpoints:
      - {path: /, cost: 100}
`, srv.Addr, up.URL)))
	usages := []string{"1000", "10", ""}
	var sum, admitted atomic.Int64
	var wg sync.WaitGroup
	c := &http.Client{}
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				u := usages[(g+i)%3]
				r, err := fetch(c, gw.base+"/llm/complete?u="+u, "X-API-Key", "k-tok")
				if err != nil {
					t.Error(err)
					return
				}
				switch r.status {
				case 200:
					admitted.Add(1)
					if n, err := strconv.ParseInt(u, 10, 64); err == nil {
						sum.Add(n)
					} else {
						sum.Add(100)
					}
				case 429:
				default:
					t.Errorf("status %d %q", r.status, r.body)
				}
			}
		}()
	}
	wg.Wait()
	key := redisKey("limitplane:", keyConsumer("k-tok"), "quota")
	var used int64
	for deadline := time.Now().Add(5 * time.Second); ; { // the last settles run after their responses
		used, _ = rc.HGet(context.Background(), key, "used").Int64()
		if used == sum.Load() || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used != sum.Load() {
		t.Fatalf("quota count %d, want the sum of actual costs %d (%d admitted)", used, sum.Load(), admitted.Load())
	}
	r := get(t, c, gw.base+"/llm/complete?u=1000", "X-API-Key", "k-tok")
	if used > 10_000-100 {
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		if r.status != 429 || ra < 50 || ra > 60 {
			t.Fatalf("over budget: %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
		}
	}
	t.Logf("%d admitted; quota count %d = sum of actual costs; then %d with Retry-After %s", admitted.Load(), used, r.status, r.header.Get("Retry-After"))
}
