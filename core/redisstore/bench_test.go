package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkTake measures decisions/s at 64 concurrent callers against one
// throwaway redis-server: each Take its own EVALSHA (Direct), batched as
// Options{} makes it (Default), and a PING loop as the one-round-trip
// ceiling. 1000 consumers at 1e9/s never deny.
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
	for _, m := range []struct {
		name     string
		pipeline int
	}{{"Direct", -1}, {"Default", 0}} {
		pipeline := m.pipeline
		b.Run(m.name, func(b *testing.B) {
			c := srv.Client(b, &redis.Options{PoolSize: 64})
			s, err := redisstore.New(c, redisstore.Options{Pipeline: pipeline})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			run(b, func(ctx context.Context, i int64) error {
				_, err := s.Take(ctx, core.Request{Consumer: strconv.FormatInt(i%1000, 10), Rate: l, Cost: 1})
				return err
			})
		})
	}
	b.Run("PING", func(b *testing.B) {
		c := srv.Client(b, &redis.Options{PoolSize: 64})
		run(b, func(ctx context.Context, _ int64) error { return c.Ping(ctx).Err() })
	})
}
