package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisDiesUnderLoad kills redis-server (SIGKILL) while 16 goroutines
// hammer an Engine, checks each failure policy while it is down, restarts
// it on the same port, and checks that limiting resumes by itself (with no
// store error at all once the bounded settling time below has passed),
// that the breaker stopped calls to the dead server, and that no goroutine
// leaks.
func TestRedisDiesUnderLoad(t *testing.T) {
	for _, pol := range []core.FailurePolicy{core.FailOpen, core.FailClosed, core.FailFallback} {
		t.Run(fmt.Sprint([]string{"FailOpen", "FailClosed", "FailFallback"}[pol]), func(t *testing.T) {
			faultRun(t, pol)
		})
	}
}

// goRedisDialProbe is how often a go-redis v9 connection pool, once PoolSize
// of its dials have failed, tries to dial again (internal/pool
// ConnPool.tryDial sleeps a fixed second between probes). Until a probe
// connects, the pool does not dial at all: every Get that finds no idle
// connection fails at once with the last dial error.
const goRedisDialProbe = time.Second

func faultRun(t *testing.T, pol core.FailurePolicy) {
	const (
		dialTimeout = 200 * time.Millisecond
		timeout     = 500 * time.Millisecond // generous: CI machines run other tests meanwhile
		cooldown    = 100 * time.Millisecond
		// settle bounds how long store errors may go on after Redis
		// answers again, while other Takes already succeed (so the breaker
		// has closed): on a small machine (PoolSize is 10 per CPU) the 16
		// goroutines' Takes fail more than PoolSize dials while Redis is
		// down, so go-redis serves its last dial error ("connection
		// refused", or "i/o timeout") to every Take that needs a new
		// connection until its next probe, up to goRedisDialProbe +
		// dialTimeout after Redis is back; a Take already in flight may
		// still time out (timeout); those failures may reopen the breaker
		// for a cooldown. The margin absorbs scheduling delays on a loaded
		// 2-CPU machine.
		margin = 500 * time.Millisecond
		settle = goRedisDialProbe + dialTimeout + timeout + cooldown + margin
	)
	srv := redistest.Start(t)
	baseline := runtime.NumGoroutine()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: dialTimeout})
	t.Cleanup(func() { client.Close() }) // for a t.Fatal before the Close below
	// sent counts commands that reached go-redis, i.e. not short-circuited.
	var sent atomic.Int64
	client.AddHook(countHook{&sent})
	var opened, closed atomic.Int32
	store := newStore(t, client, redisstore.Options{
		Timeout:         timeout,
		BreakerFailures: 3,
		BreakerCooldown: cooldown,
		OnBreakerChange: func(from, to string) {
			switch to {
			case "open":
				opened.Add(1)
			case "closed":
				closed.Add(1)
			}
		},
	})
	var storeErrs, openErrs atomic.Int64
	// Once Redis is back (backAt, Unix ns, set when Restart returns), the
	// only store errors allowed are the settling kinds described above;
	// lastErrAt is the latest store error's time.
	var backAt, lastErrAt atomic.Int64
	var oddErr atomic.Value
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 5, Period: time.Hour}}}},
		core.Options{
			FailurePolicy: pol,
			Fallback:      memory.New(memory.Options{}),
			OnStoreError: func(err error) {
				storeErrs.Add(1)
				lastErrAt.Store(time.Now().UnixNano())
				if errors.Is(err, redisstore.ErrCircuitOpen) {
					openErrs.Add(1)
				}
				if backAt.Load() != 0 && !settling(err) {
					oddErr.Store(fmt.Errorf("store error after Redis came back that is not a dial error, timeout or open breaker: %w", err))
				}
			},
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	consumer := func(id string) *core.Consumer { return &core.Consumer{ID: id, Policies: []string{"p"}} }

	// exact checks that 5 requests pass with Remaining 4…0, decided by
	// the rate limit, and the 6th is denied.
	exact := func(phase, id string) {
		t.Helper()
		for i := int64(0); i < 6; i++ {
			d, err := eng.Decide(ctx, consumer(id), "api", 1)
			if err != nil {
				t.Fatalf("%s: request %d: %v", phase, i, err)
			}
			if d.Allowed != (i < 5) || d.DecidedBy != core.KindRate || (i < 5 && d.Remaining != 4-i) {
				t.Fatalf("%s: request %d: %+v", phase, i, d)
			}
		}
	}
	if _, err := core.TakeCall(ctx, store, core.Call{Consumer: "warm-up", Rate: core.PerSecond(1), Cost: 1}); err != nil {
		t.Fatal(err) // loads the script
	}
	exact("before the kill", "before")

	// Load: 16 goroutines deciding for rotating consumers, each result
	// checked against the policy. Each pauses a millisecond between
	// decisions, like a client between requests: while the breaker is open
	// a decision costs microseconds of CPU and no I/O, and 16 goroutines
	// deciding back to back would starve the go-redis and breaker-probe
	// goroutines for hundreds of ms (with -race on a loaded 2-CPU machine,
	// or GOMAXPROCS=1) and time out the very calls the test waits for.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt) // after a t.Fatal too, so the load does not run on into later tests
	var bad atomic.Value
	var decisions atomic.Int64
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d, err := eng.Decide(ctx, consumer(fmt.Sprintf("load-%d-%d", g, i%50)), "api", 1)
				decisions.Add(1)
				switch {
				case pol == core.FailClosed && err != nil && !errors.Is(err, core.ErrStoreUnavailable):
					bad.Store(fmt.Errorf("FailClosed error %v does not wrap ErrStoreUnavailable", err))
				case pol != core.FailClosed && err != nil:
					bad.Store(fmt.Errorf("%v: unexpected error %v", pol, err))
				case pol == core.FailOpen && err == nil && d.DecidedBy == core.KindNone && (!d.Allowed || d.Remaining != 0):
					bad.Store(fmt.Errorf("FailOpen decision %+v", d))
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	srv.Kill()

	// While Redis is down, a fresh consumer sees the policy.
	deadline := time.Now().Add(5 * time.Second)
	for opened.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("breaker never opened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	switch pol {
	case core.FailOpen:
		for i := 0; i < 10; i++ {
			d, err := eng.Decide(ctx, consumer("down"), "api", 1)
			if err != nil || !d.Allowed || d.DecidedBy != core.KindNone || d.Remaining != 0 {
				t.Fatalf("FailOpen while down: %+v, %v", d, err)
			}
		}
	case core.FailClosed:
		d, err := eng.Decide(ctx, consumer("down"), "api", 1)
		if !errors.Is(err, core.ErrStoreUnavailable) || d != (core.Decision{}) {
			t.Fatalf("FailClosed while down: %+v, %v", d, err)
		}
	case core.FailFallback:
		exact("fallback while down", "down")
	}
	// The open breaker fails fast instead of calling the dead server:
	// over 300ms (three cooldowns) almost no call reaches go-redis.
	errs0, sent0 := storeErrs.Load(), sent.Load()
	time.Sleep(300 * time.Millisecond)
	calls, reached := storeErrs.Load()-errs0, sent.Load()-sent0
	if openErrs.Load() == 0 || calls < 20 || reached*10 > calls {
		t.Fatalf("breaker: %d failed calls in 300ms of which %d reached Redis; want most short-circuited", calls, reached)
	}
	srv.Restart(t)
	back := time.Now()
	backAt.Store(back.UnixNano())
	deadline = back.Add(5 * time.Second)
	for {
		_, err := core.TakeCall(ctx, store, core.Call{Consumer: "probe", Rate: core.PerSecond(1000), Cost: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store did not resume within 5s of the restart: %v; pool %+v", err, *client.PoolStats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if closed.Load() == 0 {
		t.Fatal("breaker never closed again")
	}
	// One Take succeeding does not mean they all do yet (see settle); from
	// settle after the restart on, none may fail.
	time.Sleep(time.Until(back.Add(settle)))
	errsAtResume := storeErrs.Load()
	exact("after the restart", "after")
	time.Sleep(200 * time.Millisecond)
	halt()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if err, _ := oddErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	if got := storeErrs.Load() - errsAtResume; got != 0 {
		t.Fatalf("%d store errors more than %v after Redis came back (the last %v after)", got, settle, time.Duration(lastErrAt.Load()-back.UnixNano()))
	}
	lastErr := "none"
	if d := time.Duration(lastErrAt.Load() - back.UnixNano()); d > 0 {
		lastErr = d.Round(time.Millisecond).String()
	}
	t.Logf("%d decisions under load, %d store errors (%d short-circuited by the breaker); the last store error %s after Redis came back (bound %v)",
		decisions.Load(), storeErrs.Load(), openErrs.Load(), lastErr, settle)

	client.Close()
	deadline = time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settling reports whether err is one that may still happen for a while
// after Redis came back (see settle in faultRun): the open breaker, a
// timeout, or a dial error (go-redis's pool repeating its last one).
func settling(err error) bool {
	var op *net.OpError
	return errors.Is(err, redisstore.ErrCircuitOpen) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &op) && op.Op == "dial"
}

// countHook counts commands go-redis processes.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
