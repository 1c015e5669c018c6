package drl

// BenchmarkStoreHotKey compares a drl.Store decision on a hot key (the
// Limiter behind the core.Store interface, as the Engine calls it) with the
// in-process store's Take on a hot key, in the same run:
//
//	go test -run '^$' -bench StoreHotKey -benchmem -cpu 1,2 -count 6 ./core/drl/
//
// All read one *core.CoarseClock. The target: a DRL decision costs
// at most 1.5× the memory store's.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

func BenchmarkStoreHotKey(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	const consumer = "9f86d081884c7d659a2feaa0c55ad015"
	ls := core.LimitSet{Scope: "api", Rate: core.Limit{Rate: 1_000_000_000, Period: time.Second}, Distributed: true}
	clock := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(clock.Stop)
	// run times take on req, whose rule the store under test prepared
	// once, here, outside the loop.
	run := func(b *testing.B, req core.Request, take func(*core.Request, *core.Decision)) {
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := req
			var d core.Decision
			n := int64(0)
			for pb.Next() {
				take(&r, &d)
				if d.Allowed {
					n++
				}
			}
			benchSinkMu.Lock()
			benchSink += n
			benchSinkMu.Unlock()
		})
	}
	b.Run("memory-take", func(b *testing.B) {
		m := memory.New(memory.Options{Clock: clock})
		b.Cleanup(func() { m.Close() })
		var s core.Store = m
		run(b, prepared(b, s, consumer, ls), func(r *core.Request, d *core.Decision) { *d, _ = s.Take(ctx, *r) })
	})
	b.Run("drl-store-take", func(b *testing.B) {
		var s core.Store = benchStore(b, srv, clock, consumer, ls)
		run(b, prepared(b, s, consumer, ls), func(r *core.Request, d *core.Decision) { *d, _ = s.Take(ctx, *r) })
	})
	b.Run("drl-store-into", func(b *testing.B) {
		s := benchStore(b, srv, clock, consumer, ls)
		run(b, prepared(b, s, consumer, ls), func(r *core.Request, d *core.Decision) { s.TakeInto(ctx, r, d) })
	})
}

// prepared is a request of cost 1 from consumer under ls prepared on s.
func prepared(b *testing.B, s core.Store, consumer string, ls core.LimitSet) core.Request {
	r, err := s.Prepare(ls)
	if err != nil {
		b.Fatal(err)
	}
	return core.Request{Consumer: consumer, Rule: r, Cost: 1}
}

// benchStore is a manual Store (no loop) whose table gives this gateway
// the whole limit of (consumer, ls).
func benchStore(b *testing.B, srv *redistest.Server, clock core.Clock, consumer string, ls core.LimitSet) *Store {
	c := srv.Client(b, &redis.Options{})
	exact, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s, err := newStore(c, exact, Options{Group: "bench", GatewayID: "g", Interval: time.Hour, Logger: quiet}, seams{manual: true, clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	req := prepared(b, s, consumer, ls)
	kl := LimitOf(ls.Rate)
	s.lim.Apply(clock.Nanotime(), tableFor(req, 1, "g", Share(kl)))
	var d core.Decision
	if !s.lim.Take(clock.Nanotime(), &req, &d) || !d.Allowed {
		b.Fatal("not decided in memory")
	}
	return s
}
