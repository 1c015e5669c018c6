package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

// quotaKey is the key-wide quota hash of consumer at epoch 0.
func quotaKey(consumer string) string {
	h := sha256.Sum256([]byte(consumer))
	return redisstore.DefaultKeyPrefix + "{" + hex.EncodeToString(h[:])[:32] + "}:quota:"
}

// quotaUsed reads the quota hash's count.
func quotaUsed(t *testing.T, c *redis.Client, consumer string) int64 {
	t.Helper()
	s, err := c.HGet(context.Background(), quotaKey(consumer), "used").Result()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// settleModes are the ways a store settles: in the background (the
// default) and on the caller's goroutine (Options.SyncSettle).
var settleModes = []struct {
	name string
	sync bool
}{{"async", false}, {"sync", true}}

func settleEngine(t *testing.T, srv *redistest.Server, clock core.Clock, sync bool) (*core.Engine, *redis.Client, *redisstore.Store) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, Seams: &seams.Seams{Clock: clock}, TTLMargin: 10 * time.Minute, SyncSettle: sync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "tokens", Quota: core.Quota{Max: 10_000, Renewal: time.Minute}, Settle: true}}}, core.Options{FailurePolicy: core.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	return e, c, s
}

// TestSettleConcurrentRedis: estimate 100, actual 1,000 / 10 / absent,
// budget 10,000 per minute, 16 concurrent clients: the quota count in
// Redis is exactly the sum of the admitted requests' actual costs (100
// where absent); over budget after settling, the next request is refused
// with Retry-After from the period's real end. Settling in the background
// and on the caller's goroutine; in the background, every Decide waits for
// the settles of the same quota that returned before it, and the count is
// read once none is pending (redisstore.WaitSettles).
func TestSettleConcurrentRedis(t *testing.T) {
	srv := redistest.Start(t)
	for i, m := range settleModes {
		t.Run(m.name, func(t *testing.T) { settleConcurrent(t, srv, fmt.Sprint("k", i), m.sync) })
	}
}

func settleConcurrent(t *testing.T, srv *redistest.Server, id string, syncSettle bool) {
	e, rc, s := settleEngine(t, srv, nil, syncSettle)
	c := &core.Consumer{ID: id, Policies: []string{"tokens"}}
	ctx := context.Background()
	actuals := []int64{1000, 10, -1}
	var sum, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				d, err := e.Decide(ctx, c, "api", 100)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				if a := actuals[(g+i)%3]; a < 0 {
					sum.Add(100)
					d.Hold.Release()
				} else {
					sum.Add(a)
					d.Hold.Settle(a)
				}
				d.Hold.Settle(5000) // only the first ends the hold
			}
		}()
	}
	wg.Wait()
	redisstore.WaitSettles(t, s)
	if got := quotaUsed(t, rc, id); got != sum.Load() {
		t.Fatalf("count %d, want the sum of actual costs %d (%d admitted)", got, sum.Load(), admitted.Load())
	}
	for {
		d, err := e.Decide(ctx, c, "api", 100)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		d.Hold.Settle(1000)
		sum.Add(1000)
	}
	d, err := e.Decide(ctx, c, "api", 100)
	if err != nil || d.Allowed || d.DecidedBy != core.KindQuota || d.RetryAfter <= 50*time.Second || d.RetryAfter > time.Minute || d.Quota.Remaining != max(10_000-sum.Load(), 0) {
		t.Fatalf("over budget: %+v %v", d, err)
	}
	redisstore.WaitSettles(t, s)
	if got := quotaUsed(t, rc, id); got != sum.Load() || got <= 10_000-100 {
		t.Fatalf("count %d, want the sum of actual costs %d, above 9,900", got, sum.Load())
	}
	t.Logf("%d admitted, count %d = sum of actual costs; refused with Retry-After %v", admitted.Load(), sum.Load(), d.RetryAfter)
}

// TestSettleBoundsRedis: a refund stops at zero; a settle after the
// period rolled over (a manual clock) or after a reset changes nothing in
// the new period. Settling in the background and on the caller's
// goroutine; the count is read once no settle is pending.
func TestSettleBoundsRedis(t *testing.T) {
	for _, m := range settleModes {
		t.Run(m.name, func(t *testing.T) { settleBounds(t, m.sync) })
	}
}

func settleBounds(t *testing.T, sync bool) {
	srv := redistest.Start(t)
	clock := core.NewManualClock(int64(1_000_000 * time.Hour))
	e, rc, s := settleEngine(t, srv, clock, sync)
	used := func() int64 { redisstore.WaitSettles(t, s); return quotaUsed(t, rc, "k") }
	c := &core.Consumer{ID: "k", Policies: []string{"tokens"}}
	ctx := context.Background()
	d1, _ := e.Decide(ctx, c, "api", 100)
	d2, _ := e.Decide(ctx, c, "api", 100)
	if got := used(); got != 200 || !d1.Hold.Held() {
		t.Fatalf("count %d, want 200; hold %v", got, d1.Hold.Held())
	}
	rc.HSet(ctx, quotaKey("k"), "used", 50) // lowered under the holds
	d1.Hold.Settle(0)
	if got := used(); got != 0 {
		t.Fatalf("count %d after a refund past zero, want 0", got)
	}
	clock.Advance(time.Minute)
	d3, _ := e.Decide(ctx, c, "api", 100)
	if got := used(); !d3.Allowed || got != 100 {
		t.Fatalf("new period: %+v, count %d", d3, got)
	}
	d2.Hold.Settle(0) // a refund to the period that ended
	if got := used(); got != 100 {
		t.Fatalf("count %d after a late refund, want 100", got)
	}
	d3.Hold.Settle(1000)
	if got := used(); got != 1000 {
		t.Fatalf("count %d, want 1000", got)
	}
	d4, _ := e.Decide(ctx, c, "api", 100)
	if err := e.ResetQuota(ctx, c, "api"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Millisecond) // the new period ends later than the reset one
	d5, _ := e.Decide(ctx, c, "api", 100)
	d4.Hold.Settle(5000)
	d5.Hold.Release()
	if got := used(); got != 100 {
		t.Fatalf("count %d after a settle across a reset, want 100", got)
	}
}

// thresholdLog records the thresholds an engine tells of.
type thresholdLog struct {
	mu  sync.Mutex
	got []string
}

func (l *thresholdLog) ObserveThreshold(c *core.Consumer, t core.ThresholdReached) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf("%s %d%% used=%d", c.ID, t.Percent, t.Quota.Limit-t.Quota.Remaining))
}

// TestThresholdsReachedBySettleRedis: on Redis, in both settle modes, a
// settle that takes a quota past a threshold is told of it (read after
// the settle has landed), as core's test of the memory store shows:
// estimate 1, settled to 30, 30, 1, 0, 35, then 4 at Decide.
func TestThresholdsReachedBySettleRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range settleModes {
		t.Run(m.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { c.Close() })
			s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, KeyPrefix: "th-" + m.name + ":", SyncSettle: m.sync})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			log := &thresholdLog{}
			e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{
				{ID: "q", Quota: core.Quota{Max: 100, Renewal: time.Hour}, Settle: true, Thresholds: []int64{50, 90, 100}},
			}}, core.Options{FailurePolicy: core.FailClosed, QuotaObserver: log})
			if err != nil {
				t.Fatal(err)
			}
			k := &core.Consumer{ID: "k", Policies: []string{"q"}}
			for _, actual := range []int64{30, 30, 1, 0, 35} {
				d, err := e.Decide(context.Background(), k, "api", 1)
				if err != nil || !d.Allowed {
					t.Fatalf("%+v, %v", d, err)
				}
				d.Hold.Settle(actual)
			}
			d, err := e.Decide(context.Background(), k, "api", 4)
			if err != nil || !d.Allowed || d.Quota.Remaining != 0 {
				t.Fatalf("%+v, %v: want admitted, 0 left", d, err)
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if got, want := strings.Join(log.got, ", "), "k 50% used=60, k 90% used=96, k 100% used=100"; got != want {
				t.Fatalf("told %q, want %q", got, want)
			}
		})
	}
}

// scriptCalls returns how many EVAL and EVALSHA calls the server has run.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_eval" && name != "cmdstat_evalsha") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n
}

// TestSettleThresholdsWithoutRead: with the asynchronous settle, a
// settle that reaches a threshold is told of it from the settle
// script's reply: Settle returns while redis-server is paused, nothing is
// told until the script has run, the event comes before the next
// decision of the quota returns, and no script runs but the settle's and
// that decision's (the count is not read back).
func TestSettleThresholdsWithoutRead(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	log := &thresholdLog{}
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{
		{ID: "q", Quota: core.Quota{Max: 100, Renewal: time.Hour}, Settle: true, Thresholds: []int64{50}},
	}}, core.Options{FailurePolicy: core.FailClosed, QuotaObserver: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	decide := func(k *core.Consumer) core.Decision {
		t.Helper()
		d, err := e.Decide(ctx, k, "api", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		return d
	}
	told := func() string {
		log.mu.Lock()
		defer log.mu.Unlock()
		return strings.Join(log.got, ", ")
	}
	// Both scripts loaded, so none is sent twice (NOSCRIPT) below.
	warm := &core.Consumer{ID: "warm", Policies: []string{"q"}}
	decide(warm).Hold.Settle(2)
	decide(warm)
	log.mu.Lock()
	log.got = nil
	log.mu.Unlock()

	k := &core.Consumer{ID: "k", Policies: []string{"q"}}
	d := decide(k)
	before := scriptCalls(t, c)
	srv.Pause()
	returned := make(chan struct{})
	go func() {
		d.Hold.Settle(60)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(4 * time.Second): // below the store's timeout
		srv.Resume()
		t.Fatal("Settle waited for redis-server")
	}
	if got := told(); got != "" {
		srv.Resume()
		t.Fatalf("told %q before the settle ran", got)
	}
	srv.Resume()
	if d := decide(k); d.Quota.Remaining != 39 {
		t.Fatalf("after the settle: %d left, want 39", d.Quota.Remaining)
	}
	if got, want := told(), "k 50% used=60"; got != want {
		t.Fatalf("told %q, want %q", got, want)
	}
	if n := scriptCalls(t, c) - before; n != 2 {
		t.Fatalf("%d scripts ran for the settle and the decision after it, want 2 (no read)", n)
	}
}
