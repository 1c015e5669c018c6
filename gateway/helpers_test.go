package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
)

// epoch is the frozen wall clock of these tests.
var epoch = time.Unix(1_700_000_000, 0)

// testGateway is a gateway over a memory store whose clock is frozen, so
// every count is exact however slowly the test runs, served by a real
// listener.
type testGateway struct {
	gw    *gateway.Gateway
	clock *core.ManualClock
	srv   *gateway.TestServer
	c     *http.Client
}

// newTestGateway starts a gateway with no snapshot. Everything it starts
// is stopped at the end of the test.
func newTestGateway(t *testing.T) *testGateway {
	t.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	t.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{
		Store: store,
		Seams: &seams.Seams{Clock: clock, Now: func() time.Time { return epoch }},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := gateway.ServeTest(t, gw)
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &testGateway{gw: gw, clock: clock, srv: srv, c: &http.Client{Transport: tr}}
}

// apply applies s or fails the test.
func (g *testGateway) apply(t *testing.T, s *spec.Snapshot) {
	t.Helper()
	if err := g.gw.Apply(context.Background(), s); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// answer is one response, read completely.
type answer struct {
	status int
	header http.Header
	body   string
}

// get sends GET path with key (none if "") in X-API-Key; it may be called
// from any goroutine.
func (g *testGateway) get(path, key string) (answer, error) {
	req, err := http.NewRequest(http.MethodGet, g.srv.URL+path, nil)
	if err != nil {
		return answer{}, err
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := g.c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

// mustGet is get from the test's goroutine.
func (g *testGateway) mustGet(t *testing.T, path, key string) answer {
	t.Helper()
	a, err := g.get(path, key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// keyHash is the snapshot form of a plaintext key.
func keyHash(raw string) string { return identity.HashKey(raw).String() }

// upstream is a real HTTP upstream answering 200 "upstream <path>".
func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	return up
}
