package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// syncReplica is a controlplane.SyncServer served on loopback in the
// test's process over a store it shares with other replicas. Two
// control-plane programs cannot share one bbolt file (the second is
// refused), so until the PostgreSQL store lands the replicas run here and
// only the gateway is a process of its own.
type syncReplica struct {
	dps  *controlplane.DataPlanes
	srv  *controlplane.SyncServer
	addr string

	once   sync.Once
	gs     *grpc.Server
	served chan error
}

func startSyncReplica(t *testing.T, store controlplane.Store, tk dpToken) *syncReplica {
	t.Helper()
	r := &syncReplica{dps: &controlplane.DataPlanes{}, served: make(chan error, 1)}
	var err error
	r.srv, err = controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:      store,
		DataPlanes: r.dps,
		Tokens:     []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(tk.token), Group: tk.group, Tags: tk.tags}},
		Log:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	r.gs = grpc.NewServer()
	syncpb.RegisterSyncServiceServer(r.gs, r.srv)
	go func() { r.served <- r.gs.Serve(lis) }()
	t.Cleanup(r.kill)
	return r
}

// kill stops the replica at once: listener and connections closed, the
// streams cut without the Shutdown message, as for a killed process.
func (r *syncReplica) kill() {
	r.once.Do(func() {
		r.gs.Stop()
		<-r.served
	})
}

// on reports whether gateway id has an open stream on the replica, and
// the revision it acknowledged there.
func (r *syncReplica) on(id string) (bool, uint64) {
	for _, dp := range r.dps.List() {
		if dp.GatewayID == id && dp.Connected {
			return true, dp.AppliedRevision
		}
	}
	return false, 0
}

// A gateway process whose control_plane.address lists two replicas of
// one store gets its configuration from one; when that replica is
// killed, it moves to the other, gets the keys written meanwhile as
// changes (its /readyz counts one snapshot, the first), enforces them,
// and its digest is the store's.
func TestGatewayFailsOverBetweenReplicas(t *testing.T) {
	store, err := controlplane.OpenBolt(filepath.Join(t.TempDir(), "cp.db"), controlplane.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	key := func(plain string) spec.Key {
		return spec.Key{KeyHash: identity.HashKey(plain).String(), Policies: []string{"p"}}
	}
	write := func(fn func(tx controlplane.Tx) error) uint64 {
		t.Helper()
		rev, err := store.Update(ctx, fn)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	write(func(tx controlplane.Tx) error {
		if err := tx.PutPolicy(spec.Policy{ID: "p", Rate: &spec.Rate{Requests: 1000, Per: spec.Duration(time.Second)}}); err != nil {
			return err
		}
		if err := tx.PutAPI(spec.API{ID: "api", ListenPath: "/api/", Target: spec.BuiltinEcho}); err != nil {
			return err
		}
		return tx.PutKey(key("fo-k1"))
	})

	tk := dpToken{group: "fo", token: "e2e-failover-token"}
	reps := []*syncReplica{startSyncReplica(t, store, tk), startSyncReplica(t, store, tk)}
	dp := &dataPlane{group: tk.group, tags: tk.tags, token: tk.token}
	g := startGateway(t, dp, reps[0].addr+","+reps[1].addr, "fo-gw1", gwOptions{})
	waitApplied(t, 1, g)

	on := -1
	for i, r := range reps {
		if ok, _ := r.on(g.id); ok {
			on = i
		}
	}
	if on < 0 {
		t.Fatal("the gateway is on neither replica")
	}
	rev := write(func(tx controlplane.Tx) error { return tx.PutKey(key("fo-k2")) })
	waitApplied(t, rev, g)

	reps[on].kill()
	start := time.Now()
	for _, k := range []string{"fo-k3", "fo-k4"} {
		rev = write(func(tx controlplane.Tx) error { return tx.PutKey(key(k)) })
	}
	other := reps[1-on]
	r := waitReadyz(t, g, fmt.Sprintf("revision %d from the other replica", rev), 10*time.Second, func(r readiness) bool {
		ok, acked := other.on(g.id)
		return ok && acked == rev && r.ControlPlane.State == "connected" && r.ControlPlane.AppliedRevision == rev
	})
	t.Logf("on the other replica at revision %d %v after the kill", rev, time.Since(start))
	if d := r.ControlPlane.Deliveries; d.SnapshotsApplied != 1 || d.SnapshotsRejected != 0 || d.ChangesRejected != 0 || d.ChangesApplied < 2 {
		t.Fatalf("deliveries %+v, want the first snapshot only and changes since", d)
	}
	snap, err := store.Snapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.ControlPlane.Digest != protocol.Digest(snap) {
		t.Fatalf("gateway digest %s, store's %s", r.ControlPlane.Digest, protocol.Digest(snap))
	}
	for _, k := range []string{"fo-k1", "fo-k3", "fo-k4"} {
		req, err := http.NewRequest(http.MethodGet, g.base+"/api/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", k)
		resp, err := quick.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("key %s after the failover: status %d, want 200", k, resp.StatusCode)
		}
	}
	req, err := http.NewRequest(http.MethodGet, g.base+"/api/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "fo-unknown")
	resp, err := quick.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unknown key: status %d, want 403", resp.StatusCode)
	}
}
