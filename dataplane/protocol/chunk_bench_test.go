package protocol

import (
	"encoding/json"
	"fmt"
	"testing"
)

// BenchmarkSnapshotEncoding compares, for snapshots of n keys, what a
// sync server spends to send a snapshot and keep its digest state:
// "separate" is the way before ChunksDigester (json.Marshal of the
// snapshot, then twice a Digester filled object by object on one
// goroutine: Digest for the last chunk, and the server's view); "ChunksDigester" is the one
// pass. Reported per snapshot; keys/s is n over that time.
func BenchmarkSnapshotEncoding(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		snap := snapshotWithKeys(1, n)
		b.Run(fmt.Sprintf("%d/separate", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := json.Marshal(snap); err != nil {
					b.Fatal(err)
				}
				for range 2 {
					var d Digester
					for i := range snap.Policies {
						d.AddPolicy(&snap.Policies[i])
					}
					for i := range snap.Keys {
						d.AddKey(&snap.Keys[i])
					}
					for i := range snap.APIs {
						d.AddAPI(&snap.APIs[i])
					}
					_ = d.Digest()
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
		})
		b.Run(fmt.Sprintf("%d/ChunksDigester", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, _, err := ChunksDigester(snap, "n", 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}
