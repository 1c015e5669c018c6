package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// consumers are the benchmarks' 1000 consumer IDs, made once so that
// formatting them is not measured.
var consumers = func() (c [1000]string) {
	for i := range c {
		c[i] = strconv.Itoa(i)
	}
	return c
}()

// BenchmarkTake measures decisions/s at 64 concurrent callers against one
// throwaway redis-server: each Take its own EVALSHA (Direct), batched as
// Options{} makes it (Default), and a PING loop as the one-round-trip
// ceiling. 1000 consumers at 1e9/s never deny. The Seeded variants give
// every decision to an in-process store too (Options.Seed, the gateway's
// fallback under failure_policy fallback); the Quota ones add a quota.
func BenchmarkTake(b *testing.B) {
	srv := redistest.Start(b)
	run := func(b *testing.B, do func(ctx context.Context, i int64) error) {
		var n atomic.Int64
		b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if err := do(ctx, n.Add(1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	}
	l := core.Limit{Rate: 1_000_000_000, Period: time.Second}
	q := core.Quota{Max: 1 << 50, Renewal: time.Hour}
	for _, m := range []struct {
		name     string
		pipeline int
		quota    bool
		seed     bool
	}{
		{"Direct", -1, false, false}, {"Default", 0, false, false},
		{"DirectSeeded", -1, false, true}, {"DefaultSeeded", 0, false, true},
		{"DefaultQuota", 0, true, false}, {"DefaultQuotaSeeded", 0, true, true},
	} {
		b.Run(m.name, func(b *testing.B) {
			c := srv.Client(b, &redis.Options{PoolSize: 64})
			o := redisstore.Options{Pipeline: m.pipeline}
			if m.seed {
				// The fallback of failure_policy fallback, as the gateway
				// wires it.
				fb := memory.New(memory.Options{})
				o.Seed = fb
			}
			s, err := redisstore.New(c, o)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ls := core.LimitSet{Rate: l}
			if m.quota {
				ls.Quota = q
			}
			rule, err := s.Prepare(ls) // once, as the Engine does per policy
			if err != nil {
				b.Fatal(err)
			}
			req := core.Request{Rule: rule, Cost: 1}
			run(b, func(ctx context.Context, i int64) error {
				r := req
				r.Consumer = consumers[i%1000]
				_, err := s.Take(ctx, r)
				return err
			})
		})
	}
	b.Run("PING", func(b *testing.B) {
		c := srv.Client(b, &redis.Options{PoolSize: 64})
		run(b, func(ctx context.Context, _ int64) error { return c.Ping(ctx).Err() })
	})
}

// BenchmarkInFlightTake is one caller taking an in-flight slot (cap 1000,
// with a rate limit that never denies) and giving it back: two round
// trips for the take, one for the release.
func BenchmarkInFlightTake(b *testing.B) {
	srv := redistest.Start(b)
	s, err := redisstore.New(srv.Client(b, &redis.Options{}), redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "p", InFlight: 1000, Rate: core.PerMinute(1 << 30)}}}, core.Options{FailurePolicy: core.FailClosed})
	if err != nil {
		b.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"p"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		d, err := e.Decide(ctx, c, "api", 1)
		if err != nil || !d.Allowed {
			b.Fatalf("allowed %v, err %v", d.Allowed, err)
		}
		d.Hold.Release()
	}
}
