package identity_test

import (
	"strconv"
	"testing"

	"github.com/limitplane/limitplane/identity"
)

// benchRecords returns n records, keys "0" … "n-1", each with policy "p".
func benchRecords(n int) []identity.KeyRecord {
	recs := make([]identity.KeyRecord, n)
	for i := range recs {
		recs[i] = identity.KeyRecord{Hash: identity.HashKey(strconv.Itoa(i)), Policies: []string{"p"}}
	}
	return recs
}

// BenchmarkKeysLookup measures one Lookup of a held key in a registry of
// n keys, hashes taken in turn from 1,024 held keys spread over the
// registry, and a read of the record's Inactive field, as APIKey's
// Authenticate reads it next (so a registry that reads the record during
// the lookup is not charged for a cache miss the request pays anyway).
func BenchmarkKeysLookup(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			recs := benchRecords(n)
			ks, err := identity.NewKeys(recs)
			if err != nil {
				b.Fatal(err)
			}
			hashes := make([]identity.KeyHash, 1024)
			for i := range hashes {
				hashes[i] = recs[i*(n/len(hashes))%n].Hash
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if r := ks.Lookup(hashes[i&1023]); r == nil || r.Inactive {
					b.Fatal("key not found")
				}
			}
		})
	}
}
