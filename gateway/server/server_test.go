package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/gateway/server"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
)

// logBuffer is a goroutine-safe log destination.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// deadAddr returns a loopback address nothing listens on (a port just
// freed): a control plane or an upstream that is down.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// writeFile writes s to file whole (renamed into place, so a reload never
// reads half a file).
func writeFile(t *testing.T, file, s string) {
	t.Helper()
	if err := os.WriteFile(file+".tmp", []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}

// serve opens a server with o and serves it until the end of the test,
// which then shuts it down and closes it and fails if Serve did not
// return http.ErrServerClosed.
func serve(t *testing.T, o server.Options) (*server.Server, *logBuffer) {
	t.Helper()
	log := new(logBuffer)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	if o.Seams == nil {
		o.Seams = &seams.Seams{Clock: core.NewManualClock(int64(time.Hour))}
	}
	srv, err := server.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("second Close: %v, want nil", err)
		}
	})
	return srv, log
}

// statuses sends n GETs to url with key as X-API-Key and returns their
// status codes.
func statuses(t *testing.T, url, key string, n int) string {
	t.Helper()
	var got []int
	for range n {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	return fmt.Sprint(got)
}

// quotaConfig: keys k1 (and k2 when extra adds it) with a quota of max
// an hour.
func quotaConfig(max int, extra string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
policies: [{id: p, quota: {max: %d, renewal: 1h}}]
keys:
  - {key: k1, policies: [p]}
%sapis: [{id: echo, listen_path: /echo/, target: "builtin:echo"}]
`, max, extra)
}

// TestReload: Reload applies the file's new policies and keys with the
// counts kept, refuses a file with problems (a config.Errors, one per
// problem, the running configuration stays), logs a changed local setting
// as taking effect at a restart, and refuses without a file.
func TestReload(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(quotaConfig(3, ""), engine))
		srv, log := serve(t, server.Options{ConfigPath: file})
		url := srv.URL() + "/echo/x"
		if got := statuses(t, url, "k1", 2); got != "[200 200]" {
			t.Fatalf("before reload: k1 %s, want [200 200]", got)
		}
		if got := statuses(t, url, "k2", 1); got != "[403]" {
			t.Fatalf("before reload: k2 %s, want [403]", got)
		}

		writeFile(t, file, onEngine(quotaConfig(5, "  - {key: k2, policies: [p]}\n"), engine))
		if err := srv.Reload(t.Context()); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		// The quota rose from 3 to 5 with k1's 2 counted: 3 more, then 429.
		if got := statuses(t, url, "k1", 4); got != "[200 200 200 429]" {
			t.Errorf("after reload: k1 %s, want [200 200 200 429]", got)
		}
		if got := statuses(t, url, "k2", 1); got != "[200]" {
			t.Errorf("after reload: k2 %s, want [200]", got)
		}

		writeFile(t, file, "listen: 127.0.0.1:0\npolicies: [{id: p, rate: {requests: x}}]\nkeys: [{key: k3, policies: [nope]}]\n")
		err := srv.Reload(t.Context())
		var errs config.Errors
		wantErr := file + ":1:1: apis: at least one API is required\n" +
			file + `:2:37: policies[0].rate.requests: want an integer, got "x"` + "\n" +
			file + `:3:29: keys[0].policies[0]: unknown policy "nope"`
		if !errors.As(err, &errs) || len(errs) != 3 || err.Error() != wantErr {
			t.Fatalf("Reload of a bad file: %v, want a config.Errors of 3:\n%s", err, wantErr)
		}
		if got := statuses(t, url, "k2", 1); got != "[200]" {
			t.Errorf("after a refused reload: k2 %s, want [200] (the running configuration stays)", got)
		}

		writeFile(t, file, onEngine(strings.Replace(quotaConfig(5, ""), "listen: 127.0.0.1:0", "listen: 127.0.0.1:1", 1), engine))
		if err := srv.Reload(t.Context()); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		const restart = `level=WARN msg="reload: listen changed in the file; it takes effect only when the gateway restarts" file=`
		if n := strings.Count(log.String(), restart); n != 1 {
			t.Errorf("%d lines %q, want 1:\n%s", n, restart, log)
		}
		if got := statuses(t, url, "k2", 1); got != "[403]" {
			t.Errorf("after the reload that drops k2: k2 %s, want [403]", got)
		}

		cfg, err := config.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		noFile, _ := serve(t, server.Options{Config: cfg})
		const want = "the configuration was not read from a file; there is no file to read again"
		if err := noFile.Reload(t.Context()); err == nil || err.Error() != want {
			t.Errorf("Reload without a file: %v, want %q", err, want)
		}
	})
}

// TestListenOverride: Options.Listen wins over the file's listen, and
// Config reports it; the caller's configuration is not modified.
func TestListenOverride(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		cfg, err := config.Parse("test.yaml", []byte(onEngine(quotaConfig(1, ""), engine)))
		if err != nil {
			t.Fatal(err)
		}
		srv, _ := serve(t, server.Options{Config: cfg, Listen: "127.0.0.2:0"})
		if !strings.HasPrefix(srv.URL(), "http://127.0.0.2:") {
			t.Errorf("URL %s, want one on 127.0.0.2", srv.URL())
		}
		if srv.Config().Listen != "127.0.0.2:0" || cfg.Listen != "127.0.0.1:0" {
			t.Errorf("Config().Listen %q, caller's %q; want 127.0.0.2:0 and 127.0.0.1:0", srv.Config().Listen, cfg.Listen)
		}
		if srv.AdminURL() != "" || srv.Agent() != nil || srv.PersistedIn() != "" {
			t.Errorf("AdminURL %q, Agent %v, PersistedIn %q: want none without admin and control_plane sections", srv.AdminURL(), srv.Agent(), srv.PersistedIn())
		}
		if got := statuses(t, srv.URL()+"/echo/", "k1", 2); got != "[200 429]" {
			t.Errorf("k1 %s, want [200 429]", got)
		}
	})
}

// TestOpenFailureClosesAll: when the admin address is taken, Open fails
// with the admin endpoint named, and the gateway's listener it had opened
// is closed again (its port can be listened on at once).
func TestOpenFailureClosesAll(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().String()
	free.Close()

	file := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, file, fmt.Sprintf("admin: {listen: %q}\n", taken.Addr())+quotaConfig(1, ""))
	_, err = server.Open(t.Context(), server.Options{ConfigPath: file, Listen: port, Logger: slog.New(slog.DiscardHandler)})
	want := "admin: listen tcp " + taken.Addr().String() + ": bind: address already in use"
	if err == nil || err.Error() != want {
		t.Fatalf("Open: %v, want %q", err, want)
	}
	again, err := net.Listen("tcp", port)
	if err != nil {
		t.Fatalf("the gateway's port %s is still held after Open failed: %v", port, err)
	}
	again.Close()

	if _, err := server.Open(t.Context(), server.Options{}); err == nil ||
		err.Error() != "gateway server: neither Options.ConfigPath nor Options.Config is set" {
		t.Errorf("Open without a configuration: %v", err)
	}
	_, err = server.Open(t.Context(), server.Options{ConfigPath: filepath.Join(t.TempDir(), "missing.yaml")})
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a missing file: %v, want os.ErrNotExist", err)
	}
}

// TestShutdownContextCutsRequests: a request still in flight when
// Shutdown's ctx ends is cut, Shutdown returns nil, and the log says how
// many requests were cut.
func TestShutdownContextCutsRequests(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		release := make(chan struct{})
		arrived := make(chan struct{}, 1)
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer upstream.Close()
		defer close(release)

		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(fmt.Sprintf(`listen: 127.0.0.1:0
server: {shutdown_timeout: 1m}
policies: [{id: p, rate: {requests: 10, per: 1s}}]
apis: [{id: slow, listen_path: /, target: %q, auth: keyless, policies: [p]}]
`, upstream.URL), engine))
		log := new(logBuffer)
		srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(slog.NewTextHandler(log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		served := make(chan error, 1)
		go func() { served <- srv.Serve() }()
		reqErr := make(chan error, 1)
		go func() {
			resp, err := http.Get(srv.URL() + "/x")
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			reqErr <- err
		}()
		<-arrived

		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v, want nil", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Shutdown took %v with a 200ms context", d)
		}
		if err := <-reqErr; err == nil {
			t.Error("the request in flight got a whole answer, want its connection cut")
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v, want http.ErrServerClosed", err)
		}
		const line = `level=WARN msg="shutdown context ended; closed the connections of requests still in flight" err="context deadline exceeded" requests_cut=1` + "\n"
		if !strings.Contains(log.String(), line) {
			t.Errorf("log lacks %q:\n%s", line, log)
		}
	})
}

// TestControlPlanePersistedIn: with a control_plane section, the agent
// runs, the gateway answers 503 until a configuration is applied (here
// the control plane is not there and nothing is persisted), and
// PersistedIn names the store's Redis key, or the state file with the
// memory store.
func TestControlPlanePersistedIn(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		cpAddr := deadAddr(t)
		t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
		section := fmt.Sprintf(`listen: 127.0.0.1:0
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
`, cpAddr)

		rs := redistest.Start(t)
		dir := t.TempDir()
		for _, tc := range []struct{ store, want string }{
			{"memory", "state file " + filepath.Join(dir, "gateway.state.json")},
			{"redis://" + rs.Addr, "redis key " + dataplane.RedisConfigKey("dp1")},
		} {
			file := filepath.Join(dir, "gateway.yaml")
			writeFile(t, file, onEngine("store: "+tc.store+"\n"+section, engine))
			srv, err := server.Open(t.Context(), server.Options{ConfigPath: file, Logger: slog.New(slog.DiscardHandler),
				StartTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve() }()
			if got := srv.PersistedIn(); got != tc.want {
				t.Errorf("store %s: PersistedIn %q, want %q", tc.store, got, tc.want)
			}
			if srv.Agent() == nil {
				t.Errorf("store %s: no agent", tc.store)
			}
			if got := statuses(t, srv.URL()+"/x", "k", 1); got != "[503]" {
				t.Errorf("store %s: %s before any configuration, want [503]", tc.store, got)
			}
			if err := srv.Shutdown(t.Context()); err != nil {
				t.Errorf("store %s: Shutdown: %v", tc.store, err)
			}
			<-served
			if err := srv.Close(); err != nil {
				t.Errorf("store %s: Close: %v", tc.store, err)
			}
		}
	})
}
