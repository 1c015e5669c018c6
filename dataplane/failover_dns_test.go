package dataplane_test

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is an in-process DNS server on loopback UDP answering the A
// query of one name with several addresses (no AAAA records; NXDOMAIN
// for other names). gRPC's dns resolver is pointed at it with the
// target's authority, "dns://<server>/<name>:<port>", so no system or
// external DNS is involved.
type dnsServer struct {
	addr    string
	pc      net.PacketConn
	wg      sync.WaitGroup
	name    dnsmessage.Name
	records [][4]byte

	mu      sync.Mutex
	queries int
}

func newDNSServer(t *testing.T, name string, records ...netip.Addr) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{addr: pc.LocalAddr().String(), pc: pc, name: dnsmessage.MustNewName(name)}
	for _, r := range records {
		s.records = append(s.records, r.As4())
	}
	s.wg.Go(s.serve)
	t.Cleanup(func() {
		pc.Close()
		s.wg.Wait()
	})
	return s
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		if out, err := s.answer(buf[:n]); err == nil {
			s.pc.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query.
func (s *dnsServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.queries++
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	known := strings.EqualFold(q.Name.String(), s.name.String())
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if known && q.Type == dnsmessage.TypeA {
		for _, r := range s.records {
			if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: r}); err != nil {
				return nil, err
			}
		}
	}
	return b.Finish()
}

func (s *dnsServer) queryCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

// listenPair listens on 127.0.0.1 and 127.0.0.2 on one port (A records
// carry no port), trying a few ports; it returns the port.
func listenPair(t *testing.T) (net.Listener, net.Listener, int) {
	t.Helper()
	for range 20 {
		l1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l1.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
		if err == nil {
			return l1, l2, port
		}
		l1.Close()
		if !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("listen on 127.0.0.2: %v (this test needs the loopback network 127.0.0.0/8)", err)
		}
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2 in 20 tries")
	return nil, nil, 0
}

// An agent given one DNS name whose two A records are two replicas
// (resolved by gRPC's dns resolver from an in-process DNS server) is on
// one of them; when that one is killed it moves to the other record,
// gets the writes made meanwhile as changes, and its digest is the
// store's; then back, when the first returns and the second is killed.
func TestFailoverDNSName(t *testing.T) {
	store := sharedStore(t)
	l1, l2, port := listenPair(t)
	// startReplica listens itself: free the pair just before, on the
	// same addresses.
	a1, a2 := l1.Addr().String(), l2.Addr().String()
	l1.Close()
	l2.Close()
	reps := []*replica{startReplica(t, store, a1, false), startReplica(t, store, a2, false)}
	dns := newDNSServer(t, "cp.limitplane.test.", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))

	g := newGateway(t)
	log := &lockedBuffer{}
	target := "dns://" + dns.addr + "/cp.limitplane.test:" + strconv.Itoa(port)
	a := failoverAgent(t, g, target, log)
	at := func(rev uint64) func() bool {
		return func() bool { s := a.Status(); return s.State == "connected" && s.AppliedRevision == rev }
	}
	waitFor(t, "revision 1", at(1))
	if got := a.Status().Address; got != target {
		t.Fatalf("Status.Address = %q, want %q", got, target)
	}
	if dns.queryCount() == 0 {
		t.Fatal("the DNS server was not asked")
	}
	on := -1
	for i, r := range reps {
		if ok, _ := r.connected(a.GatewayID()); ok {
			on = i
		}
	}
	if on < 0 {
		t.Fatal("the agent is on neither replica")
	}

	for round, key := range []string{"k2", "k3"} {
		from, to := reps[on], reps[1-on]
		snapsBefore, _ := to.deliveries(t)
		from.hardClose()
		rev := writeKey(t, store, key)
		waitWithin(t, "on the other record at revision "+strconv.FormatUint(rev, 10), 10*time.Second, func() bool {
			ok, acked := to.connected(a.GatewayID())
			return ok && acked == rev && at(rev)()
		})
		s := a.Status()
		if s.Deliveries.SnapshotsApplied != 1 {
			t.Fatalf("round %d: agent deliveries %+v, want the first snapshot only", round, s.Deliveries)
		}
		if snaps, changes := to.deliveries(t); snaps != snapsBefore || changes < 1 {
			t.Fatalf("round %d: the other replica sent %d snapshots (%d before) and %d changes; want no new snapshot", round, snaps, snapsBefore, changes)
		}
		if rev, digest := storeDigest(t, store); s.AppliedRevision != rev || s.Digest != digest {
			t.Fatalf("round %d: agent at %d digest %s, store at %d digest %s", round, s.AppliedRevision, s.Digest, rev, digest)
		}
		if st, body := g.get(t, key); st != 200 {
			t.Fatalf("round %d: key %s: %d %s", round, key, st, body)
		}
		reps[on] = startReplica(t, store, []string{a1, a2}[on], false) // restarted
		on = 1 - on
	}
}
