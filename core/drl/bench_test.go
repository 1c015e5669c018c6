package drl

// BenchmarkDRLHotKey compares a DRL decision on a hot key with the
// in-process store's hot-key Take, its peer, in the same run:
//
//	go test -run '^$' -bench DRLHotKey -benchmem -cpu 1,2 -count 6 ./core/drl/
//
// Both prepare their rule once, outside the loops (the DRL's is compiled
// as drl.Store.Prepare compiles it), and read the same *core.CoarseClock
// per call. "admit" admits every call
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

// compiled is req's rule compiled for l, once, outside the timed loops,
// as drl.Store.Prepare compiles it.
func compiled(b *testing.B, l *Limiter, req core.Request) hotRule {
	hr, ok := l.compile(req.Rule)
	if !ok {
		b.Fatal("not eligible")
	}
	return hr
}

// memRequest is req with its limits prepared on s, once, outside the
// timed loops.
func memRequest(b *testing.B, s *memory.Store, req core.Request) core.Request {
	r, err := s.Prepare(req.Rule.Limits())
	if err != nil {
		b.Fatal(err)
	}
	req.Rule = r
	return req
}

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
		ls := core.LimitSet{Scope: "api", Rate: w.limit, Distributed: true}
		req := request(consumer, ls)
		clock := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
		b.Run(w.name+"/drl", func(b *testing.B) {
			l := NewLimiter(LimiterOptions{Gateway: "g", Interval: time.Hour})
			// This gateway holds the whole limit (one gateway).
			kl := LimitOf(w.limit)
			l.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(kl)))
			hr := compiled(b, l, req)
			var d core.Decision
			if !l.take(clock.Nanotime(), &req, &hr, &d) {
				b.Fatal("not handled")
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := req
				var d core.Decision
				n := int64(0)
				for pb.Next() {
					l.take(clock.Nanotime(), &r, &hr, &d)
					if d.Allowed {
						n++
					}
				}
				benchSinkMu.Lock()
				benchSink += n
				benchSinkMu.Unlock()
			})
		})
		// drl-take is drl through the public Limiter.Take, which compiles
		// the rule on every call (what drl.Store.Prepare does once): the
		// cost of the per-request eligibility checks the Store skips.
		b.Run(w.name+"/drl-take", func(b *testing.B) {
			l := NewLimiter(LimiterOptions{Gateway: "g", Interval: time.Hour})
			l.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(LimitOf(w.limit))))
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
		// compile-paired alternates blocks of decisions through the rule
		// compiled once (the Store's path) and through Limiter.Take, which
		// compiles it per call, timing each block so both meet the same
		// machine load: once/per-call is the ratio to read.
		b.Run(w.name+"/compile-paired", func(b *testing.B) {
			l := NewLimiter(LimiterOptions{Gateway: "g", Interval: time.Hour})
			l.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(LimitOf(w.limit))))
			hr := compiled(b, l, req)
			const block = 256
			var mu sync.Mutex
			var tOnce, tEach time.Duration
			var ops int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := req
				var d core.Decision
				var d1, d2 time.Duration
				var n, k int64
				for more := true; more; {
					c := 0
					for c < block && pb.Next() {
						c++
					}
					more = c == block
					t0 := time.Now()
					for range c {
						l.take(clock.Nanotime(), &r, &hr, &d)
						k += d.Remaining
					}
					t1 := time.Now()
					for range c {
						l.Take(clock.Nanotime(), &r, &d)
						k += d.Remaining
					}
					t2 := time.Now()
					d1, d2, n = d1+t1.Sub(t0), d2+t2.Sub(t1), n+int64(c)
				}
				mu.Lock()
				tOnce, tEach, ops = tOnce+d1, tEach+d2, ops+n
				benchSink += k
				mu.Unlock()
			})
			if ops > 0 {
				b.ReportMetric(float64(tOnce)/float64(ops), "once-ns/op")
				b.ReportMetric(float64(tEach)/float64(ops), "per-call-ns/op")
				b.ReportMetric(float64(tOnce)/float64(tEach), "once/per-call")
			}
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
			mreq := memRequest(b, s, req)
			hr := compiled(b, l, req)
			var d core.Decision
			if !l.take(clock.Nanotime(), &req, &hr, &d) {
				b.Fatal("not handled")
			}
			if _, err := s.Take(ctx, mreq); err != nil {
				b.Fatal(err)
			}
			const block = 256
			var mu sync.Mutex
			var tDRL, tTake, tInto time.Duration
			var ops int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r, mr := req, mreq
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
						l.take(clock.Nanotime(), &r, &hr, &d)
						k += int64(d.Remaining)
					}
					t1 := time.Now()
					for range c {
						d, _ = s.Take(ctx, mr)
						k += int64(d.Remaining)
					}
					t2 := time.Now()
					for range c {
						s.TakeInto(ctx, &mr, &d)
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
			mreq := memRequest(b, s, req)
			if _, err := s.Take(ctx, mreq); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := int64(0)
				for pb.Next() {
					d, _ := s.Take(ctx, mreq)
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
			mreq := memRequest(b, s, req)
			if _, err := s.Take(ctx, mreq); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := mreq
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
