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
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// roundSlice is how long each limiter runs in each round of
// BenchmarkRedisRounds.
var roundSlice = flag.Duration("redisbench.slice", 250*time.Millisecond, "BenchmarkRedisRounds: time each limiter runs per round")

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
// (<name>-dps) and the median, min and max over the rounds of
// limitplane's decisions/s divided by redis_rate's and by PING's; every
// round's numbers are logged (-test.v shows them).
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
				allows := make([]allowFunc, len(roundContenders))
				for i, name := range roundContenders {
					allows[i] = roundLimiter(b, srv, name)
				}
				// Untimed: dial every connection and load every script.
				for _, allow := range allows {
					runSlice(b, procs, keys, allow, 50*time.Millisecond)
				}
				calls := make([]int64, len(allows))
				spent := make([]time.Duration, len(allows))
				var toRate, toPing []float64
				b.ResetTimer()
				for r := range b.N {
					dps := make([]float64, len(allows))
					for k := range allows {
						i := (r + k) % len(allows)
						n, d := runSlice(b, procs, keys, allows[i], *roundSlice)
						calls[i] += n
						spent[i] += d
						dps[i] = float64(n) / d.Seconds()
					}
					lp := dps[slices.Index(roundContenders, "limitplane")]
					toRate = append(toRate, lp/dps[slices.Index(roundContenders, "redis_rate")])
					toPing = append(toPing, lp/dps[slices.Index(roundContenders, "PING")])
					var line strings.Builder
					for i, name := range roundContenders {
						fmt.Fprintf(&line, " %s %.0f", name, dps[i])
					}
					b.Logf("round %d of %d: decisions/s%s; limitplane ÷ redis_rate %.3f, ÷ PING %.3f", r+1, b.N, line.String(), toRate[r], toPing[r])
				}
				b.StopTimer()
				for i, name := range roundContenders {
					b.ReportMetric(float64(calls[i])/spent[i].Seconds(), name+"-dps")
				}
				for _, m := range []struct {
					name string
					v    []float64
				}{{"÷redis_rate", toRate}, {"÷PING", toPing}} {
					slices.Sort(m.v)
					b.ReportMetric(median(m.v), m.name+"-median")
					b.ReportMetric(m.v[0], m.name+"-min")
					b.ReportMetric(m.v[len(m.v)-1], m.name+"-max")
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
