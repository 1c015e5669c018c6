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
	r, err := dataplane.NewQuotaRunner(dataplane.QuotaRunnerOptions{
		Client: dp.client, Group: dp.name, Token: testToken, Address: srv.addr,
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
