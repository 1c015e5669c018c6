package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// syncNow is the sync server's clock in these tests.
var syncNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const syncToken = "dp-secret-eu"

// syncFixture is a Bolt store with APIs tagged eu and us, a sync server
// over it on a real gRPC listener, and a client connection to it.
type syncFixture struct {
	srv   *controlplane.SyncServer
	store *controlplane.Bolt
	dps   *controlplane.DataPlanes
	log   *lockedBuffer
	conn  *grpc.ClientConn
	opts  fixtureOptions
	stop  func() // stops the gRPC server and closes conn
}

// pollingStore hides Bolt's RevisionChanged, so the sync server polls.
type pollingStore struct{ controlplane.Store }

// fixtureOptions vary the fixture.
type fixtureOptions struct {
	chunkBytes int
	poll       bool
	bolt       controlplane.BoltOptions
	sync       func(o *controlplane.SyncOptions) // edits the options; may be nil
}

// The second token's scope: every tag of the fixture's APIs, so its view
// is the identity.
const syncTokenAll = "dp-secret-all"

func newSyncFixture(t *testing.T, chunkBytes int) *syncFixture {
	t.Helper()
	return newSyncFixtureOpts(t, fixtureOptions{chunkBytes: chunkBytes})
}

func newSyncFixtureWith(t *testing.T, chunkBytes int, poll bool) *syncFixture {
	t.Helper()
	return newSyncFixtureOpts(t, fixtureOptions{chunkBytes: chunkBytes, poll: poll})
}

func newSyncFixtureOpts(t *testing.T, o fixtureOptions) *syncFixture {
	t.Helper()
	s, _ := open(t, o.bolt)
	update(t, s, func(tx controlplane.Tx) error {
		for _, a := range []spec.API{
			{ID: "all", ListenPath: "/all/", Target: spec.BuiltinEcho},
			{ID: "eu", ListenPath: "/eu/", Target: spec.BuiltinEcho, Tags: []string{"eu"}},
			{ID: "us", ListenPath: "/us/", Target: spec.BuiltinEcho, Tags: []string{"us"}},
		} {
			if err := tx.PutAPI(a); err != nil {
				return err
			}
		}
		if err := tx.PutPolicy(policy("global", 100)); err != nil {
			return err
		}
		return tx.PutKey(spec.Key{KeyHash: hash("a"), Policies: []string{"global"}})
	})
	f := &syncFixture{store: s, dps: &controlplane.DataPlanes{Now: func() time.Time { return syncNow }}, log: &lockedBuffer{}, opts: o}
	f.serve(t)
	return f
}

// serve starts a sync server over the fixture's store on a new gRPC
// server and connects to it; a second call is a control-plane restart
// with the same store (the first server is stopped).
func (f *syncFixture) serve(t *testing.T) {
	t.Helper()
	if f.stop != nil {
		f.stop()
	}
	var store controlplane.Store = f.store
	if f.opts.poll {
		store = pollingStore{f.store}
	}
	so := controlplane.SyncOptions{
		Store:        store,
		PollInterval: 5 * time.Millisecond,
		DataPlanes:   f.dps,
		Tokens: []controlplane.DataPlaneToken{
			{Hash: controlplane.HashToken(syncToken), Group: "eu-1", Tags: []string{"eu"}},
			{Hash: controlplane.HashToken(syncTokenAll), Group: "all-1", Tags: []string{"eu", "us"}},
		},
		ChunkBytes: f.opts.chunkBytes,
		Now:        func() time.Time { return syncNow },
		Log:        slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if f.opts.sync != nil {
		f.opts.sync(&so)
	}
	srv, err := controlplane.NewSyncServer(so)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	syncpb.RegisterSyncServiceServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	f.conn = conn
	var once sync.Once
	f.stop = func() {
		once.Do(func() {
			conn.Close()
			gs.Stop()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(f.stop)
}

type syncStream = grpc.BidiStreamingClient[syncpb.ClientMessage, syncpb.ServerMessage]

// open opens a stream and sends hello.
func (f *syncFixture) open(t *testing.T, hello *syncpb.Hello) syncStream {
	t.Helper()
	// The deadline only bounds a broken server; nothing waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := syncpb.NewSyncServiceClient(f.conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A server that has already ended the stream (a refusal, a shutdown)
	// makes Send return io.EOF; the status it ended with comes from Recv,
	// which the caller reads (grpc.ClientStream.SendMsg).
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return stream
}

func goodHello() *syncpb.Hello {
	return &syncpb.Hello{Group: "eu-1", Tags: []string{"eu"}, Token: syncToken, GatewayId: "gw-a", Version: "test"}
}

// recvSnapshot receives one whole snapshot; it returns the snapshot, its
// nonce, its digest as sent and the number of chunks.
func recvSnapshot(t *testing.T, stream syncStream) (*spec.Snapshot, string, string, int) {
	t.Helper()
	a := protocol.NewAssembler(protocol.AssemblerOptions{})
	for n := 1; ; n++ {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("chunk %d: %v", n, err)
		}
		c := m.GetSnapshotChunk()
		if c == nil {
			t.Fatalf("got %v, want a snapshot chunk", m)
		}
		snap, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		if snap != nil {
			return snap, c.GetNonce(), c.GetDigest(), n
		}
	}
}

// closeAndWait ends the client's side and waits for the server to end
// the stream cleanly: every message sent before has been handled.
func closeAndWait(t *testing.T, stream syncStream) {
	t.Helper()
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: got %v, %v; want io.EOF", m, err)
	}
}

func wantCode(t *testing.T, stream syncStream, code codes.Code) {
	t.Helper()
	m, err := stream.Recv()
	if status.Code(err) != code {
		t.Fatalf("got %v, %v; want status %s", m, err, code)
	}
}

// A wrong token is refused with Unauthenticated, a group or a tag outside
// the token's scope with PermissionDenied; each refusal is logged (the
// first of a server's at once: the log is rate-limited) and registers no
// data plane.
func TestSyncRefusesTokensOutsideScope(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(h *syncpb.Hello)
		code codes.Code
		log  string
	}{
		{"wrong token", func(h *syncpb.Hello) { h.Token = "dp-secret-eU" }, codes.Unauthenticated, "unknown data-plane token"},
		{"no token", func(h *syncpb.Hello) { h.Token = "" }, codes.Unauthenticated, "unknown data-plane token"},
		{"foreign tag", func(h *syncpb.Hello) { h.Tags = []string{"eu", "us"} }, codes.PermissionDenied, `the token may not ask for tag \"us\"`},
		{"foreign group", func(h *syncpb.Hello) { h.Group = "us-1" }, codes.PermissionDenied, `the token is not for group \"us-1\"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newSyncFixture(t, 0)
			h := goodHello()
			c.edit(h)
			before := strings.Count(f.log.String(), c.log)
			wantCode(t, f.open(t, h), c.code)
			if got := strings.Count(f.log.String(), c.log); got != before+1 {
				t.Errorf("log has %q %d times, want %d:\n%s", c.log, got, before+1, f.log.String())
			}
			if got := f.dps.List(); len(got) != 0 {
				t.Errorf("DataPlanes lists %v after a refusal, want none", got)
			}
		})
	}
	wantCode(t, newSyncFixture(t, 0).open(t, &syncpb.Hello{}), codes.Unauthenticated)
}

// TestSyncBoundsWhatAGatewaySends: a data plane holding a valid token
// cannot make the control plane keep or log large texts: a Hello whose
// gateway_id is over 256 bytes or has a control character is
// refused (InvalidArgument) and not listed, and a refusal of an
// unauthenticated Hello logs at most 1 KiB of its gateway_id; a Nack's
// error is logged and kept cut to 1 KiB (a 100,000-byte gateway_id was
// once listed for an hour, a 3 MB error logged as one line).
func TestSyncBoundsWhatAGatewaySends(t *testing.T) {
	for _, id := range []string{strings.Repeat("g", 257), "gw\n1"} { // (gRPC refuses to send a string that is not UTF-8)
		f := newSyncFixture(t, 0)
		h := goodHello()
		h.GatewayId = id
		wantCode(t, f.open(t, h), codes.InvalidArgument)
		if got := f.dps.List(); len(got) != 0 {
			t.Errorf("gateway_id %q: DataPlanes lists %v, want none", id, got)
		}
	}

	f := newSyncFixture(t, 0)
	h := goodHello()
	h.Token, h.GatewayId = "wrong", strings.Repeat("g", 100_000)
	wantCode(t, f.open(t, h), codes.Unauthenticated)
	if n := len(f.log.String()); n > 2000 {
		t.Errorf("the refusal of a Hello with a 100,000-byte gateway_id logged %d bytes, want the id cut to 1 KiB", n)
	}

	stream := f.open(t, goodHello())
	_, nonce, _, _ := recvSnapshot(t, stream)
	before := len(f.log.String())
	nack(t, stream, 1, nonce, strings.Repeat("x", 3<<20))
	closeAndWait(t, stream)
	want := strings.Repeat("x", 1024) + "…"
	if dps := f.dps.List(); len(dps) != 1 || dps[0].LastRejection == nil || dps[0].LastRejection.Problem != want {
		t.Fatalf("DataPlanes %+v, want the rejection's problem cut to 1024 bytes and …", dps)
	}
	if logged := f.log.String()[before:]; !strings.Contains(logged, "problem="+want) || len(logged) > 2000 {
		t.Errorf("the Nack logged %d bytes, want the problem cut to 1024 bytes and …", len(logged))
	}
}

// A first message that is not Hello is InvalidArgument.
func TestSyncFirstMessageMustBeHello(t *testing.T) {
	f := newSyncFixture(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := syncpb.NewSyncServiceClient(f.conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: 1}}}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, stream, codes.InvalidArgument)
}

// An accepted Hello receives, in several chunks, the snapshot its tags
// select at the store's revision; its Ack sets the applied revision in
// DataPlanes, an Ack with an unknown nonce does not, and a Nack records
// the rejection.
func TestSyncSnapshotAckNack(t *testing.T) {
	f := newSyncFixture(t, 64)
	ctx := context.Background()
	stream := f.open(t, goodHello())
	snap, nonce, digest, chunks := recvSnapshot(t, stream)

	full, err := f.store.Snapshot(ctx, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	want := controlplane.Select(full, []string{"eu"})
	if snap.Revision != 1 || want.Revision != 1 {
		t.Fatalf("snapshot revision %d (store %d), want 1", snap.Revision, want.Revision)
	}
	if got, w := protocol.Digest(snap), protocol.Digest(want); got != w || digest != w {
		t.Fatalf("digest of the snapshot %s (sent %s), want %s", got, digest, w)
	}
	var apis []string
	for _, a := range snap.APIs {
		apis = append(apis, a.ID)
	}
	if !reflect.DeepEqual(apis, []string{"all", "eu"}) || len(snap.Policies) != 1 || len(snap.Keys) != 1 {
		t.Fatalf("snapshot has APIs %v, %d policies, %d keys; want [all eu], 1, 1", apis, len(snap.Policies), len(snap.Keys))
	}
	if chunks < 3 {
		t.Fatalf("snapshot came in %d chunks of 64 bytes, want several", chunks)
	}
	if len(nonce) < 16 {
		t.Fatalf("nonce %q, want a random one", nonce)
	}

	send := func(m *syncpb.ClientMessage) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: 1, Nonce: nonce}}})
	send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: 7, Nonce: "not-sent"}}})
	send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: 1, Nonce: nonce, Error: "apis[1].listen_path: taken"}}})
	closeAndWait(t, stream)

	wantDP := []controlplane.DataPlane{{
		GatewayID:       "gw-a",
		Stream:          1,
		Group:           "eu-1",
		Tags:            []string{"eu"},
		Connected:       false,
		AppliedRevision: 1,
		LastSeen:        syncNow,
		DisconnectedAt:  syncNow,
		LastRejection:   &controlplane.Rejection{Revision: 1, Problem: "apis[1].listen_path: taken", At: syncNow},
	}}
	got := f.dps.List()
	for i := range got {
		if !strings.HasPrefix(got[i].Peer, "127.0.0.1:") {
			t.Fatalf("peer %q", got[i].Peer)
		}
		got[i].Peer = ""
	}
	if !reflect.DeepEqual(got, wantDP) {
		t.Fatalf("DataPlanes:\n got %+v\nwant %+v", got, wantDP)
	}
	for _, line := range []string{"Ack of a delivery not made on this stream ignored", "data plane rejected a revision"} {
		if got := strings.Count(f.log.String(), line); got != 1 {
			t.Errorf("log has %q %d times, want 1:\n%s", line, got, f.log.String())
		}
	}
}

// While a stream is open, DataPlanes shows it connected; a write through
// the store is pushed as a snapshot of the new revision; a DigestReport
// whose digest differs from the one sent brings a fresh snapshot of the
// same revision with a new nonce, and a matching one brings nothing.
func TestSyncPushesWritesAndRepairsDrift(t *testing.T) {
	f := newSyncFixture(t, 0)
	ctx := context.Background()
	stream := f.open(t, goodHello())
	first, nonce1, _, _ := recvSnapshot(t, stream)
	if first.Revision != 1 {
		t.Fatalf("first snapshot at revision %d, want 1", first.Revision)
	}
	if dps := f.dps.List(); len(dps) != 1 || !dps[0].Connected {
		t.Fatalf("DataPlanes %+v, want gw-a connected", dps)
	}

	rev := update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 5)) })
	if rev != 2 {
		t.Fatalf("write made revision %d, want 2", rev)
	}
	pushed, nonce2, digest2, _ := recvSnapshot(t, stream)
	full, err := f.store.Snapshot(ctx, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	if want := protocol.Digest(controlplane.Select(full, []string{"eu"})); pushed.Revision != 2 || protocol.Digest(pushed) != want {
		t.Fatalf("pushed revision %d digest %s, want 2 and %s", pushed.Revision, protocol.Digest(pushed), want)
	}
	if len(pushed.Policies) != 2 || nonce2 == nonce1 {
		t.Fatalf("pushed %d policies with nonce %q (first %q), want 2 and a new nonce", len(pushed.Policies), nonce2, nonce1)
	}

	report := func(digest string) {
		t.Helper()
		m := &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_DigestReport{DigestReport: &syncpb.DigestReport{Revision: 2, Digest: digest}}}
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	report(protocol.Digest(first)) // drift: the gateway runs something else
	again, nonce3, _, _ := recvSnapshot(t, stream)
	if again.Revision != 2 || protocol.Digest(again) != digest2 || nonce3 == nonce2 {
		t.Fatalf("repair: revision %d digest %s nonce %q; want 2, %s and a new nonce", again.Revision, protocol.Digest(again), nonce3, digest2)
	}
	report(digest2) // in step: nothing is sent
	closeAndWait(t, stream)
	if dps := f.dps.List(); len(dps) != 1 || dps[0].Connected || dps[0].AppliedRevision != 0 {
		t.Fatalf("DataPlanes %+v, want gw-a disconnected with nothing acknowledged", dps)
	}
}

// NewSyncServer refuses options it cannot serve.
func TestNewSyncServerRefuses(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	for _, c := range []struct {
		o    controlplane.SyncOptions
		want string
	}{
		{controlplane.SyncOptions{Tokens: []controlplane.DataPlaneToken{{Hash: controlplane.HashToken("x")}}}, "controlplane: sync: no store"},
		{controlplane.SyncOptions{Store: s}, "controlplane: sync: no data-plane tokens"},
		{controlplane.SyncOptions{Store: s, Tokens: []controlplane.DataPlaneToken{{Hash: "x", Group: "g"}}},
			`controlplane: sync: token 0 (group "g"): hash is not "sha256:" and 64 hex digits`},
		{controlplane.SyncOptions{Store: s, Tokens: []controlplane.DataPlaneToken{
			{Hash: controlplane.HashToken("x"), Group: "g"},
			{Hash: strings.ToUpper(controlplane.HashToken("x")[7:]), Group: "h"},
		}}, `controlplane: sync: token 1 (group "h"): hash is not "sha256:" and 64 hex digits`},
		{controlplane.SyncOptions{Store: s, Tokens: []controlplane.DataPlaneToken{
			{Hash: controlplane.HashToken("x"), Group: "g"},
			{Hash: "sha256:" + strings.ToUpper(controlplane.HashToken("x")[7:]), Group: "h"},
		}}, `controlplane: sync: token 1 (group "h"): the same token is listed twice (its scope would be ambiguous)`},
	} {
		if _, err := controlplane.NewSyncServer(c.o); err == nil || err.Error() != c.want {
			t.Errorf("NewSyncServer: %v, want %s", err, c.want)
		}
	}
}

// A store that does not announce writes is polled: a write still reaches
// the stream, once, as a snapshot of the new revision.
func TestSyncPollsStoreWithoutWatcher(t *testing.T) {
	f := newSyncFixtureWith(t, 0, true)
	stream := f.open(t, goodHello())
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 1 {
		t.Fatalf("first snapshot at revision %d, want 1", snap.Revision)
	}
	update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 5)) })
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 2 || len(snap.Policies) != 2 {
		t.Fatalf("pushed revision %d with %d policies, want 2 and 2", snap.Revision, len(snap.Policies))
	}
	// The polls after the push find revision 2 again and send nothing:
	// the next message is the end of the stream.
	closeAndWait(t, stream)
}

// RevisionChanged is closed by a write that raises the revision, and not
// by a write of nothing or a refused one.
func TestBoltRevisionChanged(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	ctx := context.Background()
	ch := s.RevisionChanged()
	closed := func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	update(t, s, func(controlplane.Tx) error { return nil })
	if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("a"), Policies: []string{"missing"}})
	}); err == nil {
		t.Fatal("a key naming a missing policy was accepted")
	}
	if closed() {
		t.Fatal("closed without a new revision")
	}
	update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 1)) })
	if !closed() {
		t.Fatal("not closed after revision 1")
	}
	if next := s.RevisionChanged(); next == ch {
		t.Fatal("the channel after a write is the one already closed")
	}
}

// A gateway that reconnects before its old stream ends (or a second
// gateway with its ID) is listed twice, both entries flagged duplicate,
// both streams sent a Warning and the control plane logs it; it stays
// connected, once, when the old stream ends; it is disconnected when the
// new one ends.
func TestSyncReconnectKeepsGatewayConnected(t *testing.T) {
	f := newSyncFixtureOpts(t, fixtureOptions{sync: func(o *controlplane.SyncOptions) { o.DuplicateGrace = 100 * time.Millisecond }})
	connected := func() bool {
		t.Helper()
		dps := f.dps.List()
		if len(dps) != 1 || dps[0].GatewayID != "gw-a" || dps[0].Duplicate {
			t.Fatalf("DataPlanes %+v, want gw-a once", dps)
		}
		return dps[0].Connected
	}
	old := f.open(t, goodHello())
	recvSnapshot(t, old)
	renewed := f.open(t, goodHello())
	recvSnapshot(t, renewed)
	wantWarning := func(stream syncStream, want string) {
		t.Helper()
		m, err := stream.Recv()
		if err != nil || !strings.HasPrefix(m.GetWarning().GetMessage(), want) {
			t.Fatalf("got %v, %v; want a Warning %q...", m, err, want)
		}
	}
	wantWarning(old, `another gateway opened a sync stream with this gateway_id "gw-a" (stream 2 from 127.0.0.1:`)
	wantWarning(renewed, `another gateway has a sync stream open with this gateway_id "gw-a" (stream 1 from 127.0.0.1:`)
	if dps := f.dps.List(); len(dps) != 2 || !dps[0].Duplicate || !dps[1].Duplicate || !dps[0].Connected || !dps[1].Connected {
		t.Fatalf("DataPlanes %+v, want gw-a's two streams, both duplicate", dps)
	}
	if n := strings.Count(f.log.String(), "two open streams with the same gateway_id"); n != 1 {
		t.Fatalf("%d log lines on the duplicate, want 1:\n%s", n, f.log)
	}
	closeAndWait(t, old)
	if !connected() {
		t.Fatal("gw-a disconnected by the end of its old stream while the new one is open")
	}
	closeAndWait(t, renewed)
	if connected() {
		t.Fatal("gw-a connected after its last stream ended")
	}
}

// A gateway that reconnects while the control plane still has its old
// stream open, the old one ending within DuplicateGrace (a gateway's
// reconnect after a frozen control plane resumed: the gateway closed the
// old stream, the control plane reads its end a moment later), is
// flagged duplicate until then but neither logged nor warned.
func TestSyncReconnectWithinGraceIsNoDuplicate(t *testing.T) {
	const grace = 3 * time.Second
	f := newSyncFixtureOpts(t, fixtureOptions{sync: func(o *controlplane.SyncOptions) { o.DuplicateGrace = grace }})
	old := f.open(t, goodHello())
	recvSnapshot(t, old)
	opened := time.Now()
	renewed := f.open(t, goodHello())
	recvSnapshot(t, renewed)
	if dps := f.dps.List(); len(dps) != 2 || !dps[0].Duplicate || !dps[1].Duplicate {
		t.Fatalf("DataPlanes %+v, want gw-a's two streams, both duplicate", dps)
	}
	closeAndWait(t, old) // no Warning before its end
	if time.Since(opened) >= grace {
		t.Fatalf("the old stream ended %v after the new one opened, not within the grace (%v): a machine this slow cannot run this test", time.Since(opened), grace)
	}
	if dps := f.dps.List(); len(dps) != 1 || dps[0].Duplicate || !dps[0].Connected {
		t.Fatalf("DataPlanes %+v, want gw-a once, connected, not duplicate", dps)
	}
	time.Sleep(time.Until(opened.Add(grace + time.Second)))
	if n := strings.Count(f.log.String(), "two open streams with the same gateway_id"); n != 0 {
		t.Fatalf("%d log lines on a duplicate, want none:\n%s", n, f.log)
	}
	// The stream goes on: its next message is the revision written now
	// (a snapshot: nothing was acknowledged), not a Warning queued
	// before it.
	update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("global", 200)) })
	if snap, _, _, _ := recvSnapshot(t, renewed); snap.Revision != 2 {
		t.Fatalf("revision %d, want 2", snap.Revision)
	}
}

// Shutdown ends an open stream with Unavailable, refuses a new one with
// it, and leaves the gateway disconnected; a second call is harmless.
func TestSyncShutdown(t *testing.T) {
	f := newSyncFixture(t, 0)
	stream := f.open(t, goodHello())
	recvSnapshot(t, stream)
	f.srv.Shutdown()
	f.srv.Shutdown()
	wantCode(t, stream, codes.Unavailable)
	wantCode(t, f.open(t, goodHello()), codes.Unavailable)
	if dps := f.dps.List(); len(dps) != 1 || dps[0].Connected {
		t.Fatalf("DataPlanes %+v, want gw-a disconnected", dps)
	}
}

// recvChanges receives one message, which must be Changes.
func recvChanges(t *testing.T, stream syncStream) *syncpb.Changes {
	t.Helper()
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	c := m.GetChanges()
	if c == nil {
		t.Fatalf("got %v, want Changes", m)
	}
	return c
}

func sendMsg(t *testing.T, stream syncStream, m *syncpb.ClientMessage) {
	t.Helper()
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
}

func ack(t *testing.T, stream syncStream, rev uint64, nonce string) {
	t.Helper()
	sendMsg(t, stream, &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: rev, Nonce: nonce}}})
}

func nack(t *testing.T, stream syncStream, rev uint64, nonce, problem string) {
	t.Helper()
	sendMsg(t, stream, &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: rev, Nonce: nonce, Error: problem}}})
}

// applyChecked applies ch to runs as a gateway would and checks the
// result against Select of the store's state for tags: same revision,
// same objects, and the digest Changes carries.
func applyChecked(t *testing.T, f *syncFixture, runs *spec.Snapshot, ch *syncpb.Changes, tags []string) *spec.Snapshot {
	t.Helper()
	next, err := protocol.ApplyChanges(runs, ch)
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.store.Snapshot(context.Background(), tags)
	if err != nil {
		t.Fatal(err)
	}
	if next.Revision != want.Revision || protocol.Digest(next) != protocol.Digest(want) || ch.Digest != protocol.Digest(want) {
		t.Fatalf("after changes %d→%d: revision %d digest %s (sent %s); want %d and %s",
			ch.FromRevision, ch.Revision, next.Revision, protocol.Digest(next), ch.Digest, want.Revision, protocol.Digest(want))
	}
	return next
}

// change is a Changes entry in short: "put key sha256:… {json}".
func changeString(c *syncpb.Change) string {
	s := strings.ToLower(strings.TrimPrefix(c.Kind.String(), "KIND_")) + " " +
		strings.ToLower(strings.TrimPrefix(c.Object.String(), "OBJECT_")) + " " + c.Id
	if len(c.Json) > 0 {
		s += " " + string(c.Json)
	}
	return s
}

func changeStrings(ch *syncpb.Changes) []string {
	out := []string{}
	for _, c := range ch.Changes {
		out = append(out, changeString(c))
	}
	return out
}

// A key written while a gateway is connected reaches it as exactly one
// Changes: from the revision it runs to the new one, with the one change
// and the digest of its view after it; its Ack is recorded.
func TestSyncKeyWriteSendsChanges(t *testing.T) {
	f := newSyncFixture(t, 0)
	stream := f.open(t, goodHello())
	runs, nonce, _, _ := recvSnapshot(t, stream)
	ack(t, stream, 1, nonce)
	if rev := update(t, f.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("b"), Policies: []string{"global"}})
	}); rev != 2 {
		t.Fatalf("write made revision %d, want 2", rev)
	}
	ch := recvChanges(t, stream)
	if ch.FromRevision != 1 || ch.Revision != 2 || len(ch.Nonce) < 16 || ch.Nonce == nonce {
		t.Fatalf("Changes %d→%d nonce %q; want 1→2 and a new nonce", ch.FromRevision, ch.Revision, ch.Nonce)
	}
	want := []string{`put key ` + hash("b") + ` {"key_hash":"` + hash("b") + `","policies":["global"]}`}
	if got := changeStrings(ch); !reflect.DeepEqual(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
	applyChecked(t, f, runs, ch, []string{"eu"})
	ack(t, stream, 2, ch.Nonce)
	closeAndWait(t, stream) // nothing else was sent
	if dps := f.dps.List(); len(dps) != 1 || dps[0].AppliedRevision != 2 {
		t.Fatalf("DataPlanes %+v, want gw-a at revision 2", dps)
	}
}

// A gateway that reconnects with the revision and digest it was sent
// gets the changes since; with a wrong digest, a snapshot; already at the
// store's revision, only a DigestRequest (and its applied revision is
// recorded); after
// a control-plane restart (an empty digest cache), a snapshot.
func TestSyncReconnectGetsChanges(t *testing.T) {
	f := newSyncFixture(t, 0)
	stream := f.open(t, goodHello())
	runs, nonce, digest, _ := recvSnapshot(t, stream)
	ack(t, stream, 1, nonce)
	closeAndWait(t, stream)
	update(t, f.store, func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("b"), Policies: []string{"global"}})
	})

	h := goodHello()
	h.LastAppliedRevision, h.Digest = 1, digest
	stream = f.open(t, h)
	ch := recvChanges(t, stream)
	if ch.FromRevision != 1 || ch.Revision != 2 || len(ch.Changes) != 1 {
		t.Fatalf("on reconnect: Changes %d→%d with %d changes, want 1→2 with 1", ch.FromRevision, ch.Revision, len(ch.Changes))
	}
	runs = applyChecked(t, f, runs, ch, []string{"eu"})
	closeAndWait(t, stream)

	h.Digest = protocol.Digest(&spec.Snapshot{}) // not what revision 1 was
	stream = f.open(t, h)
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 2 {
		t.Fatalf("wrong digest: snapshot of revision %d, want 2", snap.Revision)
	}
	closeAndWait(t, stream)

	f.dps.Remove("gw-a")
	h.LastAppliedRevision, h.Digest = 2, protocol.Digest(runs)
	stream = f.open(t, h)
	if m, err := stream.Recv(); err != nil || m.GetDigestRequest() == nil {
		t.Fatalf("in step: got %v, %v; want a DigestRequest (and nothing else)", m, err)
	}
	closeAndWait(t, stream)
	if dps := f.dps.List(); len(dps) != 1 || dps[0].AppliedRevision != 2 {
		t.Fatalf("DataPlanes %+v, want gw-a at revision 2 from its Hello", dps)
	}

	// A restart: the same store, a new sync server with an empty cache.
	// It computes the view of revision 2 from the store, finds the
	// Hello's digest, and has nothing to send.
	f.serve(t)
	stream = f.open(t, h)
	if m, err := stream.Recv(); err != nil || m.GetDigestRequest() == nil {
		t.Fatalf("after a restart, in step: got %v, %v; want a DigestRequest (and nothing else)", m, err)
	}
	closeAndWait(t, stream)
}

// A policy change reaches a data plane whose tags leave APIs out as a
// snapshot, and one whose tags select every API as Changes; an API with a
// tag it does not select makes its view filtered, so that comes as a
// snapshot too.
func TestSyncPolicyAndAPIChanges(t *testing.T) {
	f := newSyncFixture(t, 0)
	eu := f.open(t, goodHello())
	recvSnapshot(t, eu)
	allHello := &syncpb.Hello{Group: "all-1", Tags: []string{"us", "eu"}, Token: syncTokenAll, GatewayId: "gw-all"}
	all := f.open(t, allHello)
	allRuns, _, _, _ := recvSnapshot(t, all)
	allTags := []string{"eu", "us"}

	update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 5)) })
	euRuns, _, _, _ := recvSnapshot(t, eu)
	if euRuns.Revision != 2 || protocol.Digest(euRuns) != protocol.Digest(applyNothing(t, f, []string{"eu"})) {
		t.Fatalf("eu: snapshot of revision %d, want 2 with the view's digest", euRuns.Revision)
	}
	ch := recvChanges(t, all)
	if got, want := changeStrings(ch), []string{`put policy silver {"id":"silver","rate":{"requests":5,"per":"1m0s"}}`}; !reflect.DeepEqual(got, want) {
		t.Fatalf("identity view: changes %q, want %q", got, want)
	}
	allRuns = applyChecked(t, f, allRuns, ch, allTags)

	// An API the identity view selects: Changes; one it does not select
	// (tag asia): a snapshot without it.
	update(t, f.store, func(tx controlplane.Tx) error {
		return tx.PutAPI(spec.API{ID: "us2", ListenPath: "/us2/", Target: spec.BuiltinEcho, Tags: []string{"us"}})
	})
	ch = recvChanges(t, all)
	if got := changeStrings(ch); len(got) != 1 || !strings.HasPrefix(got[0], `put api us2 {"id":"us2"`) {
		t.Fatalf("identity view: changes %q, want the put of API us2", got)
	}
	applyChecked(t, f, allRuns, ch, allTags)
	if snap, _, _, _ := recvSnapshot(t, eu); snap.Revision != 3 || len(snap.APIs) != len(euRuns.APIs) {
		t.Fatalf("eu: snapshot of revision %d with %d APIs, want 3 and %d", snap.Revision, len(snap.APIs), len(euRuns.APIs))
	}
	update(t, f.store, func(tx controlplane.Tx) error {
		return tx.PutAPI(spec.API{ID: "asia", ListenPath: "/asia/", Target: spec.BuiltinEcho, Tags: []string{"asia"}})
	})
	if snap, _, _, _ := recvSnapshot(t, all); snap.Revision != 4 || slices.ContainsFunc(snap.APIs, func(a spec.API) bool { return a.ID == "asia" }) {
		t.Fatalf("identity view gaining a foreign API: snapshot of revision %d with APIs %v, want 4 without asia", snap.Revision, snap.APIs)
	}
	recvSnapshot(t, eu)
	closeAndWait(t, eu)
	closeAndWait(t, all)
}

// applyNothing is the store's view for tags now.
func applyNothing(t *testing.T, f *syncFixture, tags []string) *spec.Snapshot {
	t.Helper()
	s, err := f.store.Snapshot(context.Background(), tags)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// In a view that leaves APIs out, each key change is mapped by Select's
// rule: nothing while the view holds the key neither before nor after, a
// PUT of the key as the view holds it (its policies and api_limits for
// APIs left out removed), a DELETE when the view held it and no longer
// does.
func TestSyncFilteredKeyChanges(t *testing.T) {
	f := newSyncFixture(t, 0)
	update(t, f.store, func(tx controlplane.Tx) error {
		return tx.PutPolicy(spec.Policy{ID: "us-only", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}, APIs: []string{"us"}})
	})
	stream := f.open(t, goodHello())
	runs, _, _, _ := recvSnapshot(t, stream)
	b := hash("b")
	limit := spec.Limits{Rate: &spec.Rate{Requests: 2, Per: spec.Duration(time.Second)}}
	for i, c := range []struct {
		write func(tx controlplane.Tx) error
		want  []string
	}{
		{func(tx controlplane.Tx) error { return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"us-only"}}) },
			[]string{}},
		{func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"global", "us-only"}})
		}, []string{`put key ` + b + ` {"key_hash":"` + b + `","policies":["global"]}`}},
		{func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"us-only"}, APILimits: map[string]spec.Limits{"us": limit, "eu": limit}})
		}, []string{`put key ` + b + ` {"key_hash":"` + b + `","api_limits":{"eu":{"rate":{"requests":2,"per":"1s"}}}}`}},
		{func(tx controlplane.Tx) error { return tx.PutKey(spec.Key{KeyHash: b, Policies: []string{"us-only"}}) },
			[]string{`delete key ` + b}},
		{func(tx controlplane.Tx) error { _, err := tx.DeleteKey(b); return err },
			[]string{}},
	} {
		rev := update(t, f.store, c.write)
		ch := recvChanges(t, stream)
		if ch.FromRevision != rev-1 || ch.Revision != rev {
			t.Fatalf("write %d: Changes %d→%d, want %d→%d", i, ch.FromRevision, ch.Revision, rev-1, rev)
		}
		if got := changeStrings(ch); !reflect.DeepEqual(got, c.want) {
			t.Fatalf("write %d: changes %q, want %q", i, got, c.want)
		}
		runs = applyChecked(t, f, runs, ch, []string{"eu"})
		ack(t, stream, rev, ch.Nonce)
	}
	closeAndWait(t, stream)
}

// A Nack of Changes brings one snapshot at once (a Nack of Changes sent
// before it brings no other); a Nack of that snapshot is recorded and
// brings nothing, and the next write comes as a snapshot.
func TestSyncNacks(t *testing.T) {
	f := newSyncFixture(t, 0)
	stream := f.open(t, goodHello())
	_, nonce, _, _ := recvSnapshot(t, stream)
	ack(t, stream, 1, nonce)
	putKey := func(name string) uint64 {
		return update(t, f.store, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash(name), Policies: []string{"global"}})
		})
	}
	putKey("b")
	c1 := recvChanges(t, stream)
	putKey("c")
	c2 := recvChanges(t, stream)
	if c1.Revision != 2 || c2.FromRevision != 2 || c2.Revision != 3 {
		t.Fatalf("Changes %d→%d then %d→%d, want 1→2 then 2→3", c1.FromRevision, c1.Revision, c2.FromRevision, c2.Revision)
	}
	nack(t, stream, 2, c1.Nonce, "dataplane: digest mismatch")
	snap, _, _, _ := recvSnapshot(t, stream)
	if snap.Revision != 3 {
		t.Fatalf("after the Nack: snapshot of revision %d, want 3", snap.Revision)
	}
	nack(t, stream, 3, c2.Nonce, "protocol: changes do not start at the running revision")
	// The snapshot replaced c2: the next write comes as Changes from it.
	putKey("d")
	if ch := recvChanges(t, stream); ch.FromRevision != 3 || ch.Revision != 4 {
		t.Fatalf("Changes %d→%d, want 3→4", ch.FromRevision, ch.Revision)
	}

	// A refused snapshot is not sent again for the same revision.
	update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 5)) })
	snap, snapNonce, _, _ := recvSnapshot(t, stream)
	nack(t, stream, snap.Revision, snapNonce, "spec: policies[1].rate: bad")
	putKey("e")
	if next, _, _, _ := recvSnapshot(t, stream); next.Revision != snap.Revision+1 {
		t.Fatalf("after a refused snapshot of %d: snapshot of %d, want %d", snap.Revision, next.Revision, snap.Revision+1)
	}
	closeAndWait(t, stream)
	if dps := f.dps.List(); len(dps) != 1 || dps[0].LastRejection == nil || dps[0].LastRejection.Problem != "spec: policies[1].rate: bad" {
		t.Fatalf("DataPlanes %+v, want the last rejection", dps)
	}
	if got := strings.Count(f.log.String(), "data plane rejected a revision"); got != 3 {
		t.Fatalf("log has %d rejections, want 3:\n%s", got, f.log.String())
	}
}

// A gateway further behind than the change log reaches gets a snapshot.
func TestSyncTooFarBehindSendsSnapshot(t *testing.T) {
	f := newSyncFixtureOpts(t, fixtureOptions{bolt: controlplane.BoltOptions{ChangeLogRevisions: 2}})
	stream := f.open(t, goodHello())
	_, nonce, digest, _ := recvSnapshot(t, stream)
	ack(t, stream, 1, nonce)
	closeAndWait(t, stream)
	for _, k := range []string{"b", "c", "d"} {
		update(t, f.store, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash(k), Policies: []string{"global"}})
		})
	}
	if _, err := f.store.ChangesSince(context.Background(), 1); !errors.Is(err, controlplane.ErrTooFarBehind) {
		t.Fatalf("ChangesSince(1): %v, want ErrTooFarBehind", err)
	}
	h := goodHello()
	h.LastAppliedRevision, h.Digest = 1, digest
	stream = f.open(t, h)
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 4 || len(snap.Keys) != 4 {
		t.Fatalf("snapshot of revision %d with %d keys, want 4 and 4", snap.Revision, len(snap.Keys))
	}
	closeAndWait(t, stream)
	if !strings.Contains(f.log.String(), "sending a snapshot instead of changes") || !strings.Contains(f.log.String(), "the change log starts after 2") {
		t.Fatalf("log does not say why:\n%s", f.log.String())
	}
}

// Changes over MaxChanges or MaxChangesBytes are sent as a snapshot.
func TestSyncOversizeChangesSendSnapshot(t *testing.T) {
	f := newSyncFixtureOpts(t, fixtureOptions{sync: func(o *controlplane.SyncOptions) {
		o.MaxChanges, o.MaxChangesBytes = 2, 400
	}})
	stream := f.open(t, goodHello())
	recvSnapshot(t, stream)
	limit := spec.Limits{Rate: &spec.Rate{Requests: 2, Per: spec.Duration(time.Second)}}
	putKeys := func(names ...string) uint64 {
		return update(t, f.store, func(tx controlplane.Tx) error {
			for _, n := range names {
				k := spec.Key{KeyHash: hash(n), Policies: []string{"global"}}
				if strings.HasPrefix(n, "big") {
					k.APILimits = map[string]spec.Limits{"all": limit, "eu": limit}
				}
				if err := tx.PutKey(k); err != nil {
					return err
				}
			}
			return nil
		})
	}
	putKeys("b", "c") // two changes of about 170 bytes each
	if ch := recvChanges(t, stream); len(ch.Changes) != 2 {
		t.Fatalf("%d changes, want 2", len(ch.Changes))
	}
	rev := putKeys("d", "e", "f") // three changes
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != rev {
		t.Fatalf("snapshot of %d, want %d", snap.Revision, rev)
	}
	rev = putKeys("big1", "big2") // two changes, over 400 bytes
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != rev {
		t.Fatalf("snapshot of %d, want %d", snap.Revision, rev)
	}
	closeAndWait(t, stream)
}

// recvSnapshotHistory receives one whole snapshot and returns it with the
// history its last chunk names.
func recvSnapshotHistory(t *testing.T, stream syncStream) (*spec.Snapshot, string) {
	t.Helper()
	a := protocol.NewAssembler(protocol.AssemblerOptions{})
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		c := m.GetSnapshotChunk()
		if c == nil {
			t.Fatalf("got %v, want a snapshot chunk", m)
		}
		snap, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		if snap != nil {
			return snap, c.GetHistory()
		}
	}
}

// TestSyncHistory: snapshots name the store's history; a Hello of the
// store's revision and digest in its history is confirmed (DigestRequest),
// in another history it is sent a snapshot; a Hello ahead of the store in
// its history forks the history (a restored store) and is sent a snapshot
// of the new one, with the revision unchanged; a Hello ahead without a
// history (an agent that names none) forks nothing.
func TestSyncHistory(t *testing.T) {
	f := newSyncFixture(t, 0)
	ctx := context.Background()
	h1, err := f.store.History(ctx)
	if err != nil || h1 == "" {
		t.Fatalf("History: %q, %v", h1, err)
	}
	s := f.open(t, goodHello())
	snap, hist := recvSnapshotHistory(t, s)
	if snap.Revision != 1 || hist != h1 {
		t.Fatalf("first snapshot: revision %d, history %q; want 1, %q", snap.Revision, hist, h1)
	}
	digest := protocol.Digest(snap)
	closeAndWait(t, s)

	hello := func(rev uint64, history string) *syncpb.Hello {
		h := goodHello()
		h.LastAppliedRevision, h.Digest, h.History = rev, digest, history
		return h
	}
	s = f.open(t, hello(1, h1))
	if m, err := s.Recv(); err != nil || m.GetDigestRequest() == nil {
		t.Fatalf("Hello of the current revision in the store's history: got %v, %v; want a DigestRequest", m, err)
	}
	closeAndWait(t, s)

	s = f.open(t, hello(1, "another-history"))
	if snap, hist := recvSnapshotHistory(t, s); snap.Revision != 1 || hist != h1 {
		t.Fatalf("Hello of another history: snapshot %d of history %q; want 1 of %q", snap.Revision, hist, h1)
	}
	closeAndWait(t, s)

	s = f.open(t, hello(5, h1))
	snap, h2 := recvSnapshotHistory(t, s)
	if snap.Revision != 1 || h2 == h1 || h2 == "" || protocol.Digest(snap) != digest {
		t.Fatalf("Hello ahead in the store's history: snapshot %d of history %q; want 1 of a new history (was %q)", snap.Revision, h2, h1)
	}
	closeAndWait(t, s)
	if h, err := f.store.History(ctx); err != nil || h != h2 {
		t.Fatalf("store history %q, %v; want %q", h, err, h2)
	}
	if !strings.Contains(f.log.String(), "the store takes a new history") {
		t.Errorf("the fork is not logged:\n%s", f.log.String())
	}
	if got := revision(t, f.store); got != 1 {
		t.Fatalf("revision after the fork %d, want 1", got)
	}

	s = f.open(t, hello(5, ""))
	if snap, hist := recvSnapshotHistory(t, s); snap.Revision != 1 || hist != h2 {
		t.Fatalf("Hello ahead without a history: snapshot %d of history %q; want 1 of %q", snap.Revision, hist, h2)
	}
	closeAndWait(t, s)
	if h, err := f.store.History(ctx); err != nil || h != h2 {
		t.Fatalf("store history after a Hello without one %q, %v; want %q unchanged", h, err, h2)
	}
}

// TestSyncForksOnPersistedAhead: a Hello that runs nothing but whose data
// plane persisted a revision ahead of the store's in its history (every
// gateway restarted after a restore) forks the history too, and gets a
// snapshot of the new one; a persisted revision of another history forks
// nothing.
func TestSyncForksOnPersistedAhead(t *testing.T) {
	f := newSyncFixture(t, 0)
	ctx := context.Background()
	h1, err := f.store.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := goodHello()
	h.PersistedRevision, h.PersistedHistory = 500, "another"
	s := f.open(t, h)
	if snap, hist := recvSnapshotHistory(t, s); snap.Revision != 1 || hist != h1 {
		t.Fatalf("persisted ahead in another history: snapshot %d of %q; want 1 of %q", snap.Revision, hist, h1)
	}
	closeAndWait(t, s)
	h.PersistedHistory = h1
	s = f.open(t, h)
	snap, h2 := recvSnapshotHistory(t, s)
	if snap.Revision != 1 || h2 == h1 || h2 == "" {
		t.Fatalf("persisted ahead in the store's history: snapshot %d of %q; want 1 of a new history (was %q)", snap.Revision, h2, h1)
	}
	closeAndWait(t, s)
	if got, err := f.store.History(ctx); err != nil || got != h2 {
		t.Fatalf("store history %q, %v; want %q", got, err, h2)
	}
}

// The applied revision is the one the gateway runs: the Hello's
// last_applied_revision (a persisted configuration the control plane has
// no digest for), unchanged by a refused snapshot; the rejection is
// cleared once the gateway acknowledges a later revision.
func TestSyncAppliedRevisionAndRejectionCleared(t *testing.T) {
	f := newSyncFixture(t, 0)
	entry := func() controlplane.DataPlane {
		t.Helper()
		dps := f.dps.List()
		if len(dps) != 1 {
			t.Fatalf("DataPlanes %+v, want one", dps)
		}
		return dps[0]
	}
	h := goodHello()
	h.LastAppliedRevision, h.Digest = 9, "sha256:not-known-here"
	stream := f.open(t, h)
	snap, nonce, _, _ := recvSnapshot(t, stream)
	if got := entry().AppliedRevision; got != 9 {
		t.Fatalf("applied_revision %d on connect, want the Hello's 9", got)
	}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: snap.Revision, Nonce: nonce, Error: "refused for the test"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rejection recorded", func() bool { return entry().LastRejection != nil })
	if e := entry(); e.AppliedRevision != 9 || e.LastRejection.Revision != snap.Revision {
		t.Fatalf("after the Nack: %+v, want applied 9 and the rejection of %d", e, snap.Revision)
	}
	rev := update(t, f.store, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 3)) })
	next, nonce2, _, _ := recvSnapshot(t, stream)
	if next.Revision != rev {
		t.Fatalf("snapshot of %d, want %d", next.Revision, rev)
	}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: rev, Nonce: nonce2}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the later revision applied", func() bool { return entry().AppliedRevision == rev })
	if e := entry(); e.LastRejection != nil {
		t.Fatalf("after the Ack of %d: rejection %+v still listed", rev, e.LastRejection)
	}
}

// waitFor polls cond every 5ms until it holds, for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
	}
}

// TestSyncEmptyStoreKeepsForeignConfiguration: a control plane started on
// a store never written (a new or wrong -data file) does not replace the
// configuration a data plane runs, of another history, with nothing (it
// once did: every request of every data plane answered 503, and the empty
// configuration was persisted). The data plane is warned, the control
// plane logs an error, and the store's first write is sent as a snapshot.
// A data plane that runs nothing is sent the empty snapshot as before.
func TestSyncEmptyStoreKeepsForeignConfiguration(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	f := &syncFixture{store: s, dps: &controlplane.DataPlanes{Now: func() time.Time { return syncNow }}, log: &lockedBuffer{}}
	f.serve(t)

	h := goodHello()
	h.History, h.LastAppliedRevision, h.Digest = "another-history", 117, "sha256:"+strings.Repeat("ab", 32)
	stream := f.open(t, h)
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if w := m.GetWarning(); w == nil || !strings.Contains(w.GetMessage(), "store is empty (never written) and this data plane runs revision 117 of another history") {
		t.Fatalf("first message %v, want the warning", m)
	}
	if m, err = stream.Recv(); err != nil || m.GetDigestRequest() == nil {
		t.Fatalf("second message %v, %v; want a DigestRequest", m, err)
	}
	sendMsg(t, stream, &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_DigestReport{DigestReport: &syncpb.DigestReport{Revision: 117, Digest: h.Digest}}})
	if n := strings.Count(f.log.String(), "level=ERROR msg=\"controlplane: sync: the store is empty"); n != 1 {
		t.Fatalf("%d errors logged, want 1:\n%s", n, f.log)
	}

	rev := update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 5)) })
	snap, _, _, _ := recvSnapshot(t, stream)
	if snap.Revision != rev || len(snap.Policies) != 1 {
		t.Fatalf("after the first write: snapshot of revision %d with %d policies, want %d with 1", snap.Revision, len(snap.Policies), rev)
	}
	closeAndWait(t, stream)

	// A store still empty, and a data plane that runs nothing: the empty
	// snapshot, as ever.
	s2, _ := open(t, controlplane.BoltOptions{})
	f2 := &syncFixture{store: s2, dps: &controlplane.DataPlanes{Now: func() time.Time { return syncNow }}, log: &lockedBuffer{}}
	f2.serve(t)
	stream = f2.open(t, goodHello())
	if snap, _, _, _ := recvSnapshot(t, stream); snap.Revision != 0 {
		t.Fatalf("a new data plane: snapshot of revision %d, want 0", snap.Revision)
	}
	closeAndWait(t, stream)
}
