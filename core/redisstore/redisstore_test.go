package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

func newStore(t *testing.T, c redis.UniversalClient, o redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// take prepares c's limits on s and takes c (core.TakeCall), failing the
// test on an error.
func take(t *testing.T, s core.Store, c core.Call) core.Decision {
	t.Helper()
	d, err := core.TakeCall(context.Background(), s, c)
	if err != nil {
		t.Fatalf("TakeCall(%+v): %v", c, err)
	}
	return d
}

// prepare returns c as a Request under its limits prepared on s.
func prepare(t testing.TB, s core.Store, c core.Call) core.Request {
	t.Helper()
	r, err := s.Prepare(c.Limits())
	if err != nil {
		t.Fatalf("Prepare(%+v): %v", c.Limits(), err)
	}
	return c.Request(r)
}

// TestOracleNonMicrosecondT checks GCRA against core.GCRAParams.Step where
// T and τ are not whole microseconds and τ is near core's 2^61 ns bound:
// the µs/ns pair arithmetic must be exact to the nanosecond.
func TestOracleNonMicrosecondT(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	clock := core.NewManualClock(int64(1_000_000 * time.Hour))
	s := newStore(t, c, redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute})
	limits := []core.Limit{
		{Rate: 3, Period: time.Second, Burst: 4},                   // T = 333333333 ns
		{Rate: 7, Period: time.Second + 1},                         // T = 142857143 ns
		{Rate: 1_000_003, Period: time.Second, Burst: 9},           // T = 999 ns: below a µs
		{Rate: 1, Period: 97 * 24 * time.Hour, Burst: 27},          // τ ≈ 2^57.8 ns
		{Rate: 3, Period: 10*24*time.Hour + 1, Burst: 760},         // τ ≈ 2^60.7 ns, T not whole µs
		{Rate: 10, Period: time.Second, Burst: 5},                  // whole µs
		{Rate: 1_000_000_000, Period: time.Second, Burst: 1 << 40}, // T = 1 ns, huge burst
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for li, l := range limits {
		p := l.GCRA()
		id := "oracle-" + strconv.Itoa(li)
		tat := int64(0)
		var allowed, denied int
		for i := 0; i < 300; i++ {
			clock.Advance(time.Duration(rng.Int64N(p.T/1000*3+3)) * time.Microsecond)
			var n int64
			switch rng.IntN(4) {
			case 0:
				n = 0
			case 1:
				n = 1
			case 2:
				n = rng.Int64N(p.Burst) + 1
			default:
				n = p.Burst + rng.Int64N(3)
			}
			now := clock.Nanotime()
			r := p.Step(tat, now, n)
			if r.Store {
				tat = r.TAT
			}
			d := take(t, s, core.Call{Consumer: id, Rate: l, Cost: n})
			want := core.Status{Limit: p.Burst, Remaining: r.Remaining, ResetAfter: time.Duration(r.ResetAfter), Window: time.Duration(p.Tau)}
			if d.Allowed != r.Allowed || d.Rate != want || d.RetryAfter != time.Duration(r.RetryAfter) {
				t.Fatalf("limit %+v step %d (n=%d): got allowed=%v %+v retry=%d; oracle allowed=%v %+v retry=%d",
					l, i, n, d.Allowed, d.Rate, d.RetryAfter, r.Allowed, want, r.RetryAfter)
			}
			if n > 0 && d.Allowed {
				allowed++
			} else if n > 0 && d.RetryAfter > 0 {
				denied++
			}
		}
		if allowed < 20 || denied < 20 {
			t.Fatalf("limit %+v: %d allowed, %d denied (not a mixed sequence)", l, allowed, denied)
		}
	}
}

// TestKeysAndTTLs checks the key layout of DESIGN.md and that every key
// written carries the TTL it should, on the production (Redis TIME) path.
func TestKeysAndTTLs(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	s := newStore(t, c, redisstore.Options{KeyPrefix: "lp:"})
	ctx := context.Background()
	consumer, scope := "sk_live_secret{}:\n", "api:v1/{x}\n"
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
	q := core.Quota{Max: 100, Renewal: time.Hour}
	t0 := time.Now()
	d := take(t, s, core.Call{Consumer: consumer, Scope: scope, Rate: l, Quota: q, Cost: 3})
	if !d.Allowed || d.Rate.Remaining != 2 || d.Quota.Remaining != 97 {
		t.Fatalf("decision %+v", d)
	}
	for _, a := range []core.Algorithm{core.FixedWindow, core.SlidingWindow, core.SlidingLog} {
		take(t, s, core.Call{Consumer: consumer, Scope: scope, Rate: core.Limit{Rate: 10, Period: time.Minute, Algorithm: a}, Cost: 1})
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 5 {
		t.Fatalf("keys %q, want 5", keys)
	}
	re := regexp.MustCompile(`^lp:\{([0-9a-f]{32})\}:(gcra|quota|fw|sw|sl):api%3Av1/%7Bx%7D%0A$`)
	tag := ""
	for _, k := range keys {
		m := re.FindStringSubmatch(k)
		if m == nil {
			t.Fatalf("key %q does not follow <prefix>{<hash>}:<kind>:<escaped scope>", k)
		}
		if tag != "" && m[1] != tag {
			t.Fatalf("keys of one consumer have different hash tags: %q", keys)
		}
		tag = m[1]
		if strings.Contains(k, "secret") {
			t.Fatalf("raw consumer id in key %q", k)
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var hi time.Duration
		switch {
		case strings.Contains(k, ":gcra:"): // ceil(TAT − now) = 300ms
			hi = 300 * time.Millisecond
		case strings.Contains(k, ":quota:"): // the renewal period
			hi = time.Hour
		case strings.Contains(k, ":fw:"), strings.Contains(k, ":sl:"): // one period
			hi = time.Minute
		case strings.Contains(k, ":sw:"): // two periods
			hi = 2 * time.Minute
		}
		lo := hi - time.Since(t0) - time.Millisecond // what has elapsed since it was set
		if ttl < lo || ttl > hi {
			t.Fatalf("PTTL %s = %v, want in [%v, %v]", k, ttl, lo, hi)
		}
	}
	// A denied request writes nothing: TTLs do not move.
	before, _ := c.PTTL(ctx, keys[0]).Result()
	take(t, s, core.Call{Consumer: consumer, Scope: scope, Rate: l, Quota: q, Cost: 6})
	after, _ := c.PTTL(ctx, keys[0]).Result()
	if after > before {
		t.Fatalf("denied request refreshed a TTL: %v -> %v", before, after)
	}
	if err := s.ResetQuota(ctx, consumer, scope, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(ctx, "lp:{"+tag+"}:quota:api%3Av1/%7Bx%7D%0A").Result(); n != 0 {
		t.Fatal("ResetQuota left the quota key")
	}
}

// TestUsesRedisTime shows the production path takes "now" from Redis TIME:
// the TAT the script stores is Redis's clock plus the reported ResetAfter,
// so no app-server clock (skewed or not) enters the decision.
func TestUsesRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	s := newStore(t, c, redisstore.Options{KeyPrefix: "t:"})
	ctx := context.Background()
	l := core.Limit{Rate: 1, Period: time.Hour}
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	d := take(t, s, core.Call{Consumer: "c", Rate: l, Cost: 1})
	after, _ := c.Time(ctx).Result()
	keys, _ := c.Keys(ctx, "t:*:gcra:").Result()
	if len(keys) != 1 {
		t.Fatalf("keys %q", keys)
	}
	// The value is "<TAT>:<T>" in ns (T = 1h).
	v, _ := c.Get(ctx, keys[0]).Result()
	tv, tsuf, _ := strings.Cut(v, ":")
	tat, err := strconv.ParseInt(tv, 10, 64)
	if err != nil || tsuf != "3600000000000" {
		t.Fatalf("stored value %q (%v), want <TAT>:3600000000000", v, err)
	}
	if d.ResetAfter != time.Hour {
		t.Fatalf("ResetAfter %v, want 1h", d.ResetAfter)
	}
	now := tat - int64(time.Hour) // the script's now
	if now < before.UnixNano() || now > after.UnixNano() || now%1000 != 0 {
		t.Fatalf("script's now %d not Redis TIME in [%d, %d] µs-aligned", now, before.UnixNano(), after.UnixNano())
	}
}

// TestScriptReload: after SCRIPT FLUSH the store reloads its script.
func TestScriptReload(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	l := core.PerMinute(3)
	q := core.Quota{Max: 10, Renewal: time.Hour}
	for _, pipeline := range []int{-1, 0} { // batching off, the default (on)
		s := newStore(t, c, redisstore.Options{Pipeline: pipeline})
		t.Cleanup(func() { s.Close() })
		for _, tc := range []struct {
			name string
			req  core.Call
		}{
			{"gcra", core.Call{Rate: l, Cost: 1}},                 // the GCRA-only script
			{"gcra+quota", core.Call{Rate: l, Quota: q, Cost: 1}}, // the general one
		} {
			tc.req.Consumer = tc.name + "-" + strconv.Itoa(pipeline)
			take(t, s, tc.req)
			if err := c.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			if d := take(t, s, tc.req); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("pipeline %d, %s: after SCRIPT FLUSH: %+v", pipeline, tc.name, d)
			}
		}
	}
}

// checkErr is the error text the store gives for a window limit it cannot
// count.
func checkErr(l core.Limit) string {
	if l.Period%time.Microsecond != 0 {
		return fmt.Sprintf("invalid limit: redisstore: %v period %v is not a whole number of microseconds", l.Algorithm, l.Period)
	}
	return fmt.Sprintf("invalid limit: redisstore: sliding window rate %d × period %v reaches 2^53 µs", l.Rate, l.Period)
}

// TestWindowLimitsRejected: the sliding algorithms count whole µs.
func TestWindowLimitsRejected(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv.Client(t, nil), redisstore.Options{})
	for _, l := range []core.Limit{
		{Rate: 3, Period: time.Second + 1, Algorithm: core.SlidingWindow},
		{Rate: 3, Period: time.Second + 1, Algorithm: core.SlidingLog},
		{Rate: 1 << 30, Period: 1 << 40, Algorithm: core.SlidingWindow},
	} {
		// Prepare refuses it, and so does a one-off call (through
		// Prepare), with the same error.
		if r, err := s.Prepare(core.LimitSet{Rate: l}); r != nil || err == nil || err.Error() != checkErr(l) || !errors.Is(err, core.ErrInvalidLimit) {
			t.Errorf("%+v: Prepare = %v, %v; want ErrInvalidLimit %q", l, r, err, checkErr(l))
		}
		if _, err := core.TakeCall(context.Background(), s, core.Call{Consumer: "x", Rate: l, Cost: 1}); err == nil || err.Error() != checkErr(l) || !errors.Is(err, core.ErrInvalidLimit) {
			t.Errorf("%+v: TakeCall err %v, want ErrInvalidLimit %q", l, err, checkErr(l))
		}
		// The engine refuses such a policy up front, as the gateway's
		// Apply does, instead of failing every request later.
		_, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "w", Rate: l}}}, core.Options{})
		if want := `policy "w": ` + checkErr(l); err == nil || err.Error() != want || !errors.Is(err, core.ErrInvalidLimit) {
			t.Errorf("%+v: NewEngine err %v, want %s", l, err, want)
		}
	}
	if _, err := redisstore.New(redis.NewClient(&redis.Options{Addr: srv.Addr}), redisstore.Options{KeyPrefix: "a{b"}); err == nil {
		t.Error("prefix with '{' accepted")
	}
}

// TestWaitAcrossClients: core.Wait over three stores with separate clients
// shares one rate: 15 waits at 20/s burst 1 take at least 14 × 50ms.
func TestWaitAcrossClients(t *testing.T) {
	srv := redistest.Start(t)
	l := core.Limit{Rate: 20, Period: time.Second, Burst: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	errs := make(chan error, 15)
	for i := 0; i < 3; i++ {
		s := newStore(t, srv.Client(t, nil), redisstore.Options{})
		req := prepare(t, s, core.Call{Consumer: "waiter", Rate: l, Cost: 1})
		for j := 0; j < 5; j++ {
			go func() {
				d, err := core.Wait(ctx, s, req)
				if err == nil && !d.Allowed {
					err = errors.New("Wait returned a denial")
				}
				errs <- err
			}()
		}
	}
	for i := 0; i < 15; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 14*50*time.Millisecond {
		t.Fatalf("15 waits at 20/s burst 1 took %v, want ≥ 700ms", el)
	}
}

// TestPingCluster: over a Cluster, Ping asks every master: with one of
// three masters killed (the keys of its slots all fail) it fails, naming
// that master, where a PING to any one node could still pass (a gateway
// once answered /readyz 200 while every request got 503).
func TestPingCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newStore(t, cl.Client(t, nil), redisstore.Options{Timeout: time.Second})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with every master up: %v", err)
	}
	dead := cl.Nodes[0]
	dead.Kill()
	for range 5 { // any node the client might pick
		err := s.Ping(ctx)
		if err == nil || !strings.HasPrefix(err.Error(), "redisstore: ping: master "+dead.Addr+": ") {
			t.Fatalf("Ping with master %s killed = %v, want an error naming it", dead.Addr, err)
		}
	}
}

// TestPing: Ping answers nil while the server runs, an error while it is
// stopped (even with the breaker open, which Ping goes around), and nil
// again once the server is back on its port.
func TestPing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	s := newStore(t, c, redisstore.Options{Timeout: time.Second, BreakerFailures: 1, BreakerCooldown: time.Hour})
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}
	srv.Kill()
	if err := s.Ping(ctx); err == nil || !strings.HasPrefix(err.Error(), "redisstore: ping: ") {
		t.Fatalf("Ping with the server down = %v, want a redisstore: ping: error", err)
	}
	// One failed Take opens the breaker for an hour.
	req := prepare(t, s, core.Call{Consumer: "c", Rate: core.Limit{Rate: 1, Period: time.Second}, Cost: 1})
	if _, err := s.Take(ctx, req); err == nil {
		t.Fatal("Take with the server down succeeded")
	}
	if _, err := s.Take(ctx, req); !errors.Is(err, redisstore.ErrCircuitOpen) {
		t.Fatalf("second Take: %v, want ErrCircuitOpen", err)
	}
	srv.Restart(t)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after restart, breaker open: %v", err)
	}
}

// TestWaitDeadlineDuringStoreCall: a Wait whose deadline passes while
// Redis does not answer (redis-server paused) returns an error matching
// core.ErrWaitExceedsDeadline and context.DeadlineExceeded, batched or
// direct, whichever error the client gave (go-redis sets ctx's deadline
// on the connection: its "i/o timeout" could come before ctx.Err() was
// set, and the error was the store's alone).
func TestWaitDeadlineDuringStoreCall(t *testing.T) {
	srv := redistest.Start(t)
	for _, pipeline := range []int{0, -1} {
		// ContextTimeoutEnabled, as NewClientFromURL sets it: the read
		// deadline is ctx's.
		s := newStore(t, srv.Client(t, &redis.Options{ContextTimeoutEnabled: true}), redisstore.Options{Pipeline: pipeline, Timeout: time.Minute})
		req := prepare(t, s, core.Call{Consumer: "late", Rate: core.Limit{Rate: 20, Period: time.Second, Burst: 1}, Cost: 1})
		if _, err := s.Take(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		srv.Pause()
		for i := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+20*i)*time.Millisecond)
			_, err := core.Wait(ctx, s, req)
			cancel()
			if !errors.Is(err, core.ErrWaitExceedsDeadline) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("pipeline %d, wait %d: %v; want an error matching ErrWaitExceedsDeadline and context.DeadlineExceeded", pipeline, i, err)
			}
		}
		srv.Resume()
	}
}
