package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// outageStore is a test double of a store's database going away: a
// real Bolt store behind it answers every call, except that while down
// is set the calls fail as a database-backed store's do when its
// database cannot be reached (wrapping controlplane.ErrStoreUnavailable)
// and change nothing. It puts an outage at an exact moment of a test
// (between a write and its delivery, say); the PostgreSQL store's own
// tests stop a real PostgreSQL. It is not a RevisionWatcher, so a sync
// server polls it (see watchingOutageStore).
type outageStore struct {
	bolt  *controlplane.Bolt
	down  atomic.Bool
	fails atomic.Int64 // calls failed while down
}

var errOutage = fmt.Errorf("outage test double: dial tcp 127.0.0.1:5432: connect: connection refused: %w", controlplane.ErrStoreUnavailable)

// failed returns errOutage, counted, while the store is down.
func (s *outageStore) failed() error {
	if !s.down.Load() {
		return nil
	}
	s.fails.Add(1)
	return errOutage
}

func (s *outageStore) Update(ctx context.Context, fn func(tx controlplane.Tx) error) (uint64, error) {
	if err := s.failed(); err != nil {
		return 0, err
	}
	return s.bolt.Update(ctx, fn)
}

func (s *outageStore) View(ctx context.Context, fn func(r controlplane.Reader) error) error {
	if err := s.failed(); err != nil {
		return err
	}
	return s.bolt.View(ctx, fn)
}

func (s *outageStore) ChangesSince(ctx context.Context, rev uint64) ([]controlplane.Change, error) {
	if err := s.failed(); err != nil {
		return nil, err
	}
	return s.bolt.ChangesSince(ctx, rev)
}

func (s *outageStore) Snapshot(ctx context.Context, tags []string) (*spec.Snapshot, error) {
	if err := s.failed(); err != nil {
		return nil, err
	}
	return s.bolt.Snapshot(ctx, tags)
}

func (s *outageStore) History(ctx context.Context) (string, error) {
	if err := s.failed(); err != nil {
		return "", err
	}
	return s.bolt.History(ctx)
}

func (s *outageStore) ForkHistory(ctx context.Context, from string) (string, error) {
	if err := s.failed(); err != nil {
		return "", err
	}
	return s.bolt.ForkHistory(ctx, from)
}

func (s *outageStore) Close() error { return s.bolt.Close() }

// watchingOutageStore is an outageStore that announces the writes of its
// Bolt store, written through it or not (as a PostgreSQL replica hears of
// another replica's writes), like a store that is a RevisionWatcher.
type watchingOutageStore struct{ *outageStore }

func (s watchingOutageStore) RevisionChanged() <-chan struct{} { return s.bolt.RevisionChanged() }

// newOutageStore opens a Bolt store with policy gold (a quota of 3 an
// hour), API eu at /eu/ and key k1 on gold, at revision 3, behind an
// outageStore.
// newOutageStores returns a new outageStore and the store a sync server
// is given: s itself (polled), or when watch, s announcing writes.
func newOutageStores(t *testing.T, watch bool) (*outageStore, controlplane.Store) {
	t.Helper()
	s := newOutageStore(t)
	if watch {
		return s, watchingOutageStore{s}
	}
	return s, s
}

func newOutageStore(t *testing.T) *outageStore {
	t.Helper()
	b, _ := open(t, controlplane.BoltOptions{})
	update(t, b, func(tx controlplane.Tx) error {
		return tx.PutPolicy(spec.Policy{ID: "gold", Quota: &spec.Quota{Max: 3, Renewal: spec.Duration(time.Hour)}})
	})
	update(t, b, func(tx controlplane.Tx) error {
		return tx.PutAPI(spec.API{ID: "eu", ListenPath: "/eu/", Target: spec.BuiltinEcho})
	})
	update(t, b, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("k1"), Policies: []string{"gold"}})
	})
	return &outageStore{bolt: b}
}

// TestAdminWhileStoreUnavailable: while the store's database is
// unavailable every admin call that reads or writes the state answers
// 503 with Retry-After and says so (a write: nothing was changed), the
// outage is logged once, not per call; the registry of data planes,
// which is not in the store, still answers; and once the database is
// back the state is as it was and writes go through.
func TestAdminWhileStoreUnavailable(t *testing.T) {
	s := newOutageStore(t)
	var log lockedBuffer
	base := adminOver(t, s, controlplane.AdminOptions{Log: slog.New(slog.NewTextHandler(&log, nil))})
	before := call(t, "GET", base+"/api/export", "").body
	k := hash("k1")
	imp := `{"format_version":1,"policies":[{"id":"p"}],"apis":[],"keys":[]}`

	s.down.Store(true)
	const cause = "outage test double: dial tcp 127.0.0.1:5432: connect: connection refused: controlplane: the store's database is unavailable"
	calls := []struct{ method, path, body string }{
		{"GET", "/api/policies", ""},
		{"GET", "/api/policies/gold", ""},
		{"PUT", "/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`},
		{"DELETE", "/api/policies/gold", ""},
		{"GET", "/api/apis", ""},
		{"GET", "/api/apis/eu", ""},
		{"PUT", "/api/apis/us", `{"listen_path":"/us/","target":"builtin:echo"}`},
		{"DELETE", "/api/apis/eu", ""},
		{"GET", "/api/keys", ""},
		{"GET", "/api/keys?limit=5&after=" + k, ""},
		{"POST", "/api/keys", `{"key":"k2","policies":["gold"]}`},
		{"PUT", "/api/keys/" + k, `{"policies":["gold"]}`},
		{"PUT", "/api/keys/" + k + "?suppress_reset=1", `{"policies":["gold"]}`},
		{"GET", "/api/keys/" + k, ""},
		{"DELETE", "/api/keys/" + k, ""},
		{"POST", "/api/keys/" + k + "/reset-quota", ""},
		{"POST", "/api/keys:batch", `{"keys":[{"key":"k3","policies":["gold"]}]}`},
		{"GET", "/api/export", ""},
		{"POST", "/api/import", imp},
		{"GET", "/api/revision", ""},
	}
	for _, c := range calls {
		what := "nothing was changed"
		if c.method == "GET" {
			what = "nothing was read"
		}
		a := call(t, c.method, base+c.path, c.body)
		want := `{"error":"the control plane's database is unavailable; ` + what + `; retry in a few seconds (` + cause + `)"}`
		if a.status != 503 || a.body != want || a.header.Get("Retry-After") != "2" {
			t.Fatalf("%s %s: %d Retry-After %q %s\nwant 503 Retry-After \"2\" %s", c.method, c.path, a.status, a.header.Get("Retry-After"), a.body, want)
		}
	}
	expect(t, call(t, "GET", base+"/api/dataplanes", ""), 200, `{"dataplanes":[]}`)
	if got := strings.Count(log.String(), `msg="controlplane: admin call failed: the store's database is unavailable"`); got != 1 {
		t.Fatalf("%d outage lines, want 1 for the first failure (the others are counted):\n%s", got, log.String())
	}
	if n := s.fails.Load(); n != int64(len(calls)) {
		t.Fatalf("%d store calls failed, want %d", n, len(calls))
	}

	s.down.Store(false)
	expect(t, call(t, "GET", base+"/api/export", ""), 200, before)
	expect(t, call(t, "PUT", base+"/api/policies/silver", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":4}`)
	expect(t, call(t, "POST", base+"/api/import", imp), 200, `{"revision":5}`)
}

// TestReadyzWhileStoreUnavailable: /readyz answers 503 and says why
// while the store's database is unavailable, and 200 again once it is
// back; /healthz answers 200 throughout.
func TestReadyzWhileStoreUnavailable(t *testing.T) {
	s := newOutageStore(t)
	h, err := controlplane.Health(controlplane.HealthOptions{Store: s, CacheFor: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 200, `{"ready":true,"revision":3}`)
	s.down.Store(true)
	expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 503,
		`{"ready":false,"error":"controlplane: the store's database is unavailable (admin calls answer 503 until it returns; open sync streams keep serving what they have): outage test double: dial tcp 127.0.0.1:5432: connect: connection refused: controlplane: the store's database is unavailable"}`)
	expect(t, callWith(t, "GET", srv.URL+"/healthz", "", ""), 200, `{"ok":true}`)
	s.down.Store(false)
	expect(t, callWith(t, "GET", srv.URL+"/readyz", "", ""), 200, `{"ready":true,"revision":3}`)
}

// TestSyncStreamsStayOpenWhileStoreUnavailable: a gateway follows a sync
// server over a store whose database becomes unavailable, polled or
// announcing writes. The sync server meets the outage again and again
// (polling the revision; trying the delivery of a write made meanwhile
// through another way to the database, as another replica would), yet
// the stream stays open (the agent never reconnects), the gateway keeps
// enforcing what it runs, and once the database is back the write
// reaches it over the same stream.
func TestSyncStreamsStayOpenWhileStoreUnavailable(t *testing.T) {
	for _, watch := range []bool{false, true} {
		t.Run(map[bool]string{false: "polled", true: "watched"}[watch], func(t *testing.T) {
			s, store := newOutageStores(t, watch)
			f := follow(t, store, 5*time.Millisecond)
			f.waitApplied(t, 3)

			s.down.Store(true)
			if !watch {
				waitFails(t, s, 20) // 20 polls that failed
			}
			// A write the store's database took while this replica could
			// not read it.
			rev := update(t, s.bolt, func(tx controlplane.Tx) error {
				return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"gold"}})
			})
			waitFails(t, s, s.fails.Load()+20) // deliveries, or polls, tried again
			wantStatuses(t, "k1 during the outage", f.statuses(t, "/eu/x", "k1", 4), 200, 200, 200, 429)
			wantStatuses(t, "k2, not delivered yet", f.statuses(t, "/eu/x", "k2", 1), 403)
			if st := f.agent.Status(); st.Reconnects != 0 || st.State != "connected" || st.AppliedRevision != 3 {
				t.Fatalf("during the outage: %+v; want the first stream still connected at revision 3", st)
			}

			s.down.Store(false)
			f.waitApplied(t, rev)
			wantStatuses(t, "k2 after the outage", f.statuses(t, "/eu/x", "k2", 1), 200)
			if st := f.agent.Status(); st.Reconnects != 0 || st.State != "connected" {
				t.Fatalf("after the outage: %+v; want the first stream still connected", st)
			}
		})
	}
}

// outageStream opens a sync stream for gateway gw-1 to a sync server over
// store (polled every 300 ms unless store announces writes), receives
// the first snapshot and acks it; it returns the stream, the snapshot's
// revision and digest.
func outageStream(t *testing.T, store controlplane.Store) (syncStream, uint64, string) {
	t.Helper()
	addr := serveSync(t, store, 300*time.Millisecond)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sendMsg(t, stream, &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: &syncpb.Hello{
		Group: "g", Tags: []string{"eu", "us"}, Token: followToken, GatewayId: "gw-1"}}})
	snap, nonce, digest, _ := recvSnapshot(t, stream)
	ack(t, stream, snap.Revision, nonce)
	return stream, snap.Revision, digest
}

// recvWithin returns the next message on stream, failing the test when
// none comes within d.
func recvWithin(t *testing.T, stream syncStream, d time.Duration, what string) *syncpb.ServerMessage {
	t.Helper()
	got := make(chan *syncpb.ServerMessage, 1)
	go func() {
		if m, err := stream.Recv(); err == nil {
			got <- m
		}
	}()
	select {
	case m := <-got:
		return m
	case <-time.After(d):
		t.Fatalf("%s: nothing received within %v", what, d)
		return nil
	}
}

// TestSyncRetryOutlivesGatewayMessages: a delivery that failed because the
// store was unavailable is tried again after PollInterval even when the
// gateway sends a message meanwhile (here its periodic DigestReport, which
// matches what it runs). Such a message once cleared the stream's pending
// delivery, and with a store that announces writes nothing woke the
// stream again: the write made during the outage never reached the
// gateway after the database came back, until the next write.
func TestSyncRetryOutlivesGatewayMessages(t *testing.T) {
	s := newOutageStore(t)
	stream, runs, digest := outageStream(t, watchingOutageStore{s})

	s.down.Store(true)
	before := s.fails.Load()
	rev := update(t, s.bolt, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"gold"}})
	})
	waitFails(t, s, before+1) // the delivery the write announced failed; a retry is due in 300 ms
	sendMsg(t, stream, &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_DigestReport{DigestReport: &syncpb.DigestReport{Revision: runs, Digest: digest}}})
	// The store comes back after the stream has read the report (if it
	// has not by then, the retry is due either way: the test passes but
	// proves less).
	time.Sleep(100 * time.Millisecond)
	s.down.Store(false)

	m := recvWithin(t, stream, 5*time.Second, "after the store came back")
	if c := m.GetChanges(); c == nil || c.GetRevision() != rev {
		t.Fatalf("got %v, want the changes to revision %d", m, rev)
	}
}

// TestSyncSnapshotOwedOutlivesOutage: a gateway refuses Changes while the
// store is unavailable, so the snapshot it is owed cannot be read; once
// the store is back the snapshot comes, polled or announced. A poll that
// found the revision unchanged once cleared the owed delivery (about
// every other time, as the poll or the retry came first).
func TestSyncSnapshotOwedOutlivesOutage(t *testing.T) {
	for _, watch := range []bool{false, true} {
		t.Run(map[bool]string{false: "polled", true: "watched"}[watch], func(t *testing.T) {
			s, store := newOutageStores(t, watch)
			for round := range 3 {
				stream, _, _ := outageStream(t, store)
				rev := update(t, s.bolt, func(tx controlplane.Tx) error {
					return tx.PutKey(spec.Key{KeyHash: hash(fmt.Sprintf("k%d", round+2)), Policies: []string{"gold"}})
				})
				ch := recvChanges(t, stream)
				if ch.GetRevision() != rev {
					t.Fatalf("round %d: changes to %d, want %d", round, ch.GetRevision(), rev)
				}
				s.down.Store(true)
				before := s.fails.Load()
				nack(t, stream, ch.GetRevision(), ch.GetNonce(), "refused")
				waitFails(t, s, before+1) // the snapshot owed could not be read
				// Let a poll or two fail too, then bring the store back
				// at some point of the poll's and the retry's phases.
				time.Sleep(time.Duration(350+round*100) * time.Millisecond)
				s.down.Store(false)
				m := recvWithin(t, stream, 5*time.Second, fmt.Sprintf("round %d, after the store came back", round))
				if c := m.GetSnapshotChunk(); c == nil {
					t.Fatalf("round %d: got %v, want the snapshot a Nack of Changes asks for", round, m)
				}
			}
		})
	}
}

// waitFails waits (20 s at most) until n calls of s failed.
func waitFails(t *testing.T, s *outageStore, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.fails.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d store calls failed, want %d", s.fails.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
