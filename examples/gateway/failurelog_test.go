package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/examples/gateway/config"
	"github.com/limitplane/limitplane/internal/redistest"
)

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
func textLog() (*slog.Logger, *output) {
	out := newOutput()
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
// failure_policy open, Redis killed, 200 requests: the store_errors_total
// metric counts 200, and the log has one line for the first failure and,
// at shutdown, one for the other 199 (the interval's timer never fires
// here), instead of 200 lines.
func TestStoreFailuresCountedAndLogged(t *testing.T) {
	srv := redistest.Start(t)
	cfg, err := config.Parse("t.yaml", []byte("store: redis://"+srv.Addr+"\n"+fmt.Sprintf(faultConfig, "open")))
	if err != nil {
		t.Fatal(err)
	}
	log, out := textLog()
	e := frozen()
	timers := &manualTimers{}
	e.afterFunc = timers.after
	g, err := newGateway(context.Background(), cfg, e, log)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(g)
	defer hs.Close()
	srv.Kill()
	for i := range 200 {
		if r := get(t, nil, hs.URL+"/echo/", "X-API-Key", "a"); r.status != 200 || r.header.Get("RateLimit") != "" {
			t.Fatalf("request %d: %d RateLimit %q, want 200 without rate-limit fields (fail open)", i, r.status, r.header.Get("RateLimit"))
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.metrics)
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

// TestRedisOutageLogVolume runs the gateway as a process on a real
// redis-server, failure_policy open, under load from 8 clients in a
// bounded loop on the loopback; Redis is stopped for 3 s and restarted,
// and the load goes on until requests are limited through Redis again.
// Every request decided while Redis was away (answered without rate-limit
// fields) is a store failure: the last "limit store failed" line's total
// counts exactly those, and there are at most a few such lines (the first
// failure, one per 5 s interval, one at shutdown), not one per failure.
func TestRedisOutageLogVolume(t *testing.T) {
	srv := redistest.Start(t)
	cmd, _, stderr, base := startProcess(t, "-config", writeConfig(t, "store: redis://"+srv.Addr+`
failure_policy: open
policies: [{id: p, rate: {requests: 1000000000, per: 1s}}]
keys: [{key: k, policies: [p]}]
apis: [{id: echo, listen_path: /echo/, target: "builtin:echo"}]
`))
	const clients, maxRequests = 8, 2_000_000
	var (
		mu                  sync.Mutex
		requests, unlimited int
		sinceBack           int // limited answers since the last unlimited one
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := fetch(nil, base+"/echo/", "X-API-Key", "k")
				mu.Lock()
				if err != nil || r.status != 200 || requests >= maxRequests {
					mu.Unlock()
					if err != nil || r.status != 200 {
						t.Errorf("status %d, err %v", r.status, err)
					}
					return
				}
				requests++
				if r.header.Get("RateLimit") == "" {
					unlimited, sinceBack = unlimited+1, 0
				} else {
					sinceBack++
				}
				mu.Unlock()
			}
		}()
	}
	count := func() (int, int, int) {
		mu.Lock()
		defer mu.Unlock()
		return requests, unlimited, sinceBack
	}
	// Let the load run on Redis first.
	for n, _, _ := count(); n < 1000; n, _, _ = count() {
		time.Sleep(10 * time.Millisecond)
	}
	srv.Stop()
	down := time.Now()
	time.Sleep(3 * time.Second) // the outage's length, not a synchronisation
	srv.Restart(t)
	// Back on Redis once 1000 answers in a row carried rate-limit fields.
	deadline := time.Now().Add(30 * time.Second)
	for _, _, back := count(); back < 1000; _, _, back = count() {
		if time.Now().After(deadline) {
			t.Fatal("requests not limited through Redis 30s after its restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
	outage := time.Since(down)
	close(stop)
	wg.Wait()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if status := exitStatus(t, cmd); status != 0 {
		t.Fatalf("exit status %d", status)
	}
	requestsSent, failures, _ := count()

	var lines []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, `msg="limit store failed"`) {
			lines = append(lines, l)
		}
	}
	total := "none"
	if len(lines) > 0 {
		_, total, _ = strings.Cut(lines[len(lines)-1], " total=")
	}
	t.Logf("%d requests, %d decided without Redis over %v; last line's total=%s; %d store failure lines, %d go-redis lines, %d stderr lines, %d bytes",
		requestsSent, failures, outage.Round(time.Millisecond), total, len(lines), strings.Count(stderr.String(), `msg="redis client failed"`),
		strings.Count(stderr.String(), "\n"), len(stderr.String()))
	if failures == 0 || total != strconv.Itoa(failures) {
		t.Errorf("last store failure line says total=%s, want %d (every request answered without Redis)", total, failures)
	}
	// One at the start, one per 5s interval while failing, one at shutdown.
	if maxLines := 2 + int(outage/storeFailureLogInterval); len(lines) > maxLines {
		t.Errorf("%d store failure lines, want at most %d:\n%s", len(lines), maxLines, strings.Join(lines, "\n"))
	}
	if n, max := strings.Count(stderr.String(), `msg="redis client failed"`), 2+int(outage/storeFailureLogInterval); n > max {
		t.Errorf("%d go-redis lines, want at most %d", n, max)
	}
	if n := strings.Count(stderr.String(), "\n"); n > 40 {
		t.Errorf("%d lines on stderr, want a few dozen at most", n)
	}
}
