package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
)

// slowUpstream is an upstream that counts the requests inside it and the
// most at once: /hold waits until open is closed or the request ends,
// /fast answers at once, /drop waits 200ms and then drops the connection
// (an upstream that times out), /panic panics (net/http drops the
// connection too).
type slowUpstream struct {
	*httptest.Server
	in, most atomic.Int64
	mu       sync.Mutex
	open     chan struct{}
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{open: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.in.Add(1)
		defer u.in.Add(-1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		switch r.URL.Path {
		case "/hold":
			select {
			case <-u.gate():
			case <-r.Context().Done():
				return
			}
		case "/drop":
			time.Sleep(200 * time.Millisecond)
			panic(http.ErrAbortHandler)
		case "/panic":
			panic("upstream handler panic")
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(func() { u.release(); u.Close() })
	return u
}

func (u *slowUpstream) gate() chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.open
}

// release lets the held requests finish; reopen makes later ones wait.
func (u *slowUpstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.open:
	default:
		close(u.open)
	}
}

func (u *slowUpstream) reopen() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.open = make(chan struct{})
}

// waitIn waits until n requests are inside the upstream.
func (u *slowUpstream) waitIn(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for u.in.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in the upstream, want %d", u.in.Load(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

const inFlightBody = `{"error":"too many concurrent requests"}` + "\n"

func inFlightConfig(store, extra, upstream string) string {
	return fmt.Sprintf(`store: %s
%spolicies:
  - {id: conc, rate: {requests: 100000, per: 1s}, in_flight: 5}
keys:
  - {key: k-conc, policies: [conc]}
apis:
  - {id: slow, listen_path: /slow/, target: "%s", auth: api_key}
`, store, extra, upstream)
}

// burst sends n concurrent requests to url with ctx and returns how many
// were admitted (200) and refused (429, checked to be the in-flight
// refusal: its body, no Retry-After, no rate-limit fields); other
// answers and transport errors are counted in other.
func burst(t *testing.T, ctx context.Context, url string, n int, wait bool) (ok, refused, other *atomic.Int64, wg *sync.WaitGroup) {
	ok, refused, other, wg = new(atomic.Int64), new(atomic.Int64), new(atomic.Int64), new(sync.WaitGroup)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			req.Header.Set("X-API-Key", "k-conc")
			resp, err := c.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				refused.Add(1)
				if string(b) != inFlightBody || resp.Header.Get("Retry-After") != "" || resp.Header.Get("RateLimit") != "" {
					t.Errorf("refusal: %q %v", b, resp.Header)
				}
			default:
				other.Add(1)
			}
		}()
	}
	if wait {
		wg.Wait()
	}
	return ok, refused, other, wg
}

// waitCount waits until c reaches n.
func waitCount(t *testing.T, c *atomic.Int64, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, c.Load(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkFive checks that exactly five slots are free: 50 concurrent held
// requests get 5 into the upstream and 45 refusals while held, and the 5
// answer 200 once released.
func checkFive(t *testing.T, u *slowUpstream, url string) {
	t.Helper()
	u.reopen()
	ok, refused, other, wg := burst(t, context.Background(), url, 50, false)
	waitCount(t, refused, 45, "refused while 5 are held")
	u.waitIn(t, 5)
	if refused.Load() != 45 || u.in.Load() != 5 {
		t.Fatalf("while held: refused %d, in the upstream %d; want 45, 5", refused.Load(), u.in.Load())
	}
	u.release()
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 45 || other.Load() != 0 {
		t.Fatalf("admitted %d, refused %d, other %d; want 5, 45, 0", ok.Load(), refused.Load(), other.Load())
	}
}

// TestInFlightGateway: cap 5 through the gateway (memory store): 50
// concurrent slow requests of one key: never more than 5 in the upstream,
// exactly 5 admitted while all are held, 45 refused with 429 and the
// in-flight body; the slots come back after upstream panics, cancelled
// clients and an upstream that times out (drops the connection).
func TestInFlightGateway(t *testing.T) {
	u := newSlowUpstream(t)
	gw := start(t, env{}, "-config", writeConfig(t, inFlightConfig("memory", "", u.URL)))
	checkFive(t, u, gw.base+"/slow/hold")

	t.Run("upstream panics", func(t *testing.T) {
		for i := 0; i < 3; i++ { // 15 panics, 5 at once: more than the cap
			_, _, other, _ := burst(t, context.Background(), gw.base+"/slow/panic", 5, true)
			if other.Load() != 5 {
				t.Fatalf("%d of 5 answered other than 200/429", other.Load())
			}
		}
		checkFive(t, u, gw.base+"/slow/hold")
	})
	t.Run("cancelled clients", func(t *testing.T) {
		u.reopen()
		ctx, cancel := context.WithCancel(context.Background())
		_, _, other, wg := burst(t, ctx, gw.base+"/slow/hold", 5, false)
		u.waitIn(t, 5)
		if _, refused, _, _ := burst(t, context.Background(), gw.base+"/slow/fast", 1, true); refused.Load() != 1 {
			t.Fatal("a sixth request was not refused")
		}
		cancel()
		wg.Wait()
		if other.Load() != 5 {
			t.Fatalf("%d of 5 cancelled", other.Load())
		}
		if *engine == "fasthttp" {
			// README, "The fasthttp engine": a client that goes away
			// does not cancel the upstream call, so the five calls run
			// on and hold their slots until the upstream answers.
			time.Sleep(200 * time.Millisecond)
			if n := u.in.Load(); n != 5 {
				t.Fatalf("fasthttp: %d calls in the upstream after the clients left, want 5", n)
			}
			if _, refused, _, _ := burst(t, context.Background(), gw.base+"/slow/fast", 1, true); refused.Load() != 1 {
				t.Fatal("fasthttp: a request was admitted while the five calls hold the slots")
			}
			u.release()
		}
		u.waitIn(t, 0)
		checkFive(t, u, gw.base+"/slow/hold")
	})
	t.Run("upstream timeout", func(t *testing.T) {
		_, _, other, _ := burst(t, context.Background(), gw.base+"/slow/drop", 5, true)
		if other.Load() != 5 {
			t.Fatalf("%d of 5 answered other than 200/429", other.Load())
		}
		checkFive(t, u, gw.base+"/slow/hold")
	})
	if m := u.most.Load(); m != 5 {
		t.Fatalf("most requests in the upstream at once: %d, want 5", m)
	}
}

// TestInFlightRedisGatewayKilled: two gateway processes share one
// redis-server with a 2s lease. Gateway A holds 5 slots; 50 requests
// through B are all refused; A is killed with SIGKILL: its slots come back
// within the lease (and not before its leases could lapse), after which
// exactly 5 pass through B; never more than 5 in the upstream.
func TestInFlightRedisGatewayKilled(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	u := newSlowUpstream(t)
	const lease = 2 * time.Second
	cfg := writeConfig(t, inFlightConfig("redis://"+srv.Addr+"/0", "redis: {timeout: 10s, in_flight_lease: 2s}\n", u.URL))
	a, _, _, baseA := startProcess(t, "-config", cfg)
	_, _, _, baseB := startProcess(t, "-config", cfg)

	_, _, _, _ = burst(t, context.Background(), baseA+"/slow/hold", 5, false)
	u.waitIn(t, 5)
	slots := redisKey("limitplane:", keyConsumer("k-conc"), "inflight")
	if n := rc.ZCard(context.Background(), slots).Val(); n != 5 {
		t.Fatalf("%d slots in Redis, want 5", n)
	}
	time.Sleep(lease) // A renews its leases meanwhile
	_, refused, _, _ := burst(t, context.Background(), baseB+"/slow/hold", 50, true)
	if refused.Load() != 50 {
		t.Fatalf("B refused %d of 50 while A held 5", refused.Load())
	}

	if err := a.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	killed := time.Now()
	a.Wait()
	u.waitIn(t, 0) // A's connections to the upstream died with it
	c := &http.Client{}
	var back time.Duration
	for {
		req, _ := http.NewRequest("GET", baseB+"/slow/fast", nil)
		req.Header.Set("X-API-Key", "k-conc")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			back = time.Since(killed)
			break
		}
		if time.Since(killed) > lease+time.Second {
			t.Fatalf("slots still held %v after SIGKILL (lease %v)", time.Since(killed), lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a killed gateway's slots came back %v after SIGKILL (lease %v, renewed every %v)", back, lease, lease/3)
	if back > lease+100*time.Millisecond || back < lease-lease/3-100*time.Millisecond {
		t.Fatalf("slots came back after %v; want within (%v, %v]", back, lease-lease/3, lease)
	}
	checkFive(t, u, baseB+"/slow/hold")
	if n := rc.ZCard(context.Background(), slots).Val(); n != 0 {
		t.Fatalf("%d slots left in Redis", n)
	}
	if m := u.most.Load(); m != 5 {
		t.Fatalf("most requests in the upstream at once: %d, want 5", m)
	}
}

// TestInFlightEndpointGateway: an in-flight cap of 5 set by an endpoint's
// policy (GET /hold of the API) through the gateway: 50 concurrent held
// requests there get 5 into the upstream and 45 refusals; while those 5
// hold their slots, requests to another path of the API are not capped.
func TestInFlightEndpointGateway(t *testing.T) {
	u := newSlowUpstream(t)
	gw := start(t, env{}, "-config", writeConfig(t, fmt.Sprintf(`store: memory
policies:
  - {id: plain, rate: {requests: 100000, per: 1s}}
  - {id: reports, in_flight: 5}
keys:
  - {key: k-conc, policies: [plain]}
apis:
  - id: slow
    listen_path: /slow/
    target: "%s"
    auth: api_key
    endpoints:
      - {method: GET, path: /hold, policies: [reports]}
`, u.URL)))
	checkFive(t, u, gw.base+"/slow/hold")

	u.reopen()
	ok, refused, other, wg := burst(t, context.Background(), gw.base+"/slow/hold", 5, false)
	u.waitIn(t, 5)
	fastOK, fastRefused, fastOther, _ := burst(t, context.Background(), gw.base+"/slow/fast", 20, true)
	if fastOK.Load() != 20 || fastRefused.Load() != 0 || fastOther.Load() != 0 {
		t.Fatalf("/fast while /hold holds 5: admitted %d, refused %d, other %d; want 20, 0, 0", fastOK.Load(), fastRefused.Load(), fastOther.Load())
	}
	u.release()
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 0 || other.Load() != 0 {
		t.Fatalf("/hold: admitted %d, refused %d, other %d; want 5, 0, 0", ok.Load(), refused.Load(), other.Load())
	}
}
