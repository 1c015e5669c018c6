package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
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

// TestStoreFailuresCountedAndLogged: a gateway on a real redis-server,
// failure_policy open, Redis killed, 200 requests: every failure reaches
// Options.OnStoreError (store_errors_total counts 200), and the log has
// one line for the first failure and, at Close, one for the other 199
// (the interval's timer never fires here), instead of 200 lines.
func TestStoreFailuresCountedAndLogged(t *testing.T) {
	srv := redistest.Start(t)
	log, out := textLog()
	timers := &failurelog.ManualTimers{}
	store, closeStore, err := OpenStore(context.Background(), StoreOptions{
		URL: "redis://" + srv.Addr, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	col := metrics.New(metrics.Options{})
	g, err := New(Options{Store: store, OnStoreError: col.ObserveStoreError, Logger: log, Seams: &seams.Seams{AfterFunc: timers.After}})
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
	hs := ServeTest(t, g)
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

// TestRedisLoggerSentinelNews: go-redis's Sentinel lines that tell what it
// found (the master it selected, a failover, a new sentinel) are INFO, not
// failures; its Sentinel failures are counted as any other. The lines are
// go-redis v9's own formats (sentinel.go). A trial saw "redis client
// failed" at every healthy start on a Sentinel URL.
func TestRedisLoggerSentinelNews(t *testing.T) {
	log, out := textLog()
	timers := &failurelog.ManualTimers{}
	r := NewRedisLogger(log, timers.After)
	ctx := context.Background()
	r.Printf(ctx, "sentinel: selected addr=%s masterAddr=%s", "127.0.0.1:26391", "127.0.0.1:16391")
	r.Printf(ctx, "sentinel: new master=%q addr=%q", "mymaster", "127.0.0.1:16392")
	r.Printf(ctx, "sentinel: discovered new sentinel=%q for master=%q", "x", "mymaster")
	r.Printf(ctx, "sentinel: ignore addr for master=%q", "other")
	r.Printf(ctx, "sentinel: GetMasterAddrByName name=%q failed: %s", "mymaster", "dial tcp: connection refused")
	r.Close()
	want := `level=INFO msg="redis sentinel" news="sentinel: selected addr=127.0.0.1:26391 masterAddr=127.0.0.1:16391" component=go-redis` + "\n" +
		`level=INFO msg="redis sentinel" news="sentinel: new master=\"mymaster\" addr=\"127.0.0.1:16392\"" component=go-redis` + "\n" +
		`level=INFO msg="redis sentinel" news="sentinel: discovered new sentinel=\"x\" for master=\"mymaster\"" component=go-redis` + "\n" +
		`level=INFO msg="redis sentinel" news="sentinel: ignore addr for master=\"other\"" component=go-redis` + "\n" +
		`level=WARN msg="redis client failed" err="sentinel: GetMasterAddrByName name=\"mymaster\" failed: dial tcp: connection refused" failures=1 total=1 component=go-redis` + "\n"
	if out.String() != want {
		t.Fatalf("log:\n%s\nwant\n%s", out, want)
	}
}
