package controlplane_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// benchStores are the stores the store benchmarks compare: Bolt and
// Postgres on a server with fsync on (durable commits).
func benchStores(b *testing.B) map[string]func(b *testing.B) controlplane.Store {
	return map[string]func(b *testing.B) controlplane.Store{
		"bolt": func(b *testing.B) controlplane.Store { s, _ := open(b, controlplane.BoltOptions{}); return s },
		"postgres": func(b *testing.B) controlplane.Store {
			srv := pgtest.Start(b, pgtest.Options{Durable: true})
			return openPostgres(b, srv.ConnString(), controlplane.PostgresOptions{})
		},
	}
}

// BenchmarkAdminWrites16 measures admin-style writes (read the key, then
// put it: one new key per write) from 16 concurrent writers, each write
// durable when it returns. Reported as writes/s.
func BenchmarkAdminWrites16(b *testing.B) {
	for _, name := range []string{"bolt", "postgres"} {
		b.Run(name, func(b *testing.B) {
			s := benchStores(b)[name](b)
			ctx := context.Background()
			if _, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) }); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := 0; w < 16; w++ {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						k := spec.Key{KeyHash: hash(fmt.Sprint("admin-", i)), Policies: []string{"gold"}}
						_, err := s.Update(ctx, func(tx controlplane.Tx) error {
							if old, err := tx.Key(k.KeyHash); err != nil || old != nil {
								return fmt.Errorf("key %s there already (%v)", k.KeyHash, err)
							}
							return tx.PutKey(k)
						})
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
		})
	}
}

// BenchmarkStoreSnapshot1M measures Store.Snapshot of 1,000,000 keys (and
// one policy and API), after loading them in ten writes of 100,000
// (load-s, not in the timing). Reported in seconds per snapshot.
func BenchmarkStoreSnapshot1M(b *testing.B) {
	const n, per = 1_000_000, 100_000
	for _, name := range []string{"bolt", "postgres"} {
		b.Run(name, func(b *testing.B) {
			s := benchStores(b)[name](b)
			ctx := context.Background()
			if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
				if err := tx.PutAPI(spec.API{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho}); err != nil {
					return err
				}
				return tx.PutPolicy(policy("gold", 10))
			}); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for lo := 0; lo < n; lo += per {
				if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
					for i := lo; i < lo+per; i++ {
						if err := tx.PutKey(spec.Key{KeyHash: hash(fmt.Sprint("bulk-", i)), Policies: []string{"gold"}}); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			load := time.Since(start)
			b.ResetTimer()
			for range b.N {
				snap, err := s.Snapshot(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if len(snap.Keys) != n {
					b.Fatalf("%d keys, want %d", len(snap.Keys), n)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/snapshot")
			b.ReportMetric(load.Seconds(), "load-s")
		})
	}
}
