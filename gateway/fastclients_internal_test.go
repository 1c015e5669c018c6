package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/spec"
)

// The fasthttp engine's upstream clients do not pile up as a control
// plane names new upstreams: of 201 snapshots, each proxying to another
// upstream, exactly one client is held (the running snapshot's) once
// the others are collected, and the entries of collected clients go
// when the next client is made; a client with an idle connection to an
// upstream no snapshot names any more is kept until that connection
// goes (Close closes it); one the running snapshot names again is the
// same client, connections and all.
func TestFastClientsDropUnusedUpstreams(t *testing.T) {
	var mu sync.Mutex
	var closed int
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "up")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			mu.Lock()
			closed++
			mu.Unlock()
		}
	}
	up.Start()
	t.Cleanup(up.Close)

	g := newFastTestGateway(t)
	apply := func(target string) { t.Helper(); applyUpstream(t, g, target) }

	// Upstreams nobody connects to: 127.0.0.1 on ports nothing listens
	// at is fine, no request goes there.
	for i := range 200 {
		apply(fmt.Sprintf("http://127.0.0.2:%d", 20000+i))
	}
	runtime.GC() // the first 199 clients are unreferenced
	apply(up.URL)
	runtime.GC()
	// Making up's client dropped the 199 entries; the 200th client was
	// the running snapshot's until this Apply, and its entry stays until
	// a client is made next.
	if n, m := g.fast.len(), len(g.fast.m); n != 1 || m != 2 {
		t.Fatalf("after 201 upstreams and a collection: %d clients held, %d entries; want 1 and 2", n, m)
	}

	// One request through the fasthttp engine leaves an idle
	// connection to up.
	front := serveFastTest(t, g)
	get := func() { t.Helper(); getBody(t, front.URL+"/a/x", "up") }
	get()
	upKey := "http://" + up.Listener.Addr().String()
	held := g.fast.m[upKey] // weakly: the test must not keep the client

	// Another upstream replaces up: up's client is no snapshot's, yet
	// its idle connection keeps it (fasthttp closes it after
	// MaxIdleConnDuration).
	apply("http://127.0.0.2:19999")
	runtime.GC()
	apply("http://127.0.0.2:19999")
	if n := g.fast.len(); n != 2 {
		t.Fatalf("with up's connection idle: %d clients held; want 2", n)
	}
	// Named again, up gets the same client and its connection.
	apply(up.URL)
	if g.fast.m[upKey] != held || held.Value() == nil {
		t.Fatalf("up named again got a new client")
	}
	get()
	mu.Lock()
	c := closed
	mu.Unlock()
	if c != 0 {
		t.Fatalf("%d upstream connections closed before Close; want 0 (one kept alive)", c)
	}
	g.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		c = closed
		mu.Unlock()
		if c == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c != 1 {
		t.Fatalf("after Close: %d upstream connections closed; want 1", c)
	}
}

// The fasthttp engine proxies to an upstream on an IPv6 address, as the
// net/http engine does (fasthttp's client dials IPv4 only unless told).
func TestFastUpstreamIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatalf("listen on the IPv6 loopback (.ci/run enables it): %v", err)
	}
	up := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "up6")
	})}}
	up.Start()
	t.Cleanup(up.Close)
	g := newFastTestGateway(t)
	applyUpstream(t, g, up.URL)
	getBody(t, serveFastTest(t, g).URL+"/a/x", "up6")
}

// newFastTestGateway returns a gateway on a memory store, closed when the
// test ends (Close may be called before: a second does nothing).
func newFastTestGateway(t *testing.T) *Gateway {
	t.Helper()
	store := memory.New(memory.Options{})
	t.Cleanup(func() { store.Close() })
	g, err := New(Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// applyUpstream applies one keyless API at /a/ proxying to target.
func applyUpstream(t *testing.T, g *Gateway, target string) {
	t.Helper()
	err := g.Apply(context.Background(), &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 1000, Per: spec.Duration(time.Second)}}},
		APIs:     []spec.API{{ID: "a", ListenPath: "/a/", Target: target, Auth: spec.AuthKeyless, Policies: []string{"p"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// getBody GETs url and fails t unless the answer is 200 with body want.
func getBody(t *testing.T, url, want string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != want {
		t.Fatalf("GET %s: %d %q; want 200 %q", url, resp.StatusCode, b, want)
	}
}
