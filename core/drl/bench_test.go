package drl

// BenchmarkDRLHotKey compares a DRL decision on a hot key with the
// in-process store's hot-key Take, its peer, in the same run:
//
//	go test -run '^$' -bench DRLHotKey -benchmem -cpu 1,2 -count 6 ./dataplane/drl/
//
// Both read the same *core.CoarseClock per call. "admit" admits every call
// (each stores a TAT with a CAS); "deny" is exhausted (a load, no write).
// The target: drl ≤ 1.5× memory-take.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

var (
	benchSink   int64
	benchSinkMu sync.Mutex
)

func BenchmarkDRLHotKey(b *testing.B) {
	const consumer = "9f86d081884c7d659a2feaa0c55ad015"
	workloads := []struct {
		name  string
		limit core.Limit
	}{
		{"admit", core.Limit{Rate: 1_000_000_000, Period: time.Second}},
		{"deny", core.Limit{Rate: 1000, Period: time.Second, Burst: 100}}, // exhausted: about 1 admitted per ms
	}
	ctx := context.Background()
	for _, w := range workloads {
		req := core.Request{Consumer: consumer, Scope: "api", Rate: w.limit, Cost: 1, Distributed: true}
		clock := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
		b.Run(w.name+"/drl", func(b *testing.B) {
			l := NewLimiter(LimiterOptions{Gateway: "g", Interval: time.Hour})
			// This gateway holds the whole limit (one gateway).
			kl := LimitOf(w.limit)
			l.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(kl)))
			var d core.Decision
			if !l.Take(clock.Nanotime(), &req, &d) {
				b.Fatal("not handled")
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := req
				var d core.Decision
				n := int64(0)
				for pb.Next() {
					l.Take(clock.Nanotime(), &r, &d)
					if d.Allowed {
						n++
					}
				}
				benchSinkMu.Lock()
				benchSink += n
				benchSinkMu.Unlock()
			})
		})
		// paired alternates blocks of DRL decisions, memory Takes and
		// memory TakeIntos in each goroutine, timing each block, so the
		// three meet the same machine load (the machine is shared):
		// drl-ns/op, take-ns/op, into-ns/op and the ratios are what to
		// read; ns/op is the three together.
		b.Run(w.name+"/paired", func(b *testing.B) {
			l := NewLimiter(LimiterOptions{Gateway: "g", Interval: time.Hour})
			kl := LimitOf(w.limit)
			l.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(kl)))
			s := memory.New(memory.Options{Clock: clock})
			b.Cleanup(func() { s.Close() })
			var d core.Decision
			if !l.Take(clock.Nanotime(), &req, &d) {
				b.Fatal("not handled")
			}
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
			const block = 256
			var mu sync.Mutex
			var tDRL, tTake, tInto time.Duration
			var ops int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := req
				var d core.Decision
				var dd, dt, di time.Duration
				var n, k int64
				for more := true; more; {
					c := 0
					for c < block && pb.Next() {
						c++
					}
					more = c == block
					t0 := time.Now()
					for range c {
						l.Take(clock.Nanotime(), &r, &d)
						k += int64(d.Remaining)
					}
					t1 := time.Now()
					for range c {
						d, _ = s.Take(ctx, r)
						k += int64(d.Remaining)
					}
					t2 := time.Now()
					for range c {
						s.TakeInto(ctx, &r, &d)
						k += int64(d.Remaining)
					}
					t3 := time.Now()
					dd, dt, di, n = dd+t1.Sub(t0), dt+t2.Sub(t1), di+t3.Sub(t2), n+int64(c)
				}
				mu.Lock()
				tDRL, tTake, tInto, ops = tDRL+dd, tTake+dt, tInto+di, ops+n
				benchSink += k
				mu.Unlock()
			})
			if ops > 0 {
				b.ReportMetric(float64(tDRL)/float64(ops), "drl-ns/op")
				b.ReportMetric(float64(tTake)/float64(ops), "take-ns/op")
				b.ReportMetric(float64(tInto)/float64(ops), "into-ns/op")
				b.ReportMetric(float64(tDRL)/float64(tTake), "drl/take")
				b.ReportMetric(float64(tDRL)/float64(tInto), "drl/into")
			}
		})
		b.Run(w.name+"/memory-take", func(b *testing.B) {
			s := memory.New(memory.Options{Clock: clock})
			b.Cleanup(func() { s.Close() })
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := int64(0)
				for pb.Next() {
					d, _ := s.Take(ctx, req)
					if d.Allowed {
						n++
					}
				}
				benchSinkMu.Lock()
				benchSink += n
				benchSinkMu.Unlock()
			})
		})
		b.Run(w.name+"/memory-into", func(b *testing.B) {
			s := memory.New(memory.Options{Clock: clock})
			b.Cleanup(func() { s.Close() })
			if _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := req
				var d core.Decision
				n := int64(0)
				for pb.Next() {
					s.TakeInto(ctx, &r, &d)
					if d.Allowed {
						n++
					}
				}
				benchSinkMu.Lock()
				benchSink += n
				benchSinkMu.Unlock()
			})
		})
	}
}
