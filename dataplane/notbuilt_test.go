package dataplane_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// unsetSecretEnv is an environment variable no test sets.
const unsetSecretEnv = "LP_DATAPLANE_TEST_UNSET_SECRET"

// hmacAPI is a jwt API at /<id>/ whose one HS256 key is k.
func hmacAPI(id string, k spec.JWTKey) spec.API {
	return spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
		JWT: &spec.JWT{Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{k}, DefaultPolicies: []string{"p"}}}
}

// nextReport returns the gateway's next DigestReport, skipping nothing
// else (the test expects no Ack or Nack meanwhile).
func (s *fakeStream) nextReport(t *testing.T) *syncpb.DigestReport {
	t.Helper()
	select {
	case m, ok := <-s.recv:
		if !ok || m.GetDigestReport() == nil {
			t.Fatalf("got %v, want a DigestReport", m)
		}
		return m.GetDigestReport()
	case <-time.After(20 * time.Second):
		t.Fatal("no DigestReport within 20 s")
		return nil
	}
}

// TestAgentAppliesWithoutUnbuildableAPIs delivers a snapshot with two
// JWT APIs the gateway cannot build: the agent Acks it listing both (not
// only the first), a key delete that follows as Changes applies, a
// DigestReport carries the digest of the snapshot as delivered (no drift)
// and both APIs again, and a later snapshot without them is Acked with an
// empty list.
func TestAgentAppliesWithoutUnbuildableAPIs(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		missing := filepath.Join(t.TempDir(), "missing.secret")
		bad := snapshot(1, "k1", "k2")
		bad.APIs = append(bad.APIs, hmacAPI("jwt-env", spec.JWTKey{SecretEnv: unsetSecretEnv}), hmacAPI("jwt-file", spec.JWTKey{SecretFile: missing}))
		s.sendSnapshot(t, bad, "snap-1")
		want := []*syncpb.NotBuilt{
			{Api: "jwt-env", Problem: "spec: keys[0].secret_env: environment variable " + unsetSecretEnv + " is not set"},
			{Api: "jwt-file", Problem: "spec: keys[0].secret_file: open " + missing + ": no such file or directory"},
		}
		m := s.answer(t)
		if ack := m.GetAck(); ack == nil || ack.GetRevision() != 1 || ack.GetNonce() != "snap-1" || !notBuiltEqual(ack.GetNotBuilt(), want) {
			t.Fatalf("got %v, want Ack{1, snap-1} listing %v", m, want)
		}
		if st, body := g.get(t, "k1"); st != 200 {
			t.Fatalf("k1 on the built API: %d %s", st, body)
		}

		ch := changes(t, bad, 1, 2, protocol.Delete(syncpb.Change_OBJECT_KEY, hash("k1")))
		s.sendChanges(t, ch)
		m = s.answer(t)
		if ack := m.GetAck(); ack == nil || ack.GetRevision() != 2 || !notBuiltEqual(ack.GetNotBuilt(), want) {
			t.Fatalf("got %v, want Ack{2} listing %v", m, want)
		}
		if st, _ := g.get(t, "k1"); st != 403 {
			t.Errorf("deleted k1: %d, want 403", st)
		}
		if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_DigestRequest{DigestRequest: &syncpb.DigestRequest{}}}); err != nil {
			t.Fatal(err)
		}
		r := s.nextReport(t)
		if r.GetRevision() != 2 || r.GetDigest() != ch.Digest || !notBuiltEqual(r.GetNotBuilt(), want) {
			t.Errorf("DigestReport %v, want revision 2, digest %s (as delivered), listing %v", r, ch.Digest, want)
		}
		if st := a.Status(); st.LastError != "" || st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, ChangesApplied: 1}) {
			t.Errorf("status: %+v", st)
		}

		s.sendSnapshot(t, snapshot(3, "k2"), "snap-3")
		m = s.answer(t)
		if ack := m.GetAck(); ack == nil || ack.GetRevision() != 3 || len(ack.GetNotBuilt()) != 0 {
			t.Fatalf("got %v, want Ack{3} with nothing not built", m)
		}
		if nb := g.tg.NotBuilt(); nb != nil {
			t.Errorf("gateway NotBuilt after a good revision: %+v", nb)
		}
	})
}

func notBuiltEqual(got, want []*syncpb.NotBuilt) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			return false
		}
	}
	return true
}

// TestNotBuiltShownAndClearedOnControlPlane runs an agent against the
// real SyncServer with a JWT API whose secret_file is missing: the
// control plane's DataPlanes entry lists it with the revision applied;
// writing the file lets the gateway's own retry build it, and the entry's
// list empties without a new revision.
func TestNotBuiltShownAndClearedOnControlPlane(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		secretFile := filepath.Join(t.TempDir(), "hmac.secret")
		snap := snapshot(0, "k1")
		snap.APIs = append(snap.APIs, hmacAPI("jwt", spec.JWTKey{SecretFile: secretFile}))
		cp := newControlPlane(t, snap)
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, cp.addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		entry := func() controlplane.DataPlane {
			for _, dp := range cp.dps.List() {
				if dp.GatewayID == "gw-test" {
					return dp
				}
			}
			return controlplane.DataPlane{}
		}
		want := []controlplane.NotBuilt{{API: "jwt", Problem: "spec: keys[0].secret_file: open " + secretFile + ": no such file or directory"}}
		waitFor(t, "revision 1 applied with jwt not built", func() bool {
			e := entry()
			return e.AppliedRevision == 1 && reflect.DeepEqual(e.NotBuilt, want)
		})
		if err := os.WriteFile(secretFile, []byte(strings.Repeat("s", 32)), 0o600); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "jwt built and the list cleared", func() bool {
			e := entry()
			return e.AppliedRevision == 1 && e.NotBuilt == nil && g.tg.NotBuilt() == nil
		})
		if e := entry(); e.LastRejection != nil || !e.Connected {
			t.Errorf("entry %+v", e)
		}
	})
}
