package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/internal/redistest"
)

// haCluster is a highly available control plane run by a test: N
// control-plane processes (the built binary) on one throwaway PostgreSQL
// (internal/pgtest), each with its own admin and sync ports and the same
// -dataplanes file.
type haCluster struct {
	pg *pgtest.Server
	// store is the replicas' -store URL: pg's, or one naming more
	// servers (pgtest.MultiHostConnString).
	store    string
	dpFile   string
	replicas []*replica
}

// replica is one control-plane process of an haCluster. It is a
// controlPlane (admin, mustAdmin, putPolicy, retry... work on it) started
// with -store on the cluster's database instead of -data; restarts keep
// its ports.
type replica struct {
	*controlPlane
	name string
	h    *haCluster
}

// haLogRevisions is the replicas' -change-log: more than any test here
// writes, so ChangesSince(0) holds every revision and the tests can check
// the sequence has no gaps.
const haLogRevisions = 100000

// startHA starts a PostgreSQL and n replicas on it with the data-plane
// tokens; o's keepalive and args apply to every replica.
func startHA(t testing.TB, n int, tokens []dpToken, o cpOptions) *haCluster {
	t.Helper()
	pg := pgtest.Start(t, pgtest.Options{})
	return startHAOn(t, pg, pg.ConnString(), n, tokens, o)
}

// startHAOn is startHA on a PostgreSQL the test started, pg, with the
// replicas' -store URL store (pg's, or one listing pg's standbys too).
func startHAOn(t testing.TB, pg *pgtest.Server, store string, n int, tokens []dpToken, o cpOptions) *haCluster {
	t.Helper()
	h := &haCluster{pg: pg, store: store}
	var b strings.Builder
	for _, tk := range tokens {
		fmt.Fprintf(&b, "- group: %s\n  tags: [%s]\n  token_hash: %q\n", tk.group, strings.Join(tk.tags, ", "), controlplane.HashToken(tk.token))
	}
	h.dpFile = filepath.Join(t.TempDir(), "dataplanes.yaml")
	if err := os.WriteFile(h.dpFile, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		r := &replica{name: fmt.Sprintf("cp%d", i+1), h: h, controlPlane: &controlPlane{
			dpFile:    h.dpFile,
			adminAddr: freePort(t),
			syncAddr:  freePortOn(t, o.syncHost),
			opts:      o,
			client:    &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}},
		}}
		t.Cleanup(r.client.CloseIdleConnections)
		r.start(t)
		h.replicas = append(h.replicas, r)
	}
	return h
}

// start (re)starts the replica's process and waits for its banner. A
// port that lingers after a kill is retried for a few seconds.
func (r *replica) start(t testing.TB) {
	t.Helper()
	args := []string{"-admin-listen", r.adminAddr, "-sync-listen", r.syncAddr, "-store", r.h.store,
		"-dataplanes", r.dpFile, "-change-log", fmt.Sprint(haLogRevisions)}
	if r.opts.keepalive != "" {
		args = append(args, "-keepalive", r.opts.keepalive)
	}
	args = append(args, r.opts.args...)
	for attempt := 0; ; attempt++ {
		p := startProc(t, "controlplane "+r.name, bin.controlPlane, args, []string{"LP_CP_ADMIN_TOKEN=" + adminToken})
		deadline := time.Now().Add(syncTimeout)
		for !cpSyncRE.MatchString(p.stdout.String()) && !p.exited() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if m := cpSyncRE.FindStringSubmatch(p.stdout.String()); m != nil {
			if m[1] != r.syncAddr {
				t.Fatalf("replica %s syncs on %s, asked for %s", r.name, m[1], r.syncAddr)
			}
			r.proc = p
			return
		}
		if p.exited() && strings.Contains(p.stderr.String(), "address already in use") && attempt < 50 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		p.kill()
		t.Fatalf("replica %s did not start: %v\nstdout:\n%s\nstderr:\n%s", r.name, p.err, p.stdout, p.stderr)
	}
}

// syncAddrs returns the sync addresses of the replicas idx (every
// replica when none is given), comma-separated, as control_plane.address
// takes them.
func (h *haCluster) syncAddrs(idx ...int) string {
	if len(idx) == 0 {
		for i := range h.replicas {
			idx = append(idx, i)
		}
	}
	var out []string
	for _, i := range idx {
		out = append(out, h.replicas[i].syncAddr)
	}
	return strings.Join(out, ",")
}

// startHADataPlane starts a redis-server and n gateways named
// group-gw1... following the replicas at addrs (see syncAddrs).
func startHADataPlane(t testing.TB, addrs string, tk dpToken, n int) *dataPlane {
	t.Helper()
	dp := &dataPlane{group: tk.group, tags: tk.tags, token: tk.token, redis: redistest.Start(t)}
	dp.redisAddr = dp.redis.Addr
	for i := range n {
		dp.gws = append(dp.gws, startGateway(t, dp, addrs, fmt.Sprintf("%s-gw%d", dp.group, i+1), gwOptions{}))
	}
	return dp
}

// openStore opens the cluster's database in the test's process, to read
// what the database holds (its revision, snapshot and change log) beside
// what the replicas answer. It is closed at cleanup.
func (h *haCluster) openStore(t testing.TB) *controlplane.Postgres {
	t.Helper()
	return openStoreAt(t, h.store)
}

// openStoreAt is openStore on the database at the URL connString.
func openStoreAt(t testing.TB, connString string) *controlplane.Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	s, err := controlplane.OpenPostgres(ctx, connString, controlplane.PostgresOptions{ChangeLogRevisions: haLogRevisions, MaxConns: 2})
	if err != nil {
		t.Fatalf("open the database in the test: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// dbView returns the database's revision and the digest of what a data
// plane with tags receives at it.
func dbView(t testing.TB, s controlplane.Store, tags []string) (uint64, string) {
	t.Helper()
	snap, err := s.Snapshot(context.Background(), tags)
	if err != nil {
		t.Fatalf("snapshot of the database: %v", err)
	}
	return snap.Revision, protocol.Digest(snap)
}

// checkGapless reads the whole change log and fails the test unless it
// holds every revision from 1 to want, in order, each with at least one
// change; it returns the changes by revision.
func checkGapless(t testing.TB, s controlplane.Store, want uint64) map[uint64][]controlplane.Change {
	t.Helper()
	changes, err := s.ChangesSince(context.Background(), 0)
	if err != nil {
		t.Fatalf("ChangesSince(0): %v", err)
	}
	by := map[uint64][]controlplane.Change{}
	var last uint64
	for i, ch := range changes {
		if ch.Revision < last {
			t.Fatalf("change %d has revision %d after %d: the log is out of order", i, ch.Revision, last)
		}
		last = ch.Revision
		by[ch.Revision] = append(by[ch.Revision], ch)
	}
	for rev := uint64(1); rev <= want; rev++ {
		if len(by[rev]) == 0 {
			t.Fatalf("revision %d has no change in the log (of revisions 1…%d): a gap", rev, want)
		}
	}
	if last != want {
		t.Fatalf("the change log ends at revision %d, the database is at %d", last, want)
	}
	return by
}

// checkGatewaysAt fails the test unless every gateway of every data
// plane reports (its /readyz) the database's revision rev and the digest
// of its data plane's view at rev.
func checkGatewaysAt(t testing.TB, s controlplane.Store, rev uint64, dps ...*dataPlane) {
	t.Helper()
	for _, dp := range dps {
		dbRev, want := dbView(t, s, dp.tags)
		if dbRev != rev {
			t.Fatalf("the database moved from revision %d to %d while the test checks it", rev, dbRev)
		}
		for _, g := range dp.gws {
			r, err := g.readyz()
			if err != nil {
				t.Fatal(err)
			}
			if r.ControlPlane.AppliedRevision != rev || r.Revision != rev || r.ControlPlane.Digest != want {
				t.Errorf("gateway %s runs revision %d (%d) digest %q; the database's view for %v is revision %d digest %s",
					g.id, r.ControlPlane.AppliedRevision, r.Revision, r.ControlPlane.Digest, dp.tags, rev, want)
			}
		}
	}
}

// replicaOf returns the address of the replica a gateway's /readyz says
// it follows ("" when it says none).
func replicaOf(g *gateway) string {
	resp, err := g.adminGet("/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var r struct {
		ControlPlane struct {
			Address string `json:"address"`
		} `json:"control_plane"`
	}
	if json.NewDecoder(resp.Body).Decode(&r) != nil {
		return ""
	}
	return r.ControlPlane.Address
}

// waitConnected waits until each gateway is listed connected, in its
// group, with an applied revision ≥ rev, by GET /api/dataplanes of one
// of the replicas (each lists the gateways it streams to).
func (h *haCluster) waitConnected(t testing.TB, rev uint64, gws ...*gateway) {
	t.Helper()
	waitFor(t, "every gateway connected to a replica in its /api/dataplanes", syncTimeout, func() (bool, string) {
		var lists [][]controlplane.DataPlane
		for _, r := range h.replicas {
			lists = append(lists, r.dataPlanes(t))
		}
		for _, g := range gws {
			found := false
			for _, list := range lists {
				i := slices.IndexFunc(list, func(d controlplane.DataPlane) bool { return d.GatewayID == g.id && d.Connected })
				if i >= 0 && list[i].AppliedRevision >= rev && list[i].Group == g.dp.group {
					found = true
				}
			}
			if !found {
				return false, fmt.Sprintf("gateway %s not connected at ≥ %d: %+v", g.id, rev, lists)
			}
		}
		return true, ""
	})
}
