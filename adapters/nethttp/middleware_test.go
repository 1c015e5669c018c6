package nethttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
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
