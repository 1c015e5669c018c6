package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway/server"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestControlPlaneRunsQuotaRunner: a gateway with a control_plane section
// and a Redis store runs the data plane's global-quota runner (elected:
// its lease is in Redis), and Close stops it (the lease is given up).
func TestControlPlaneRunsQuotaRunner(t *testing.T) {
	cpAddr := deadAddr(t)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	rs := redistest.Start(t)
	client := rs.Client(t, nil)
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, file, fmt.Sprintf(`store: redis://%s
listen: 127.0.0.1:0
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
`, rs.Addr, cpAddr))
	srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(slog.DiscardHandler), StartTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	key := redisstore.DefaultKeyPrefix + "{gq}:lease"
	deadline := time.Now().Add(20 * time.Second)
	for client.Exists(context.Background(), key).Val() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the quota runner was not elected")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if client.Exists(context.Background(), key).Val() != 0 {
		t.Fatal("the runner's lease is still in Redis after Close")
	}
}

// TestControlPlaneMemoryStoreNotes: a gateway that follows a control plane
// with the in-process store cannot spend a global quota's leases (they live
// in the data plane's Redis), and says so in an info line at start.
func TestControlPlaneMemoryStoreNotes(t *testing.T) {
	cpAddr := deadAddr(t)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, file, fmt.Sprintf(`listen: 127.0.0.1:0
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
`, cpAddr))
	var log strings.Builder
	var mu sync.Mutex
	h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return log.Write(p) }), nil)
	srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(h), StartTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	const want = `level=INFO msg="should the control plane mark a quota global: with the in-process store this gateway counts it as its own quota (global quotas need a Redis store)" store=memory`
	if !strings.Contains(log.String(), want) {
		t.Fatalf("log lacks\n%s\ngot:\n%s", want, log.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestThresholdsWithoutWebhookWarn: policies with thresholds and no
// threshold_webhook section start, and the log says, once, that no events
// are sent and for which policies.
func TestThresholdsWithoutWebhookWarn(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, file, `listen: 127.0.0.1:0
policies:
  - {id: gold, quota: {max: 10, renewal: 1h}, thresholds: [80, 100]}
  - {id: silver, quota: {max: 5, renewal: 1h}}
  - {id: bronze, quota: {max: 2, renewal: 1h}, thresholds: [50]}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo", auth: keyless, policies: [gold]}
`)
	var log strings.Builder
	srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	const want = `level=WARN msg="policies name thresholds but there is no threshold_webhook section: no threshold events are sent" policies="[gold bronze]"`
	if got := strings.Count(log.String(), "threshold_webhook"); got != 1 || !strings.Contains(log.String(), want) {
		t.Fatalf("log (%d lines naming threshold_webhook) lacks\n%s\ngot:\n%s", got, want, log.String())
	}
}

// TestSettleWithoutHeaderWarns: settling policies and no API naming a
// settle_header start, and the log says once that every request keeps its
// estimate, naming the policies; an API that names one silences it.
func TestSettleWithoutHeaderWarns(t *testing.T) {
	const want = `level=WARN msg="policies settle but no API names a settle_header: every request keeps its estimate" policies="[tokens bytes]"`
	for _, header := range []string{"", ", settle_header: X-Usage-Tokens"} {
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, `listen: 127.0.0.1:0
policies:
  - {id: tokens, quota: {max: 10000, renewal: 1m}, settle: true}
  - {id: plain, quota: {max: 5, renewal: 1h}}
  - {id: bytes, quota: {max: 100, renewal: 1h}, settle: true}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo", auth: keyless, policies: [tokens]`+header+`}
`)
		var log strings.Builder
		srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if got, warned := strings.Count(log.String(), "settle_header"), header == ""; got != map[bool]int{true: 1, false: 0}[warned] || warned != strings.Contains(log.String(), want) {
			t.Fatalf("settle_header %q: log (%d lines naming settle_header) should warn: %v, with\n%s\ngot:\n%s", header, got, warned, want, log.String())
		}
	}
}
