package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// inFlightStore returns a store with the lease over a new client of srv.
func inFlightStore(t *testing.T, srv *redistest.Server, lease time.Duration) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, InFlightLease: lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestInFlightSlotsConcurrent: cap 5, 50 goroutines of one consumer
// through two stores (two processes' worth) on one Redis, holding what
// they get: exactly 5 admitted, 45 denied by the in-flight limit; after
// the releases no slot is left, and a rate denial gives its slot back.
func TestInFlightSlotsConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	stores := []*redisstore.Store{inFlightStore(t, srv, 0), inFlightStore(t, srv, 0)}
	var engines []*core.Engine
	for _, s := range stores {
		e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "p", InFlight: 5, Rate: core.PerMinute(1000)}}}, core.Options{FailurePolicy: core.FailClosed})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	ctx := context.Background()
	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		var admitted, denied atomic.Int64
		holds := make(chan core.Hold, 50)
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := engines[i%2].Decide(ctx, c, "api", 1)
				switch {
				case err != nil:
					t.Error(err)
				case d.Allowed:
					admitted.Add(1)
					holds <- d.Hold
				default:
					denied.Add(1)
					if d.DecidedBy != core.KindInFlight || d.Limit != 5 || d.Policy != "p" || d.RetryAfter != 0 {
						t.Errorf("denied: %+v", d)
					}
				}
			}()
		}
		wg.Wait()
		close(holds)
		if admitted.Load() != 5 || denied.Load() != 45 {
			t.Fatalf("admitted %d, denied %d; want 5, 45", admitted.Load(), denied.Load())
		}
		if n, err := stores[0].InFlight(ctx, "k", ""); err != nil || n != 5 {
			t.Fatalf("in flight %d %v, want 5", n, err)
		}
		for h := range holds {
			h.Release()
			h.Release()
		}
		if n, err := stores[1].InFlight(ctx, "k", ""); err != nil || n != 0 {
			t.Fatalf("in flight after release %d %v, want 0", n, err)
		}
	}
	// A rate denial gives its slot back.
	e, err := core.NewEngine(stores[0], core.Config{Policies: []core.Policy{{ID: "r", InFlight: 5, Rate: core.PerMinute(2)}}}, core.Options{FailurePolicy: core.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	rc := &core.Consumer{ID: "r", Policies: []string{"r"}}
	for i, want := range []bool{true, true, false} {
		d, err := e.Decide(ctx, rc, "api", 1)
		if err != nil || d.Allowed != want || d.Hold.Held() != want {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		if !want && (d.DecidedBy != core.KindRate || d.RetryAfter <= 29*time.Second || d.RetryAfter > 30*time.Second) { // Redis TIME runs
			t.Fatalf("rate denial: %+v", d)
		}
	}
	if n, err := stores[0].InFlight(ctx, "r", ""); err != nil || n != 2 {
		t.Fatalf("in flight %d %v, want 2", n, err)
	}
}

// TestInFlightLease: slots of a store that stops renewing (closed without
// releasing, as a process that died) are free again within the lease;
// slots whose store renews them stay held well past the lease.
func TestInFlightLease(t *testing.T) {
	srv := redistest.Start(t)
	const lease = time.Second
	ctx := context.Background()
	before := runtime.NumGoroutine()
	a, b := inFlightStore(t, srv, lease), inFlightStore(t, srv, lease)
	pol := core.Config{Policies: []core.Policy{{ID: "p", InFlight: 5}}}
	ea, _ := core.NewEngine(a, pol, core.Options{FailurePolicy: core.FailClosed})
	eb, _ := core.NewEngine(b, pol, core.Options{FailurePolicy: core.FailClosed})
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	var holds []core.Hold
	for i := 0; i < 5; i++ {
		d, err := ea.Decide(ctx, c, "api", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
		holds = append(holds, d.Hold)
	}
	// Renewed: still held three leases later.
	time.Sleep(3 * lease)
	if d, err := eb.Decide(ctx, c, "api", 1); err != nil || d.Allowed {
		t.Fatalf("renewed slots were free: %+v %v", d, err)
	}
	// a stops renewing: within the lease (and not much sooner than its
	// last renewal allows) the slots are free.
	a.Close()
	stopped := time.Now()
	for {
		d, err := eb.Decide(ctx, c, "api", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			d.Hold.Release()
			break
		}
		if time.Since(stopped) > lease+200*time.Millisecond {
			t.Fatalf("slots still held %v after the renewals stopped (lease %v)", time.Since(stopped), lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("slots free %v after the renewals stopped (lease %v)", time.Since(stopped), lease)
	for _, h := range holds {
		h.Release() // a late release of lapsed slots removes nothing of b's
	}
	if n, err := b.InFlight(ctx, "k", ""); err != nil || n != 0 {
		t.Fatalf("in flight %d %v, want 0", n, err)
	}
	b.Close()
	// No goroutine left behind by either store's renewals.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) { // the clients' pools may keep a goroutine each
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Fatalf("%d goroutines, %d before", n, before)
	}
}

// TestInFlightFailedTakeFreesItsSlot: a take sent to a paused Redis times
// out, and Redis runs it when it resumes, adding a slot nobody holds; the
// store cancels the failed take, so the consumer's one slot is free again
// as soon as Redis answers, not a lease (30 s) later. A cancel that
// reaches Redis before its take leaves the take adding nothing.
func TestInFlightFailedTakeFreesItsSlot(t *testing.T) {
	srv, s, e, c := pausableInFlight(t, false)
	ctx := context.Background()

	srv.Pause()
	d, err := e.Decide(ctx, c, "api", 1)
	if !errors.Is(err, core.ErrStoreUnavailable) || d.Allowed {
		srv.Resume()
		t.Fatalf("take while Redis is paused: allowed %v, err %v; want refused with ErrStoreUnavailable", d.Allowed, err)
	}
	// Paused past the cancel's own timeout: the cancel too waits in the
	// server's socket, on a connection its client gave up.
	time.Sleep(500 * time.Millisecond)
	srv.Resume()
	resumed := time.Now()
	for {
		n, err := s.InFlight(ctx, "k", "")
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Since(resumed) > 5*time.Second {
			t.Fatalf("%d slot(s) held %v after Redis resumed, want 0: the failed take's slot was not canceled", n, time.Since(resumed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("failed take's slot gone %v after Redis resumed", time.Since(resumed))
	d, err = e.Decide(ctx, c, "api", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("after the cancel: allowed %v, err %v; want the one slot", d.Allowed, err)
	}
	if d2, err := e.Decide(ctx, c, "api", 1); err != nil || d2.Allowed || d2.DecidedBy != core.KindInFlight {
		t.Fatalf("second while the first is held: allowed %v by %v, err %v; want refused by the in-flight cap", d2.Allowed, d2.DecidedBy, err)
	}
	d.Hold.Release()

	// A cancel that comes first: the take it cancels adds nothing (its
	// caller is gone; here the refusal reaches the test), and the next
	// take gets the slot.
	redisstore.CancelNextSlot(t, s, "k", "")
	if d, err := e.Decide(ctx, c, "api", 1); err != nil || d.Allowed || d.DecidedBy != core.KindInFlight {
		t.Fatalf("canceled take: allowed %v by %v, err %v; want nothing added", d.Allowed, d.DecidedBy, err)
	}
	if n, err := s.InFlight(ctx, "k", ""); err != nil || n != 0 {
		t.Fatalf("in flight %d %v after a canceled take, want 0", n, err)
	}
	d, err = e.Decide(ctx, c, "api", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("after a canceled take: allowed %v, err %v; want the slot", d.Allowed, err)
	}
	d.Hold.Release()
	if n, err := s.InFlight(ctx, "k", ""); err != nil || n != 0 {
		t.Fatalf("in flight %d %v after the release, want 0", n, err)
	}
}

// pausableInFlight returns a redis-server to pause, a store on it whose
// calls time out after 200 ms (slow: its failed cancels are sent again
// only after 10 s), and an engine with one policy, an in-flight cap of 1,
// for consumer k, whose one slot has been taken and given back.
func pausableInFlight(t *testing.T, slow bool) (*redistest.Server, *redisstore.Store, *core.Engine, *core.Consumer) {
	t.Helper()
	srv := redistest.Start(t)
	// ContextTimeoutEnabled: the store's Timeout bounds the call's read
	// (else go-redis's own ReadTimeout of 3 s does).
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	s, err := redisstore.New(rc, redisstore.Options{Timeout: 200 * time.Millisecond, InFlightLease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if slow {
		redisstore.SlowCancelRetries(s)
	}
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "p", InFlight: 1}}}, core.Options{FailurePolicy: core.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	// One slot taken and given back first: the pool has an open connection
	// for the take to go out on, into the paused server's socket, and
	// Redis has the scripts (a queued EVALSHA of a script it did not have
	// would fail on resume and add nothing).
	if d, err := e.Decide(context.Background(), c, "api", 1); err != nil || !d.Allowed {
		t.Fatalf("first take: allowed %v, err %v", d.Allowed, err)
	} else {
		d.Hold.Release()
	}
	return srv, s, e, c
}

// TestInFlightRequestCancelsFailedTakes: Redis paused for 3 s while the
// store's failed cancels wait 10 s to be sent again (lease/3; after a long
// outage the backoff between them is that long too), and the take that
// failed runs when Redis resumes, holding the consumer's one slot. The
// first request after the resume finds the slot held while cancels wait,
// cancels that key's and asks again: admitted, not refused for a slot
// nobody holds.
func TestInFlightRequestCancelsFailedTakes(t *testing.T) {
	srv, s, e, c := pausableInFlight(t, true)
	ctx := context.Background()
	srv.Pause()
	if d, err := e.Decide(ctx, c, "api", 1); !errors.Is(err, core.ErrStoreUnavailable) || d.Allowed {
		srv.Resume()
		t.Fatalf("take while Redis is paused: allowed %v, err %v; want refused with ErrStoreUnavailable", d.Allowed, err)
	}
	time.Sleep(3 * time.Second)
	srv.Resume()
	d, err := e.Decide(ctx, c, "api", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("first request after a 3 s pause: allowed %v by %v, err %v; want the one slot", d.Allowed, d.DecidedBy, err)
	}
	if n, err := s.InFlight(ctx, "k", ""); err != nil || n != 1 {
		t.Fatalf("in flight %d %v while the slot is held, want 1", n, err)
	}
	d.Hold.Release()

}
