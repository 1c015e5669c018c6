package redisstore_test

import (
	"context"
	"errors"
	"fmt"
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
// it on the same port, and checks that limiting resumes by itself, that
// the breaker stopped calls to the dead server, and that no goroutine
// leaks.
func TestRedisDiesUnderLoad(t *testing.T) {
	for _, pol := range []core.FailurePolicy{core.FailOpen, core.FailClosed, core.FailFallback} {
		t.Run(fmt.Sprint([]string{"FailOpen", "FailClosed", "FailFallback"}[pol]), func(t *testing.T) {
			faultRun(t, pol)
		})
	}
}

func faultRun(t *testing.T, pol core.FailurePolicy) {
	srv := redistest.Start(t)
	baseline := runtime.NumGoroutine()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: 200 * time.Millisecond})
	var sent atomic.Int64 // commands that reached go-redis, i.e. not short-circuited
	client.AddHook(countHook{&sent})
	var opened, closed atomic.Int32
	store := newStore(t, client, redisstore.Options{
		Timeout:         500 * time.Millisecond, // generous: CI machines run other tests meanwhile
		BreakerFailures: 3,
		BreakerCooldown: 100 * time.Millisecond,
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
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 5, Period: time.Hour}}}},
		core.Options{
			FailurePolicy: pol,
			Fallback:      memory.New(memory.Options{}),
			OnStoreError: func(err error) {
				storeErrs.Add(1)
				if errors.Is(err, redisstore.ErrCircuitOpen) {
					openErrs.Add(1)
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
	if _, err := store.Take(ctx, core.Request{Consumer: "warm-up", Rate: core.PerSecond(1), Cost: 1}); err != nil {
		t.Fatal(err) // loads the script
	}
	exact("before the kill", "before")

	// Load: 16 goroutines deciding for rotating consumers, each result
	// checked against the policy.
	stop := make(chan struct{})
	var wg sync.WaitGroup
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
	deadline = time.Now().Add(5 * time.Second)
	for {
		if _, err := store.Take(ctx, core.Request{Consumer: "probe", Rate: core.PerSecond(1000), Cost: 1}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("store did not resume within 5s of the restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if closed.Load() == 0 {
		t.Fatal("breaker never closed again")
	}
	// Requests already dialling when Redis came back may still time out
	// and briefly reopen the breaker; wait for 300ms without a store error.
	for {
		e0 := storeErrs.Load()
		time.Sleep(300 * time.Millisecond)
		if storeErrs.Load() == e0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("store errors continued 5s after the restart")
		}
	}
	errsAtResume := storeErrs.Load()
	exact("after the restart", "after")
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if got := storeErrs.Load() - errsAtResume; got != 0 {
		t.Fatalf("%d store errors after Redis came back", got)
	}
	t.Logf("%v: %d decisions under load, %d store errors (%d short-circuited by the breaker)", pol, decisions.Load(), storeErrs.Load(), openErrs.Load())

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

// countHook counts commands go-redis processes.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
