package main

import (
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/redistest"
)

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
	if maxLines := 2 + int(outage/gateway.StoreFailureLogInterval); len(lines) > maxLines {
		t.Errorf("%d store failure lines, want at most %d:\n%s", len(lines), maxLines, strings.Join(lines, "\n"))
	}
	if n, max := strings.Count(stderr.String(), `msg="redis client failed"`), 2+int(outage/gateway.StoreFailureLogInterval); n > max {
		t.Errorf("%d go-redis lines, want at most %d", n, max)
	}
	// The breaker: one line when it opens, one when it closes, however
	// many trials it made in between.
	if n := strings.Count(stderr.String(), `msg="redis circuit breaker`); n != 2 {
		t.Errorf("%d circuit breaker lines, want 2 (opened, closed)", n)
	}
	if n := strings.Count(stderr.String(), "\n"); n > 40 {
		t.Errorf("%d lines on stderr, want a few dozen at most", n)
	}
}
