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
