package redisstore

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// settleGate holds every settle script the senders send (EVALSHA of
// settleQuota, alone or in a pipeline) until release is closed, telling
// entered as each arrives. Other commands pass, among them the EVALs of
// the settles a Take claimed (Store.runAfter); pipelines records the
// commands of every pipeline, as "settle" (an EVAL of settleQuota) or
// the command's name.
type settleGate struct {
	entered, release chan struct{}
	mu               sync.Mutex
	pipelines        [][]string
}

func newSettleGate() *settleGate {
	return &settleGate{entered: make(chan struct{}, 1024), release: make(chan struct{})}
}

func (g *settleGate) hold(cmds ...redis.Cmder) {
	if len(cmds) > 1 {
		var names []string
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && a[1] == settleQuota {
				names = append(names, "settle")
			} else {
				names = append(names, c.Name())
			}
		}
		if slices.ContainsFunc(names, func(n string) bool { return n == "settle" || n == "evalsha" }) {
			g.mu.Lock() // (not a new connection's HELLO and CLIENT SETINFO)
			g.pipelines = append(g.pipelines, names)
			g.mu.Unlock()
		}
	}
	for _, c := range cmds {
		if a := c.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == settleQuotaScript.Hash() {
			g.entered <- struct{}{}
			<-g.release
			return
		}
	}
}

func (g *settleGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *settleGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { g.hold(cmd); return next(ctx, cmd) }
}
func (g *settleGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { g.hold(cmds...); return next(ctx, cmds) }
}

// within waits up to d for ch, or fails with what.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

// gatedStore returns a store (timeout 10 s) on a redis-server of its
// own, through a client with a pool of 4 whose settle scripts wait in the
// returned settleGate until let through, and the client. Closing the
// store is the caller's.
func gatedStore(t *testing.T) (*Store, *redis.Client, *settleGate) {
	t.Helper()
	srv := redistest.Start(t)
	c := srv.Client(t, &redis.Options{PoolSize: 4})
	g := newSettleGate()
	c.AddHook(g)
	s, err := New(c, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, g
}

// settleRequest prepares a quota of max per hour that settles, on s.
func settleRequest(t *testing.T, s *Store, consumer string, max, cost int64) core.Request {
	t.Helper()
	r, err := s.Prepare(core.LimitSet{Quota: core.Quota{Max: max, Renewal: time.Hour}, Settle: true})
	if err != nil {
		t.Fatal(err)
	}
	return core.Request{Consumer: consumer, Rule: r, Cost: cost}
}

// hashUsed reads consumer's quota count straight from Redis.
func hashUsed(t *testing.T, s *Store, c redis.UniversalClient, consumer string) int64 {
	t.Helper()
	v, err := c.HGet(context.Background(), s.key(consumer, appendQuotaKind(nil, 0), ""), "used").Result()
	if err != nil {
		t.Fatalf("HGET used of %s: %v", consumer, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type takeResult struct {
	d   core.Decision
	err error
}

func takeAsync(s *Store, req core.Request) <-chan takeResult {
	ch := make(chan takeResult, 1)
	go func() {
		d, err := s.Take(context.Background(), req)
		ch <- takeResult{d, err}
	}()
	return ch
}

// stillWaiting fails t if the Take of got returns within 100 ms: it
// waits for a settle held before it.
func stillWaiting(t *testing.T, got <-chan takeResult) {
	t.Helper()
	select {
	case r := <-got:
		t.Fatalf("Take returned %+v, %v while the settle before it was held", r.d, r.err)
	case <-time.After(100 * time.Millisecond):
	}
}

// awaitTake returns the result of the Take of got, failing t when it has
// none within limit (after what).
func awaitTake(t *testing.T, got <-chan takeResult, limit time.Duration, what string) takeResult {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(limit):
		t.Fatalf("Take still waiting %v after %s", limit, what)
	}
	return takeResult{}
}

// TestSettleReturnsBeforeScript: with every settle script held in a
// go-redis hook, Settle returns (so the caller does not wait for Redis);
// a Take of the same consumer made after it returned waits while the
// script is held and, once it is let through, sees the settled count
// exactly (1,000 − 700 settled − its own 100 = 200 remaining); a Take of
// another consumer meanwhile does not wait.
func TestSettleReturnsBeforeScript(t *testing.T) {
	s, c, g := gatedStore(t)
	t.Cleanup(func() { s.Close() })
	req := settleRequest(t, s, "async", 1000, 100)
	d := take(t, s, req)
	if !d.Allowed || d.Remaining != 900 || !d.Hold.Held() {
		t.Fatalf("first Take: %+v, want allowed, 900 remaining, a hold", d)
	}
	returned := make(chan struct{})
	go func() { d.Hold.Settle(700); close(returned) }()
	within(t, returned, 5*time.Second, "Settle returning while its script is held")
	within(t, g.entered, 5*time.Second, "the settle script reaching go-redis")
	if n := s.settles.pending.Load(); n != 1 {
		t.Fatalf("%d settles pending, want 1", n)
	}
	if used := hashUsed(t, s, c, "async"); used != 100 {
		t.Fatalf("count %d while the settle is held, want the estimate 100", used)
	}

	other := take(t, s, settleRequest(t, s, "other", 1000, 100))
	if !other.Allowed || other.Remaining != 900 {
		t.Fatalf("another consumer's Take: %+v, want allowed, 900 remaining", other)
	}
	other.Hold.Release()

	got := takeAsync(s, req)
	stillWaiting(t, got)
	close(g.release)
	r := awaitTake(t, got, 5*time.Second, "the settle was let through")
	if r.err != nil || !r.d.Allowed || r.d.Remaining != 200 || r.d.Quota.Remaining != 200 {
		t.Fatalf("Take after the settle: %+v, %v; want allowed, 200 remaining", r.d, r.err)
	}
	r.d.Hold.Release()
	if used := hashUsed(t, s, c, "async"); used != 800 {
		t.Fatalf("count %d, want 700 + 100 = 800", used)
	}
	if n := s.settles.pending.Load(); n != 0 {
		t.Fatalf("%d settles pending at the end, want 0", n)
	}
}

// TestCloseWaitsForSettles: 50 requests charged 10 each are settled to 1,
// 2, ..., 50 (Settle returning at once each time) while the settle
// scripts are held; Close does not return
// until they are let through and answered, and the count in Redis is then
// exactly 1 + ... + 50 = 1,275. A settle after Close is sent on the
// caller's goroutine: the count has it when Settle returns.
func TestCloseWaitsForSettles(t *testing.T) {
	const n = 50
	s, c, g := gatedStore(t)
	req := settleRequest(t, s, "closing", 1_000_000, 10)
	late := take(t, s, req)
	holds := make([]core.Hold, n)
	for i := range holds {
		d := take(t, s, req)
		if !d.Allowed {
			t.Fatalf("Take %d: %+v", i, d)
		}
		holds[i] = d.Hold
	}
	for i, h := range holds {
		h.Settle(int64(i + 1))
	}
	within(t, g.entered, 5*time.Second, "a settle script reaching go-redis")
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while settles were held")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.release)
	within(t, closed, 10*time.Second, "Close once the settles are let through")
	if p := s.settles.pending.Load(); p != 0 {
		t.Fatalf("%d settles pending after Close, want 0", p)
	}
	if used := hashUsed(t, s, c, "closing"); used != 10+n*(n+1)/2 {
		t.Fatalf("count %d after Close, want 10 (a hold not yet settled) + 1,275", used)
	}
	late.Hold.Settle(5000)
	if used := hashUsed(t, s, c, "closing"); used != 5000+n*(n+1)/2 {
		t.Fatalf("count %d after a settle after Close, want 5,000 + 1,275", used)
	}
}

// TestSettleRedisDown: Redis is killed while a settle script is held on
// its way; a Take of the same quota made meanwhile waits for it and, once
// the settle has failed, fails itself (Redis is down) instead of hanging;
// nothing panics; the estimate is kept (read back after a restart, the
// data kept by an append-only file); Close returns and no goroutine is
// left over.
func TestSettleRedisDown(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	baseline := runtime.NumGoroutine()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4, MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	g := newSettleGate()
	c.AddHook(g)
	s, err := New(c, Options{Timeout: 3 * time.Second, BreakerFailures: -1})
	if err != nil {
		t.Fatal(err)
	}
	req := settleRequest(t, s, "down", 1000, 100)
	d := take(t, s, req)
	if !d.Allowed || d.Remaining != 900 {
		t.Fatalf("Take: %+v", d)
	}
	d.Hold.Settle(700)
	within(t, g.entered, 5*time.Second, "the settle script reaching go-redis")
	srv.Kill()
	t0 := time.Now()
	got := takeAsync(s, req)
	stillWaiting(t, got)
	close(g.release)
	r := awaitTake(t, got, 10*time.Second, "the failed settle")
	if r.err == nil || errors.Is(r.err, errSettleWait) || time.Since(t0) > 2500*time.Millisecond {
		t.Fatalf("Take with Redis down after %v: %+v, %v; want Redis's error, not the wait's bound", time.Since(t0), r.d, r.err)
	}
	t.Logf("Take with Redis down, after the failed settle: %v (%v)", r.err, time.Since(t0))
	if p := s.settles.pending.Load(); p != 0 {
		t.Fatalf("%d settles pending after the failure, want 0", p)
	}
	srv.Restart(t)
	check := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer check.Close()
	if used := hashUsed(t, s, check, "down"); used != 100 {
		t.Fatalf("count %d after the failed settle, want the estimate 100", used)
	}
	s.Close()
	c.Close()
	check.Close()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > baseline; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
	}
}

// TestSettleWaitOnlyEarlier: a Take waits for the settles of its quota
// registered before it, not for those registered after it began (so a
// stream of settles cannot hold it back), whatever order they finish in:
// settles a, b pending; w1 waits; c registered; b done (w1 still waits
// for a), a done (w1 returns, c still pending); w2 waits for c alone.
func TestSettleWaitOnlyEarlier(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(t, nil), Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	key := s.key("earlier", appendQuotaKind(nil, 0), "")
	ss := &s.settles
	st := func() *settlement { return &settlement{s: s, key: key} }
	waiter := func() <-chan struct{} {
		ch := make(chan struct{})
		go func() {
			if claimed, err := ss.before(context.Background(), []byte(key)); err != nil || claimed != nil {
				t.Error(claimed, err)
			}
			close(ch)
		}()
		return ch
	}
	// waiting reports whether ch is still open 50 ms on.
	waiting := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return false
		case <-time.After(50 * time.Millisecond):
			return true
		}
	}
	a, b, c := st(), st(), st()
	ss.register(a)
	ss.register(b)
	w1 := waiter()
	if !waiting(w1) {
		t.Fatal("w1 returned with a, b pending")
	}
	ss.register(c)
	ss.done(b)
	if !waiting(w1) {
		t.Fatal("w1 returned with a pending")
	}
	ss.done(a)
	within(t, w1, 5*time.Second, "w1 once a and b are done, c pending")
	if n := ss.pending.Load(); n != 1 {
		t.Fatalf("%d pending, want 1 (c)", n)
	}
	w2 := waiter()
	if !waiting(w2) {
		t.Fatal("w2 returned with c pending")
	}
	ss.done(c)
	within(t, w2, 5*time.Second, "w2 once c is done")
	if n, m := ss.pending.Load(), len(ss.shard(key[len(s.head)]).m); n != 0 || m != 0 {
		t.Fatalf("%d pending, %d keys in the shard, want none", n, m)
	}
	if claimed, err := ss.before(context.Background(), []byte(key)); err != nil || claimed != nil {
		t.Fatalf("wait with nothing pending: %v, %v", claimed, err)
	}
}

// TestSettleWaitBounded: a Take waiting for a settle that does not come
// back gives up at its context's end (with its error) or after the
// store's Timeout (context.DeadlineExceeded), and the Take fails with it.
func TestSettleWaitBounded(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(t, nil), Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	req := settleRequest(t, s, "bounded", 1000, 100)
	stuck := &settlement{s: s, key: s.key("bounded", appendQuotaKind(nil, 0), "")}
	s.settles.register(stuck)
	defer s.settles.done(stuck)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take on a cancelled context: %v, want context.Canceled", err)
	}
	t0 := time.Now()
	_, err = s.Take(context.Background(), req)
	if el := time.Since(t0); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errSettleWait) || el < 200*time.Millisecond || el > 2*time.Second {
		t.Fatalf("Take after %v: %v, want the store's timeout (200 ms) waiting for the settle", el, err)
	}
	if d := take(t, s, settleRequest(t, s, "unrelated", 1000, 100)); !d.Allowed || d.Remaining != 900 {
		t.Fatalf("another consumer's Take: %+v", d)
	}
}

// TestSettleCluster: on a 3-node Cluster, 40 consumers (keys in slots
// across the nodes) are each charged 100 and settled to 10·i, all Settles
// returning before any is sent, so the senders send them in pipelines
// spanning nodes; each consumer's next Take sees its own settle exactly
// (1,000 − 10·i − 1 remaining), and so does its hash in Redis.
func TestSettleCluster(t *testing.T) {
	const n = 40
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t, &redis.ClusterOptions{PoolSize: 8})
	s, err := New(c, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reqs := make([]core.Request, n)
	holds := make([]core.Hold, n)
	for i := range reqs {
		reqs[i] = settleRequest(t, s, "cluster-"+strconv.Itoa(i), 1000, 100)
		d := take(t, s, reqs[i])
		if !d.Allowed || d.Remaining != 900 {
			t.Fatalf("Take %d: %+v", i, d)
		}
		holds[i] = d.Hold
	}
	for i, h := range holds {
		h.Settle(int64(10 * i))
	}
	for i, req := range reqs {
		req.Cost = 1
		d := take(t, s, req)
		if want := int64(1000 - 10*i - 1); !d.Allowed || d.Remaining != want {
			t.Fatalf("consumer %d after its settle: %+v, want %d remaining", i, d, want)
		}
		d.Hold.Release()
	}
	WaitSettles(t, s)
	for i := range reqs {
		if used := hashUsed(t, s, c, "cluster-"+strconv.Itoa(i)); used != int64(10*i+1) {
			t.Fatalf("consumer %d: count %d, want %d", i, used, 10*i+1)
		}
	}
}

// TestSettleClaimedByTake: with both senders held (two other consumers'
// settles), a third consumer's settle stays queued; that consumer's next
// Take does not wait for a sender but sends the settle itself, in one
// pipeline before its own script, and sees it (1,000 − 700 − 100 = 200
// remaining). Once the senders are let through they skip it: the count
// is 800, the settle applied once.
func TestSettleClaimedByTake(t *testing.T) {
	s, c, g := gatedStore(t)
	t.Cleanup(func() { s.Close() })
	if s.settles.workers != 2 {
		t.Fatalf("%d senders, want 2 (2 CPUs or more, a pool of 4)", s.settles.workers)
	}
	var holds []core.Hold
	for _, id := range []string{"busy-1", "busy-2", "claimed"} {
		d := take(t, s, settleRequest(t, s, id, 1000, 100))
		if !d.Allowed {
			t.Fatalf("%s: %+v", id, d)
		}
		holds = append(holds, d.Hold)
	}
	var once sync.Once
	release := func() { once.Do(func() { close(g.release) }) }
	t.Cleanup(release) // (before Close, on a failure)
	holds[0].Settle(10)
	within(t, g.entered, 5*time.Second, "the first sender's settle reaching go-redis")
	holds[1].Settle(20)
	within(t, g.entered, 5*time.Second, "the second sender's settle reaching go-redis")
	holds[2].Settle(700)
	s.settles.mu.Lock()
	queued := len(s.settles.queue)
	s.settles.mu.Unlock()
	if queued != 1 {
		t.Fatalf("%d settles queued, want 1", queued)
	}
	got := takeAsync(s, settleRequest(t, s, "claimed", 1000, 100))
	var r takeResult
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("Take waited for a held sender instead of sending the queued settle itself")
	}
	if r.err != nil || !r.d.Allowed || r.d.Remaining != 200 {
		t.Fatalf("Take after the queued settle: %+v, %v; want allowed, 200 remaining", r.d, r.err)
	}
	r.d.Hold.Release()
	g.mu.Lock()
	pipes := slices.Clone(g.pipelines)
	g.mu.Unlock()
	if len(pipes) != 1 || !slices.Equal(pipes[0], []string{"settle", "evalsha"}) {
		t.Fatalf("pipelines %v, want one: the claimed settle, then the Take's EVALSHA", pipes)
	}
	release()
	WaitSettles(t, s)
	for id, want := range map[string]int64{"busy-1": 10, "busy-2": 20, "claimed": 800} {
		if used := hashUsed(t, s, c, id); used != want {
			t.Errorf("%s: count %d, want %d", id, used, want)
		}
	}
}

// TestSettleShardSize: a shard of the pending settles' map fills one
// 64-byte cache line.
func TestSettleShardSize(t *testing.T) {
	if n := unsafe.Sizeof(settleShard{}); n != 64 {
		t.Errorf("settleShard is %d bytes, want 64", n)
	}
}
