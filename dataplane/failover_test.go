package dataplane_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// sharedStore is one Bolt store with snapshot(1, "k1")'s state, shared
// by the replicas of a test: several control-plane processes on one
// database, in one process.
func sharedStore(t *testing.T) *controlplane.Bolt {
	t.Helper()
	store, err := controlplane.OpenBolt(filepath.Join(t.TempDir(), "cp.db"), controlplane.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	snap := snapshot(1, "k1")
	if _, err := store.Update(context.Background(), func(tx controlplane.Tx) error {
		if err := tx.PutPolicy(snap.Policies[0]); err != nil {
			return err
		}
		if err := tx.PutAPI(snap.APIs[0]); err != nil {
			return err
		}
		return tx.PutKey(snap.Keys[0])
	}); err != nil {
		t.Fatal(err)
	}
	return store
}

// writeKey writes plaintext key k on policy p and returns the revision.
func writeKey(t *testing.T, store *controlplane.Bolt, k string) uint64 {
	t.Helper()
	rev, err := store.Update(context.Background(), func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash(k), Policies: []string{"p"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// storeDigest is the digest of the state a data plane without tags gets
// from the store now, and its revision.
func storeDigest(t *testing.T, store *controlplane.Bolt) (uint64, string) {
	t.Helper()
	snap, err := store.Snapshot(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Revision, protocol.Digest(snap)
}

// replica is a real controlplane.SyncServer over a shared store, served
// by its own gRPC server on a loopback listener, with its own
// DataPlanes and metrics; optionally behind a freezable proxy.
type replica struct {
	srv     *controlplane.SyncServer
	dps     *controlplane.DataPlanes
	metrics *prometheus.Registry
	addr    string // what agents dial (the proxy's when there is one)
	proxy   *freezeProxy

	mu     sync.Mutex
	gs     *grpc.Server
	lis    *trackingListener
	served chan error
}

// startReplica starts a replica over store listening on listen
// ("127.0.0.1:0" for any port).
func startReplica(t *testing.T, store controlplane.Store, listen string, proxied bool) *replica {
	t.Helper()
	r := &replica{dps: &controlplane.DataPlanes{}, metrics: prometheus.NewRegistry()}
	m, err := controlplane.NewMetrics(r.metrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.srv, err = controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:      store,
		DataPlanes: r.dps,
		Tokens:     []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(testToken), Group: testGroup}},
		Metrics:    m,
		Log:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	r.serve(lis)
	if proxied {
		r.proxy = newFreezeProxy(t, r.addr)
		r.addr = r.proxy.addr
	}
	t.Cleanup(r.stop)
	return r
}

func (r *replica) serve(lis net.Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The agent pings every 10 s (gRPC's least) also without a stream.
	r.gs = grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}))
	syncpb.RegisterSyncServiceServer(r.gs, r.srv)
	r.lis = &trackingListener{Listener: lis, conns: map[net.Conn]bool{}}
	r.served = make(chan error, 1)
	gs, l, served := r.gs, r.lis, r.served
	go func() { served <- gs.Serve(l) }()
}

// gracefulStop is how the control-plane program stops: Shutdown ends the
// streams with Unavailable, GracefulStop closes the listener and waits.
func (r *replica) gracefulStop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Shutdown()
	r.gs.GracefulStop()
	<-r.served
}

// hardClose is a killed process: its listener and every connection
// closed at once, nothing said on the streams.
func (r *replica) hardClose() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lis.closeAll()
}

// stop ends the gRPC server (at the test's end).
func (r *replica) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gs.Stop()
	select {
	case <-r.served:
	default:
	}
}

// snapshots and changes are the deliveries the replica sent, by kind.
func (r *replica) deliveries(t *testing.T) (snapshots, changes int) {
	t.Helper()
	mfs, err := r.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "limitplane_controlplane_sync_deliveries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch l.GetValue() {
				case "snapshot":
					snapshots = int(m.GetCounter().GetValue())
				case "changes":
					changes = int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return snapshots, changes
}

// connected reports whether gateway id has an open stream on the
// replica, and the revision it acknowledged there.
func (r *replica) connected(id string) (bool, uint64) {
	for _, dp := range r.dps.List() {
		if dp.GatewayID == id && dp.Connected {
			return true, dp.AppliedRevision
		}
	}
	return false, 0
}

// trackingListener remembers the connections it accepted, so closeAll
// can cut them as a killed process's kernel would.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c] = true
	l.mu.Unlock()
	return c, nil
}

func (l *trackingListener) closeAll() {
	l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as for a killed process
		}
		c.Close()
	}
}

// freezeProxy forwards TCP connections to a backend; frozen, it still
// accepts connections and reads, but delivers nothing either way, as a
// SIGSTOPped process whose kernel keeps its sockets open.
type freezeProxy struct {
	addr    string
	lis     net.Listener
	backend string
	done    chan struct{}
	wg      sync.WaitGroup

	mu     sync.Mutex
	thawed chan struct{} // closed while not frozen
	conns  map[net.Conn]bool
}

func newFreezeProxy(t *testing.T, backend string) *freezeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{addr: lis.Addr().String(), lis: lis, backend: backend, done: make(chan struct{}),
		thawed: make(chan struct{}), conns: map[net.Conn]bool{}}
	close(p.thawed)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.thawed = make(chan struct{})
}

func (p *freezeProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// wait returns when the proxy is not frozen, false when it closes.
func (p *freezeProxy) wait() bool {
	p.mu.Lock()
	th := p.thawed
	p.mu.Unlock()
	select {
	case <-th:
		return true
	case <-p.done:
		return false
	}
}

func (p *freezeProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		c.Close()
		return false
	default:
	}
	p.conns[c] = true
	return true
}

func (p *freezeProxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() {
			if !p.wait() {
				return
			}
			b, err := net.Dial("tcp", p.backend)
			if err != nil {
				c.Close()
				return
			}
			if !p.track(b) {
				c.Close()
				return
			}
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 && (!p.wait() || func() bool { _, werr := dst.Write(buf[:n]); return werr != nil }()) {
						break
					}
					if err != nil {
						break
					}
				}
				dst.Close()
				src.Close()
			}
			p.wg.Go(func() { pipe(b, c) })
			pipe(c, b)
		})
	}
}

func (p *freezeProxy) close() {
	p.mu.Lock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.lis.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// failoverAgent starts an agent for g with the given Address, pinging
// every 10 s (gRPC's least) with a 1 s timeout.
func failoverAgent(t *testing.T, g *testGateway, address string, log io.Writer) *dataplane.Agent {
	t.Helper()
	o := agentOptions(g.tg, address, log)
	o.Keepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: time.Second}
	a, err := dataplane.New(o)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	return a
}

// waitWithin waits up to bound for cond and returns how long it took; it
// fails the test when cond does not hold by then.
func waitWithin(t *testing.T, what string, bound time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// An agent given two replicas' addresses follows the writes through the
// one it is on; when that replica goes (shut down gracefully, killed:
// listener and connections cut, or frozen: its connections silent until
// keepalive gives up) it moves to the other within a bound, receives the
// writes made meanwhile as changes (neither the agent nor the other
// replica counts a snapshot), and its digest is the store's. Then the
// first replica comes back, the second goes, and the agent moves back,
// again without a snapshot.
func TestFailoverBetweenReplicas(t *testing.T) {
	for _, c := range []struct {
		name    string
		proxied bool
		bound   time.Duration // from the loss to the writes applied on the other
	}{
		{"graceful", false, 5 * time.Second},
		{"killed", false, 5 * time.Second},
		// Keepalive: 10 s quiet, then 1 s for the ping's answer.
		{"frozen", true, 30 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := sharedStore(t)
			reps := []*replica{startReplica(t, store, "127.0.0.1:0", c.proxied), startReplica(t, store, "127.0.0.1:0", c.proxied)}
			g := newGateway(t)
			log := &lockedBuffer{}
			a := failoverAgent(t, g, reps[0].addr+" , "+reps[1].addr, log)

			at := func(rev uint64) func() bool {
				return func() bool { s := a.Status(); return s.State == "connected" && s.AppliedRevision == rev }
			}
			waitFor(t, "revision 1", at(1))
			on := -1
			for i, r := range reps {
				if a.Status().Address == r.addr {
					on = i
				}
			}
			if on < 0 {
				t.Fatalf("Status.Address %q is neither replica's (%s, %s)", a.Status().Address, reps[0].addr, reps[1].addr)
			}
			rev := writeKey(t, store, "k2")
			waitFor(t, "k2 through the first replica", at(rev))
			if st := a.Status().Deliveries; st.SnapshotsApplied != 1 || st.ChangesApplied != 1 {
				t.Fatalf("deliveries before the failover: %+v, want 1 snapshot and 1 changes", st)
			}

			lose := func(r *replica) {
				switch c.name {
				case "graceful":
					r.gracefulStop()
				case "killed":
					r.hardClose()
				case "frozen":
					r.proxy.freeze()
				}
			}
			restore := func(t *testing.T, r *replica) *replica {
				if c.name == "frozen" {
					r.proxy.thaw()
					return r
				}
				// A restarted process on the same address: a new sync
				// server with an empty cache.
				return startReplica(t, store, r.addr, false)
			}

			for round, keys := range [][]string{{"k3", "k4"}, {"k5", "k6"}} {
				from, to := reps[on], reps[1-on]
				snapsBefore, _ := to.deliveries(t)
				start := time.Now()
				lose(from)
				var last uint64
				for _, k := range keys {
					last = writeKey(t, store, k)
				}
				took := waitWithin(t, fmt.Sprintf("round %d: on the other replica at revision %d", round, last), c.bound, func() bool {
					ok, acked := to.connected(a.GatewayID())
					return ok && acked == last && at(last)() && a.Status().Address == to.addr
				})
				t.Logf("round %d: moved and at revision %d %v after the loss (%v waiting)", round, last, time.Since(start), took)
				s := a.Status()
				if s.Deliveries.SnapshotsApplied != 1 || s.Deliveries.SnapshotsRejected != 0 || s.Deliveries.ChangesRejected != 0 {
					t.Fatalf("round %d: agent deliveries %+v, want still the first snapshot only", round, s.Deliveries)
				}
				if snaps, changes := to.deliveries(t); snaps != snapsBefore || changes < 1 {
					t.Fatalf("round %d: the other replica sent %d snapshots (%d before) and %d changes; want no new snapshot and changes", round, snaps, snapsBefore, changes)
				}
				if rev, digest := storeDigest(t, store); s.AppliedRevision != rev || s.Digest != digest {
					t.Fatalf("round %d: agent at %d digest %s, store at %d digest %s", round, s.AppliedRevision, s.Digest, rev, digest)
				}
				for _, k := range keys {
					if st, body := g.get(t, k); st != 200 {
						t.Fatalf("round %d: key %s written during the failover: %d %s", round, k, st, body)
					}
				}
				reps[on] = restore(t, from)
				on = 1 - on
			}
			if n := strings.Count(log.String(), "sync stream ended; reconnecting"); n < 2 {
				t.Fatalf("%d reconnects logged, want 2 or more:\n%s", n, log)
			}
		})
	}
}

// New refuses an Address list with an empty part, a part without a
// host or with port 0, naming it.
func TestAgentAddressList(t *testing.T) {
	g := newGateway(t)
	for _, c := range []struct{ address, want string }{
		{"127.0.0.1:1,,127.0.0.1:2", `dataplane: AgentOptions.Address "127.0.0.1:1,,127.0.0.1:2": part 2 is empty (want host:port, or host:port,host:port,…)`},
		{"127.0.0.1:1, ", `dataplane: AgentOptions.Address "127.0.0.1:1, ": part 2 is empty (want host:port, or host:port,host:port,…)`},
		{"127.0.0.1:0", `dataplane: AgentOptions.Address "127.0.0.1:0": part 1, "127.0.0.1:0", has port 0, which names no server (want a port from 1 to 65535)`},
		{"127.0.0.1:1, :7071", `dataplane: AgentOptions.Address "127.0.0.1:1, :7071": part 2, ":7071", names no host (want host:port, like cp.example:7071)`},
		// Neither host:port nor a target of a scheme gRPC resolves: a
		// typo, refused rather than retried forever.
		{"garbage::::", `dataplane: AgentOptions.Address "garbage::::": part 1, "garbage::::": address garbage::::: too many colons in address (want host:port, or a gRPC target such as unix:///path or dns:///host:port)`},
		{"cp.example", `dataplane: AgentOptions.Address "cp.example": part 1, "cp.example": address cp.example: missing port in address (want host:port, or a gRPC target such as unix:///path or dns:///host:port)`},
		// Targets gRPC resolves are left to the dial.
		{"unix:///tmp/cp.sock", ""},
		{"dns:///cp.example:7071", ""},
		{"127.0.0.1:1,passthrough:///127.0.0.1:2", ""},
	} {
		_, err := dataplane.New(agentOptions(g.tg, c.address, io.Discard))
		if c.want == "" && err != nil {
			t.Errorf("New(%q): %v, want no error", c.address, err)
		}
		if c.want != "" && (err == nil || err.Error() != c.want) {
			t.Errorf("New(%q): %v, want %s", c.address, err, c.want)
		}
	}
}

// New and Follow refuse a group that is not ValidGroup: it names a
// Cluster hash tag.
func TestGroupChecked(t *testing.T) {
	g := newGateway(t)
	for _, c := range []struct {
		group string
		valid bool
	}{
		{"dp1", true}, {"eu-west.1:a_b", true}, {"grüne", true}, {strings.Repeat("g", 128), true},
		{strings.Repeat("g", 129), false}, {"a b", false}, {"a}b{c", false}, {"{g}", false}, {"a\x01", false}, {"a\x7f", false}, {"tab\t", false},
	} {
		if got := dataplane.ValidGroup(c.group); got != c.valid {
			t.Errorf("ValidGroup(%q) = %v, want %v", c.group, got, c.valid)
		}
		o := agentOptions(g.tg, "127.0.0.1:1", io.Discard)
		o.Group = c.group
		_, err := dataplane.New(o)
		want := fmt.Sprintf(`dataplane: AgentOptions.Group %q: want 1 to 128 characters without spaces, control characters, "{" or "}" (it names a Cluster hash tag)`, c.group)
		if c.valid && err != nil || !c.valid && (err == nil || err.Error() != want) {
			t.Errorf("New with group %q: %v", c.group, err)
		}
		if c.valid {
			continue
		}
		_, err = dataplane.Follow(context.Background(), dataplane.FollowOptions{Address: "127.0.0.1:1", Group: c.group, Token: "t"})
		if want := strings.Replace(want, "AgentOptions", "FollowOptions", 1); err == nil || err.Error() != want {
			t.Errorf("Follow with group %q: %v, want %s", c.group, err, want)
		}
	}
}

// TestGatewayIDChecked: New and Follow refuse a gateway_id the control
// plane would refuse (protocol.CheckGatewayID), naming the option; the
// default, "<hostname>-<pid>", passes.
func TestGatewayIDChecked(t *testing.T) {
	g := newGateway(t)
	for _, c := range []struct{ id, problem string }{
		{strings.Repeat("g", 257), "gateway_id is 257 bytes long, more than 256"},
		{"gw\n1", `gateway_id "gw\n1" has a control character`},
	} {
		o := agentOptions(g.tg, "127.0.0.1:1", io.Discard)
		o.GatewayID = c.id
		if _, err := dataplane.New(o); err == nil || err.Error() != "dataplane: AgentOptions.GatewayID: "+c.problem {
			t.Errorf("New with gateway_id %q: %v, want %s", c.id, err, c.problem)
		}
		_, err := dataplane.Follow(context.Background(), dataplane.FollowOptions{Address: "127.0.0.1:1", Group: "g", Token: "t", ID: c.id})
		if err == nil || err.Error() != "dataplane: FollowOptions.ID: "+c.problem {
			t.Errorf("Follow with ID %q: %v, want %s", c.id, err, c.problem)
		}
	}
	o := agentOptions(g.tg, "127.0.0.1:1", io.Discard)
	o.GatewayID = ""
	a, err := dataplane.New(o)
	if err != nil {
		t.Fatalf("New with the default gateway_id: %v", err)
	}
	host, _ := os.Hostname()
	if want := host + "-" + strconv.Itoa(os.Getpid()); a.GatewayID() != want {
		t.Errorf("default gateway_id %q, want %q", a.GatewayID(), want)
	}
}
