package nethttp_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

type fixture struct {
	srv   *httptest.Server
	store *memory.Store
}

func newFixture(t *testing.T, p core.Policy) *fixture {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{p}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{p.ID}}})
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(eng, identity.NewAPIKey(keys, identity.APIKeyOptions{}), nethttp.Options{API: "echo"})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, store: store}
}

func (f *fixture) get(t *testing.T, key string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+"/x", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestMiddlewareConcurrentExact(t *testing.T) {
	f := newFixture(t, core.Policy{ID: "default", Rate: core.Limit{Rate: 100, Period: 10 * time.Second}})
	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				req, _ := http.NewRequest("GET", f.srv.URL+"/x", nil)
				req.Header.Set("X-API-Key", "k1")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 100 || limited.Load() != 400 {
		t.Fatalf("200s: %d, 429s: %d; want 100 and 400", ok.Load(), limited.Load())
	}
	resp, body := f.get(t, "k1")
	want := map[string]string{
		"Ratelimit-Policy": `"default";q=100;w=10`,
		"Ratelimit":        `"default";r=0;t=1`,
		"Retry-After":      "1",
		"Content-Type":     "application/json",
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if resp.StatusCode != 429 || body != `{"error":"rate limit exceeded","retry_after_ms":100}`+"\n" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

func TestMiddlewareAuthFailuresCreateNoState(t *testing.T) {
	f := newFixture(t, core.Policy{ID: "default", Rate: core.PerSecond(5)})
	resp, body := f.get(t, "")
	if resp.StatusCode != 401 || body != `{"error":"no API key"}`+"\n" || resp.Header.Get("Ratelimit") != "" {
		t.Fatalf("missing key: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = f.get(t, "not-a-key")
	if resp.StatusCode != 403 || body != `{"error":"unknown API key"}`+"\n" {
		t.Fatalf("unknown key: %d %q", resp.StatusCode, body)
	}
	if n := f.store.Len(); n != 0 {
		t.Fatalf("failed authentication created %d limiter entries", n)
	}
	resp, body = f.get(t, "k1")
	if resp.StatusCode != 200 || body != "ok" || resp.Header.Get("Ratelimit") != `"default";r=4;t=1` {
		t.Fatalf("valid key: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if n := f.store.Len(); n != 1 {
		t.Fatalf("store holds %d entries, want 1", n)
	}
}

// keylessHandler is a handler answering "ok" behind the middleware on a
// keyless API whose clients may make 3 requests an hour each, with opts'
// renderer.
func keylessHandler(t *testing.T, o response.Options) http.Handler {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "ip", Rate: core.Limit{Rate: 3, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mw := nethttp.Middleware(eng, &identity.Keyless{Policies: []string{"ip"}}, nethttp.Options{Renderer: response.NewRenderer(o)})
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
}

// Clients answered at once, each consumer and answer rendered into memory
// the next request reuses, are counted apart and get exactly their fields
// (which the header map keeps) and bodies; with the X-RateLimit fields too.
func TestKeylessClientsConcurrently(t *testing.T) {
	for _, x := range []bool{false, true} {
		h := keylessHandler(t, response.Options{XRateLimit: x, XRateLimitReset: response.ResetSeconds})
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := httptest.NewRequest("GET", "/", nil)
				r.RemoteAddr = fmt.Sprintf("10.0.0.%d:4000", g)
				var ws []*httptest.ResponseRecorder
				for range 4 {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					ws = append(ws, w)
				}
				for i, w := range ws { // read after later requests reused the scratch
					got := fmt.Sprintf("%d %s|%s|%s|%s|%s|%s", w.Code, w.Header().Get("Ratelimit-Policy"), w.Header().Get("Ratelimit"),
						w.Header().Get("Retry-After"), w.Header().Get("X-Ratelimit-Remaining"), w.Header().Get("X-Ratelimit-Reset"), w.Body.String())
					want := fmt.Sprintf(`200 "ip";q=3;w=3600|"ip";r=%d;t=%d||||ok`, 2-i, 1200*(i+1))
					if x {
						want = fmt.Sprintf(`200 "ip";q=3;w=3600|"ip";r=%d;t=%d||%d|%d|ok`, 2-i, 1200*(i+1), 2-i, 1200*(i+1))
					}
					if i == 3 {
						want = `429 "ip";q=3;w=3600|"ip";r=0;t=1200|1200|||{"error":"rate limit exceeded","retry_after_ms":1200000}` + "\n"
						if x {
							want = `429 "ip";q=3;w=3600|"ip";r=0;t=1200|1200|0|3600|{"error":"rate limit exceeded","retry_after_ms":1200000}` + "\n"
						}
					}
					if got != want {
						t.Errorf("X-RateLimit %v, client %d, request %d: %s, want %s", x, g, i+1, got, want)
					}
				}
			}()
		}
		wg.Wait()
	}
}

// reusedWriter is a ResponseWriter whose header map is cleared, not
// remade, between requests, so that only the middleware's allocations
// are counted.
type reusedWriter struct{ h http.Header }

func (w *reusedWriter) Header() http.Header         { return w.h }
func (w *reusedWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *reusedWriter) WriteHeader(int)             {}

// The middleware allocates once per request on a keyless API (the header
// values the map keeps), admitted or denied.
func TestKeylessAllocations(t *testing.T) {
	h := keylessHandler(t, response.Options{})
	for _, tc := range []struct {
		name   string
		before int
	}{{"admitted", 0}, {"denied", 3}} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = fmt.Sprintf("10.1.0.%d:4000", tc.before)
		w := &reusedWriter{h: http.Header{}}
		for range tc.before + 1 {
			h.ServeHTTP(w, r)
		}
		n := testing.AllocsPerRun(200, func() {
			clear(w.h)
			h.ServeHTTP(w, r)
		})
		if n != 1 {
			t.Errorf("%s: %v allocations per request, want 1", tc.name, n)
		}
	}
}

// TestKeylessOnUnixSocket: a service served on a Unix socket has no client
// address to limit a keyless API by: every request is answered 500 with
// the reason, and the handler is not called (a 401 told the client to fix
// credentials it did not have).
func TestKeylessOnUnixSocket(t *testing.T) {
	client := serveUnix(t, keylessHandler(t, response.Options{}))
	for _, xff := range []string{"", "192.0.2.1"} { // the header is not trusted
		resp, body := getVia(t, client, xff)
		if resp.StatusCode != 500 || body != "{\"error\":\"no client address\"}\n" || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("X-Forwarded-For %q: %d %s %v; want 500 {\"error\":\"no client address\"}", xff, resp.StatusCode, body, resp.Header)
		}
	}
}

// TestKeylessBehindUnixSocketProxy: with ClientIPOptions.TrustUnixPeers,
// a service on a Unix socket reads the client from the X-Forwarded-For
// its proxy writes: each client its own 3 an hour, exactly; a request
// without the header still has no client (500).
func TestKeylessBehindUnixSocketProxy(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "ip", Rate: core.Limit{Rate: 3, Period: time.Hour}}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cip, err := identity.NewClientIP(identity.ClientIPOptions{TrustUnixPeers: true})
	if err != nil {
		t.Fatal(err)
	}
	mw := nethttp.Middleware(eng, &identity.Keyless{Policies: []string{"ip"}, ClientIP: cip}, nethttp.Options{})
	client := serveUnix(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	for _, xff := range []string{"192.0.2.1", "203.0.113.9, 192.0.2.2", "192.0.2.1", "192.0.2.2", "192.0.2.1", "192.0.2.2"} {
		if resp, body := getVia(t, client, xff); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("client %q: %d %s", xff, resp.StatusCode, body)
		}
	}
	for _, xff := range []string{"192.0.2.1", "192.0.2.2"} {
		if resp, _ := getVia(t, client, xff); resp.StatusCode != 429 {
			t.Fatalf("client %s, 4th request: %d, want 429", xff, resp.StatusCode)
		}
	}
	if resp, _ := getVia(t, client, "192.0.2.3"); resp.StatusCode != 200 {
		t.Fatalf("a third client: %d", resp.StatusCode)
	}
	if resp, body := getVia(t, client, ""); resp.StatusCode != 500 || body != "{\"error\":\"no client address\"}\n" {
		t.Fatalf("no X-Forwarded-For: %d %s", resp.StatusCode, body)
	}
	if n := store.Len(); n != 3 {
		t.Fatalf("store holds %d keys, want 3", n)
	}
}

// serveUnix serves h on a Unix socket until the test ends, and returns a
// client that dials it.
func serveUnix(t *testing.T, h http.Handler) *http.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "svc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(client.CloseIdleConnections)
	return client
}

// getVia sends GET /x through client with X-Forwarded-For xff ("": none).
func getVia(t *testing.T, client *http.Client, xff string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://svc/x", nil)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}
