package dataplane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

const (
	testToken = "dp-secret"
	testGroup = "dp1"
)

// waitFor polls cond every 5 ms until it holds, failing the test after
// 20 s with what.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lockedBuffer is a log sink safe for concurrent use.
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

// hash is the snapshot form of a plaintext key.
func hash(raw string) string { return identity.HashKey(raw).String() }

// perHour is a quota of n requests an hour.
func perHour(n int64) *spec.Quota { return &spec.Quota{Max: n, Renewal: spec.Duration(time.Hour)} }

// snapshot returns a valid snapshot at rev: policy p (a quota of 3 an
// hour), API "api" at /api/ (builtin echo) and the given plaintext keys
// on p.
func snapshot(rev uint64, keys ...string) *spec.Snapshot {
	s := &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{{ID: "p", Quota: perHour(3)}},
		APIs:     []spec.API{{ID: "api", ListenPath: "/api/", Target: spec.BuiltinEcho}},
	}
	for _, k := range keys {
		s.Keys = append(s.Keys, spec.Key{KeyHash: hash(k), Policies: []string{"p"}})
	}
	return s
}

// target is what the agent tests keep in step: a *gateway.Gateway or a
// service's *live.Config (both implement dataplane.Target), with the
// accessors the tests read.
type target interface {
	dataplane.Target
	Engine() *core.Engine
	Revision() uint64
}

// testGateway is a running configuration an agent keeps in step, over an
// in-process store with a frozen clock (so quota counts are exact),
// serving the API "api" on a real loopback listener: a gateway (gw set)
// or a service (gw nil) whose net/http handler is behind the nethttp
// middleware with the Config's Limiter and Authenticator of "api".
type testGateway struct {
	tg  target
	gw  *gateway.Gateway // nil for a service
	url string
}

// targetKinds are the two implementations of dataplane.Target the agent
// tests run against, each by its constructor. A test that means the agent
// and not the gateway's own features (its admin handler's /readyz: the
// refusal tests) runs its body under eachTarget; the tests' comments
// say "gateway" for either.
var targetKinds = []struct {
	name string
	new  func(t *testing.T) *testGateway
}{
	{"gateway", newGateway},
	{"service", newService},
}

// eachTarget runs test once per target kind, as a subtest named after
// it; test makes its targets with newTarget.
func eachTarget(t *testing.T, test func(t *testing.T, newTarget func(t *testing.T) *testGateway)) {
	for _, k := range targetKinds {
		t.Run(k.name, func(t *testing.T) { test(t, k.new) })
	}
}

func newGateway(t *testing.T) *testGateway {
	t.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	t.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{Store: store, Seams: &seams.Seams{Clock: clock}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &testGateway{tg: gw, gw: gw, url: srv.URL}
}

// newService is newGateway for a service of its own: a live.Config
// enforcing the API "api" in the nethttp middleware of a handler that
// answers 200 "ok".
func newService(t *testing.T) *testGateway {
	t.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	t.Cleanup(func() { store.Close() })
	cfg, err := live.New(live.Options{Store: store, Seams: &seams.Seams{Clock: clock}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cfg.Close() })
	limit := nethttp.Middleware(cfg.Limiter("api"), cfg.Authenticator("api"), nethttp.Options{API: "api"})
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	t.Cleanup(srv.Close)
	return &testGateway{tg: cfg, url: srv.URL}
}

// get sends GET /api/x with key and returns the status and body.
func (g *testGateway) get(t *testing.T, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.url+"/api/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// statuses sends n requests with key and returns their statuses.
func (g *testGateway) statuses(t *testing.T, key string, n int) []int {
	t.Helper()
	var out []int
	for range n {
		s, _ := g.get(t, key)
		out = append(out, s)
	}
	return out
}

// liveAgents counts the agents runAgent started and has not stopped.
var liveAgents atomic.Int32

// runAgent starts a.Run and stops it at the end of the test; the test
// fails if Run does not return nil or, once no agent runs any more,
// leaves an agent goroutine behind. The returned function stops it
// earlier.
func runAgent(t *testing.T, a *dataplane.Agent) (stop func()) {
	t.Helper()
	liveAgents.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return within 20 s of its context's end")
			}
			if liveAgents.Add(-1) > 0 {
				return
			}
			if n := agentGoroutines(); n != 0 {
				t.Errorf("%d agent goroutines left after Run returned:\n%s", n, stacks())
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// agentGoroutines counts the goroutines running the agent's code. Tests
// run one at a time (no t.Parallel), so any is a leak of a stopped agent.
func agentGoroutines() int {
	n := 0
	for _, g := range strings.Split(stacks(), "\n\n") {
		if strings.Contains(g, "dataplane.(*Agent)") || strings.Contains(g, "dataplane.(*session)") {
			n++
		}
	}
	return n
}

// agentOptions are the options of an agent for tg reaching addr, with
// quick timers for tests and its log in log.
func agentOptions(tg dataplane.Target, addr string, log io.Writer) dataplane.AgentOptions {
	return dataplane.AgentOptions{
		Target:       tg,
		Address:      addr,
		Group:        testGroup,
		Token:        testToken,
		GatewayID:    "gw-test",
		Version:      "test",
		SaveDelay:    10 * time.Millisecond,
		StartTimeout: 20 * time.Second, // tests of the start set their own
		Backoff:      dataplane.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Logger:       slog.New(slog.NewTextHandler(log, nil)),
	}
}

// controlPlane is a real controlplane.SyncServer over a Bolt store, served
// by gRPC on a loopback address that Stop and Start keep.
type controlPlane struct {
	store *controlplane.Bolt
	dps   *controlplane.DataPlanes
	srv   *controlplane.SyncServer
	addr  string

	mu     sync.Mutex
	gs     *grpc.Server
	served chan error
	// quota, when set before Start, is served beside the sync server.
	quota *controlplane.QuotaServer
}

// newControlPlane starts a control plane whose state is snap (its
// revision is the store's).
func newControlPlane(t testing.TB, snap *spec.Snapshot) *controlPlane {
	t.Helper()
	store, err := controlplane.OpenBolt(filepath.Join(t.TempDir(), "cp.db"), controlplane.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cp := &controlPlane{store: store, dps: &controlplane.DataPlanes{}}
	cp.write(t, func(tx controlplane.Tx) error {
		for _, p := range snap.Policies {
			if err := tx.PutPolicy(p); err != nil {
				return err
			}
		}
		for _, a := range snap.APIs {
			if err := tx.PutAPI(a); err != nil {
				return err
			}
		}
		for _, k := range snap.Keys {
			if err := tx.PutKey(k); err != nil {
				return err
			}
		}
		return nil
	})
	cp.srv, err = controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:      store,
		DataPlanes: cp.dps,
		Tokens:     []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(testToken), Group: testGroup}},
		Log:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = lis.Addr().String()
	cp.serve(lis)
	t.Cleanup(cp.Stop)
	return cp
}

func (cp *controlPlane) serve(lis net.Listener) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.gs = grpc.NewServer()
	syncpb.RegisterSyncServiceServer(cp.gs, cp.srv)
	if cp.quota != nil {
		syncpb.RegisterQuotaServiceServer(cp.gs, cp.quota)
	}
	cp.served = make(chan error, 1)
	gs, served := cp.gs, cp.served
	go func() { served <- gs.Serve(lis) }()
}

// Stop stops serving: open streams end, new connections are refused.
func (cp *controlPlane) Stop() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.gs == nil {
		return
	}
	cp.gs.Stop()
	<-cp.served
	cp.gs = nil
}

// Start serves again on the same address.
func (cp *controlPlane) Start(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("tcp", cp.addr)
	if err != nil {
		t.Fatal(err)
	}
	cp.serve(lis)
}

// write runs fn in a write transaction and returns the new revision.
func (cp *controlPlane) write(t testing.TB, fn func(tx controlplane.Tx) error) uint64 {
	t.Helper()
	rev, err := cp.store.Update(context.Background(), fn)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// applied returns the revision gateway id acknowledged.
func (cp *controlPlane) applied(id string) uint64 {
	for _, dp := range cp.dps.List() {
		if dp.GatewayID == id {
			return dp.AppliedRevision
		}
	}
	return 0
}

// fakeCP is a test-only SyncService whose streams the test drives: each
// Sync call is handed to the test (streams), which sends what it likes
// and reads what the gateway sends (fakeStream.recv). The first refuse
// calls are refused with Unavailable at once; every call's time is kept.
type fakeCP struct {
	syncpb.UnimplementedSyncServiceServer
	streams chan *fakeStream

	mu        sync.Mutex
	refuse    int
	refuseErr error // when set, every call is refused with it
	attempts  []time.Time
}

// refuseWith makes every Sync call end at once with err (nil: serve
// again).
func (f *fakeCP) refuseWith(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuseErr = err
}

// attemptCount returns how many Sync calls came.
func (f *fakeCP) attemptCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.attempts)
}

// fakeStream is one Sync call of a fakeCP.
type fakeStream struct {
	hello  *syncpb.Hello
	stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]
	recv   chan *syncpb.ClientMessage
	end    chan error // what Sync returns
}

func (f *fakeCP) Sync(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]) error {
	f.mu.Lock()
	f.attempts = append(f.attempts, time.Now())
	refused := len(f.attempts) <= f.refuse
	refuseErr := f.refuseErr
	f.mu.Unlock()
	if refuseErr != nil {
		return refuseErr
	}
	if refused {
		return status.Error(codes.Unavailable, "fake: not yet")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	fs := &fakeStream{hello: first.GetHello(), stream: stream, recv: make(chan *syncpb.ClientMessage, 64), end: make(chan error, 1)}
	ctx := stream.Context()
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case fs.recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case f.streams <- fs:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-fs.end:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeCP) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.attempts...)
}

// newFakeCP serves a fakeCP on a loopback address.
func newFakeCP(t *testing.T, refuse int, opts ...grpc.ServerOption) (*fakeCP, string) {
	t.Helper()
	f := &fakeCP{streams: make(chan *fakeStream, 4), refuse: refuse}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	syncpb.RegisterSyncServiceServer(gs, f)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	return f, lis.Addr().String()
}

// next waits for the next stream.
func (f *fakeCP) next(t *testing.T) *fakeStream {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("no stream within 20 s")
		return nil
	}
}

// sendSnapshot sends snap in chunks of 512 bytes with nonce.
func (s *fakeStream) sendSnapshot(t *testing.T, snap *spec.Snapshot, nonce string) {
	t.Helper()
	s.sendSnapshotOf(t, snap, nonce, "")
}

// sendSnapshotOf is sendSnapshot naming history on the last chunk.
func (s *fakeStream) sendSnapshotOf(t *testing.T, snap *spec.Snapshot, nonce, history string) {
	t.Helper()
	chunks, err := protocol.Chunks(snap, nonce, 512)
	if err != nil {
		t.Fatal(err)
	}
	chunks[len(chunks)-1].History = history
	for _, c := range chunks {
		if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: c}}); err != nil {
			t.Fatal(err)
		}
	}
}

// sendChanges sends ch.
func (s *fakeStream) sendChanges(t *testing.T, ch *syncpb.Changes) {
	t.Helper()
	if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_Changes{Changes: ch}}); err != nil {
		t.Fatal(err)
	}
}

// answer returns the gateway's next Ack or Nack (skipping digest
// reports).
func (s *fakeStream) answer(t *testing.T) *syncpb.ClientMessage {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-s.recv:
			if !ok {
				t.Fatal("the stream ended")
			}
			if m.GetDigestReport() != nil {
				continue
			}
			return m
		case <-timeout:
			t.Fatal("no answer within 20 s")
			return nil
		}
	}
}

// wantAck checks that the next answer is Ack{rev, nonce}.
func (s *fakeStream) wantAck(t *testing.T, rev uint64, nonce string) {
	t.Helper()
	m := s.answer(t)
	if a := m.GetAck(); a == nil || a.GetRevision() != rev || a.GetNonce() != nonce {
		t.Fatalf("got %v, want Ack{%d, %s}", m, rev, nonce)
	}
}

// wantNack checks that the next answer is Nack{rev, nonce, problem}.
func (s *fakeStream) wantNack(t *testing.T, rev uint64, nonce, problem string) {
	t.Helper()
	m := s.answer(t)
	if n := m.GetNack(); n == nil || n.GetRevision() != rev || n.GetNonce() != nonce || n.GetError() != problem {
		t.Fatalf("got %v\nwant Nack{%d, %s, %q}", m, rev, nonce, problem)
	}
}

// changes returns Changes from→to of cs with the digest of what they
// make of base.
func changes(t *testing.T, base *spec.Snapshot, from, to uint64, cs ...*syncpb.Change) *syncpb.Changes {
	t.Helper()
	ch := &syncpb.Changes{FromRevision: from, Revision: to, Nonce: "n" + time.Now().Format("150405.000000000"), Changes: cs}
	next, err := protocol.ApplyChanges(base, ch)
	if err != nil {
		t.Fatal(err)
	}
	ch.Digest = protocol.Digest(next)
	return ch
}

func putKey(t *testing.T, k spec.Key) *syncpb.Change {
	t.Helper()
	c, err := protocol.PutKey(&k)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
