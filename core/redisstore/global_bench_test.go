package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// BenchmarkGlobalQuotaTake compares, on one throwaway redis-server in the
// same run, a decision on a global quota spent from a lease (the slot's
// hash holding a lease that never runs out, as the QuotaRunner writes it)
// with a decision on a plain per-data-plane quota of the same size: issue
// 22's "the request latency of a global-quota key is within noise of a
// per-data-plane quota key". Serial is one caller (ns/op is the latency
// of one decision), Parallel64 64 callers; 1000 consumers, never denied.
// QuotaDirect is the plain quota with one EVALSHA per decision
// (Options.Pipeline −1), as the global quota's script is run today: the
// default mode batches plain decisions into pipelines, which the global
// script does not join yet.
// serverCPU returns the CPU time (s, user + system) redis-server has used,
// from INFO cpu: the benchmarks report it per decision (srv-µs/op), the
// cost inside Redis apart from the client's and the network's.
func serverCPU(b *testing.B, c redis.UniversalClient) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", k, err)
			}
			sum += f
		}
	}
	return sum
}

func BenchmarkGlobalQuotaTake(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	l := core.Limit{Rate: 1_000_000_000, Period: time.Second}
	for _, kind := range []string{"Quota", "QuotaDirect", "GlobalQuota"} {
		c := srv.Client(b, &redis.Options{PoolSize: 64})
		q := core.Quota{Max: 1 << 50, Renewal: time.Hour}
		o := redisstore.Options{}
		if kind == "QuotaDirect" {
			o.Pipeline = -1
		}
		if kind == "GlobalQuota" {
			q.Global = core.GlobalQuota{Mode: core.GlobalStrict, Policy: "bench"}
			o.FollowsControlPlane = true
		}
		s, err := redisstore.New(c, o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		rule, err := s.Prepare(core.LimitSet{Rate: l, Quota: q})
		if err != nil {
			b.Fatal(err)
		}
		if kind == "GlobalQuota" {
			now, err := c.Time(ctx).Result()
			if err != nil {
				b.Fatal(err)
			}
			far := now.Add(24 * time.Hour).UnixMicro()
			for _, id := range consumers {
				key := redisstore.GlobalSlotKey("", id, "", "bench", 0)
				if err := c.HSet(ctx, key, "L", fmt.Sprintf("bench/1/1 %d %d\n", far, int64(1)<<50), "pe", far, "ct", now.UnixMicro()).Err(); err != nil {
					b.Fatal(err)
				}
			}
		}
		take := func(i int) error {
			d, err := s.Take(ctx, core.Request{Consumer: consumers[i%len(consumers)], Rule: rule, Cost: 1})
			if err == nil && !d.Allowed {
				err = fmt.Errorf("%s: consumer %d denied", kind, i%len(consumers))
			}
			return err
		}
		b.Run(kind+"/Serial", func(b *testing.B) {
			cpu := serverCPU(b, c)
			for i := 0; b.Loop(); i++ {
				if err := take(i); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((serverCPU(b, c)-cpu)*1e6/float64(b.N), "srv-µs/op")
		})
		b.Run(kind+"/Parallel64", func(b *testing.B) {
			b.SetParallelism(32)
			cpu := serverCPU(b, c)
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if err := take(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric((serverCPU(b, c)-cpu)*1e6/float64(b.N), "srv-µs/op")
		})
	}
}
