package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
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
}

// pollingStore hides Bolt's RevisionChanged, so the sync server polls.
type pollingStore struct{ controlplane.Store }

func newSyncFixture(t *testing.T, chunkBytes int) *syncFixture {
	t.Helper()
	return newSyncFixtureWith(t, chunkBytes, false)
}

func newSyncFixtureWith(t *testing.T, chunkBytes int, poll bool) *syncFixture {
	t.Helper()
	s, _ := open(t, controlplane.BoltOptions{})
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
	f := &syncFixture{store: s, dps: &controlplane.DataPlanes{}, log: &lockedBuffer{}}
	var store controlplane.Store = s
	if poll {
		store = pollingStore{s}
	}
	srv, err := controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:        store,
		PollInterval: 5 * time.Millisecond,
		DataPlanes:   f.dps,
		Tokens:       []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(syncToken), Group: "eu-1", Tags: []string{"eu"}}},
		ChunkBytes:   chunkBytes,
		Now:          func() time.Time { return syncNow },
		Log:          slog.New(slog.NewTextHandler(f.log, nil)),
	})
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
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.conn.Close() })
	return f
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
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil {
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
// the token's scope with PermissionDenied; each refusal is logged and
// registers no data plane.
func TestSyncRefusesTokensOutsideScope(t *testing.T) {
	f := newSyncFixture(t, 0)
	for _, c := range []struct {
		name string
		edit func(h *syncpb.Hello)
		code codes.Code
		log  string
	}{
		{"wrong token", func(h *syncpb.Hello) { h.Token = "dp-secret-eU" }, codes.Unauthenticated, "unknown data-plane token"},
		{"no token", func(h *syncpb.Hello) { h.Token = "" }, codes.Unauthenticated, "unknown data-plane token"},
		{"foreign tag", func(h *syncpb.Hello) { h.Tags = []string{"eu", "us"} }, codes.PermissionDenied, "tag outside the token's scope"},
		{"foreign group", func(h *syncpb.Hello) { h.Group = "us-1" }, codes.PermissionDenied, "group outside the token's scope"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := goodHello()
			c.edit(h)
			before := strings.Count(f.log.String(), c.log)
			wantCode(t, f.open(t, h), c.code)
			if got := strings.Count(f.log.String(), c.log); got != before+1 {
				t.Errorf("log has %q %d times, want %d:\n%s", c.log, got, before+1, f.log.String())
			}
		})
	}
	if got := f.dps.List(); len(got) != 0 {
		t.Errorf("DataPlanes lists %v after refusals, want none", got)
	}
	wantCode(t, f.open(t, &syncpb.Hello{}), codes.Unauthenticated)
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
		Group:           "eu-1",
		Tags:            []string{"eu"},
		Connected:       false,
		AppliedRevision: 1,
		LastSeen:        syncNow,
		LastRejection:   &controlplane.Rejection{Revision: 1, Problem: "apis[1].listen_path: taken", At: syncNow},
	}}
	if got := f.dps.List(); !reflect.DeepEqual(got, wantDP) {
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

// A gateway that reconnects before its old stream ends stays connected
// when the old stream ends; it is disconnected when the new one ends.
func TestSyncReconnectKeepsGatewayConnected(t *testing.T) {
	f := newSyncFixture(t, 0)
	connected := func() bool {
		t.Helper()
		dps := f.dps.List()
		if len(dps) != 1 || dps[0].GatewayID != "gw-a" {
			t.Fatalf("DataPlanes %+v, want gw-a only", dps)
		}
		return dps[0].Connected
	}
	old := f.open(t, goodHello())
	recvSnapshot(t, old)
	renewed := f.open(t, goodHello())
	recvSnapshot(t, renewed)
	closeAndWait(t, old)
	if !connected() {
		t.Fatal("gw-a disconnected by the end of its old stream while the new one is open")
	}
	closeAndWait(t, renewed)
	if connected() {
		t.Fatal("gw-a connected after its last stream ended")
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
