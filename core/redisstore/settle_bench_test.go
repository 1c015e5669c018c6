package redisstore_test

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// callCounter counts the commands a client sends (a pipeline's each).
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// BenchmarkSettleRedis is Engine.Decide and the end of the request (Hold's
// Release or Settle) for one caller on a throwaway redis-server: a quota
// whose estimate stands ("quota", Release), the same quota settled to
// another cost in the background ("quota+settle": the next Decide of the
// same consumer waits for it) and on the caller's goroutine
// ("quota+settle/sync", Options.SyncSettle), and an in-flight cap
// ("in_flight", Release). redis-calls/op counts the commands sent per request (an
// EVALSHA each; a NOSCRIPT retry would count twice).
func BenchmarkSettleRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, tc := range []struct {
		name   string
		p      core.Policy
		settle bool
	}{
		{"quota", core.Policy{ID: "p", Quota: core.Quota{Max: 1 << 50, Renewal: time.Hour}, Settle: true}, false},
		{"quota+settle", core.Policy{ID: "p", Quota: core.Quota{Max: 1 << 50, Renewal: time.Hour}, Settle: true}, true},
		{"quota+settle/sync", core.Policy{ID: "p", Quota: core.Quota{Max: 1 << 50, Renewal: time.Hour}, Settle: true}, true},
		{"in_flight", core.Policy{ID: "p", InFlight: 1000}, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer c.Close()
			cc := &callCounter{}
			c.AddHook(cc)
			s, err := redisstore.New(c, redisstore.Options{Pipeline: -1, SyncSettle: strings.HasSuffix(tc.name, "/sync")})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{tc.p}}, core.Options{FailurePolicy: core.FailClosed})
			if err != nil {
				b.Fatal(err)
			}
			cons := &core.Consumer{ID: "bench", Policies: []string{"p"}}
			ctx := context.Background()
			end := func() {
				d, err := e.Decide(ctx, cons, "api", 100)
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				if tc.settle {
					d.Hold.Settle(7)
				} else {
					d.Hold.Release()
				}
			}
			end() // scripts loaded
			cc.n.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				end()
			}
			b.ReportMetric(float64(cc.n.Load())/float64(b.N), "redis-calls/op")
		})
	}
}

// BenchmarkSettleCall is what Hold.Settle costs its caller (the adapters
// call it before the response is done): the settle call alone, timed, on
// a hold taken with the timer stopped and, in the background mode, after
// the previous settle has landed (so each one starts a sender, as for a
// lone request). mode=sync is Options.SyncSettle (one round trip on the
// caller's goroutine), mode=async the default; p50-ns and p99-ns are the
// median and 99th percentile of the settle calls' times. B/op and
// allocs/op count every goroutine's allocations while the clock runs, so
// for mode=async they include part of the sender's (the script call's) work.
// Run with a fixed -benchtime
// (e.g. 5000x): each iteration also takes a hold, off the clock.
func BenchmarkSettleCall(b *testing.B) {
	srv := redistest.Start(b)
	for _, mode := range []string{"sync", "async"} {
		b.Run("mode="+mode, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer c.Close()
			s, err := redisstore.New(c, redisstore.Options{SyncSettle: mode == "sync"})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			r, err := s.Prepare(core.LimitSet{Quota: core.Quota{Max: 1 << 50, Renewal: time.Hour}, Settle: true})
			if err != nil {
				b.Fatal(err)
			}
			req := core.Request{Consumer: "bench-" + mode, Rule: r, Cost: 100}
			ctx := context.Background()
			hold := func() core.Hold {
				for redisstore.PendingSettles(s) != 0 {
					runtime.Gosched()
				}
				d, err := s.Take(ctx, req)
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				return d.Hold
			}
			hold().Settle(7) // scripts loaded
			lat := make([]time.Duration, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				h := hold()
				b.StartTimer()
				t0 := time.Now()
				h.Settle(7)
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			redisstore.WaitSettles(b, s)
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
		})
	}
}
