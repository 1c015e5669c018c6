package redisbench

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// concurrency is the number of goroutines calling at once.
const concurrency = 64

// benchLimit admits everything these benchmarks can send (a few hundred
// thousand decisions a second at most), so every call of every limiter
// writes its key: 1,000,000 per second, burst 1,000,000 (T = 1 µs, a step
// redis_rate's float seconds still resolve).
var benchLimit = limit{perSec: 1_000_000, burst: 1_000_000}

// BenchmarkRedis is the side-by-side run: every limiter, then a plain PING
// as the one-round-trip ceiling, on the same redis-server, each with its
// own client of poolSize connections, 64 goroutines calling at once.
//
//	HotKey:    all calls on one key.
//	Keys10k:   10,000 keys, each goroutine walking them from its own
//	           offset.
//
// decisions/s is b.N over the timed wall-clock time; B/op and allocs/op are
// the whole process's (the pipeline's goroutines included), divided by b.N.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b) // one server for every limiter in this run
	for _, w := range []struct {
		name string
		keys int
	}{{"HotKey", 1}, {"Keys10k", 10_000}} {
		keys := make([]string, w.keys)
		for i := range keys {
			keys[i] = "bench-" + strconv.Itoa(w.keys) + "-" + strconv.Itoa(i)
		}
		b.Run(w.name, func(b *testing.B) {
			b.Run("PING", func(b *testing.B) {
				c := client(b, srv)
				runParallel(b, keys, func(ctx context.Context, _ string) (bool, error) {
					return true, c.Ping(ctx).Err()
				})
			})
			for _, ct := range contenders {
				b.Run(ct.name, func(b *testing.B) {
					runParallel(b, keys, ct.build(b, srv, benchLimit, redisstore.Options{}))
				})
			}
		})
	}
}

// runParallel calls allow from concurrency goroutines until b.N calls
// are done, and reports decisions/s. Any error or denial fails the
// benchmark: every limiter must do the same (admitting) work.
func runParallel(b *testing.B, keys []string, allow allowFunc) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((concurrency + procs - 1) / procs)
	var offset, denied, failed atomic.Int64
	var firstErr atomic.Value
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := int(offset.Add(1)) * 7919
		for pb.Next() {
			ok, err := allow(ctx, keys[i%len(keys)])
			i++
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			} else if !ok {
				denied.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d calls failed, first: %v", n, b.N, firstErr.Load())
	}
	if n := denied.Load(); n > 0 {
		b.Fatalf("%d of %d calls denied; the benchmark limit must admit all", n, b.N)
	}
}
