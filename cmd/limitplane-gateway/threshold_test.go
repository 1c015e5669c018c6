package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/threshold"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestThresholdEventsAcrossRestart runs the built gateway on a
// redis-server with a threshold webhook, a real HTTP receiver that
// answers 500 to its first two attempts: key k1 spends 5 of its quota of
// 10 (50 %) on one gateway process, which is then killed with SIGKILL; a
// new process on the same Redis spends the rest and 2 more (refused).
// The receiver gets exactly one event for 50 % and one for 100 %, each
// signed, and the two gateways together exactly 10 admitted.
func TestThresholdEventsAcrossRestart(t *testing.T) {
	secret := "webhook-secret-0123456789abcdef-0123"
	t.Setenv("LP_TEST_WEBHOOK_SECRET", secret)
	var mu sync.Mutex
	attempts := 0
	var got []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts <= 2 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var e threshold.Event
		if r.Header.Get(threshold.SignatureHeader) != threshold.Sign([]byte(secret), body) || json.Unmarshal(body, &e) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		got = append(got, fmt.Sprintf("%s %s %s %d%% used=%d/%d", e.Consumer, e.API, e.Policy, e.Threshold, e.Used, e.Quota))
	}))
	defer rcv.Close()
	srv := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: 127.0.0.1:0
store: redis://%s/0
redis: {timeout: 10s}
threshold_webhook: {url: %q, secret_env: LP_TEST_WEBHOOK_SECRET}
policies:
  - id: q
    quota: {max: 10, renewal: 1h}
    thresholds: [50, 100]
keys:
  - key: k1
    policies: [q]
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
`, srv.Addr, rcv.URL))
	bin := buildGateway(t)
	run := func() (*exec.Cmd, string, chan error) {
		cmd := exec.Command(bin, "-config", cfg)
		out, errs := newOutput(), newLogWatch()
		cmd.Stdout, cmd.Stderr = out, errs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		select {
		case base := <-out.addr:
			return cmd, base, exited
		case err := <-exited:
			t.Fatalf("exited before listening: %v\nstderr: %s", err, errs)
		case <-time.After(30 * time.Second):
			t.Fatalf("no banner within 30s; stderr: %s", errs)
		}
		return nil, "", nil
	}
	admitted := 0
	spend := func(base string, n int) {
		for range n {
			if get(t, nil, base+"/echo/x", "X-API-Key", "k1").status == 200 {
				admitted++
			}
		}
	}
	events := func() ([]string, int) {
		mu.Lock()
		defer mu.Unlock()
		out := append([]string(nil), got...)
		sort.Strings(out)
		return out, attempts
	}
	wait := func(n int) {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if g, _ := events(); len(g) >= n {
				return
			}
		}
		g, a := events()
		t.Fatalf("waited for %d events: %q after %d attempts", n, g, a)
	}

	cmd1, base1, exited1 := run()
	spend(base1, 5)
	wait(1) // delivered on the third attempt, after two 500s
	cmd1.Process.Kill()
	<-exited1
	_, base2, _ := run()
	spend(base2, 7)
	wait(2)
	time.Sleep(500 * time.Millisecond) // nothing more comes
	consumer := keyConsumer("k1")
	want := []string{consumer + " echo q 100% used=10/10", consumer + " echo q 50% used=5/10"}
	g, a := events()
	if fmt.Sprint(g) != fmt.Sprint(want) || a != 4 || admitted != 10 {
		t.Fatalf("events %q in %d attempts, %d admitted; want %q in 4, 10 admitted", g, a, admitted, want)
	}
}
