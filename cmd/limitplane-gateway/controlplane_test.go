package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// startControlPlane serves a real controlplane.SyncServer over a Bolt
// store holding policy p (a quota of 3 an hour), API echo at /echo/ and
// key k on p, on a loopback address, for the token "dp-token" of group
// dp1 with tag dp1. Everything stops at the end of the test.
func startControlPlane(t *testing.T) (*controlplane.Bolt, string, func()) {
	t.Helper()
	store, err := controlplane.OpenBolt(filepath.Join(t.TempDir(), "cp.db"), controlplane.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	_, err = store.Update(context.Background(), func(tx controlplane.Tx) error {
		if err := tx.PutPolicy(spec.Policy{ID: "p", Quota: &spec.Quota{Max: 3, Renewal: spec.Duration(time.Hour)}}); err != nil {
			return err
		}
		if err := tx.PutAPI(spec.API{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho}); err != nil {
			return err
		}
		return tx.PutKey(spec.Key{KeyHash: identity.HashKey("k").String(), Policies: []string{"p"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:  store,
		Tokens: []controlplane.DataPlaneToken{{Hash: controlplane.HashToken("dp-token"), Group: "dp1", Tags: []string{"dp1"}}},
		Log:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	syncpb.RegisterSyncServiceServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			srv.Shutdown()
			gs.Stop()
			<-served
		})
	}
	t.Cleanup(stop)
	return store, lis.Addr().String(), stop
}

// TestControlPlaneSection runs the gateway as a process with a
// control_plane section against a real sync server: the banner names the
// control plane; /readyz reports it connected at revision 1; the key the
// control plane sent is enforced (3 of 4 pass a quota of 3); /metrics has
// the sync series; a write on the control plane reaches the gateway and
// its state file; SIGHUP applies nothing; SIGTERM ends it with status 0.
func TestControlPlaneSection(t *testing.T) {
	store, cpAddr, _ := startControlPlane(t)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	file := writeConfig(t, fmt.Sprintf(`
admin: {listen: "127.0.0.1:0"}
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
  tags: [dp1]
  gateway_id: gw-proc
`, cpAddr))
	cmd, stdout, stderr, base := startProcess(t, "-config", file)
	lines := strings.Split(stdout.String(), "\n")
	wantFirst := fmt.Sprintf("limitplane gateway listening on %s (config: %s, store: memory%s, control plane: %s group dp1)", base, file, engineNote(), cpAddr)
	if lines[0] != wantFirst {
		t.Fatalf("banner line 1:\n%s\nwant\n%s", lines[0], wantFirst)
	}
	admin := regexp.MustCompile(`admin endpoint at (http://\S+)`).FindStringSubmatch(stdout.String())
	stateFile := strings.TrimSuffix(file, ".yaml") + ".state.json"
	wantCP := "  policies, keys and APIs from the control plane (tags [dp1], tls: off, on_stale: keep); last applied configuration persisted in state file " + stateFile
	if admin == nil || len(lines) < 3 || lines[2] != wantCP {
		t.Fatalf("banner:\n%s\nwant line 3:\n%s", stdout, wantCP)
	}

	type readyz struct {
		Ready        bool   `json:"ready"`
		Revision     uint64 `json:"revision"`
		ControlPlane struct {
			State            string  `json:"state"`
			AppliedRevision  uint64  `json:"applied_revision"`
			StalenessSeconds float64 `json:"staleness_seconds"`
			Source           string  `json:"source"`
			LastError        string  `json:"last_error"`
			Digest           string  `json:"digest"`
		} `json:"control_plane"`
	}
	ready := func() (int, readyz) {
		r := get(t, nil, admin[1]+"/readyz")
		var out readyz
		if err := json.Unmarshal([]byte(r.body), &out); err != nil {
			t.Fatalf("readyz %q: %v", r.body, err)
		}
		return r.status, out
	}
	var rz readyz
	var code int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if code, rz = ready(); code == 200 || time.Now().After(deadline) {
			break
		}
	}
	snap, err := store.Snapshot(context.Background(), []string{"dp1"})
	if err != nil {
		t.Fatal(err)
	}
	if cp := rz.ControlPlane; code != 200 || !rz.Ready || rz.Revision != 1 || cp.State != "connected" || cp.AppliedRevision != 1 ||
		cp.StalenessSeconds != 0 || cp.Source != "control_plane" || cp.LastError != "" || cp.Digest != protocol.Digest(snap) {
		t.Fatalf("readyz %d %+v\nstderr: %s", code, rz, stderr)
	}

	var got []int
	for range 4 {
		got = append(got, get(t, nil, base+"/echo/x", "X-API-Key", "k").status)
	}
	if fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("key k: %v, want 3 of a quota of 3", got)
	}

	metrics := get(t, nil, admin[1]+"/metrics").body
	for _, line := range []string{
		"limitplane_sync_connected 1",
		"limitplane_sync_applied_revision 1",
		"limitplane_sync_staleness_seconds 0",
		`limitplane_sync_deliveries_total{kind="snapshot",result="applied"} 1`,
		`limitplane_sync_deliveries_total{kind="snapshot",result="rejected"} 0`,
		`limitplane_sync_deliveries_total{kind="changes",result="applied"} 0`,
		`limitplane_sync_deliveries_total{kind="changes",result="rejected"} 0`,
		"limitplane_sync_reconnects_total 0",
		"limitplane_config_revision 1",
	} {
		if !strings.Contains(metrics, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}

	rev, err := store.Update(context.Background(), func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: identity.HashKey("k2").String(), Policies: []string{"p"}})
	})
	if err != nil || rev != 2 {
		t.Fatalf("write: %d, %v", rev, err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, rz = ready(); rz.ControlPlane.AppliedRevision == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision 2 not applied: %+v", rz)
		}
	}
	if r := get(t, nil, base+"/echo/x", "X-API-Key", "k2"); r.status != 200 {
		t.Fatalf("k2: %d %s", r.status, r.body)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(stateFile)
		if err == nil {
			if s, err := protocol.DecodeSnapshot(b); err == nil && s.Revision == 2 && len(s.Keys) == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("state file %s not at revision 2: %v", stateFile, err)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	stderr.waitFor(t, "reloaded: the configuration comes from the control plane")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(t, cmd); code != 0 {
		t.Fatalf("exit status %d; stderr: %s", code, stderr)
	}
}

// TestControlPlaneRedisPersistence: a data-plane gateway on a Redis store
// persists the control plane's configuration in that Redis; a second
// gateway started while the control plane is down enforces it after the
// start timeout (503 before): 3 of 5 requests pass a quota of 3.
func TestControlPlaneRedisPersistence(t *testing.T) {
	rs := redistest.Start(t)
	client := rs.Client(t, nil)
	_, cpAddr, stopCP := startControlPlane(t)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	file := writeConfig(t, fmt.Sprintf(`
store: redis://%s/0
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
  tags: [dp1]
`, rs.Addr, cpAddr))
	r1 := start(t, env{}, "-config", file)
	if !strings.Contains(r1.stdout.String(), "persisted in redis key limitplane:dataplane:{dp1}:config\n") {
		t.Fatalf("banner: %s", r1.stdout)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rev, _ := client.HGet(context.Background(), "limitplane:dataplane:{dp1}:config", "revision").Result(); rev == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision 1 not persisted in Redis; stderr: %s", r1.stderr)
		}
	}
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	stopCP()

	r2 := start(t, env{startTimeout: 300 * time.Millisecond}, "-config", file)
	if r := get(t, nil, r2.base+"/echo/x", "X-API-Key", "unknown"); r.status != 503 {
		t.Fatalf("before the start timeout: %d %s", r.status, r.body)
	}
	// An unknown key spends nothing: 403 once the configuration runs.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r := get(t, nil, r2.base+"/echo/x", "X-API-Key", "unknown"); r.status == 403 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the persisted configuration was not applied; stderr: %s", r2.stderr)
		}
	}
	var got []int
	for range 5 {
		got = append(got, get(t, nil, r2.base+"/echo/x", "X-API-Key", "k").status)
	}
	if fmt.Sprint(got) != "[200 200 200 429 429]" {
		t.Fatalf("key k under the persisted configuration: %v, want 3 of 5", got)
	}
	r2.stderr.waitFor(t, "enforcing the persisted configuration")
}
