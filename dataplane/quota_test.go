package dataplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane/quotaledger"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/internal/redistest"
)

// ledgerServer is a real QuotaService over gRPC whose brain is a
// quotaledger.Ledger in memory: the test's control plane. It resolves a
// request's zero PeriodStart to the period in force (the first request of
// a slot starts its first period; periods follow back to back) and opens
// entries with cfg.
type ledgerServer struct {
	syncpb.UnimplementedQuotaServiceServer
	mu      sync.Mutex
	ledger  *quotaledger.Ledger
	cfg     quotaledger.Config // Key is filled per entry
	first   map[lease.EntryID]time.Time
	blocked atomic.Bool
	calls   atomic.Int64
	addr    string
}

func startLedgerServer(t *testing.T, cfg quotaledger.Config) *ledgerServer {
	t.Helper()
	s := &ledgerServer{ledger: quotaledger.New(), cfg: cfg, first: map[lease.EntryID]time.Time{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	g := grpc.NewServer()
	syncpb.RegisterQuotaServiceServer(g, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return s
}

func (s *ledgerServer) Lease(_ context.Context, req *syncpb.LeaseRequest) (*syncpb.LeaseResponse, error) {
	if s.blocked.Load() {
		return nil, status.Error(codes.Unavailable, "test: cut off")
	}
	s.calls.Add(1)
	var b lease.Batch
	if err := json.Unmarshal(req.GetBody(), &b); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var ans lease.BatchAnswer
	for _, g := range b.Grants {
		if g.ID.DataPlane != req.GetGroup() {
			return nil, status.Error(codes.PermissionDenied, "group")
		}
		if g.Entry.PeriodStart.IsZero() {
			g.Entry.PeriodStart = s.resolve(g.Entry, now)
			if !g.After.IsZero() && !g.Entry.PeriodStart.After(g.After) {
				// As the control plane: not from the period the holder
				// has finished with.
				ans.Refusals = append(ans.Refusals, refusal(g.Entry, errors.New("test: the period after has not started"), &g.ID, nil))
				continue
			}
		}
		gr, err := s.ledger.Grant(now, g)
		if err != nil {
			ans.Refusals = append(ans.Refusals, refusal(g.Entry, err, &g.ID, nil))
			continue
		}
		ans.Grants = append(ans.Grants, gr)
	}
	for _, r := range b.Reports {
		ack, err := s.ledger.Report(now, r)
		if err != nil {
			ans.Refusals = append(ans.Refusals, refusal(r.Entry, err, nil, &lease.ReportRef{Token: r.Token, Seq: r.Seq}))
			continue
		}
		ans.Acks = append(ans.Acks, ack)
	}
	body, _ := json.Marshal(ans)
	return &syncpb.LeaseResponse{Body: body}, nil
}

func refusal(e lease.EntryKey, err error, id *lease.RequestID, rep *lease.ReportRef) lease.Refused {
	why := lease.RefusedUnknownEntry
	if errors.Is(err, quotaledger.ErrStaleToken) {
		why = lease.RefusedStaleToken
	}
	return lease.Refused{Entry: e, Request: id, Report: rep, Why: why, Error: err.Error()}
}

// resolve returns the start of the period in force for e's slot at now,
// opening its entry.
func (s *ledgerServer) resolve(e lease.EntryKey, now time.Time) time.Time {
	slot := e
	slot.PeriodStart = time.Time{}
	f, ok := s.first[slot.ID()]
	if !ok {
		f = now
		s.first[slot.ID()] = f
	}
	k := now.Sub(f) / s.cfg.Period
	start := f.Add(k * s.cfg.Period)
	c := s.cfg
	c.Key = e
	c.Key.PeriodStart = start
	if _, err := s.ledger.Open(c); err != nil {
		panic(err)
	}
	return start
}

// entries returns the ledger's entries' states.
func (s *ledgerServer) entries() []quotaledger.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ledger.State()
}

func (s *ledgerServer) audit(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ledger.Audit(); err != nil {
		t.Fatal(err)
	}
}

// settled reports whether every lease of every entry is released (its
// final spend reported).
func (s *ledgerServer) settled() bool {
	for _, st := range s.entries() {
		for _, l := range st.Leases {
			if !l.Released {
				return false
			}
		}
	}
	return true
}

// testHolder is the holder template of the tests: short horizons so that
// leases cycle within a few seconds.
var testHolder = lease.Options{
	Horizon: time.Second, LowWater: 300 * time.Millisecond, MinRequest: 5, MaxRequest: 100,
	ReportInterval: 200 * time.Millisecond, RetryInterval: 300 * time.Millisecond,
	CutOffAfter: time.Second, ExhaustedBackoff: 200 * time.Millisecond,
	Smoothing: 500 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
}

// quotaDP is one data plane of the tests: its own Redis, a store that
// follows the control plane, and runners.
type quotaDP struct {
	name   string
	client redis.UniversalClient
	store  *redisstore.Store
	rule   *core.Rule
	ok     atomic.Int64 // units admitted by the test's load
}

func newQuotaDP(t *testing.T, name string, client redis.UniversalClient, q core.Quota) *quotaDP {
	t.Helper()
	st, err := redisstore.New(client, redisstore.Options{FollowsControlPlane: true, GlobalCutOff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	r, err := st.Prepare(core.LimitSet{Quota: q})
	if err != nil {
		t.Fatal(err)
	}
	return &quotaDP{name: name, client: client, store: st, rule: r}
}

// runner starts a QuotaRunner for dp against srv; the returned func stops
// it and waits for it.
func (dp *quotaDP) runner(t *testing.T, srv *ledgerServer) (*dataplane.QuotaRunner, func()) {
	t.Helper()
	return dp.runnerOn(t, srv, dp.client)
}

// runnerOn is runner with a Redis client of its own.
func (dp *quotaDP) runnerOn(t *testing.T, srv *ledgerServer, client redis.UniversalClient) (*dataplane.QuotaRunner, func()) {
	t.Helper()
	r, err := dataplane.NewQuotaRunner(dataplane.QuotaRunnerOptions{
		Client: client, Group: dp.name, Token: testToken, Address: srv.addr,
		Tick: 50 * time.Millisecond, ElectionTTL: 500 * time.Millisecond, Holder: testHolder,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("runner %s: %v", dp.name, err)
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// load runs workers goroutines taking cost-1 requests of consumer, each
// pausing pause between requests, until stop is closed.
func (dp *quotaDP) load(t *testing.T, consumer string, workers int, pause time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) {
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := dp.store.Take(context.Background(), core.Request{Consumer: consumer, Rule: dp.rule, Cost: 1})
				if err != nil {
					t.Errorf("%s: take: %v", dp.name, err)
					return
				}
				if d.Allowed {
					dp.ok.Add(1)
				}
				time.Sleep(pause)
			}
		}()
	}
}

// slotField reads one field of dp's slot hash of consumer.
func (dp *quotaDP) slotField(t *testing.T, consumer, policy, field string) int64 {
	t.Helper()
	v, err := dp.client.HGet(context.Background(), redisstore.GlobalSlotKey("", consumer, "", policy, 0), field).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

func globalQuota(max int64, period time.Duration, mode core.GlobalMode, floor int64) core.Quota {
	return core.Quota{Max: max, Renewal: period, Global: core.GlobalQuota{Mode: mode, Floor: floor, Policy: "gold"}}
}

// ledgerTotals sums the entries' committed units and the leases' spend
// plus floors spent.
func ledgerTotals(s *ledgerServer) (committed, spent int64) {
	for _, st := range s.entries() {
		committed += st.Committed
		for _, l := range st.Leases {
			spent += l.Spent
		}
		for _, dp := range st.DataPlanes {
			spent += dp.FloorSpent
		}
	}
	return committed, spent
}

// TestGlobalQuotaStrictThreeDataPlanes: three data planes, each with its
// own Redis, offer far more than Q = 1000: Σ admitted ≤ 1000, at least
// 99 % of it, and once the final reports are in the ledger's committed
// equals Σ admitted exactly.
func TestGlobalQuotaStrictThreeDataPlanes(t *testing.T) {
	const Q = 1000
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	q := globalQuota(Q, time.Minute, core.GlobalStrict, 0)
	var dps []*quotaDP
	for i := range 3 {
		dp := newQuotaDP(t, fmt.Sprintf("dp%d", i+1), redistest.Start(t).Client(t, nil), q)
		dp.runner(t, srv)
		dps = append(dps, dp)
	}
	total := func() int64 {
		var n int64
		for _, dp := range dps {
			n += dp.ok.Load()
		}
		return n
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, dp := range dps {
		dp.load(t, "k1", 4, time.Millisecond, stop, &wg)
	}
	deadline := time.Now().Add(20 * time.Second)
	for total() < Q && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Leases granted before the quota ran out keep being spent: go on a
	// little, then stop.
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	adm := total()
	committed, spent := ledgerTotals(srv)
	t.Logf("admitted %d (%d, %d, %d), ledger committed %d, calls %d", adm, dps[0].ok.Load(), dps[1].ok.Load(), dps[2].ok.Load(), committed, srv.calls.Load())
	if adm > Q {
		t.Fatalf("admitted %d > Q %d", adm, Q)
	}
	if adm < Q*99/100 {
		t.Fatalf("admitted %d < 99 %% of %d", adm, Q)
	}
	if committed != adm || spent != adm {
		t.Fatalf("ledger committed %d, spent %d; admitted %d", committed, spent, adm)
	}
}

// TestGlobalQuotaDemandShift: one busy data plane and two nearly idle
// ones: the budget the idle ones do not use goes to the busy one, which
// admits far more than a static third.
func TestGlobalQuotaDemandShift(t *testing.T) {
	const Q = 1000
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	q := globalQuota(Q, time.Minute, core.GlobalStrict, 0)
	var dps []*quotaDP
	for i := range 3 {
		dp := newQuotaDP(t, fmt.Sprintf("dp%d", i+1), redistest.Start(t).Client(t, nil), q)
		dp.runner(t, srv)
		dps = append(dps, dp)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	dps[0].load(t, "k1", 4, time.Millisecond, stop, &wg)
	dps[1].load(t, "k1", 1, 100*time.Millisecond, stop, &wg)
	dps[2].load(t, "k1", 1, 100*time.Millisecond, stop, &wg)
	total := func() int64 { return dps[0].ok.Load() + dps[1].ok.Load() + dps[2].ok.Load() }
	deadline := time.Now().Add(20 * time.Second)
	for total() < Q*99/100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	adm := total()
	committed, _ := ledgerTotals(srv)
	t.Logf("admitted %d: busy %d, idle %d and %d; committed %d", adm, dps[0].ok.Load(), dps[1].ok.Load(), dps[2].ok.Load(), committed)
	if adm > Q || adm < Q*99/100 {
		t.Fatalf("admitted %d, want in [%d, %d]", adm, Q*99/100, Q)
	}
	if busy := dps[0].ok.Load(); busy < 2*Q/3 {
		t.Fatalf("the busy data plane admitted %d, want more than 2/3 of %d", busy, Q)
	}
	if committed != adm {
		t.Fatalf("ledger committed %d, admitted %d", committed, adm)
	}
}

// TestGlobalQuotaCutOff: a data plane cut off from the control plane
// spends its leases, then by mode: strict refuses, reserved spends exactly
// its floor, optimistic spends exactly its floor and only while cut off.
// After the control plane is back, the ledger's committed equals the units
// admitted.
func TestGlobalQuotaCutOff(t *testing.T) {
	const Q, F = 1000, 50
	for _, tc := range []struct {
		mode  lease.Mode
		cmode core.GlobalMode
	}{{lease.Strict, core.GlobalStrict}, {lease.Reserved, core.GlobalReserved}, {lease.Optimistic, core.GlobalOptimistic}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			cfg := quotaledger.Config{Quota: Q, Period: time.Minute, Mode: tc.mode, LeaseDuration: time.Second}
			floor := int64(0)
			if tc.mode != lease.Strict {
				cfg.Floors, floor = map[string]int64{"dp1": F}, F
			}
			srv := startLedgerServer(t, cfg)
			dp := newQuotaDP(t, "dp1", redistest.Start(t).Client(t, nil), globalQuota(Q, time.Minute, tc.cmode, floor))
			dp.runner(t, srv)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			dp.load(t, "k1", 1, 5*time.Millisecond, stop, &wg)
			waitFor(t, "a lease spent", func() bool { return dp.ok.Load() >= 20 })
			if tc.mode == lease.Optimistic {
				if fl := dp.slotField(t, "k1", "gold", "fl"); fl != 0 {
					t.Fatalf("optimistic floor spent while connected: %d", fl)
				}
			}
			srv.blocked.Store(true)
			// Leases stop within their duration (1 s) and the holder counts
			// as cut off a second after its last answer.
			time.Sleep(2500 * time.Millisecond)
			a1 := dp.ok.Load()
			time.Sleep(700 * time.Millisecond)
			a2 := dp.ok.Load()
			fl := dp.slotField(t, "k1", "gold", "fl")
			if a1 != a2 {
				t.Fatalf("admitted %d then %d while cut off with leases and floor spent", a1, a2)
			}
			if fl != floor {
				t.Fatalf("floor spent %d, want %d", fl, floor)
			}
			srv.blocked.Store(false)
			waitFor(t, "a new lease after the cut", func() bool { return dp.ok.Load() > a2+20 })
			close(stop)
			wg.Wait()
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, spent := ledgerTotals(srv)
				if srv.settled() && spent == dp.ok.Load() {
					break
				}
				if time.Now().After(deadline) {
					b, _ := json.MarshalIndent(srv.entries(), "", " ")
					st, _ := dp.client.HGetAll(context.Background(), redisstore.GlobalSlotKey("", "k1", "", "gold", 0)).Result()
					t.Fatalf("not settled: admitted %d, spent %d\n%s\n%v", dp.ok.Load(), spent, b, st)
				}
				time.Sleep(10 * time.Millisecond)
			}
			srv.audit(t)
			committed, _ := ledgerTotals(srv)
			adm := dp.ok.Load()
			t.Logf("admitted %d (at the cut %d), floor spent %d, committed %d", adm, a1, fl, committed)
			if committed != adm {
				t.Fatalf("ledger committed %d, admitted %d", committed, adm)
			}
			if adm > Q {
				t.Fatalf("admitted %d > %d", adm, Q)
			}
		})
	}
}

// TestGlobalQuotaHolderFailover: two runners on one data plane's Redis;
// the elected one is stopped mid-period and the other takes over with a
// higher token, restores the holders from Redis and carries on: nothing
// granted twice (the ledger audits), Σ admitted ≤ Q and committed equals
// it once settled.
func TestGlobalQuotaHolderFailover(t *testing.T) {
	const Q = 1000
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	dp := newQuotaDP(t, "dp1", redistest.Start(t).Client(t, nil), globalQuota(Q, time.Minute, core.GlobalStrict, 0))
	a, stopA := dp.runner(t, srv)
	waitFor(t, "runner A elected", func() bool { return a.Token() > 0 })
	b, _ := dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	dp.load(t, "k1", 2, 2*time.Millisecond, stop, &wg)
	waitFor(t, "300 admitted", func() bool { return dp.ok.Load() >= 300 })
	ta := a.Token()
	stopA()
	waitFor(t, "runner B elected", func() bool { return b.Token() > ta })
	waitFor(t, "990 admitted", func() bool { return dp.ok.Load() >= Q*99/100 })
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	committed, _ := ledgerTotals(srv)
	adm := dp.ok.Load()
	st := srv.entries()
	t.Logf("tokens %d → %d, admitted %d, committed %d, leases %d", ta, b.Token(), adm, committed, len(st[0].Leases))
	if adm > Q || committed != adm {
		t.Fatalf("admitted %d, committed %d, Q %d", adm, committed, Q)
	}
	if got := st[0].DataPlanes["dp1"].Token; got != b.Token() {
		t.Fatalf("ledger's token for dp1 %d, want runner B's %d", got, b.Token())
	}
	var granted int64
	for _, l := range st[0].Leases {
		granted += l.Amount
	}
	if granted < adm {
		t.Fatalf("leases granted %d < admitted %d", granted, adm)
	}
}

// TestGlobalQuotaManyConsumers: eight consumers of one data plane whose
// slots ask the ledger in the same rounds, with different demand (so
// their grants differ): the holders' request IDs are equal across slots
// (each numbers its own requests), and every answer must reach the holder
// of its own entry. Each consumer admits at most its Q, and each entry's
// committed equals that consumer's admitted exactly. (Routed by request
// ID alone, a grant of one consumer's entry was spent by another's slot:
// that consumer then overshot by the difference between the two grants.)
func TestGlobalQuotaManyConsumers(t *testing.T) {
	const Q = 400
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	client := redistest.Start(t).Client(t, nil)
	dp := newQuotaDP(t, "dp1", client, globalQuota(Q, time.Minute, core.GlobalStrict, 0))
	dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	per := map[string]*quotaDP{}
	for i := range 8 {
		k := fmt.Sprintf("k%d", i+1)
		d := &quotaDP{name: "dp1", client: client, store: dp.store, rule: dp.rule}
		per[k] = d
		d.load(t, k, 1, time.Duration(2+3*i)*time.Millisecond, stop, &wg)
	}
	waitFor(t, "each consumer's quota spent", func() bool {
		for _, d := range per {
			if d.ok.Load() < Q {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	committed := map[string]int64{}
	for _, st := range srv.entries() {
		committed[st.Config.Key.Consumer] += st.Committed
		for _, l := range st.Leases {
			if l.Spent > l.Amount {
				t.Errorf("%s: lease %v: spent %d of %d", st.Config.Key.Consumer, l.ID, l.Spent, l.Amount)
			}
		}
	}
	for k, d := range per {
		if d.ok.Load() != Q || committed[k] != Q {
			t.Errorf("%s: admitted %d, its entry's committed %d; want %d and %d", k, d.ok.Load(), committed[k], Q, Q)
		}
	}
}

// TestGlobalQuotaCluster: the spend script and the runner on a 3-node
// Redis Cluster, three consumers (spread over the slots): each admits at
// most its Q, and the ledger agrees exactly.
func TestGlobalQuotaCluster(t *testing.T) {
	const Q = 300
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	cl := redistest.StartCluster(t, 3).Client(t, nil)
	dp := newQuotaDP(t, "dp1", cl, globalQuota(Q, time.Minute, core.GlobalStrict, 0))
	dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	per := map[string]*quotaDP{}
	for _, k := range []string{"k1", "k2", "k3"} {
		d := &quotaDP{name: "dp1", client: cl, store: dp.store, rule: dp.rule}
		per[k] = d
		d.load(t, k, 2, 2*time.Millisecond, stop, &wg)
	}
	waitFor(t, "each consumer's quota spent", func() bool {
		for _, d := range per {
			if d.ok.Load() < Q*99/100 {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	var adm int64
	for k, d := range per {
		if d.ok.Load() > Q {
			t.Fatalf("%s admitted %d > %d", k, d.ok.Load(), Q)
		}
		adm += d.ok.Load()
	}
	committed, _ := ledgerTotals(srv)
	if committed != adm || len(srv.entries()) != 3 {
		t.Fatalf("committed %d over %d entries, admitted %d", committed, len(srv.entries()), adm)
	}
}

// TestGlobalQuotaRedisDown: through an Engine (which names the policy in
// the slot), a global quota's Take on a Redis that is gone gets the
// store's outage answer by failure policy, and the runner keeps running.
func TestGlobalQuotaRedisDown(t *testing.T) {
	srv := startLedgerServer(t, quotaledger.Config{Quota: 100, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	rs := redistest.Start(t)
	client := rs.Client(t, nil)
	q := globalQuota(100, time.Minute, core.GlobalStrict, 0)
	q.Global.Policy = ""
	dp := newQuotaDP(t, "dp1", client, q)
	_, stopRunner := dp.runner(t, srv)
	c := &core.Consumer{ID: "k1", Policies: []string{"gold"}}
	cfg := core.Config{Policies: []core.Policy{{ID: "gold", Quota: q}}}
	closed, err := core.NewEngine(dp.store, cfg, core.Options{FailurePolicy: core.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	open, err := core.NewEngine(dp.store, cfg, core.Options{FailurePolicy: core.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a request admitted from a lease", func() bool {
		d, err := closed.Decide(context.Background(), c, "api", 1)
		return err == nil && d.Allowed
	})
	if n := dp.slotField(t, "k1", "gold", "a"); n < 1 {
		t.Fatalf("the slot named after policy gold admitted %d", n)
	}
	rs.Kill()
	if _, err := closed.Decide(context.Background(), c, "api", 1); !errors.Is(err, core.ErrStoreUnavailable) {
		t.Fatalf("fail closed: %v, want ErrStoreUnavailable", err)
	}
	if d, err := open.Decide(context.Background(), c, "api", 1); err != nil || !d.Allowed {
		t.Fatalf("fail open: %+v, %v", d, err)
	}
	time.Sleep(200 * time.Millisecond) // rounds against a dead Redis
	stopRunner()
}

// TestFollowRunsQuotaRunner: Follow over a Redis store that follows the
// control plane runs the data plane's quota runner (it is elected: its
// lease is in Redis) and Close stops it (the lease is given up).
func TestFollowRunsQuotaRunner(t *testing.T) {
	srv := startLedgerServer(t, quotaledger.Config{Quota: 10, Period: time.Minute, LeaseDuration: time.Second})
	client := redistest.Start(t).Client(t, nil)
	st, err := redisstore.New(client, redisstore.Options{FollowsControlPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	f, err := dataplane.Follow(context.Background(), dataplane.FollowOptions{Address: srv.addr, Group: testGroup, Token: testToken, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	leaseKey := redisstore.DefaultKeyPrefix + "{gq}:lease"
	waitFor(t, "the quota runner elected", func() bool { return client.Exists(context.Background(), leaseKey).Val() == 1 })
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(context.Background(), leaseKey).Val(); n != 0 {
		t.Fatalf("the runner's lease is still in Redis after Close")
	}
}

// TestGlobalQuotaPeriods: a period of 3 s crossed twice under load: at
// each period's end the old entry gets its final reports and the slot
// moves to the next period's entry; every entry admits at most Q and its
// committed equals its spend exactly, and Σ committed equals Σ admitted.
func TestGlobalQuotaPeriods(t *testing.T) {
	const Q = 200
	const period = 3 * time.Second
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: period, Mode: lease.Strict, LeaseDuration: time.Second})
	var dps []*quotaDP
	for i := range 2 {
		dp := newQuotaDP(t, fmt.Sprintf("dp%d", i+1), redistest.Start(t).Client(t, nil), globalQuota(Q, period, core.GlobalStrict, 0))
		dp.runner(t, srv)
		dps = append(dps, dp)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, dp := range dps {
		dp.load(t, "k1", 2, 5*time.Millisecond, stop, &wg)
	}
	waitFor(t, "three periods' entries", func() bool { return len(srv.entries()) >= 3 })
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	var committed int64
	for _, st := range srv.entries() {
		var spent int64
		for _, l := range st.Leases {
			spent += l.Spent
		}
		t.Logf("entry %s: committed %d, spent %d", st.Config.Key.PeriodStart.Format("15:04:05.000"), st.Committed, spent)
		if st.Committed > Q || st.Committed != spent {
			t.Fatalf("entry %s: committed %d, spent %d, Q %d", st.Config.Key, st.Committed, spent, Q)
		}
		committed += st.Committed
	}
	adm := dps[0].ok.Load() + dps[1].ok.Load()
	if committed != adm {
		t.Fatalf("Σ committed %d, admitted %d", committed, adm)
	}
}

// TestGlobalQuotaCutThenPeriodEnd: the data plane is cut off from the
// control plane while its grant request is in flight; the request is
// answered after the cut. The holder counts the answer's period left from
// the send that was answered, not from the first send before the cut, so
// the period's end it writes into Redis is the ledger's (it was seconds
// early before: the holder moved to the next period while the ledger was
// still in the first, its successor's grants landed in the first period's
// entry, and the old holder's final report was ignored, so the usage lost
// admissions). The ledger's admitted counts equal what was admitted, per
// entry, and every lease in an entry comes from one holder.
func TestGlobalQuotaCutThenPeriodEnd(t *testing.T) {
	const period = 6 * time.Second
	srv := startLedgerServer(t, quotaledger.Config{Quota: 1_000_000, Period: period, Mode: lease.Strict, LeaseDuration: time.Second})
	dp := newQuotaDP(t, "dp1", redistest.Start(t).Client(t, nil), globalQuota(1_000_000, period, core.GlobalStrict, 0))
	dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	dp.load(t, "k1", 1, 5*time.Millisecond, stop, &wg)
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad) // before the store closes, also after a failure
	waitFor(t, "a lease spent", func() bool { return dp.ok.Load() >= 20 })
	srv.blocked.Store(true)
	time.Sleep(2500 * time.Millisecond)
	a := dp.ok.Load()
	es := srv.entries()
	if len(es) != 1 {
		t.Fatalf("%d entries at the cut, want 1", len(es))
	}
	end := es[0].Config.Key.PeriodStart.Add(period)
	// Watch the slot in Redis from the end of the cut until just before
	// the ledger's period end: the earliest period end the holder wrote,
	// and whether it moved to the next period (its state went to "old").
	var minPE time.Time
	moved := false
	srv.blocked.Store(false)
	key := redisstore.GlobalSlotKey("", "k1", "", "gold", 0)
	for time.Now().Before(end.Add(-300 * time.Millisecond)) {
		v, err := dp.client.HMGet(context.Background(), key, "pe", "old").Result()
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := v[0].(string); s != "" && s != "0" {
			us, _ := strconv.ParseInt(s, 10, 64)
			if pe := time.UnixMicro(us); minPE.IsZero() || pe.Before(minPE) {
				minPE = pe
			}
		}
		if s, _ := v[1].(string); s != "" {
			moved = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("admitted %d at the cut, %d after; period end: ledger %s, holder's earliest %s", a, dp.ok.Load(), end.Format("15:04:05.000"), minPE.Format("15:04:05.000"))
	if dp.ok.Load() <= a {
		t.Fatalf("nothing admitted after the cut")
	}
	// The holder's end is the ledger's, less an answer's flight time.
	if d := end.Sub(minPE); d < 0 || d > 300*time.Millisecond {
		t.Fatalf("the holder's period end was %v before the ledger's (want 0 to 300ms)", d)
	}
	if moved {
		t.Fatalf("the holder moved to the next period before the ledger's period end")
	}
	waitFor(t, "the second period's entry", func() bool { return len(srv.entries()) >= 2 })
	waitFor(t, "admissions in the second period", func() bool {
		for _, st := range srv.entries() {
			if st.Config.Key.PeriodStart.Equal(end) && st.Committed > 0 {
				return true
			}
		}
		return false
	})
	stopLoad()
	waitFor(t, "every lease's final report", srv.settled)
	waitFor(t, "the ledger's admitted counts", func() bool {
		var adm int64
		for _, st := range srv.entries() {
			adm += st.DataPlanes["dp1"].Admitted
		}
		return adm == dp.ok.Load()
	})
	srv.audit(t)
	for _, st := range srv.entries() {
		var spent int64
		seqBase := uint64(0)
		for i, l := range st.Leases {
			spent += l.Spent
			if i == 0 {
				seqBase = l.ID.Seq >> 20
			} else if l.ID.Seq>>20 != seqBase {
				t.Errorf("entry %s holds leases of two holders: %v and %v", st.Config.Key.PeriodStart.Format("15:04:05.000"), st.Leases[0].ID, l.ID)
			}
		}
		if adm := st.DataPlanes["dp1"].Admitted; adm != spent || st.Committed != spent {
			t.Errorf("entry %s: admitted %d, spent %d, committed %d", st.Config.Key.PeriodStart.Format("15:04:05.000"), adm, spent, st.Committed)
		}
	}
}

// TestGlobalQuotaElectionLost: the holder's election lease vanishes from
// Redis mid-period (as when it expires under a stalled holder): a runner
// is elected with a higher token and restores the slots; the deposed
// token's writes are refused (by the slot's token in Redis and by the
// ledger), and the ledger stays exact.
func TestGlobalQuotaElectionLost(t *testing.T) {
	const Q = 1000
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	dp := newQuotaDP(t, "dp1", redistest.Start(t).Client(t, nil), globalQuota(Q, time.Minute, core.GlobalStrict, 0))
	a, _ := dp.runner(t, srv)
	b, _ := dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	dp.load(t, "k1", 2, 2*time.Millisecond, stop, &wg)
	waitFor(t, "300 admitted", func() bool { return dp.ok.Load() >= 300 })
	ctx := context.Background()
	for range 3 {
		first := max(a.Token(), b.Token())
		if err := dp.client.Del(ctx, redisstore.DefaultKeyPrefix+"{gq}:lease").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a new holder", func() bool { return max(a.Token(), b.Token()) > first })
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, "990 admitted", func() bool { return dp.ok.Load() >= Q*99/100 })
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	committed, _ := ledgerTotals(srv)
	adm := dp.ok.Load()
	tok := srv.entries()[0].DataPlanes["dp1"].Token
	t.Logf("tokens a %d b %d, ledger %d, admitted %d, committed %d", a.Token(), b.Token(), tok, adm, committed)
	if adm > Q || committed != adm {
		t.Fatalf("admitted %d, committed %d, Q %d", adm, committed, Q)
	}
	if tok < 4 {
		t.Fatalf("ledger's token %d, want the fourth election's or later", tok)
	}
}

// TestGlobalQuotaHolderDies: the elected runner loses its Redis (its
// client is closed: it can neither renew nor give up its election lease)
// mid-period; the other runner takes over once the lease expires (500 ms
// here), and the ledger stays exact.
func TestGlobalQuotaHolderDies(t *testing.T) {
	const Q = 1000
	srv := startLedgerServer(t, quotaledger.Config{Quota: Q, Period: time.Minute, Mode: lease.Strict, LeaseDuration: time.Second})
	rs := redistest.Start(t)
	dp := newQuotaDP(t, "dp1", rs.Client(t, nil), globalQuota(Q, time.Minute, core.GlobalStrict, 0))
	own := rs.Client(t, nil)
	a, _ := dp.runnerOn(t, srv, own)
	waitFor(t, "runner A elected", func() bool { return a.Token() > 0 })
	b, _ := dp.runner(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	dp.load(t, "k1", 2, 2*time.Millisecond, stop, &wg)
	waitFor(t, "300 admitted", func() bool { return dp.ok.Load() >= 300 })
	ta := a.Token()
	died := time.Now()
	_ = own.Close()
	waitFor(t, "runner B elected", func() bool { return b.Token() > ta })
	took := time.Since(died)
	waitFor(t, "990 admitted", func() bool { return dp.ok.Load() >= Q*99/100 })
	close(stop)
	wg.Wait()
	waitFor(t, "every lease's final report", srv.settled)
	srv.audit(t)
	committed, _ := ledgerTotals(srv)
	adm := dp.ok.Load()
	t.Logf("takeover after %v; tokens %d → %d; admitted %d, committed %d", took, ta, b.Token(), adm, committed)
	if adm > Q || committed != adm {
		t.Fatalf("admitted %d, committed %d, Q %d", adm, committed, Q)
	}
	if took > 5*time.Second {
		t.Fatalf("takeover took %v with an election lease of 500 ms", took)
	}
}
