package e2e

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// logged reports whether a process's log holds text, as written or as
// slog's text handler quotes it.
func logged(log, text string) bool {
	q := strconv.Quote(text)
	return strings.Contains(log, text) || strings.Contains(log, q[1:len(q)-1])
}

// TestBadTokens starts gateways the control plane must refuse: one with
// a token it does not know, one with a good token asking for a tag outside
// its scope. Each refusal is logged by the control plane and shown in the
// gateway's /readyz (last_error; no configuration, so not ready); a
// refused gateway does not enter /api/dataplanes. A gateway with the right
// token and tags beside them is served.
func TestBadTokens(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "good-token"}
	cp := startControlPlane(t, []dpToken{tk, {group: "dp2", tags: []string{"dp2"}, token: "dp2-token"}}, cpOptions{})
	cp.putPolicy(t, quotaPolicy("q", 10))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	redis := redistest.Start(t)
	dp := &dataPlane{group: tk.group, tags: tk.tags, token: tk.token, redis: redis, redisAddr: redis.Addr}
	good := startGateway(t, dp, cp.syncAddr, "good", gwOptions{})
	wrong := startGateway(t, dp, cp.syncAddr, "wrong-token", gwOptions{token: "not-a-token"})
	foreign := startGateway(t, dp, cp.syncAddr, "foreign-tags", gwOptions{tags: []string{"dp1", "dp2"}})

	for _, c := range []struct {
		g             *gateway
		shown, series string
	}{
		{wrong, "unknown data-plane token", `limitplane_controlplane_sync_refused_total{reason="unauthenticated"}`},
		{foreign, `may not ask for tag "dp2"`, `limitplane_controlplane_sync_refused_total{reason="permission_denied"}`},
	} {
		r := waitReadyz(t, c.g, "the refusal in last_error", syncTimeout, func(r readiness) bool {
			return strings.Contains(r.ControlPlane.LastError, c.shown)
		})
		if r.Ready || r.ControlPlane.State == "connected" || r.ControlPlane.AppliedRevision != 0 {
			t.Errorf("gateway %s refused, yet /readyz says %+v %+v", c.g.id, r, r.ControlPlane)
		}
		// The control plane counts every refusal and logs them
		// rate-limited (the first at once, then a line per 5s).
		waitFor(t, "the control plane's count of "+c.g.id+"'s refusals", syncTimeout, func() (bool, string) {
			m := string(cp.mustAdmin(t, "GET", "/metrics", nil, 200))
			for line := range strings.Lines(m) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), c.series+" "); ok && v != "0" {
					return true, ""
				}
			}
			return false, tail(m, 2000)
		})
	}
	if log := cp.proc.stderr.String(); !logged(log, `msg="controlplane: sync stream refused"`) {
		t.Errorf("no refusal in the control plane's log:\n%s", tail(log, 2000))
	}
	rev := waitSynced(t, cp, good)
	waitConnected(t, cp, rev, good)
	for _, d := range cp.dataPlanes(t) {
		if d.GatewayID != "good" {
			t.Errorf("/api/dataplanes lists a refused gateway: %+v", d)
		}
	}
}

// fakeControlPlane is a SyncService server the test drives message by
// message: a gateway pointed at it gets exactly what the test sends.
type fakeControlPlane struct {
	syncpb.UnimplementedSyncServiceServer
	addr   string
	hellos chan *syncpb.Hello
	// answers gets the gateway's Acks and Nacks (DigestReports are
	// dropped).
	answers chan *syncpb.ClientMessage

	mu  sync.Mutex
	out chan *syncpb.ServerMessage // the latest stream's
}

func startFakeControlPlane(t *testing.T) *fakeControlPlane {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeControlPlane{addr: ln.Addr().String(), hellos: make(chan *syncpb.Hello, 16), answers: make(chan *syncpb.ClientMessage, 64)}
	srv := grpc.NewServer()
	syncpb.RegisterSyncServiceServer(srv, f)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return f
}

// Sync serves one stream: it passes the Hello on, then sends what the
// test queues and passes Acks and Nacks on.
func (f *fakeControlPlane) Sync(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	if m.GetHello() == nil {
		return status.Error(codes.InvalidArgument, "fake: the first message is not Hello")
	}
	out := make(chan *syncpb.ServerMessage, 64)
	f.mu.Lock()
	f.out = out
	f.mu.Unlock()
	select {
	case f.hellos <- m.GetHello():
	default:
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if m.GetDigestReport() == nil {
				select {
				case f.answers <- m:
				default:
				}
			}
		}
	}()
	for {
		select {
		case m := <-out:
			if err := stream.Send(m); err != nil {
				return err
			}
		case err := <-recvErr:
			return err
		}
	}
}

// send queues messages on the latest stream.
func (f *fakeControlPlane) send(t *testing.T, msgs ...*syncpb.ServerMessage) {
	t.Helper()
	f.mu.Lock()
	out := f.out
	f.mu.Unlock()
	if out == nil {
		t.Fatal("fake control plane: no stream")
	}
	for _, m := range msgs {
		out <- m
	}
}

// answer waits for the gateway's next Ack or Nack.
func (f *fakeControlPlane) answer(t *testing.T) *syncpb.ClientMessage {
	t.Helper()
	select {
	case m := <-f.answers:
		return m
	case <-time.After(syncTimeout):
		t.Fatal("fake control plane: no Ack or Nack within 30s")
		return nil
	}
}

func snapshotMessages(t *testing.T, snap *spec.Snapshot, nonce string, chunkBytes int) []*syncpb.ServerMessage {
	t.Helper()
	chunks, err := protocol.Chunks(snap, nonce, chunkBytes)
	if err != nil {
		t.Fatal(err)
	}
	var out []*syncpb.ServerMessage
	for _, c := range chunks {
		out = append(out, &syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: c}})
	}
	return out
}

func changesMessage(ch *syncpb.Changes) *syncpb.ServerMessage {
	return &syncpb.ServerMessage{Kind: &syncpb.ServerMessage_Changes{Changes: ch}}
}

// TestFakeControlPlaneBadDeliveries points a gateway at a fake control
// plane (a gRPC server on dataplane/syncpb in this test) that first sends
// a good snapshot (revision 1, in 64-byte chunks: Acked, a key passes),
// then deliveries that are malformed or invalid: a key whose JSON has an
// unknown field, a key naming a policy that does not exist, changes whose
// digest is not the result's, changes that do not start at the running
// revision, a snapshot whose first chunk is not 0, and a whole snapshot
// with an invalid key. Each is Nacked with its revision, nonce and the
// problem, which the gateway logs; its running configuration is untouched
// (applied revision 1, the key still passes, the refused key does not).
// A good delivery after them is applied.
func TestFakeControlPlaneBadDeliveries(t *testing.T) {
	t.Parallel()
	fake := startFakeControlPlane(t)
	redis := redistest.Start(t)
	dp := &dataPlane{group: "fake", tags: []string{"fake"}, token: "fake-token", redis: redis, redisAddr: redis.Addr}
	g := startGateway(t, dp, fake.addr, "fake-gw", gwOptions{})
	var hello *syncpb.Hello
	select {
	case hello = <-fake.hellos:
	case <-time.After(syncTimeout):
		t.Fatal("no Hello from the gateway")
	}
	if hello.GetGroup() != "fake" || !slices.Equal(hello.GetTags(), []string{"fake"}) || hello.GetToken() != "fake-token" ||
		hello.GetGatewayId() != "fake-gw" || hello.GetLastAppliedRevision() != 0 {
		t.Fatalf("Hello %v", hello)
	}

	hash := func(k string) string { return identity.HashKey(k).String() }
	base := &spec.Snapshot{Revision: 1,
		Policies: []spec.Policy{quotaPolicy("q100", 100)},
		Keys:     []spec.Key{{KeyHash: hash("fake-key"), Policies: []string{"q100"}}},
		APIs:     []spec.API{echoAPI("echo", "/echo/")},
	}
	fake.send(t, snapshotMessages(t, base, "nonce-1", 64)...)
	if a := fake.answer(t).GetAck(); a == nil || a.GetRevision() != 1 || a.GetNonce() != "nonce-1" {
		t.Fatalf("the good snapshot was not Acked: %v", a)
	}
	waitApplied(t, 1, g)

	key2 := func(policy string) *syncpb.Change {
		c, err := protocol.PutKey(&spec.Key{KeyHash: hash("fake-key-2"), Policies: []string{policy}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	digestAfter := func(ch *syncpb.Changes) string {
		next, err := protocol.ApplyChanges(base, ch)
		if err != nil {
			t.Fatal(err)
		}
		return protocol.Digest(next)
	}
	withDigest := func(ch *syncpb.Changes) *syncpb.Changes { ch.Digest = digestAfter(ch); return ch }
	unknownField := key2("q100")
	unknownField.Json = []byte(`{"key_hash":"` + hash("fake-key-2") + `","policies":["q100"],"bogus":1}`)
	badSnap := *base
	badSnap.Revision = 3
	badSnap.Keys = append(slices.Clone(base.Keys), spec.Key{KeyHash: hash("fake-key-2"), Policies: []string{"nope"}})
	goodSnap3 := *base
	goodSnap3.Revision = 3
	goodSnap3.Policies = append(slices.Clone(base.Policies), quotaPolicy("padding-to-make-several-chunks", 1))
	outOfOrder := snapshotMessages(t, &goodSnap3, "nonce-ooo", 64)
	if len(outOfOrder) < 3 {
		t.Fatalf("the snapshot makes %d chunks, want several", len(outOfOrder))
	}

	for _, c := range []struct {
		name     string
		msgs     []*syncpb.ServerMessage
		revision uint64
		nonce    string
		problem  string // in the Nack and the gateway's log; "" to check only that it is there
	}{
		{"a key with an unknown field", []*syncpb.ServerMessage{changesMessage(&syncpb.Changes{FromRevision: 1, Revision: 2, Nonce: "nonce-2a",
			Changes: []*syncpb.Change{unknownField}, Digest: digestAfter(&syncpb.Changes{FromRevision: 1, Revision: 2, Changes: []*syncpb.Change{key2("q100")}})})},
			2, "nonce-2a", "bogus"},
		{"a key naming an unknown policy", []*syncpb.ServerMessage{changesMessage(withDigest(&syncpb.Changes{FromRevision: 1, Revision: 2, Nonce: "nonce-2b",
			Changes: []*syncpb.Change{key2("nope")}}))}, 2, "nonce-2b", "nope"},
		{"a wrong digest", []*syncpb.ServerMessage{changesMessage(&syncpb.Changes{FromRevision: 1, Revision: 2, Nonce: "nonce-2c",
			Changes: []*syncpb.Change{key2("q100")}, Digest: "v1:" + strings.Repeat("0", 64)})}, 2, "nonce-2c", "digest mismatch"},
		{"changes from another revision", []*syncpb.ServerMessage{changesMessage(&syncpb.Changes{FromRevision: 7, Revision: 8, Nonce: "nonce-8",
			Changes: []*syncpb.Change{key2("q100")}, Digest: digestAfter(&syncpb.Changes{FromRevision: 1, Revision: 2, Changes: []*syncpb.Change{key2("q100")}})})},
			8, "nonce-8", ""},
		{"a snapshot starting at chunk 1", outOfOrder[1:2], 3, "nonce-ooo", ""},
		{"a snapshot with an invalid key", snapshotMessages(t, &badSnap, "nonce-3", 0), 3, "nonce-3", "nope"},
	} {
		before := len(g.proc.stderr.String())
		fake.send(t, c.msgs...)
		m := fake.answer(t)
		n := m.GetNack()
		if n == nil || n.GetRevision() != c.revision || n.GetNonce() != c.nonce || n.GetError() == "" || !strings.Contains(n.GetError(), c.problem) {
			t.Fatalf("%s: answered %v, want a Nack of revision %d nonce %s naming %q", c.name, m, c.revision, c.nonce, c.problem)
		}
		t.Logf("%s: Nack %q", c.name, n.GetError())
		waitFor(t, c.name+": the gateway's log of the Nack", syncTimeout, func() (bool, string) {
			log := g.proc.stderr.String()[before:]
			return logged(log, n.GetError()) || c.problem != "" && logged(log, c.problem), log
		})
		r, err := g.readyz()
		if err != nil {
			t.Fatal(err)
		}
		if r.ControlPlane.AppliedRevision != 1 || r.Revision != 1 || !r.Ready {
			t.Fatalf("%s: /readyz %+v %+v; want revision 1 still running", c.name, r, r.ControlPlane)
		}
		if status, body := sendOne(t, g, "/echo/x", "fake-key"); status != 200 {
			t.Fatalf("%s: the running key answered %d %s", c.name, status, body)
		}
		if status, _ := sendOne(t, g, "/echo/x", "fake-key-2"); status == 200 {
			t.Fatalf("%s: the refused key passes", c.name)
		}
	}

	fake.send(t, changesMessage(withDigest(&syncpb.Changes{FromRevision: 1, Revision: 2, Nonce: "nonce-2d", Changes: []*syncpb.Change{key2("q100")}})))
	if a := fake.answer(t).GetAck(); a == nil || a.GetRevision() != 2 || a.GetNonce() != "nonce-2d" {
		t.Fatalf("good changes after the bad ones were not Acked: %v", a)
	}
	waitApplied(t, 2, g)
	if status, body := sendOne(t, g, "/echo/x", "fake-key-2"); status != 200 {
		t.Fatalf("the key added by the good changes answered %d %s", status, body)
	}
}
