package controlplane_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// replica starts another sync server over f's store, on its own gRPC
// server and with its own DataPlanes and digest cache: a replica of the
// same state, as a second control-plane process on a shared database
// would be.
func (f *syncFixture) replica(t *testing.T) *syncFixture {
	t.Helper()
	r := &syncFixture{store: f.store, dps: &controlplane.DataPlanes{Now: func() time.Time { return syncNow }}, log: &lockedBuffer{}, opts: f.opts}
	r.serve(t)
	return r
}

// A data plane that ran revision 1 from one replica and connects to
// another (which never delivered anything) gets the writes made
// meanwhile as Changes, with the digest the first replica would send;
// more writes follow as Changes; in a view that leaves APIs out too.
func TestSyncReplicaContinuesWithChanges(t *testing.T) {
	a := newSyncFixture(t, 0)
	stream := a.open(t, goodHello())
	runs, nonce, digest, _ := recvSnapshot(t, stream)
	ack(t, stream, 1, nonce)
	closeAndWait(t, stream)

	b, c := hash("b"), hash("c")
	update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"global"}})
	})
	update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: c, Policies: []string{"global"}})
	})
	update(t, a.store, func(tx controlplane.Tx) error { _, err := tx.DeleteKey(hash("a")); return err })

	r := a.replica(t)
	h := goodHello()
	h.LastAppliedRevision, h.Digest = 1, digest
	stream = r.open(t, h)
	ch := recvChanges(t, stream)
	if ch.FromRevision != 1 || ch.Revision != 4 || len(ch.Changes) != 3 {
		t.Fatalf("on the other replica: Changes %d→%d with %d changes, want 1→4 with 3", ch.FromRevision, ch.Revision, len(ch.Changes))
	}
	runs = applyChecked(t, r, runs, ch, []string{"eu"})
	ack(t, stream, 4, ch.Nonce)

	rev := update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"global"}, Inactive: true})
	})
	ch = recvChanges(t, stream)
	if ch.FromRevision != 4 || ch.Revision != rev || len(ch.Changes) != 1 {
		t.Fatalf("next write: Changes %d→%d with %d changes, want 4→%d with 1", ch.FromRevision, ch.Revision, len(ch.Changes), rev)
	}
	applyChecked(t, r, runs, ch, []string{"eu"})
	closeAndWait(t, stream)
	if dps := r.dps.List(); len(dps) != 1 || dps[0].AppliedRevision != 4 {
		t.Fatalf("the replica's DataPlanes %+v, want gw-a at revision 4 (its Ack)", dps)
	}
}

// A data plane whose view is the identity gets policy and API changes
// from a replica that did not deliver its revision; one whose view
// leaves APIs out gets a snapshot after a policy change (as from the
// replica that delivered it).
func TestSyncReplicaPolicyAndAPIChanges(t *testing.T) {
	a := newSyncFixture(t, 0)
	allHello := &syncpb.Hello{Group: "all-1", Tags: []string{"us", "eu"}, Token: syncTokenAll, GatewayId: "gw-all"}
	all := a.open(t, allHello)
	allRuns, _, allDigest, _ := recvSnapshot(t, all)
	closeAndWait(t, all)
	eu := a.open(t, goodHello())
	_, _, euDigest, _ := recvSnapshot(t, eu)
	closeAndWait(t, eu)

	update(t, a.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 5)) })
	update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutAPI(spec.API{ID: "us2", ListenPath: "/us2/", Target: spec.BuiltinEcho, Tags: []string{"us"}})
	})
	update(t, a.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("global", 50)) })

	r := a.replica(t)
	allHello.LastAppliedRevision, allHello.Digest = 1, allDigest
	all = r.open(t, allHello)
	ch := recvChanges(t, all)
	if ch.FromRevision != 1 || ch.Revision != 4 || len(ch.Changes) != 3 {
		t.Fatalf("identity view: Changes %d→%d with %d changes, want 1→4 with 3", ch.FromRevision, ch.Revision, len(ch.Changes))
	}
	applyChecked(t, r, allRuns, ch, []string{"eu", "us"})
	closeAndWait(t, all)

	h := goodHello()
	h.LastAppliedRevision, h.Digest = 1, euDigest
	eu = r.open(t, h)
	snap, _, sent, _ := recvSnapshot(t, eu)
	if want := applyNothing(t, r, []string{"eu"}); snap.Revision != 4 || sent != protocol.Digest(want) {
		t.Fatalf("filtered view: snapshot of revision %d digest %s, want 4 and %s", snap.Revision, sent, protocol.Digest(want))
	}
	closeAndWait(t, eu)
}

// On a replica that did not deliver it, a Hello whose digest is not
// that of its revision (drift) gets a snapshot; one at the current
// revision with the right digest gets a DigestRequest only; one whose
// changes the change log no longer holds gets a snapshot.
func TestSyncReplicaDriftAndInStep(t *testing.T) {
	a := newSyncFixtureOpts(t, fixtureOptions{bolt: controlplane.BoltOptions{ChangeLogRevisions: 2}})
	stream := a.open(t, goodHello())
	_, _, digest, _ := recvSnapshot(t, stream)
	closeAndWait(t, stream)
	update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("b"), Policies: []string{"global"}})
	})

	h := goodHello()
	h.LastAppliedRevision, h.Digest = 1, protocol.Digest(&spec.Snapshot{}) // not what revision 1 was
	stream = a.replica(t).open(t, h)
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 2 {
		t.Fatalf("drift: snapshot of revision %d, want 2", snap.Revision)
	}
	closeAndWait(t, stream)

	h.LastAppliedRevision, h.Digest = 2, protocol.Digest(applyNothing(t, a, []string{"eu"}))
	stream = a.replica(t).open(t, h)
	if m, err := stream.Recv(); err != nil || m.GetDigestRequest() == nil {
		t.Fatalf("in step: got %v, %v; want a DigestRequest (and nothing else)", m, err)
	}
	closeAndWait(t, stream)

	for _, k := range []string{"c", "d", "e"} {
		update(t, a.store, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash(k), Policies: []string{"global"}})
		})
	}
	h.LastAppliedRevision, h.Digest = 1, digest // its changes are gone from the log
	stream = a.replica(t).open(t, h)
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 5 || protocol.Digest(snap) != protocol.Digest(applyNothing(t, a, []string{"eu"})) {
		t.Fatalf("too far behind: snapshot of revision %d, want 5", snap.Revision)
	}
	closeAndWait(t, stream)
}

// Many data planes with the same tags and revision that connect to a
// fresh replica at once all get the same Changes (the view they share is
// computed once and read by all; -race checks the sharing).
func TestSyncReplicaManyAtOnce(t *testing.T) {
	a := newSyncFixture(t, 0)
	stream := a.open(t, goodHello())
	runs, _, digest, _ := recvSnapshot(t, stream)
	closeAndWait(t, stream)
	rev := update(t, a.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("b"), Policies: []string{"global"}})
	})
	want := protocol.Digest(applyNothing(t, a, []string{"eu"}))

	r := a.replica(t)
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			h := goodHello()
			h.GatewayId = fmt.Sprintf("gw-%d", i)
			h.LastAppliedRevision, h.Digest = 1, digest
			s := r.open(t, h)
			m, err := s.Recv()
			switch {
			case err != nil:
				errs <- fmt.Errorf("gw-%d: %w", i, err)
			case m.GetChanges() == nil:
				errs <- fmt.Errorf("gw-%d: got %v, want Changes", i, m)
			default:
				ch := m.GetChanges()
				next, err := protocol.ApplyChanges(runs, ch)
				if err != nil || ch.FromRevision != 1 || ch.Revision != rev || ch.Digest != want || protocol.Digest(next) != want {
					errs <- fmt.Errorf("gw-%d: Changes %d→%d digest %s (%v), want 1→%d and %s", i, ch.FromRevision, ch.Revision, ch.Digest, err, rev, want)
				}
			}
			if err := s.CloseSend(); err != nil {
				errs <- err
			}
			for {
				if _, err := s.Recv(); err != nil {
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
