package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// bulkKeys returns n keys using policy "gold", with distinct hashes.
func bulkKeys(n int) []spec.Key {
	keys := make([]spec.Key, n)
	for i := range keys {
		keys[i] = spec.Key{KeyHash: hash(fmt.Sprint("bulk-", i)), Policies: []string{"gold"}}
	}
	return keys
}

// BenchmarkBulkPutKeys measures one Store.Update (Bolt) that writes n
// keys into a store holding one policy: a bulk import, validated and
// logged like any write. Reported as keys/s.
func BenchmarkBulkPutKeys(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			keys := bulkKeys(n)
			ctx := context.Background()
			var fileSize int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				s, path := open(b, controlplane.BoltOptions{})
				if _, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) }); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
					for _, k := range keys {
						if err := tx.PutKey(k); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				s.Close()
				fi, err := os.Stat(path)
				if err != nil {
					b.Fatal(err)
				}
				fileSize = fi.Size()
				b.StartTimer()
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(float64(fileSize)/float64(n), "file-B/key")
		})
	}
}
