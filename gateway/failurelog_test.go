package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/metrics"
	"github.com/limitplane/limitplane/spec"
)

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// manualTimers is an afterFunc whose calls fire only when the test says.
type manualTimers struct {
	mu      sync.Mutex
	pending []func()
	delays  []time.Duration
}

func (m *manualTimers) after(d time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := len(m.pending)
	m.pending, m.delays = append(m.pending, f), append(m.delays, d)
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		stopped := m.pending[i] != nil
		m.pending[i] = nil
		return stopped
	}
}

// fire runs the timer functions scheduled and not stopped, and returns
// how many it ran.
func (m *manualTimers) fire() int {
	m.mu.Lock()
	fs := m.pending
	m.pending = make([]func(), len(fs)) // keep indexes for stop
	m.mu.Unlock()
	n := 0
	for _, f := range fs {
		if f != nil {
			f()
			n++
		}
	}
	return n
}

// textLog returns a logger writing slog's text lines without time to a
// buffer.
func textLog() (*slog.Logger, *syncBuffer) {
	out := new(syncBuffer)
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})), out
}

// TestFailureLog drives the store-failure log with manual timers: 100
// failures in one interval write the first at once and one line for the
// other 99 when the interval ends; an interval without failures ends the
// run, so the next failure is logged at once; Close writes what is
// pending and nothing is written after it.
func TestFailureLog(t *testing.T) {
	log, out := textLog()
	timers := &manualTimers{}
	f := newFailureLog(log, failureLogOptions{Msg: "limit store failed", Interval: 5 * time.Second, AfterFunc: timers.after})
	for i := range 100 {
		f.Failed(fmt.Errorf("dial: refused %d", i))
	}
	want := `level=WARN msg="limit store failed" err="dial: refused 0" failures=1 total=1` + "\n"
	if out.String() != want {
		t.Fatalf("after 100 failures:\n%s\nwant\n%s", out, want)
	}
	if n := timers.fire(); n != 1 || timers.delays[0] != 5*time.Second {
		t.Fatalf("%d timers fired, delays %v; want 1 of 5s", n, timers.delays)
	}
	want += `level=WARN msg="limit store failed" err="dial: refused 99" failures=99 total=100` + "\n"
	if out.String() != want {
		t.Fatalf("at the interval's end:\n%s\nwant\n%s", out, want)
	}
	// A quiet interval: no line, and the next failure is logged at once.
	if n := timers.fire(); n != 1 || out.String() != want {
		t.Fatalf("quiet interval: %d timers fired, output:\n%s", n, out)
	}
	if n := timers.fire(); n != 0 {
		t.Fatalf("%d timers after a quiet interval, want none", n)
	}
	f.Failed(errors.New("timeout"))
	f.Failed(errors.New("breaker open"))
	f.Failed(errors.New("breaker open"))
	want += `level=WARN msg="limit store failed" err=timeout failures=1 total=101` + "\n"
	if out.String() != want {
		t.Fatalf("after a quiet interval:\n%s\nwant\n%s", out, want)
	}
	f.Close()
	want += `level=WARN msg="limit store failed" err="breaker open" failures=2 total=103` + "\n"
	if out.String() != want {
		t.Fatalf("after Close:\n%s\nwant\n%s", out, want)
	}
	f.Failed(errors.New("late"))
	if n := timers.fire(); n != 0 || out.String() != want || f.Total() != 104 {
		t.Fatalf("after Close: %d timers fired, total %d, output:\n%s", n, f.Total(), out)
	}
}

// TestStoreFailuresCountedAndLogged: a gateway on a real redis-server,
// failure_policy open, Redis killed, 200 requests: every failure reaches
// Options.OnStoreError (store_errors_total counts 200), and the log has
// one line for the first failure and, at Close, one for the other 199
// (the interval's timer never fires here), instead of 200 lines.
func TestStoreFailuresCountedAndLogged(t *testing.T) {
	srv := redistest.Start(t)
	log, out := textLog()
	timers := &manualTimers{}
	store, closeStore, err := OpenStore(context.Background(), StoreOptions{
		URL: "redis://" + srv.Addr, Logger: log, AfterFunc: timers.after,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	col := metrics.New(metrics.Options{})
	g, err := New(Options{Store: store, OnStoreError: col.ObserveStoreError, Logger: log, AfterFunc: timers.after})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	snap := &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 3, Per: spec.Duration(time.Minute)}}},
		Keys:     []spec.Key{{KeyHash: identityHash("a"), Policies: []string{"p"}}},
		APIs:     []spec.API{{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho}},
	}
	if err := g.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(g)
	defer hs.Close()
	srv.Kill()
	for i := range 200 {
		req, _ := http.NewRequest("GET", hs.URL+"/echo/", nil)
		req.Header.Set("X-API-Key", "a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("request %d: %d RateLimit %q, want 200 without rate-limit fields (fail open)", i, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP limitplane_store_errors_total Store calls that failed (unreachable, timed out, circuit breaker open), whatever the failure policy then decided.
# TYPE limitplane_store_errors_total counter
limitplane_store_errors_total 200
`), "limitplane_store_errors_total"); err != nil {
		t.Error(err)
	}
	hs.Close()
	g.Close()
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, `msg="limit store failed"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " failures=1 total=1") || !strings.HasSuffix(lines[1], " failures=199 total=200") {
		t.Errorf("store failure lines:\n%s\nwant 2: failures=1 total=1, then failures=199 total=200", strings.Join(lines, "\n"))
	}
}

// identityHash is the key_hash of the API key raw.
func identityHash(raw string) string {
	return identity.HashKey(raw).String()
}
