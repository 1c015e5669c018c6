package redisbench

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// roundSlice is how long each limiter runs in each round of
// BenchmarkRedisRounds.
var roundSlice = flag.Duration("redisbench.slice", 250*time.Millisecond, "BenchmarkRedisRounds: time each limiter runs per round")

// roundInFlight adds limitplane with other Options.PipelineInFlight
// values to BenchmarkRedisRounds.
var roundInFlight = flag.String("redisbench.inflight", "", "BenchmarkRedisRounds: comma-separated Options.PipelineInFlight values to add as limiters limitplane-inflight=N")

// roundContenders are the limiters BenchmarkRedisRounds interleaves: PING
// (the one-round-trip ceiling), the two peers and limitplane as
// Options{} makes it.
var roundContenders = []string{"PING", "redis_rate", "ulule", "limitplane"}

// BenchmarkRedisRounds is BenchmarkRedis for a shared, noisy machine: each
// iteration is one round in which every limiter of roundContenders runs
// for -redisbench.slice (250 ms) in turn, each round starting with the
// next one (PING first in round 1, redis_rate first in round 2, …), so a
// change of load hits all of them alike and the ratios of one round are
// measured within about a second of each other. Run it with
// -test.benchtime=Nx for N rounds. It reports, per workload (as
// BenchmarkRedis's), each limiter's decisions/s over all rounds
// (<name>-dps) and, for limitplane (and each variant that
// -redisbench.inflight adds), the median, min and max over the rounds of
// its decisions/s divided by redis_rate's and by PING's; every round's
// numbers are logged (-test.v shows them). <name>-cpu-µs and
// <name>-redis-cpu-µs are the CPU time (user + system) of this process
// (the limiter's client side, with the benchmark's own loop) and of the
// redis-server per decision: unlike decisions/s, what other work on the
// machine changes little.
func BenchmarkRedisRounds(b *testing.B) {
	srv := redistest.Start(b)
	for _, wl := range []struct {
		name string
		keys int
	}{{"HotKey", 1}, {"Keys10k", 10_000}} {
		keys := make([]string, wl.keys)
		for i := range keys {
			keys[i] = "rounds-" + strconv.Itoa(wl.keys) + "-" + strconv.Itoa(i)
		}
		for _, procs := range concurrencies {
			b.Run(wl.name+"/c="+strconv.Itoa(procs), func(b *testing.B) {
				names := roundContenders
				for _, f := range strings.Split(*roundInFlight, ",") {
					if f != "" {
						names = append(slices.Clip(names), "limitplane-inflight="+f)
					}
				}
				allows := make([]allowFunc, len(names))
				for i, name := range names {
					allows[i] = roundLimiter(b, srv, name)
				}
				// Untimed: dial every connection and load every script.
				for _, allow := range allows {
					runSlice(b, procs, keys, allow, 50*time.Millisecond)
				}
				admin := srv.Client(b, &redis.Options{PoolSize: 1})
				calls := make([]int64, len(allows))
				spent := make([]time.Duration, len(allows))
				cpu := make([]float64, len(allows))  // this process's CPU time, µs
				rcpu := make([]float64, len(allows)) // redis-server's, µs
				rate, ping := slices.Index(names, "redis_rate"), slices.Index(names, "PING")
				toRate := make([][]float64, len(allows)) // per limitplane variant
				toPing := make([][]float64, len(allows))
				b.ResetTimer()
				for r := range b.N {
					dps := make([]float64, len(allows))
					for k := range allows {
						i := (r + k) % len(allows)
						c0, r0 := processCPU(b), serverStats(b, admin)
						n, d := runSlice(b, procs, keys, allows[i], *roundSlice)
						cpu[i] += processCPU(b) - c0
						rcpu[i] += serverStats(b, admin).cpu - r0.cpu
						calls[i] += n
						spent[i] += d
						dps[i] = float64(n) / d.Seconds()
					}
					var line strings.Builder
					for i, name := range names {
						fmt.Fprintf(&line, " %s %.0f", name, dps[i])
					}
					for i, name := range names {
						if strings.HasPrefix(name, "limitplane") {
							toRate[i] = append(toRate[i], dps[i]/dps[rate])
							toPing[i] = append(toPing[i], dps[i]/dps[ping])
							fmt.Fprintf(&line, "; %s ÷ redis_rate %.3f, ÷ PING %.3f", name, dps[i]/dps[rate], dps[i]/dps[ping])
						}
					}
					b.Logf("round %d of %d: decisions/s%s", r+1, b.N, line.String())
				}
				b.StopTimer()
				for i, name := range names {
					b.ReportMetric(float64(calls[i])/spent[i].Seconds(), name+"-dps")
					b.ReportMetric(cpu[i]/float64(calls[i]), name+"-cpu-µs")
					b.ReportMetric(rcpu[i]/float64(calls[i]), name+"-redis-cpu-µs")
					if toRate[i] == nil {
						continue
					}
					for _, m := range []struct {
						name string
						v    []float64
					}{{"÷redis_rate", toRate[i]}, {"÷PING", toPing[i]}} {
						slices.Sort(m.v)
						b.ReportMetric(median(m.v), name+m.name+"-median")
						b.ReportMetric(m.v[0], name+m.name+"-min")
						b.ReportMetric(m.v[len(m.v)-1], name+m.name+"-max")
					}
				}
			})
		}
	}
}

// median returns the median of sorted v (the mean of the middle two for
// an even length).
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// roundLimiter returns the named limiter of roundContenders on a fresh
// client of srv.
func roundLimiter(tb testing.TB, srv *redistest.Server, name string) allowFunc {
	if f, ok := strings.CutPrefix(name, "limitplane-inflight="); ok {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			tb.Fatalf("-redisbench.inflight: %q is not a positive number", f)
		}
		return limitplane(tb, srv, benchLimit, redisstore.Options{PipelineInFlight: n})
	}
	if name == "PING" {
		c := client(tb, srv)
		return func(ctx context.Context, _ string) (bool, error) { return true, c.Ping(ctx).Err() }
	}
	for _, ct := range contenders {
		if ct.name == name {
			return ct.build(tb, srv, benchLimit, redisstore.Options{})
		}
	}
	tb.Fatalf("no limiter %q", name)
	return nil
}

// runSlice calls allow from procs goroutines for d and returns the number
// of calls made and the time from the start until the last returned. Any
// error or denial fails the benchmark, as in runConcurrent.
func runSlice(b *testing.B, procs int, keys []string, allow allowFunc, d time.Duration) (int64, time.Duration) {
	var n, denied, failed atomic.Int64
	var firstErr atomic.Value
	var stop atomic.Bool
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := g * 7919; !stop.Load(); i++ {
				ok, err := allow(ctx, keys[i%len(keys)])
				n.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else if !ok {
					denied.Add(1)
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(t0)
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d calls failed, first: %v", f, n.Load(), firstErr.Load())
	}
	if x := denied.Load(); x > 0 {
		b.Fatalf("%d of %d calls denied; the benchmark limit must admit all", x, n.Load())
	}
	return n.Load(), el
}

// processCPU returns this process's CPU time so far (user + system), in
// µs.
func processCPU(tb testing.TB) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}
