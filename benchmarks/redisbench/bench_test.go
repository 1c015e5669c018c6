package redisbench

import (
	"context"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// concurrency is the number of goroutines calling at once in the
// overshoot test.
const concurrency = 64

// concurrencies are the HotKey workload's numbers of goroutines calling at
// once.
var concurrencies = []int{1, 8, 64, 256}

// benchLimit admits everything these benchmarks can send (a few hundred
// thousand decisions a second at most), so every call of every limiter
// writes its key: 1,000,000 per second, burst 1,000,000 (T = 1 µs, a step
// redis_rate's float seconds still resolve).
var benchLimit = limit{perSec: 1_000_000, burst: 1_000_000}

// BenchmarkRedis is the side-by-side run: a plain PING as the
// one-round-trip ceiling, then every limiter, on the same redis-server,
// each with its own client of poolSize connections.
//
//	HotKey/c=N:  all calls on one key, N goroutines calling at once.
//	Keys10k/c=N: 10,000 keys, N goroutines, each walking them from its own
//	             offset.
//
// decisions/s is b.N over the timed wall-clock time; p50-µs and p99-µs are
// the median and 99th percentile of one call's latency (from a histogram
// with 1/32-octave buckets, so within 3 %); B/op and allocs/op are the
// whole process's (the batching included), divided by b.N. redis-cpu-µs
// is the redis-server process's CPU time (user + system, from INFO cpu)
// per decision over the timed part, and redis-cmd-µs the time Redis
// itself reports for the commands the limiter sent (INFO commandstats:
// PING, EVAL, EVALSHA and the like, each with the Redis calls of its
// script inside; without reading, parsing and replying), per decision: the
// script's own cost.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b) // one server for every limiter in this run
	type workload struct {
		name        string
		keys, procs int
	}
	var ws []workload
	for _, c := range concurrencies {
		ws = append(ws, workload{"HotKey/c=" + strconv.Itoa(c), 1, c})
	}
	for _, c := range concurrencies {
		ws = append(ws, workload{"Keys10k/c=" + strconv.Itoa(c), 10_000, c})
	}
	for _, w := range ws {
		keys := make([]string, w.keys)
		for i := range keys {
			keys[i] = "bench-" + strconv.Itoa(w.keys) + "-" + strconv.Itoa(i)
		}
		b.Run(w.name, func(b *testing.B) {
			b.Run("PING", func(b *testing.B) {
				c := client(b, srv)
				runConcurrent(b, srv, w.procs, keys, func(ctx context.Context, _ string) (bool, error) {
					return true, c.Ping(ctx).Err()
				})
			})
			for _, ct := range contenders {
				b.Run(ct.name, func(b *testing.B) {
					runConcurrent(b, srv, w.procs, keys, ct.build(b, srv, benchLimit, redisstore.Options{}))
				})
			}
		})
	}
}

// histogram counts latencies in buckets of 1/32 octave: value v ≥ 32 ns
// lands in bucket 32×(bits.Len(v)−5) + the 5 bits after v's leading one.
type histogram [64 * 32]uint64

func (h *histogram) add(d time.Duration) {
	v := uint64(max(d, 0))
	if v < 32 {
		h[v]++
		return
	}
	e := bits.Len64(v) - 6 // shift that leaves 6 bits: the leading one and 5 more
	h[32*(e+1)+int(v>>e&31)]++
}

// lower returns the smallest value of bucket i.
func lower(i int) time.Duration {
	if i < 32 {
		return time.Duration(i)
	}
	e := i/32 - 1
	return time.Duration((32 + uint64(i%32)) << e)
}

// quantile returns the lower bound of the bucket holding the q-quantile.
func (h *histogram) quantile(q float64) time.Duration {
	var n uint64
	for _, c := range h {
		n += c
	}
	want := uint64(q*float64(n)) + 1
	var seen uint64
	for i, c := range h {
		seen += c
		if seen >= want {
			return lower(i)
		}
	}
	return 0
}

// runConcurrent calls allow from procs goroutines until b.N calls are
// done, and reports decisions/s and the latency percentiles. Any error or
// denial fails the benchmark: every limiter must do the same (admitting)
// work. The goroutines, their histograms and the client's connections
// exist before the timer starts, so they count in neither the time nor the
// allocations.
func runConcurrent(b *testing.B, srv *redistest.Server, procs int, keys []string, allow allowFunc) {
	var next, denied, failed, warmFailed atomic.Int64
	var firstErr atomic.Value
	hists := make([]histogram, procs)
	start := make(chan struct{})
	var wg, ready sync.WaitGroup
	ready.Add(procs)
	for g := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			h := &hists[g]
			i := g * 7919
			// One untimed call each first: every connection is dialled
			// and every script loaded before the clock starts.
			if _, err := allow(ctx, keys[i%len(keys)]); err != nil {
				warmFailed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			ready.Done()
			<-start
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				ok, err := allow(ctx, keys[i%len(keys)])
				h.add(time.Since(t0))
				i++
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else if !ok {
					denied.Add(1)
				}
			}
		}()
	}
	ready.Wait()
	admin := srv.Client(b, &redis.Options{PoolSize: 1})
	before := serverStats(b, admin)
	b.ReportAllocs()
	b.ResetTimer()
	close(start)
	wg.Wait()
	b.StopTimer()
	after := serverStats(b, admin)
	var all histogram
	for i := range hists {
		for j, c := range hists[i] {
			all[j] += c
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(all.quantile(0.50))/1e3, "p50-µs")
	b.ReportMetric(float64(all.quantile(0.99))/1e3, "p99-µs")
	b.ReportMetric((after.cpu-before.cpu)/float64(b.N), "redis-cpu-µs")
	b.ReportMetric((after.cmd-before.cmd)/float64(b.N), "redis-cmd-µs")
	if n, w := failed.Load(), warmFailed.Load(); n+w > 0 {
		b.Fatalf("%d of %d calls and %d of %d untimed first calls failed, first: %v", n, b.N, w, procs, firstErr.Load())
	}
	if n := denied.Load(); n > 0 {
		b.Fatalf("%d of %d calls denied; the benchmark limit must admit all", n, b.N)
	}
}

// redisStats is what serverStats reads: the server's CPU time so far and
// the time its limiter commands took, both in µs.
type redisStats struct{ cpu, cmd float64 }

// limiterCommands are the commands a limiter's call sends (INFO
// commandstats names); the Redis calls inside a script are counted in
// its EVAL or EVALSHA (and again under their own names, left out here).
var limiterCommands = []string{"ping", "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// serverStats reads INFO cpu and commandstats from c's server.
func serverStats(tb testing.TB, c *redis.Client) redisStats {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO: %v", err)
	}
	var st redisStats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_sys", "used_cpu_user":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				tb.Fatalf("INFO %s: %v", line, err)
			}
			st.cpu += f * 1e6
			continue
		}
		cmd, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok || !slices.Contains(limiterCommands, cmd) {
			continue
		}
		for _, f := range strings.Split(val, ",") {
			if u, ok := strings.CutPrefix(f, "usec="); ok {
				x, err := strconv.ParseFloat(u, 64)
				if err != nil {
					tb.Fatalf("INFO %s: %v", line, err)
				}
				st.cmd += x
			}
		}
	}
	return st
}
