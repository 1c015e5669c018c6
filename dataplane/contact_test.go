package dataplane_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestAgentStaleCountsFromPersistedContact: an agent persists the time of
// its last contact with the control plane (again every
// ContactSaveInterval while connected, and as it stops) beside the
// configuration (Redis: the hash's "contact" field, the hash then holding
// exactly contact, revision and snapshot; file: a sidecar). A gateway
// restarted an hour later (its clock an hour ahead) during the outage,
// with max_stale 30m and fail_closed, starts from the persisted
// configuration already stale: its first request gets the fail-closed
// 503, and Status says LastContact is the persisted contact and
// Staleness at least an hour. Once with Redis, once with a file.
func TestAgentStaleCountsFromPersistedContact(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		for _, c := range []struct {
			name      string
			persister func(t *testing.T) (dataplane.ContactPersister, func() []string)
		}{
			{"redis", func(t *testing.T) (dataplane.ContactPersister, func() []string) {
				client := redistest.Start(t).Client(t, nil)
				return dataplane.NewRedisPersister(client, testGroup), func() []string {
					fields, err := client.HKeys(context.Background(), dataplane.RedisConfigKey(testGroup)).Result()
					if err != nil {
						t.Fatal(err)
					}
					slices.Sort(fields)
					return fields
				}
			}},
			{"file", func(t *testing.T) (dataplane.ContactPersister, func() []string) {
				return dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}, nil
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				persister, fields := c.persister(t)
				ctx := context.Background()
				contact := func() time.Time {
					t.Helper()
					ct, err := persister.LoadContact(ctx)
					if err != nil {
						t.Fatal(err)
					}
					return ct
				}
				if ct := contact(); !ct.IsZero() {
					t.Fatalf("a contact before any: %v", ct)
				}
				cp := newControlPlane(t, snapshot(0, "k1"))
				g1 := newTarget(t)
				o := agentOptions(g1.tg, cp.addr, &lockedBuffer{})
				o.Persister = persister
				o.ContactSaveInterval = 20 * time.Millisecond
				a1, err := dataplane.New(o)
				if err != nil {
					t.Fatal(err)
				}
				stop1 := runAgent(t, a1)
				waitFor(t, "revision 1 persisted", func() bool { return a1.Status().PersistedRevision == 1 })
				waitFor(t, "a contact persisted", func() bool { return !contact().IsZero() })
				first := contact()
				waitFor(t, "a later contact persisted while connected", func() bool { return contact().After(first) })
				stop1()
				cp.Stop()
				saved := contact()
				if fields != nil {
					if got := fmt.Sprint(fields()); got != "[contact history revision snapshot]" {
						t.Fatalf("hash fields %s, want [contact history revision snapshot]", got)
					}
				}

				g2 := newTarget(t)
				o = agentOptions(g2.tg, cp.addr, &lockedBuffer{})
				o.Persister = persister
				o.StartTimeout = 100 * time.Millisecond
				o.GatewayID = "gw-2"
				o.MaxStale = 30 * time.Minute
				o.OnStale = dataplane.StaleFailClosed
				o.Now = func() time.Time { return time.Now().Add(time.Hour) }
				a2, err := dataplane.New(o)
				if err != nil {
					t.Fatal(err)
				}
				runAgent(t, a2)
				waitFor(t, "the persisted configuration", func() bool { return a2.Status().Source == "persisted" })
				want := `{"error":"dataplane: no contact with the control plane for over 30m0s; failing closed (on_stale: fail_closed)"}` + "\n"
				if st, body := g2.get(t, "k1"); st != 503 || body != want {
					t.Fatalf("the first request after the restart: %d %s, want 503 %s", st, body, want)
				}
				st := a2.Status()
				if !st.Stale || st.LastContact == nil || !st.LastContact.Equal(saved) || st.Staleness < time.Hour || st.AppliedRevision != 1 {
					t.Fatalf("status after the restart: %+v (persisted contact %v)", st, saved)
				}
			})
		}
	})
}

// TestContactPersisters: LoadContact is the zero time before any save,
// then what SaveContact saved (Redis: to the millisecond); Redis keeps
// the later of two contacts (gateways of a group save concurrently), the
// file the last saved; neither touches the persisted configuration.
func TestContactPersisters(t *testing.T) {
	ctx := context.Background()
	t1 := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	t0 := t1.Add(-time.Minute)
	for _, c := range []struct {
		name       string
		p          dataplane.ContactPersister
		afterOlder time.Time
	}{
		{"redis", dataplane.NewRedisPersister(redistest.Start(t).Client(t, nil), testGroup), t1},
		{"file", dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}, t0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := c.p.LoadContact(ctx); err != nil || !got.IsZero() {
				t.Fatalf("LoadContact before any save: %v, %v", got, err)
			}
			if err := c.p.Save(ctx, snapshot(5, "k1")); err != nil {
				t.Fatal(err)
			}
			if err := c.p.SaveContact(ctx, t1); err != nil {
				t.Fatal(err)
			}
			if got, err := c.p.LoadContact(ctx); err != nil || !got.Equal(t1) {
				t.Fatalf("LoadContact: %v, %v; want %v", got, err, t1)
			}
			if err := c.p.SaveContact(ctx, t0); err != nil {
				t.Fatal(err)
			}
			if got, err := c.p.LoadContact(ctx); err != nil || !got.Equal(c.afterOlder) {
				t.Fatalf("LoadContact after an older save: %v, %v; want %v", got, err, c.afterOlder)
			}
			snap, err := c.p.Load(ctx)
			if err != nil || snap == nil || snap.Revision != 5 || len(snap.Keys) != 1 {
				t.Fatalf("Load after SaveContact: %+v, %v", snap, err)
			}
		})
	}
}
