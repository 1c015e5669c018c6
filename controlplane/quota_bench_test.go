package controlplane_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/spec"
)

// BenchmarkQuotaLease: one Lease call over gRPC with one grant request
// of 1 unit for one of 100 consumers of a global policy, durable before
// the answer; serially and from 3 data planes × GOMAXPROCS goroutines at
// once. An entry's state is rewritten whole by each call, so run it with
// a fixed -benchtime (e.g. 3000x: 30 leases per entry) to compare.
func BenchmarkQuotaLease(b *testing.B) {
	for _, sc := range storeCases {
		b.Run(sc.name, func(b *testing.B) {
			s, _ := sc.open(b, 0)
			if _, err := s.Update(b.Context(), func(tx controlplane.Tx) error {
				return tx.PutPolicy(spec.Policy{ID: "g", Quota: &spec.Quota{Max: 1 << 40, Renewal: spec.Duration(time.Hour),
					Global: &spec.GlobalQuota{Mode: "strict"}}})
			}); err != nil {
				b.Fatal(err)
			}
			q := serveQuota(b, s, func() time.Time { return quotaStart }, nil)
			var seqs [3]atomic.Uint64
			var n atomic.Uint64
			call := func(b *testing.B) {
				i := n.Add(1)
				g := int(i % 3)
				group := quotaGroups[g]
				id := lease.RequestID{DataPlane: group, Token: 1, Seq: seqs[g].Add(1)}
				key := lease.EntryKey{Consumer: fmt.Sprintf("jwt:user-%d", i%100), Policy: "g"}
				if _, err := leaseCall(b.Context(), q.client, group, lease.Batch{Grants: []lease.GrantRequest{{Entry: key, ID: id, Want: 1}}}); err != nil {
					b.Error(err)
				}
			}
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					call(b)
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						call(b)
					}
				})
			})
		})
	}
}
