package dataplane_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane"
)

// TestAgentHistory: within one control-plane history a lower revision is
// refused; a snapshot of another history replaces the running
// configuration whatever its revision, is persisted with its history,
// and the next Hello names it.
func TestAgentHistory(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		o := agentOptions(g.tg, addr, &lockedBuffer{})
		p := dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}
		o.Persister, o.SaveDelay = p, 20*time.Millisecond
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		if h := s.hello.GetHistory(); h != "" {
			t.Fatalf("first Hello names history %q, want none", h)
		}
		s.sendSnapshotOf(t, snapshot(5, "k1"), "n1", "H1")
		s.wantAck(t, 5, "n1")
		if st := a.Status(); st.AppliedRevision != 5 || st.History != "H1" {
			t.Fatalf("status %+v, want revision 5 of H1", st)
		}
		s.sendSnapshotOf(t, snapshot(3, "k2"), "n2", "H1")
		s.wantNack(t, 3, "n2", "live: snapshot revision is older than the running one (3 < 5)")
		s.sendSnapshotOf(t, snapshot(3, "k2"), "n3", "H2")
		s.wantAck(t, 3, "n3")
		if st := a.Status(); st.AppliedRevision != 3 || st.History != "H2" || g.tg.Revision() != 3 {
			t.Fatalf("status %+v (gateway at %d), want revision 3 of H2", st, g.tg.Revision())
		}
		if got := fmt.Sprint(g.statuses(t, "k1", 1), g.statuses(t, "k2", 1)); got != "[403] [200]" {
			t.Fatalf("k1, k2 after the snapshot of H2: %s, want [403] [200]", got)
		}
		waitFor(t, "revision 3 of H2 persisted", func() bool {
			snap, h, err := p.LoadHistory(context.Background())
			return err == nil && snap != nil && snap.Revision == 3 && h == "H2"
		})
		s.end <- status.Error(codes.Unavailable, "fake: restart")
		s = f.next(t)
		if h := s.hello; h.GetLastAppliedRevision() != 3 || h.GetHistory() != "H2" {
			t.Fatalf("Hello after the reconnect: revision %d of %q, want 3 of H2", h.GetLastAppliedRevision(), h.GetHistory())
		}
	})
}
