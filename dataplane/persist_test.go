package dataplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRedisPersisterKeepsTheHighestRevision: Load finds nothing at
// first; a save is loaded back whole; a lower or equal revision does not
// overwrite a higher one, a higher one does. The key is the contract's.
func TestRedisPersisterKeepsTheHighestRevision(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t, nil)
	ctx := context.Background()
	p := dataplane.NewRedisPersister(client, "eu-1")
	if got, err := p.Load(ctx); got != nil || err != nil {
		t.Fatalf("Load of nothing: %v, %v", got, err)
	}
	five := snapshot(5, "a", "b")
	if err := p.Save(ctx, five); err != nil {
		t.Fatal(err)
	}
	if rev, err := client.HGet(ctx, "limitplane:dataplane:{eu-1}:config", "revision").Result(); err != nil || rev != "5" {
		t.Fatalf("stored revision %q, %v", rev, err)
	}
	if ttl, err := client.TTL(ctx, "limitplane:dataplane:{eu-1}:config").Result(); err != nil || ttl != -1 {
		t.Fatalf("TTL %v, %v; want none (-1)", ttl, err)
	}
	for _, older := range []*spec.Snapshot{snapshot(3, "c"), snapshot(5, "d")} {
		if err := p.Save(ctx, older); err != nil {
			t.Fatal(err)
		}
	}
	got, err := p.Load(ctx)
	if err != nil || jsonOf(t, got) != jsonOf(t, five) {
		t.Fatalf("after lower saves: %s, %v; want %s", jsonOf(t, got), err, jsonOf(t, five))
	}
	ten := snapshot(10, "e")
	if err := p.Save(ctx, ten); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Load(ctx); err != nil || jsonOf(t, got) != jsonOf(t, ten) {
		t.Fatalf("after a higher save: %s, %v", jsonOf(t, got), err)
	}
	// Another group's configuration is apart.
	if got, err := dataplane.NewRedisPersister(client, "us-1").Load(ctx); got != nil || err != nil {
		t.Fatalf("other group: %v, %v", got, err)
	}
}

// TestFilePersister: Load of a missing file is nothing; Save replaces the
// file whole by a rename (no temporary file left beside it).
func TestFilePersister(t *testing.T) {
	dir := t.TempDir()
	p := dataplane.FilePersister{Path: filepath.Join(dir, "gw.state.json")}
	ctx := context.Background()
	if got, err := p.Load(ctx); got != nil || err != nil {
		t.Fatalf("Load of nothing: %v, %v", got, err)
	}
	for _, s := range []*spec.Snapshot{snapshot(1, "a", "b"), snapshot(2, "c")} {
		if err := p.Save(ctx, s); err != nil {
			t.Fatal(err)
		}
		got, err := p.Load(ctx)
		if err != nil || jsonOf(t, got) != jsonOf(t, s) {
			t.Fatalf("Load: %s, %v; want %s", jsonOf(t, got), err, jsonOf(t, s))
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "gw.state.json" {
		t.Fatalf("directory holds %v", entries)
	}
	if err := os.WriteFile(p.Path, []byte(`{"revision": 3, "nonsense": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Load(ctx); err == nil {
		t.Fatal("a file with an unknown field loaded")
	}
}

// TestAgentStartsFromPersisted: an agent persists what the control plane
// sent; a new gateway whose control plane is down applies the persisted
// configuration after StartTimeout and enforces it (3 of 5 requests pass
// a quota of 3); when the control plane comes back, its configuration
// replaces the persisted one. Once with Redis, once with a file.
func TestAgentStartsFromPersisted(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		for _, c := range []struct {
			name      string
			persister func(t *testing.T) dataplane.Persister
		}{
			{"redis", func(t *testing.T) dataplane.Persister {
				return dataplane.NewRedisPersister(redistest.Start(t).Client(t, nil), testGroup)
			}},
			{"file", func(t *testing.T) dataplane.Persister {
				return dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				persister := c.persister(t)
				cp := newControlPlane(t, snapshot(0, "k1"))
				g1 := newTarget(t)
				o := agentOptions(g1.tg, cp.addr, &lockedBuffer{})
				o.Persister = persister
				a1, err := dataplane.New(o)
				if err != nil {
					t.Fatal(err)
				}
				stop1 := runAgent(t, a1)
				waitFor(t, "revision 1 persisted", func() bool { return a1.Status().PersistedRevision == 1 })
				stop1()
				cp.Stop()

				g2 := newTarget(t)
				log := &lockedBuffer{}
				o = agentOptions(g2.tg, cp.addr, log)
				o.Persister = persister
				o.StartTimeout = 100 * time.Millisecond
				o.GatewayID = "gw-2"
				a2, err := dataplane.New(o)
				if err != nil {
					t.Fatal(err)
				}
				runAgent(t, a2)
				if st, body := g2.get(t, "k1"); st != 503 || body != `{"error":"no configuration applied yet"}`+"\n" {
					t.Fatalf("before StartTimeout: %d %s", st, body)
				}
				waitFor(t, "the persisted configuration", func() bool { return a2.Status().Source == "persisted" })
				if got := fmt.Sprint(g2.statuses(t, "k1", 5)); got != "[200 200 200 429 429]" {
					t.Fatalf("k1 under the persisted configuration: %s, want 3 of 5", got)
				}
				st := a2.Status()
				if st.AppliedRevision != 1 || st.PersistedRevision != 1 || st.State == "connected" {
					t.Fatalf("status: %+v", st)
				}

				cp.Start(t)
				waitFor(t, "the control plane's configuration", func() bool { return a2.Status().Source == "control_plane" })
				if st := a2.Status(); st.AppliedRevision != 1 || st.State != "connected" {
					t.Fatalf("status after the control plane came back: %+v", st)
				}
				waitFor(t, "gw-2's Ack", func() bool { return cp.applied("gw-2") == 1 })
			})
		}
	})
}

// TestAgentOnStale: with fail_closed, once max_stale passes without the
// control plane the gateway answers 503 (and the agent says stale); when
// the control plane is back it serves again, counters kept. With keep it
// serves on throughout.
func TestAgentOnStale(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		for _, policy := range []dataplane.OnStale{dataplane.StaleFailClosed, dataplane.StaleKeep} {
			t.Run(string(policy), func(t *testing.T) {
				cp := newControlPlane(t, snapshot(0, "k1"))
				g := newTarget(t)
				o := agentOptions(g.tg, cp.addr, &lockedBuffer{})
				o.MaxStale = 200 * time.Millisecond
				o.OnStale = policy
				changes := make(chan bool, 4)
				o.StaleChanged = func(stale bool) { changes <- stale }
				a, err := dataplane.New(o)
				if err != nil {
					t.Fatal(err)
				}
				runAgent(t, a)
				waitFor(t, "revision 1", func() bool { return cp.applied("gw-test") == 1 })
				if got := fmt.Sprint(g.statuses(t, "k1", 1)); got != "[200]" {
					t.Fatalf("connected: %s", got)
				}
				cp.Stop()
				waitFor(t, "stale", func() bool { return a.Status().Stale })
				if got := <-changes; !got {
					t.Fatal("StaleChanged(false) first")
				}
				st, body := g.get(t, "k1")
				if policy == dataplane.StaleFailClosed {
					want := `{"error":"dataplane: no contact with the control plane for over 200ms; failing closed (on_stale: fail_closed)"}` + "\n"
					if st != 503 || body != want {
						t.Fatalf("stale, fail_closed: %d %s", st, body)
					}
				} else if st != 200 {
					t.Fatalf("stale, keep: %d %s", st, body)
				}
				// Between attempts, or in one (each dials anew).
				if s := a.Status(); s.State != "disconnected" && s.State != "connecting" || s.Staleness < 200*time.Millisecond || s.StalenessSeconds < 0.2 {
					t.Fatalf("stale status: %+v", s)
				}
				cp.Start(t)
				waitFor(t, "connected again", func() bool { return a.Status().State == "connected" })
				if got := <-changes; got {
					t.Fatal("StaleChanged(true) again")
				}
				// One spent before (and, under keep, one while stale) of 3.
				want := "[200 200 429]"
				if policy == dataplane.StaleKeep {
					want = "[200 429 429]"
				}
				if got := fmt.Sprint(g.statuses(t, "k1", 3)); got != want {
					t.Fatalf("after the control plane came back: %s, want %s", got, want)
				}
				if s := a.Status(); s.Stale || s.Staleness != 0 {
					t.Fatalf("status after the control plane came back: %+v", s)
				}
			})
		}
	})
}

// TestAgentSavesWhenStopped: a configuration applied less than SaveDelay
// before Run stops is persisted as it stops.
func TestAgentSavesWhenStopped(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		o := agentOptions(g.tg, addr, &lockedBuffer{})
		p := dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}
		o.Persister, o.SaveDelay = p, time.Hour
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		stop := runAgent(t, a)
		s := f.next(t)
		snap := snapshot(4, "k1")
		s.sendSnapshot(t, snap, "snap-4")
		s.wantAck(t, 4, "snap-4")
		if got, err := p.Load(context.Background()); got != nil || err != nil {
			t.Fatalf("saved before SaveDelay: %v, %v", got, err)
		}
		stop()
		got, err := p.Load(context.Background())
		if err != nil || jsonOf(t, got) != jsonOf(t, snap) {
			t.Fatalf("after stop: %s, %v; want %s", jsonOf(t, got), err, jsonOf(t, snap))
		}
		if st := a.Status(); st.PersistedRevision != 4 {
			t.Fatalf("PersistedRevision %d, want 4", st.PersistedRevision)
		}
	})
}

// countingPersister counts saves and keeps the revisions saved.
type countingPersister struct {
	dataplane.FilePersister
	mu    sync.Mutex
	saved []uint64
}

func (c *countingPersister) Save(ctx context.Context, snap *spec.Snapshot) error {
	return c.SaveHistory(ctx, snap, "")
}

// SaveHistory is what the agent calls: FilePersister is a
// HistoryPersister.
func (c *countingPersister) SaveHistory(ctx context.Context, snap *spec.Snapshot, history string) error {
	c.mu.Lock()
	c.saved = append(c.saved, snap.Revision)
	c.mu.Unlock()
	return c.FilePersister.SaveHistory(ctx, snap, history)
}

func (c *countingPersister) revisions() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint64(nil), c.saved...)
}

// TestAgentCoalescesSaves: a snapshot and two Changes applied within
// SaveDelay are persisted by one save, of the latest revision.
func TestAgentCoalescesSaves(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		o := agentOptions(g.tg, addr, &lockedBuffer{})
		p := &countingPersister{FilePersister: dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}}
		o.Persister, o.SaveDelay = p, 2*time.Second
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		base := snapshot(1, "k1")
		s.sendSnapshot(t, base, "snap-1")
		s.wantAck(t, 1, "snap-1")
		ch2 := changes(t, base, 1, 2, putKey(t, spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}}))
		s.sendChanges(t, ch2)
		s.wantAck(t, 2, ch2.Nonce)
		ch3 := changes(t, g.tg.Snapshot(), 2, 3, putKey(t, spec.Key{KeyHash: hash("k3"), Policies: []string{"p"}}))
		s.sendChanges(t, ch3)
		s.wantAck(t, 3, ch3.Nonce)
		waitFor(t, "revision 3 persisted", func() bool { return a.Status().PersistedRevision == 3 })
		if got := fmt.Sprint(p.revisions()); got != "[3]" {
			t.Fatalf("saves %s, want one of revision 3", got)
		}
		got, err := p.Load(context.Background())
		if err != nil || got.Revision != 3 || protocol.Digest(got) != ch3.Digest {
			t.Fatalf("persisted %+v, %v", got, err)
		}
	})
}

// TestPersistedRevision: both persisters read the persisted revision
// without the configuration: 0 before any save, the revision after one,
// 0 again once the configuration is gone; a state file written by hand
// with the revision after the lists is read whole.
func TestPersistedRevision(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t, nil)
	path := filepath.Join(t.TempDir(), "state.json")
	for name, p := range map[string]dataplane.HistoryPersister{
		"redis": dataplane.NewRedisPersister(client, "eu-1"),
		"file":  dataplane.FilePersister{Path: path},
	} {
		if rev, h, err := p.PersistedRevision(ctx); rev != 0 || h != "" || err != nil {
			t.Fatalf("%s: before any save: %d, %q, %v; want 0", name, rev, h, err)
		}
		if err := p.Save(ctx, snapshot(18446744073709551615, "a")); err != nil {
			t.Fatal(err)
		}
		if rev, h, err := p.PersistedRevision(ctx); rev != 18446744073709551615 || h != "" || err != nil {
			t.Fatalf("%s: after a save of revision 2^64-1: %d, %q, %v", name, rev, h, err)
		}
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if rev, _, err := dataplane.NewRedisPersister(client, "eu-1").PersistedRevision(ctx); rev != 0 || err != nil {
		t.Fatalf("redis: after FLUSHALL: %d, %v; want 0", rev, err)
	}
	if err := os.WriteFile(path, []byte(`{"keys": [], "revision": 42}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rev, _, err := (dataplane.FilePersister{Path: path}).PersistedRevision(ctx); rev != 42 || err != nil {
		t.Fatalf("file with the revision last: %d, %v; want 42", rev, err)
	}
	if err := os.WriteFile(path, []byte(`{"revision": "x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rev, _, err := (dataplane.FilePersister{Path: path}).PersistedRevision(ctx); err == nil {
		t.Fatalf("file with a revision that is not a number: %d, no error", rev)
	}
}

// TestRedisPersisterHistory: within one history only a higher revision
// overwrites; a save of another history overwrites whatever the
// revisions, and a save naming none follows the revision rule.
func TestRedisPersisterHistory(t *testing.T) {
	ctx := context.Background()
	p := dataplane.NewRedisPersister(redistest.Start(t).Client(t, nil), "eu-1")
	check := func(what string, rev uint64, history string) {
		t.Helper()
		snap, h, err := p.LoadHistory(ctx)
		if err != nil || snap == nil || snap.Revision != rev || h != history {
			t.Fatalf("%s: loaded %v of %q, %v; want revision %d of %q", what, snap, h, err, rev, history)
		}
		if r, h, err := p.PersistedRevision(ctx); r != rev || h != history || err != nil {
			t.Fatalf("%s: PersistedRevision %d, %q, %v; want %d, %q", what, r, h, err, rev, history)
		}
	}
	for _, s := range []struct {
		what    string
		rev     uint64
		history string
		wantRev uint64
		wantH   string
	}{
		{"first save", 500, "H1", 500, "H1"},
		{"lower revision, same history", 400, "H1", 500, "H1"},
		{"lower revision, another history", 400, "H2", 400, "H2"},
		{"higher revision, the old history", 450, "H1", 450, "H1"},
		{"lower revision, no history", 300, "", 450, "H1"},
		{"higher revision, no history", 460, "", 460, ""},
		{"lower revision, a history after none", 10, "H3", 10, "H3"},
	} {
		if err := p.SaveHistory(ctx, snapshot(s.rev, "a"), s.history); err != nil {
			t.Fatal(err)
		}
		check(s.what, s.wantRev, s.wantH)
	}
}
