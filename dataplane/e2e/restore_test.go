package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// copyFile copies the file from to to (mode 0600).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// state reads the control plane's whole state through the admin API (a
// data plane whose tags select every API receives all of it) and returns
// its revision and protocol.Digest.
func (c *controlPlane) state(t *testing.T) (uint64, string) {
	t.Helper()
	var snap spec.Snapshot
	var pols struct {
		Revision uint64        `json:"revision"`
		Policies []spec.Policy `json:"policies"`
	}
	mustDecode(t, c.mustAdmin(t, "GET", "/api/policies", nil, 200), &pols)
	var apis struct {
		Revision uint64     `json:"revision"`
		APIs     []spec.API `json:"apis"`
	}
	mustDecode(t, c.mustAdmin(t, "GET", "/api/apis", nil, 200), &apis)
	snap.Policies, snap.APIs = pols.Policies, apis.APIs
	for after := ""; ; {
		var page struct {
			Revision uint64     `json:"revision"`
			Keys     []spec.Key `json:"keys"`
			Next     string     `json:"next"`
		}
		if err := json.Unmarshal(c.mustAdmin(t, "GET", "/api/keys?limit=1000&after="+url.QueryEscape(after), nil, 200), &page); err != nil {
			t.Fatal(err)
		}
		if page.Revision != pols.Revision || apis.Revision != pols.Revision {
			t.Fatalf("the state changed while read: revisions %d, %d, %d", pols.Revision, apis.Revision, page.Revision)
		}
		snap.Keys = append(snap.Keys, page.Keys...)
		if after = page.Next; after == "" {
			break
		}
	}
	return pols.Revision, protocol.Digest(&snap)
}

// TestRestoreFromCopy restores the control plane's data file from a copy
// taken 100 revisions earlier, under two data planes of two gateways
// each: 400 revisions, a copy (stopped, copied, started), 100 more (one
// deletes a key of the copy, 99 create keys), then the copy put back and
// 50 writes (revision 450). Every gateway must come to the control
// plane's revision and digest, in a new history: the keys created after
// the copy are refused (403), the key deleted after it is served again,
// and the keys created since the restore are served. Each data plane's
// Redis must hold the new history's configuration, so that a gateway
// restarted while the control plane is down serves it, not the lost
// history's revision 500. Before histories, every gateway refused each
// snapshot as older than the one it ran, until the control plane passed
// revision 500.
func TestRestoreFromCopy(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("q", 1000))
	rev := cp.putAPI(t, echoAPI("echo", "/echo/")) // untagged: both data planes serve it
	key := func(kind string, i int) string { return "restore-" + kind + "-" + strconv.Itoa(i) }
	for i := 1; rev < 400; i++ {
		_, rev = cp.postKey(t, key("old", i), spec.Key{Policies: []string{"q"}})
	}
	if err := cp.proc.stop(); err != nil {
		t.Fatalf("control plane exited with %v", err)
	}
	backup := filepath.Join(t.TempDir(), "cp-400.db")
	copyFile(t, cp.data, backup)
	cp.start(t)
	rev = decodeWritten(t, cp.mustAdmin(t, "DELETE", "/api/keys/"+identity.HashKey(key("old", 1)).String(), nil, 200)).Revision
	for i := 1; rev < 500; i++ {
		_, rev = cp.postKey(t, key("lost", i), spec.Key{Policies: []string{"q"}})
	}
	waitApplied(t, 500, gws...)
	for _, g := range gws { // the lost history's revision 500 is in both data planes' Redis
		waitReadyz(t, g, "revision 500 persisted", syncTimeout, func(r readiness) bool { return r.ControlPlane.PersistedRevision == 500 })
	}
	r, err := gws[0].readyz()
	if err != nil {
		t.Fatal(err)
	}
	lostHistory := r.ControlPlane.History

	if err := cp.proc.stop(); err != nil {
		t.Fatalf("control plane exited with %v", err)
	}
	copyFile(t, backup, cp.data)
	cp.start(t)
	if got := cp.revision(t); got != 400 {
		t.Fatalf("the restored control plane is at revision %d, want 400", got)
	}
	for i := 1; i <= 50; i++ {
		_, rev = cp.postKey(t, key("new", i), spec.Key{Policies: []string{"q"}})
	}
	wantRev, wantDigest := cp.state(t)
	if wantRev != 450 || rev != 450 {
		t.Fatalf("the restored control plane is at revision %d (the last write %d), want 450", wantRev, rev)
	}
	var history string
	for _, g := range gws {
		r := waitReadyz(t, g, fmt.Sprintf("revision %d, digest %s, a new history", wantRev, wantDigest), syncTimeout, func(r readiness) bool {
			c := r.ControlPlane
			return c.AppliedRevision == wantRev && r.Revision == wantRev && c.Digest == wantDigest && c.History != lostHistory && c.History != "" && c.Source == "control_plane"
		})
		if history == "" {
			history = r.ControlPlane.History
			t.Logf("history %s before the restore, %s after", lostHistory, history)
		}
		if r.ControlPlane.History != history {
			t.Fatalf("gateway %s runs history %s, gateway %s %s", g.id, r.ControlPlane.History, gws[0].id, history)
		}
	}
	checkServes := func(what string, gws []*gateway) {
		t.Helper()
		for _, g := range gws {
			for k, want := range map[string]int{key("lost", 1): 403, key("lost", 99): 403, key("old", 1): 200, key("old", 398): 200, key("new", 1): 200, key("new", 50): 200} {
				if st, body := sendOne(t, g, "/echo/x", k); st != want {
					t.Errorf("%s: gateway %s answered %s with %d %s, want %d", what, g.id, k, st, body, want)
				}
			}
		}
	}
	checkServes("after the restore", gws)

	for _, dp := range []*dataPlane{dp1, dp2} {
		rdb := dp.redis.Client(t, nil)
		p := dataplane.NewRedisPersister(rdb, dp.group)
		waitFor(t, dp.group+"'s Redis holding the new history's configuration", syncTimeout, func() (bool, string) {
			snap, err := p.Load(context.Background())
			if err != nil || snap == nil {
				return false, fmt.Sprintf("%v %v", snap, err)
			}
			h, _ := rdb.HGet(context.Background(), dataplane.RedisConfigKey(dp.group), "history").Result()
			return snap.Revision == wantRev && h == history && protocol.Digest(snap) == wantDigest,
				fmt.Sprintf("revision %d, history %s, digest %s", snap.Revision, h, protocol.Digest(snap))
		})
	}
	cp.kill()
	restarted := []*gateway{dp1.gws[0], dp2.gws[0]}
	for _, g := range restarted {
		if err := g.proc.stop(); err != nil {
			t.Fatalf("gateway %s exited with %v", g.id, err)
		}
		g.start(t)
	}
	for _, g := range restarted {
		r := waitReadyz(t, g, "the persisted configuration", syncTimeout, func(r readiness) bool {
			return r.ControlPlane.Source == "persisted" && r.Ready
		})
		if c := r.ControlPlane; c.AppliedRevision != wantRev || c.Digest != wantDigest || c.History != history {
			t.Fatalf("gateway %s restarted without the control plane runs revision %d, digest %s, history %s; want %d, %s, %s",
				g.id, c.AppliedRevision, c.Digest, c.History, wantRev, wantDigest, history)
		}
	}
	checkServes("restarted without the control plane", restarted)
}

// TestRestoreWhileGatewaysDown restores the control plane's file while
// the data plane's only gateway is down too: the gateway starts with
// nothing running, but its Redis holds the lost history's later revision,
// which its Hello names, so the control plane takes a new history and the
// gateway's save of it replaces the lost one. Restarted again while the
// control plane is down, the gateway serves the restored state (the key
// created after the copy refused), not the lost revision.
func TestRestoreWhileGatewaysDown(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "restore-down-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{})
	dp := startDataPlane(t, cp, tk, 1, nil)
	g := dp.gws[0]
	cp.putPolicy(t, quotaPolicy("q", 1000))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "restore-down-old", spec.Key{Policies: []string{"q"}})
	if err := cp.proc.stop(); err != nil {
		t.Fatalf("control plane exited with %v", err)
	}
	backup := filepath.Join(t.TempDir(), "cp-3.db")
	copyFile(t, cp.data, backup)
	cp.start(t)
	_, lost := cp.postKey(t, "restore-down-lost", spec.Key{Policies: []string{"q"}})
	waitApplied(t, lost, g)
	waitReadyz(t, g, "the lost revision persisted", syncTimeout, func(r readiness) bool { return r.ControlPlane.PersistedRevision == lost })

	if err := g.proc.stop(); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	if err := cp.proc.stop(); err != nil {
		t.Fatalf("control plane exited with %v", err)
	}
	copyFile(t, backup, cp.data)
	cp.start(t)
	g.start(t)
	wantRev, wantDigest := cp.state(t)
	waitReadyz(t, g, "the restored state applied", syncTimeout, func(r readiness) bool {
		c := r.ControlPlane
		return c.Source == "control_plane" && c.AppliedRevision == wantRev && c.Digest == wantDigest && c.PersistedRevision == wantRev
	})
	cp.kill()
	if err := g.proc.stop(); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	g.start(t)
	r := waitReadyz(t, g, "the persisted configuration", syncTimeout, func(r readiness) bool {
		return r.ControlPlane.Source == "persisted" && r.Ready
	})
	if c := r.ControlPlane; c.AppliedRevision != wantRev || c.Digest != wantDigest {
		t.Fatalf("restarted without the control plane, the gateway runs revision %d, digest %s; want the restored %d, %s", c.AppliedRevision, c.Digest, wantRev, wantDigest)
	}
	for k, want := range map[string]int{"restore-down-old": 200, "restore-down-lost": 403} {
		if st, body := sendOne(t, g, "/echo/x", k); st != want {
			t.Errorf("gateway answered %s with %d %s, want %d", k, st, body, want)
		}
	}
}
