package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// quotaStart is the ledger's clock at the start of these tests.
var quotaStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The quota tests' data planes: group dpN has token "dp-secret-N".
var quotaGroups = []string{"dp1", "dp2", "dp3"}

func quotaToken(group string) string { return "dp-secret-" + strings.TrimPrefix(group, "dp") }

func quotaTokens() []controlplane.DataPlaneToken {
	var ts []controlplane.DataPlaneToken
	for _, g := range quotaGroups {
		ts = append(ts, controlplane.DataPlaneToken{Hash: controlplane.HashToken(quotaToken(g)), Group: g})
	}
	return ts
}

// clock is a settable clock, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// The configuration of the quota tests: policy "g" has a strict global
// quota of 1000 per hour, policy "local" a quota that is not global, key
// "alice" has both policies, and key "bob" has api_limits on API "api1"
// with an optimistic global quota of 500 per hour, floor 10.
const (
	quotaQ      = 1000
	quotaPeriod = time.Hour
)

var (
	aliceConsumer = identity.HashKey("alice").ConsumerID()
	bobConsumer   = identity.HashKey("bob").ConsumerID()
)

func putQuotaConfig(t *testing.T, s controlplane.Store) {
	t.Helper()
	update(t, s, func(tx controlplane.Tx) error {
		if err := tx.PutAPI(spec.API{ID: "api1", ListenPath: "/api1/", Target: spec.BuiltinEcho}); err != nil {
			return err
		}
		if err := tx.PutPolicy(spec.Policy{ID: "g", Quota: &spec.Quota{Max: quotaQ, Renewal: spec.Duration(quotaPeriod),
			Global: &spec.GlobalQuota{Mode: "strict", LeaseDuration: spec.Duration(10 * time.Second)}}}); err != nil {
			return err
		}
		if err := tx.PutPolicy(spec.Policy{ID: "local", Quota: &spec.Quota{Max: 50, Renewal: spec.Duration(quotaPeriod)}}); err != nil {
			return err
		}
		if err := tx.PutKey(spec.Key{KeyHash: hash("alice"), Policies: []string{"g", "local"}}); err != nil {
			return err
		}
		return tx.PutKey(spec.Key{KeyHash: hash("bob"), APILimits: map[string]spec.Limits{"api1": {
			Quota: &spec.Quota{Max: 500, Renewal: spec.Duration(quotaPeriod), Global: &spec.GlobalQuota{Mode: "optimistic", Floor: 10}}}}})
	})
}

// quotaServing is a QuotaServer on a real gRPC listener and a client
// connected to it.
type quotaServing struct {
	srv    *controlplane.QuotaServer
	client syncpb.QuotaServiceClient
	stop   func()
}

// serveQuota serves a QuotaServer over store; stopped at the end of the
// test, or by stop.
func serveQuota(t testing.TB, store controlplane.Store, now func() time.Time, edit func(o *controlplane.QuotaOptions)) *quotaServing {
	t.Helper()
	o := controlplane.QuotaOptions{Store: store, Tokens: quotaTokens(), Now: now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if edit != nil {
		edit(&o)
	}
	srv, err := controlplane.NewQuotaServer(o)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	syncpb.RegisterQuotaServiceServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			conn.Close()
			gs.Stop()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &quotaServing{srv: srv, client: syncpb.NewQuotaServiceClient(conn), stop: stop}
}

// leaseCall sends b as group with its token.
func leaseCall(ctx context.Context, c syncpb.QuotaServiceClient, group string, b lease.Batch) (lease.BatchAnswer, error) {
	body, err := json.Marshal(b)
	if err != nil {
		return lease.BatchAnswer{}, err
	}
	resp, err := c.Lease(ctx, &syncpb.LeaseRequest{Token: quotaToken(group), Group: group, Body: body})
	if err != nil {
		return lease.BatchAnswer{}, err
	}
	var a lease.BatchAnswer
	if err := json.Unmarshal(resp.GetBody(), &a); err != nil {
		return lease.BatchAnswer{}, fmt.Errorf("decode the answer: %w", err)
	}
	return a, nil
}

// mustLease is leaseCall that fails the test on an error.
func mustLease(t testing.TB, c syncpb.QuotaServiceClient, group string, b lease.Batch) lease.BatchAnswer {
	t.Helper()
	a, err := leaseCall(context.Background(), c, group, b)
	if err != nil {
		t.Fatalf("Lease(%s): %v", group, err)
	}
	return a
}

// grantOne asks for want units of key as group and returns the only
// answer, which must be a grant.
func grantOne(t testing.TB, c syncpb.QuotaServiceClient, key lease.EntryKey, id lease.RequestID, want int64) lease.Grant {
	t.Helper()
	a := mustLease(t, c, id.DataPlane, lease.Batch{Grants: []lease.GrantRequest{{Entry: key, ID: id, Want: want}}})
	if len(a.Grants) != 1 || len(a.Refusals) != 0 {
		t.Fatalf("grant %s: answer %+v, want one grant", id, a)
	}
	return a.Grants[0]
}

// refusedOne asks as grantOne and returns the only answer, which must be
// a refusal.
func refusedOne(t testing.TB, c syncpb.QuotaServiceClient, key lease.EntryKey, id lease.RequestID) lease.Refused {
	t.Helper()
	a := mustLease(t, c, id.DataPlane, lease.Batch{Grants: []lease.GrantRequest{{Entry: key, ID: id, Want: 10}}})
	if len(a.Refusals) != 1 || len(a.Grants) != 0 || a.Refusals[0].Request == nil || *a.Refusals[0].Request != id {
		t.Fatalf("grant %s: answer %+v, want one refusal of it", id, a)
	}
	return a.Refusals[0]
}

// ledgerEntries reads every ledger entry of the store.
func ledgerEntries(t testing.TB, s controlplane.Store) []*quotaledger.Entry {
	t.Helper()
	var out []*quotaledger.Entry
	err := s.(controlplane.QuotaLedgerStore).ScanQuota(context.Background(), "e/", func(id string, r controlplane.QuotaRecord) error {
		var st quotaledger.State
		if err := json.Unmarshal(r.Value, &st); err != nil {
			return err
		}
		e, err := quotaledger.Restore(st)
		if err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// aliceKey is alice's entry of policy g at epoch 0, period in force.
func aliceKey() lease.EntryKey { return lease.EntryKey{Consumer: aliceConsumer, Policy: "g"} }

// grantConcurrently runs writers goroutines per group, spread over the
// clients in turn, each asking for 1 to 40 units of aliceKey until an
// answer says nothing remains; the goroutines of a group share its
// holder's sequence numbers (token 1). It returns every distinct grant.
func grantConcurrently(t *testing.T, clients []syncpb.QuotaServiceClient, writers int) map[lease.RequestID]lease.Grant {
	t.Helper()
	var mu sync.Mutex
	grants := map[lease.RequestID]lease.Grant{}
	var wg sync.WaitGroup
	var failed atomic.Bool
	n := 0
	for gi, g := range quotaGroups {
		var seq atomic.Uint64
		for w := range writers {
			c := clients[n%len(clients)]
			n++
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(gi), uint64(w)))
				for !failed.Load() {
					id := lease.RequestID{DataPlane: g, Token: 1, Seq: seq.Add(1)}
					a, err := leaseCall(context.Background(), c, g, lease.Batch{Grants: []lease.GrantRequest{{Entry: aliceKey(), ID: id, Want: 1 + rng.Int64N(40)}}})
					if err != nil || len(a.Grants) != 1 {
						t.Errorf("grant %s: %+v, %v", id, a, err)
						failed.Store(true)
						return
					}
					gr := a.Grants[0]
					mu.Lock()
					grants[id] = gr
					mu.Unlock()
					if gr.Remaining == 0 {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
	return grants
}

// checkGranted checks that the grants sum to Q exactly, every grant names
// one period, and the store's only entry audits, has committed Q and
// leases equal to the grants.
func checkGranted(t *testing.T, s controlplane.Store, grants map[lease.RequestID]lease.Grant) {
	t.Helper()
	var sum int64
	var start time.Time
	for id, g := range grants {
		sum += g.Amount
		if start.IsZero() {
			start = g.Entry.PeriodStart
		}
		if !g.Entry.PeriodStart.Equal(start) || g.Entry.Consumer != aliceConsumer || g.ID != id {
			t.Fatalf("grant %s names %s, want %s|…|%d", id, g.Entry, aliceConsumer, start.UnixNano())
		}
	}
	if sum != quotaQ {
		t.Fatalf("Σ granted %d, want exactly %d", sum, quotaQ)
	}
	es := ledgerEntries(t, s)
	if len(es) != 1 {
		t.Fatalf("%d ledger entries, want 1", len(es))
	}
	e := es[0]
	if err := e.Audit(); err != nil {
		t.Fatal(err)
	}
	var leased int64
	for _, l := range e.Leases() {
		leased += l.Amount
		if g, ok := grants[l.ID]; !ok || g.Amount != l.Amount {
			t.Fatalf("lease %s of %d units: the clients were granted %+v", l.ID, l.Amount, g)
		}
	}
	if e.Committed() != quotaQ || leased != quotaQ {
		t.Fatalf("committed %d, Σ leases %d; want %d", e.Committed(), leased, quotaQ)
	}
	for id, g := range grants {
		if _, ok := e.Lease(id); !ok && g.Amount > 0 {
			t.Fatalf("grant %s of %d units has no lease in the ledger", id, g.Amount)
		}
	}
}

// TestQuotaConcurrentGrants: 3 data planes × 4 goroutines ask for budget
// of one entry with Q = 1000 at once: the grants sum to 1000 exactly, the
// ledger audits, its leases are the grants; on both stores. The ledger's
// writes leave the configuration's revision and change log alone.
func TestQuotaConcurrentGrants(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		rev := revision(t, s)
		q := serveQuota(t, s, func() time.Time { return quotaStart }, nil)
		grants := grantConcurrently(t, []syncpb.QuotaServiceClient{q.client}, 4)
		checkGranted(t, s, grants)
		if got := revision(t, s); got != rev {
			t.Fatalf("revision %d after ledger writes, want %d", got, rev)
		}
		if cs, err := s.ChangesSince(context.Background(), rev); err != nil || len(cs) != 0 {
			t.Fatalf("ChangesSince(%d) = %v, %v; want none", rev, cs, err)
		}
	})
}

// TestQuotaReplicasOnOnePostgres: two control planes (stores and
// servers) on one PostgreSQL database grant one entry concurrently: Σ
// granted is Q exactly, and is what the ledger holds.
func TestQuotaReplicasOnOnePostgres(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	s1 := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	s2 := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	putQuotaConfig(t, s1)
	now := func() time.Time { return quotaStart }
	q1, q2 := serveQuota(t, s1, now, nil), serveQuota(t, s2, now, nil)
	grants := grantConcurrently(t, []syncpb.QuotaServiceClient{q1.client, q2.client}, 4)
	checkGranted(t, s2, grants)
}

// TestQuotaRestart: after the store is closed and opened again under a
// new server, a repeated request gets the same grant and grants nothing
// more, a new one continues from the ledger, and the period anchor is
// kept: the next period starts one renewal after the first request. A
// request naming an ended period is granted nothing; one naming a start
// that is not a period, or a future one, is refused.
func TestQuotaRestart(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, reopen := sc.open(t, 0)
		putQuotaConfig(t, s)
		clk := &clock{t: quotaStart}
		q := serveQuota(t, s, clk.Now, nil)
		id1 := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}
		g1 := grantOne(t, q.client, aliceKey(), id1, 300)
		if g1.Amount != 300 || !g1.Entry.PeriodStart.Equal(quotaStart) || g1.Remaining != quotaQ-300 || g1.Duration != 10*time.Second || g1.PeriodLeft != quotaPeriod {
			t.Fatalf("first grant %+v", g1)
		}
		clk.Add(time.Minute)
		q.stop()
		s.Close()
		s = reopen()
		q = serveQuota(t, s, clk.Now, nil)
		// The same lease, its times counted from the repeat's answer, a
		// minute on: the 10 s lease is over, 59 minutes of the period left.
		again := g1
		again.Duration, again.PeriodLeft = 0, quotaPeriod-time.Minute
		if g := grantOne(t, q.client, aliceKey(), id1, 300); !sameGrant(g, again) {
			t.Fatalf("repeated after a restart: %+v, want %+v", g, again)
		}
		// The repeat naming the resolved period start: the same too.
		if g := grantOne(t, q.client, g1.Entry, id1, 999); !sameGrant(g, again) {
			t.Fatalf("repeated with its period start: %+v, want %+v", g, again)
		}
		g2 := grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 1}, 800)
		if g2.Amount != quotaQ-300 || g2.Remaining != 0 || !g2.Entry.PeriodStart.Equal(quotaStart) {
			t.Fatalf("second grant %+v, want %d units of the same period", g2, quotaQ-300)
		}
		es := ledgerEntries(t, s)
		if len(es) != 1 || es[0].Committed() != quotaQ || es[0].Audit() != nil {
			t.Fatalf("ledger after the restart: %d entries", len(es))
		}
		// A period start that is no period, and one in the future.
		bad := aliceKey()
		bad.PeriodStart = quotaStart.Add(time.Second)
		if r := refusedOne(t, q.client, bad, lease.RequestID{DataPlane: "dp3", Token: 1, Seq: 1}); r.Why != lease.RefusedUnknownEntry || !strings.Contains(r.Error, "not the period in force") {
			t.Fatalf("a start that is no period: %+v", r)
		}
		bad.PeriodStart = quotaStart.Add(quotaPeriod)
		if r := refusedOne(t, q.client, bad, lease.RequestID{DataPlane: "dp3", Token: 1, Seq: 2}); r.Why != lease.RefusedUnknownEntry || !strings.Contains(r.Error, "in the future") {
			t.Fatalf("a future start: %+v", r)
		}
		// The next period, after another restart: one renewal after the
		// anchor, whatever the time of the request in it.
		clk.Add(quotaPeriod + 5*time.Minute)
		q.stop()
		s.Close()
		s = reopen()
		q = serveQuota(t, s, clk.Now, nil)
		g3 := grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 2}, 100)
		if g3.Amount != 100 || !g3.Entry.PeriodStart.Equal(quotaStart.Add(quotaPeriod)) || g3.PeriodLeft != quotaPeriod-6*time.Minute {
			t.Fatalf("next period's grant %+v, want 100 units from %s", g3, quotaStart.Add(quotaPeriod))
		}
		// The first period, named: over, so nothing, but no refusal.
		g4 := grantOne(t, q.client, g1.Entry, lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 3}, 100)
		if g4.Amount != 0 || g4.PeriodLeft != 0 {
			t.Fatalf("ended period's grant %+v, want 0 units", g4)
		}
		if n := len(ledgerEntries(t, s)); n != 2 {
			t.Fatalf("%d entries, want 2 (one per period)", n)
		}
	})
}

// sameGrant compares grants, their period starts as instants.
func sameGrant(a, b lease.Grant) bool {
	if !a.Entry.PeriodStart.Equal(b.Entry.PeriodStart) {
		return false
	}
	a.Entry.PeriodStart = b.Entry.PeriodStart
	return a == b
}

// holder is a test's model of one data plane's lease holder: what it
// truly admitted, refused and spent, and the reports it sends.
type holder struct {
	group                    string
	seq                      uint64 // of reports
	grantSeq                 uint64
	admitted, refused, floor int64
	leases                   map[lease.RequestID]*lease.LeaseSpend
	amounts                  map[lease.RequestID]int64
	entry                    lease.EntryKey
	delayed                  *lease.Report // a duplicate sent one round later
}

func (h *holder) report() lease.Report {
	h.seq++
	r := lease.Report{Entry: h.entry, DataPlane: h.group, Token: 1, Seq: h.seq, FloorSpent: h.floor, Admitted: h.admitted, Refused: h.refused}
	ids := make([]lease.RequestID, 0, len(h.leases))
	for id := range h.leases {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b lease.RequestID) int { return int(a.Seq) - int(b.Seq) })
	for _, id := range ids {
		r.Leases = append(r.Leases, *h.leases[id])
	}
	return r
}

// TestQuotaReportsLossy: three holders spend their leases and report
// cumulative spends, admitted and refused counts, through a network that
// drops 20 % of the reports and duplicates 10 % (the duplicate arriving a
// round late, after the next report); each keeps sending its last report
// until one is acknowledged. The ledger's usage per data plane equals the
// true cumulative values exactly, on both stores.
func TestQuotaReportsLossy(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		clk := &clock{t: quotaStart}
		q := serveQuota(t, s, clk.Now, nil)
		rng := rand.New(rand.NewPCG(22, 1))
		var hs []*holder
		for _, g := range quotaGroups {
			hs = append(hs, &holder{group: g, leases: map[lease.RequestID]*lease.LeaseSpend{}, amounts: map[lease.RequestID]int64{}})
		}
		dropped, duplicated := 0, 0
		send := func(h *holder, r lease.Report) bool {
			if rng.Float64() < 0.2 {
				dropped++
				return false
			}
			a := mustLease(t, q.client, h.group, lease.Batch{Reports: []lease.Report{r}})
			if len(a.Acks) != 1 || len(a.Refusals) != 0 {
				t.Fatalf("report %s/%d: %+v", h.group, r.Seq, a)
			}
			if rng.Float64() < 0.1 {
				duplicated++
				rr := r
				h.delayed = &rr
			}
			return true
		}
		for round := range 60 {
			for _, h := range hs {
				late := h.delayed // last round's duplicate, delivered after this round's report
				h.delayed = nil
				if round%5 == 0 {
					h.grantSeq++
					id := lease.RequestID{DataPlane: h.group, Token: 1, Seq: h.grantSeq}
					g := grantOne(t, q.client, lease.EntryKey{Consumer: aliceConsumer, Policy: "g"}, id, 20+rng.Int64N(30))
					h.entry = g.Entry
					if g.Amount > 0 {
						h.leases[id] = &lease.LeaseSpend{Lease: id}
						h.amounts[id] = g.Amount
					}
				}
				// Spend some of the open leases; finish one now and then.
				for id, l := range h.leases {
					if l.Final {
						continue
					}
					n := min(rng.Int64N(8), h.amounts[id]-l.Spent)
					l.Spent += n
					h.admitted += n
					if rng.Float64() < 0.15 || l.Spent == h.amounts[id] {
						l.Final = true
					}
				}
				h.refused += rng.Int64N(3)
				send(h, h.report())
				if late != nil {
					if a := mustLease(t, q.client, h.group, lease.Batch{Reports: []lease.Report{*late}}); len(a.Acks) != 1 {
						t.Fatalf("a late duplicate: %+v, want acknowledged (and ignored)", a)
					}
				}
			}
			clk.Add(time.Second)
		}
		for _, h := range hs {
			for _, l := range h.leases {
				l.Final = true
			}
			for r := h.report(); !send(h, r); r = h.report() {
			}
		}
		if dropped == 0 || duplicated == 0 {
			t.Fatalf("dropped %d, duplicated %d: the network did nothing", dropped, duplicated)
		}
		es := ledgerEntries(t, s)
		if len(es) != 1 {
			t.Fatalf("%d entries, want 1", len(es))
		}
		e := es[0]
		if err := e.Audit(); err != nil {
			t.Fatal(err)
		}
		us := e.Usage()
		var spentAll int64
		for i, h := range hs {
			var spent, leased int64
			for id, l := range h.leases {
				spent += l.Spent
				leased += h.amounts[id]
			}
			spentAll += spent
			want := quotaledger.Usage{DataPlane: h.group, Spent: spent, Leased: leased, Admitted: h.admitted, Refused: h.refused}
			if us[i] != want {
				t.Fatalf("usage of %s %+v, want %+v", h.group, us[i], want)
			}
		}
		if e.Committed() != spentAll {
			t.Fatalf("committed %d after every lease's final report, want Σ spent %d", e.Committed(), spentAll)
		}
		t.Logf("reports dropped %d, duplicated %d", dropped, duplicated)
	})
}

// grpcCode is err's gRPC code.
func grpcCode(err error) codes.Code { return status.Code(err) }

// TestQuotaRefusals: what the server refuses, per request (lease.Refused)
// and per call (gRPC codes).
func TestQuotaRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		reg := prometheus.NewRegistry()
		m, err := controlplane.NewMetrics(reg, nil)
		if err != nil {
			t.Fatal(err)
		}
		q := serveQuota(t, s, func() time.Time { return quotaStart }, func(o *controlplane.QuotaOptions) { o.Metrics = m })
		// Per request.
		grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 2, Seq: 1}, 10)
		if r := refusedOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 2}); r.Why != lease.RefusedStaleToken {
			t.Fatalf("an older token: %+v, want stale_token", r)
		}
		for _, c := range []struct {
			name string
			key  lease.EntryKey
			want string
		}{
			{"unknown policy", lease.EntryKey{Consumer: aliceConsumer, Policy: "nope"}, `no policy "nope"`},
			{"not global", lease.EntryKey{Consumer: aliceConsumer, Policy: "local"}, `policy "local" has no global quota`},
			{"key lacks the policy", lease.EntryKey{Consumer: bobConsumer, Policy: "g"}, "does not have policy"},
			{"old epoch", lease.EntryKey{Consumer: aliceConsumer, Policy: "g", Epoch: 0}, "quota epoch 0 is not the control plane's 1"},
			{"unknown key", lease.EntryKey{Consumer: identity.HashKey("nobody").ConsumerID(), Scope: "api1"}, "no key of consumer"},
			{"no api_limits", lease.EntryKey{Consumer: aliceConsumer, Scope: "api1"}, `has no api_limits for "api1"`},
			{"not a key", lease.EntryKey{Consumer: "jwt:alice", Scope: "api1"}, "is not a key"},
			{"api_limits epoch ahead", lease.EntryKey{Consumer: bobConsumer, Scope: "api1", Epoch: 3}, "quota epoch 3 is not the control plane's 0"},
		} {
			if c.name == "old epoch" {
				update(t, s, func(tx controlplane.Tx) error {
					return tx.PutKey(spec.Key{KeyHash: hash("alice"), Policies: []string{"g", "local"}, QuotaEpoch: 1})
				})
			}
			r := refusedOne(t, q.client, c.key, lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 1})
			if r.Why != lease.RefusedUnknownEntry || !strings.Contains(r.Error, c.want) {
				t.Fatalf("%s: %+v, want unknown_entry with %q", c.name, r, c.want)
			}
		}
		// The new epoch opens a new entry with a new anchor; a JWT
		// consumer takes the epoch it names; a key's api_limits are
		// found from its hash in either form, named in the engine's.
		if g := grantOne(t, q.client, lease.EntryKey{Consumer: aliceConsumer, Policy: "g", Epoch: 1}, lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 2}, 10); g.Amount != 10 || g.Entry.Epoch != 1 {
			t.Fatalf("new epoch: %+v", g)
		}
		if g := grantOne(t, q.client, lease.EntryKey{Consumer: "jwt:carol", Policy: "g", Epoch: 7}, lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 3}, 10); g.Amount != 10 || g.Entry.Consumer != "jwt:carol" {
			t.Fatalf("JWT consumer: %+v", g)
		}
		g := grantOne(t, q.client, lease.EntryKey{Consumer: hash("bob"), Scope: "api1"}, lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 4}, 1000)
		if g.Amount != 500 || g.Entry.Consumer != bobConsumer || g.Mode != lease.Optimistic || g.Floor != 10 {
			t.Fatalf("bob's api_limits: %+v, want 500 units of %s, optimistic, floor 10", g, bobConsumer)
		}
		// Per call.
		body, _ := json.Marshal(lease.Batch{Grants: []lease.GrantRequest{{Entry: aliceKey(), ID: lease.RequestID{DataPlane: "dp1", Token: 2, Seq: 9}, Want: 1}}})
		for _, c := range []struct {
			name string
			req  *syncpb.LeaseRequest
			want codes.Code
		}{
			{"wrong token", &syncpb.LeaseRequest{Token: "nope", Group: "dp1", Body: body}, codes.Unauthenticated},
			{"token of another group", &syncpb.LeaseRequest{Token: quotaToken("dp2"), Group: "dp1", Body: body}, codes.PermissionDenied},
			{"request of another data plane", &syncpb.LeaseRequest{Token: quotaToken("dp2"), Group: "dp2", Body: body}, codes.PermissionDenied},
			{"malformed body", &syncpb.LeaseRequest{Token: quotaToken("dp1"), Group: "dp1", Body: []byte(`{"grants": 1}`)}, codes.InvalidArgument},
		} {
			if _, err := q.client.Lease(ctx, c.req); grpcCode(err) != c.want {
				t.Fatalf("%s: %v, want %s", c.name, err, c.want)
			}
		}
		rep, _ := json.Marshal(lease.Batch{Reports: []lease.Report{{Entry: aliceKey(), DataPlane: "dp3", Token: 1, Seq: 1}}})
		if _, err := q.client.Lease(ctx, &syncpb.LeaseRequest{Token: quotaToken("dp1"), Group: "dp1", Body: rep}); grpcCode(err) != codes.PermissionDenied {
			t.Fatalf("a report of another data plane: %v, want PermissionDenied", err)
		}
		if got := counterValue(t, reg, "limitplane_controlplane_quota_refusals_total", map[string]string{"group": "dp2", "reason": "unknown_entry"}); got != 8 {
			t.Fatalf("quota_refusals_total{dp2,unknown_entry} = %v, want 8", got)
		}
		if got := counterValue(t, reg, "limitplane_controlplane_quota_leased_units_total", map[string]string{"group": "dp2", "mode": "optimistic"}); got != 500 {
			t.Fatalf("quota_leased_units_total{dp2,optimistic} = %v, want 500", got)
		}
		if got := counterValue(t, reg, "limitplane_controlplane_quota_call_errors_total", map[string]string{"code": "PermissionDenied"}); got != 3 {
			t.Fatalf("quota_call_errors_total{PermissionDenied} = %v, want 3", got)
		}
		// The store gone: Unavailable.
		s.Close()
		if _, err := q.client.Lease(ctx, &syncpb.LeaseRequest{Token: quotaToken("dp1"), Group: "dp1", Body: body}); grpcCode(err) != codes.Unavailable {
			t.Fatalf("store closed: %v, want Unavailable", err)
		}
	})
}

// counterValue returns the counter of name with labels in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if fmt.Sprint(got) == fmt.Sprint(labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// TestQuotaDatabaseDown: with PostgreSQL stopped, a Lease call is
// Unavailable; once it is back, the same batch is answered as before.
func TestQuotaDatabaseDown(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	s := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{ConnectTimeout: time.Second})
	putQuotaConfig(t, s)
	q := serveQuota(t, s, func() time.Time { return quotaStart }, nil)
	id := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}
	g := grantOne(t, q.client, aliceKey(), id, 10)
	srv.StopImmediate()
	if _, err := leaseCall(context.Background(), q.client, "dp1", lease.Batch{Grants: []lease.GrantRequest{{Entry: aliceKey(), ID: id, Want: 10}}}); grpcCode(err) != codes.Unavailable {
		t.Fatalf("database down: %v, want Unavailable", err)
	}
	srv.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := leaseCall(context.Background(), q.client, "dp1", lease.Batch{Grants: []lease.GrantRequest{{Entry: aliceKey(), ID: id, Want: 10}}})
		if err == nil {
			if len(a.Grants) != 1 || !sameGrant(a.Grants[0], g) {
				t.Fatalf("after the database came back: %+v, want %+v", a, g)
			}
			break
		}
		if grpcCode(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("after the database came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling a database coming back: no event to wait on
	}
}

// TestQuotaUsageHTTP: GET /api/usage/keys/{hash} and
// /api/usage/dataplanes over HTTP answer exactly what was reported.
func TestQuotaUsageHTTP(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		q := serveQuota(t, s, func() time.Time { return quotaStart }, nil)
		h, err := controlplane.Admin(controlplane.AdminOptions{Store: s, Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		web := httptest.NewServer(h)
		t.Cleanup(web.Close)
		id1 := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}
		id2 := lease.RequestID{DataPlane: "dp2", Token: 1, Seq: 1}
		g1 := grantOne(t, q.client, aliceKey(), id1, 100)
		grantOne(t, q.client, aliceKey(), id2, 50)
		mustLease(t, q.client, "dp1", lease.Batch{Reports: []lease.Report{{Entry: g1.Entry, DataPlane: "dp1", Token: 1, Seq: 1,
			Leases: []lease.LeaseSpend{{Lease: id1, Spent: 70, Final: true}}, Admitted: 70, Refused: 4}}})
		mustLease(t, q.client, "dp2", lease.Batch{Reports: []lease.Report{{Entry: g1.Entry, DataPlane: "dp2", Token: 1, Seq: 1,
			Leases: []lease.LeaseSpend{{Lease: id2, Spent: 20}}, Admitted: 20, Refused: 1}}})
		// bob: optimistic, dp3 spends floor while cut off.
		gb := grantOne(t, q.client, lease.EntryKey{Consumer: bobConsumer, Scope: "api1"}, lease.RequestID{DataPlane: "dp3", Token: 1, Seq: 1}, 5)
		mustLease(t, q.client, "dp3", lease.Batch{Reports: []lease.Report{{Entry: gb.Entry, DataPlane: "dp3", Token: 1, Seq: 1,
			Leases: []lease.LeaseSpend{{Lease: gb.ID, Spent: 5, Final: true}}, FloorSpent: 3, Admitted: 8}}})

		start := quotaStart.Format(time.RFC3339)
		end := quotaStart.Add(quotaPeriod).Format(time.RFC3339)
		a := call(t, "GET", web.URL+"/api/usage/keys/"+hash("alice"), "")
		want := `{"key_hash":"` + hash("alice") + `","consumer":"` + aliceConsumer + `","entries":[{"policy":"g","scope":"","epoch":0,` +
			`"period_start":"` + start + `","period_end":"` + end + `","mode":"strict","quota":1000,"committed":120,"bound":1000,"data_planes":[` +
			`{"data_plane":"dp1","spent":70,"leased":100,"outstanding":0,"floor_spent":0,"admitted":70,"refused":4},` +
			`{"data_plane":"dp2","spent":20,"leased":50,"outstanding":1,"floor_spent":0,"admitted":20,"refused":1}],` +
			`"totals":{"spent":90,"leased":150,"floor_spent":0,"admitted":90,"refused":5}}],` +
			`"totals":{"spent":90,"leased":150,"floor_spent":0,"admitted":90,"refused":5}}`
		expect(t, a, 200, want)
		a = call(t, "GET", web.URL+"/api/usage/keys/"+hash("bob"), "")
		if !strings.Contains(a.body, `"mode":"optimistic","quota":500,"committed":8,"bound":530,`) ||
			!strings.Contains(a.body, `"totals":{"spent":8,"leased":5,"floor_spent":3,"admitted":8,"refused":0}}`) {
			t.Fatalf("bob's usage: %s", a.body)
		}
		// A key not used yet: zeros. A hash that is no key: 404, until it
		// is one. A deleted key's use stays readable.
		update(t, s, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash("carol"), Policies: []string{"g"}})
		})
		expect(t, call(t, "GET", web.URL+"/api/usage/keys/"+hash("carol"), ""), 200,
			`{"key_hash":"`+hash("carol")+`","consumer":"`+identity.HashKey("carol").ConsumerID()+`","entries":[],"totals":{"spent":0,"leased":0,"floor_spent":0,"admitted":0,"refused":0}}`)
		expect(t, call(t, "GET", web.URL+"/api/usage/keys/"+hash("nobody"), ""), 404,
			`{"error":"no key `+hash("nobody")+` and no usage of it"}`)
		update(t, s, func(tx controlplane.Tx) error {
			_, err := tx.DeleteKey(hash("alice"))
			return err
		})
		expect(t, call(t, "GET", web.URL+"/api/usage/keys/"+hash("alice"), ""), 200, want)
		expect(t, call(t, "GET", web.URL+"/api/usage/dataplanes", ""), 200, `{"dataplanes":[`+
			`{"data_plane":"dp1","leases":1,"granted":100,"reports":1,"spent":70,"floor_spent":0,"admitted":70,"refused":4},`+
			`{"data_plane":"dp2","leases":1,"granted":50,"reports":1,"spent":20,"floor_spent":0,"admitted":20,"refused":1},`+
			`{"data_plane":"dp3","leases":1,"granted":5,"reports":1,"spent":8,"floor_spent":3,"admitted":8,"refused":0}]}`)
		if a := callWith(t, "GET", web.URL+"/api/usage/dataplanes", "", ""); a.status != 401 {
			t.Fatalf("without the token: %d", a.status)
		}
		if a := call(t, "GET", web.URL+"/api/usage/keys/nothash", ""); a.status != 400 {
			t.Fatalf("a bad hash: %d %s", a.status, a.body)
		}
	})
}

// TestQuotaPrune: entries and anchors expire max(Retention, 2 × period)
// after their period ends and are pruned (at most PruneLimit per prune);
// the data planes' totals stay.
func TestQuotaPrune(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		putQuotaConfig(t, s)
		clk := &clock{t: quotaStart}
		q := serveQuota(t, s, clk.Now, func(o *controlplane.QuotaOptions) {
			o.Retention = time.Minute
			o.PruneLimit = 1
			o.PruneInterval = time.Nanosecond
		})
		grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}, 10)
		grantOne(t, q.client, lease.EntryKey{Consumer: bobConsumer, Scope: "api1"}, lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 2}, 10)
		count := func() int {
			n := 0
			err := s.(controlplane.QuotaLedgerStore).ScanQuota(context.Background(), "", func(string, controlplane.QuotaRecord) error { n++; return nil })
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := count(); n != 5 { // 2 entries, 2 anchors, dp1's totals
			t.Fatalf("%d records, want 5", n)
		}
		// Just before expiry: nothing goes.
		clk.Add(quotaPeriod + 2*quotaPeriod - time.Second)
		mustLease(t, q.client, "dp1", lease.Batch{})
		if n := count(); n != 5 {
			t.Fatalf("%d records before expiry, want 5", n)
		}
		clk.Add(2 * time.Second)
		for want := 4; want >= 1; want-- {
			clk.Add(time.Millisecond) // the next prune is due
			mustLease(t, q.client, "dp1", lease.Batch{})
			if n := count(); n != want {
				t.Fatalf("%d records, want %d (one pruned per call)", n, want)
			}
		}
		clk.Add(time.Millisecond)
		mustLease(t, q.client, "dp1", lease.Batch{})
		if n := count(); n != 1 {
			t.Fatalf("%d records, want only dp1's totals", n)
		}
		// A new request opens a new period anchored now.
		g := grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 3}, 10)
		if !g.Entry.PeriodStart.Equal(clk.Now()) || g.Amount != 10 {
			t.Fatalf("after the prune: %+v", g)
		}
	})
}

// TestQuotaPeriodsFollowRenewal: periods run back to back from the
// anchor; a renewal changed mid-period applies from the next period (the
// open entry keeps its configuration), and the periods after it are as
// long as the new renewal. A report with no period start is for the
// period in force, and refused before any grant opened one.
func TestQuotaPeriodsFollowRenewal(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	putQuotaConfig(t, s)
	clk := &clock{t: quotaStart}
	q := serveQuota(t, s, clk.Now, nil)
	rep := lease.Report{Entry: aliceKey(), DataPlane: "dp1", Token: 1, Seq: 1, Admitted: 3}
	a := mustLease(t, q.client, "dp1", lease.Batch{Reports: []lease.Report{rep}})
	if len(a.Refusals) != 1 || a.Refusals[0].Why != lease.RefusedUnknownEntry || a.Refusals[0].Report == nil || *a.Refusals[0].Report != (lease.ReportRef{Token: 1, Seq: 1}) {
		t.Fatalf("a report before any grant: %+v, want refused", a)
	}
	seq := uint64(0)
	grant := func() lease.Grant {
		seq++
		return grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: seq}, 1)
	}
	if g := grant(); !g.Entry.PeriodStart.Equal(quotaStart) {
		t.Fatalf("first period %s", g.Entry.PeriodStart)
	}
	a = mustLease(t, q.client, "dp1", lease.Batch{Reports: []lease.Report{rep}})
	if len(a.Acks) != 1 || !a.Acks[0].Entry.PeriodStart.Equal(quotaStart) {
		t.Fatalf("a report with no period start: %+v, want acknowledged for the period in force", a)
	}
	update(t, s, func(tx controlplane.Tx) error {
		return tx.PutPolicy(spec.Policy{ID: "g", Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(30 * time.Minute),
			Global: &spec.GlobalQuota{Mode: "strict"}}})
	})
	for _, c := range []struct {
		at         time.Duration // since quotaStart
		start      time.Duration
		periodLeft time.Duration
	}{
		{50 * time.Minute, 0, 10 * time.Minute},                  // the open period keeps its hour
		{70 * time.Minute, 60 * time.Minute, 20 * time.Minute},   // then 30 minutes each
		{95 * time.Minute, 90 * time.Minute, 25 * time.Minute},   //
		{185 * time.Minute, 180 * time.Minute, 25 * time.Minute}, // periods nobody used are skipped
	} {
		clk.Set(quotaStart.Add(c.at))
		g := grant()
		if !g.Entry.PeriodStart.Equal(quotaStart.Add(c.start)) || g.PeriodLeft != c.periodLeft {
			t.Fatalf("at +%s: period start +%s, %s left; want +%s, %s left", c.at, g.Entry.PeriodStart.Sub(quotaStart), g.PeriodLeft, c.start, c.periodLeft)
		}
	}
	es := ledgerEntries(t, s)
	if len(es) != 4 || es[0].Config().Quota != quotaQ || es[1].Config().Quota != 5 {
		t.Fatalf("%d entries; quotas %d, %d; want 4 entries, the first with the old quota", len(es), es[0].Config().Quota, es[1].Config().Quota)
	}
}

// TestQuotaBatchReportsBeforeGrants: a batch's reports are applied
// before its grant requests, so a final report's unspent budget is
// granted in the same call; the whole batch is answered.
func TestQuotaBatchReportsBeforeGrants(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	putQuotaConfig(t, s)
	q := serveQuota(t, s, func() time.Time { return quotaStart }, nil)
	id1 := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}
	g1 := grantOne(t, q.client, aliceKey(), id1, 5000)
	if g1.Amount != quotaQ {
		t.Fatalf("first grant %+v", g1)
	}
	id2 := lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 2}
	a := mustLease(t, q.client, "dp1", lease.Batch{
		Grants:  []lease.GrantRequest{{Entry: aliceKey(), ID: id2, Want: 700}},
		Reports: []lease.Report{{Entry: g1.Entry, DataPlane: "dp1", Token: 1, Seq: 1, Leases: []lease.LeaseSpend{{Lease: id1, Spent: 400, Final: true}}, Admitted: 400}},
	})
	if len(a.Acks) != 1 || len(a.Grants) != 1 || len(a.Refusals) != 0 || a.Grants[0].Amount != 600 || a.Grants[0].Remaining != 0 {
		t.Fatalf("answer %+v, want the report acknowledged and 600 units granted", a)
	}
	es := ledgerEntries(t, s)
	if len(es) != 1 || es[0].Committed() != quotaQ || es[0].Audit() != nil {
		t.Fatalf("ledger: %d entries", len(es))
	}
}

// TestQuotaAfterAFinishedPeriod: a holder that has finished with a period
// (its clock put the period's end a little before the control plane's)
// asks for "the period after" it (GrantRequest.After): refused as an
// unknown entry while that period is still in force, so it never lands in
// the finished period's entry, then granted from the next period once it
// has begun. The answer echoes the request's send time.
func TestQuotaAfterAFinishedPeriod(t *testing.T) {
	s, _ := open(t, controlplane.BoltOptions{})
	putQuotaConfig(t, s)
	clk := &clock{t: quotaStart}
	q := serveQuota(t, s, clk.Now, nil)
	first := grantOne(t, q.client, aliceKey(), lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1}, 10)
	if !first.Entry.PeriodStart.Equal(quotaStart) {
		t.Fatalf("first period starts %s", first.Entry.PeriodStart)
	}
	clk.Set(quotaStart.Add(quotaPeriod - 200*time.Millisecond))
	r := lease.GrantRequest{Entry: aliceKey(), ID: lease.RequestID{DataPlane: "dp1", Token: 1, Seq: 1<<20 + 1}, Want: 10,
		After: quotaStart, SentAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := mustLease(t, q.client, "dp1", lease.Batch{Grants: []lease.GrantRequest{r}})
	if len(a.Grants) != 0 || len(a.Refusals) != 1 || a.Refusals[0].Why != lease.RefusedUnknownEntry || *a.Refusals[0].Request != r.ID ||
		!strings.Contains(a.Refusals[0].Error, "the period after 2026-03-01T12:00:00Z has not started") {
		t.Fatalf("a request for the period after the one in force: %+v, want refused as an unknown entry", a)
	}
	clk.Set(quotaStart.Add(quotaPeriod + 100*time.Millisecond))
	a = mustLease(t, q.client, "dp1", lease.Batch{Grants: []lease.GrantRequest{r}})
	if len(a.Grants) != 1 || len(a.Refusals) != 0 {
		t.Fatalf("the same request in the next period: %+v, want a grant", a)
	}
	g := a.Grants[0]
	if !g.Entry.PeriodStart.Equal(quotaStart.Add(quotaPeriod)) || g.Amount != 10 || !g.SentAt.Equal(r.SentAt) ||
		g.PeriodLeft != quotaPeriod-100*time.Millisecond {
		t.Fatalf("grant %+v, want 10 from the period starting %s, %s left, SentAt echoed", g, quotaStart.Add(quotaPeriod), quotaPeriod-100*time.Millisecond)
	}
	es := ledgerEntries(t, s)
	if len(es) != 2 || len(es[0].Leases()) != 1 || es[0].Leases()[0].ID.Seq != 1 {
		t.Fatalf("%d entries, the first with leases %+v; want 2, the first with only the first holder's", len(es), es[0].Leases())
	}
}
