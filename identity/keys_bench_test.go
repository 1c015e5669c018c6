package identity_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
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

// benchReq is a Request presenting one API key in the X-API-Key header.
type benchReq struct{ key []string }

func (r *benchReq) Header(name string) string {
	if name == "X-Api-Key" {
		return r.key[0]
	}
	return ""
}

func (r *benchReq) HeaderValues(name string) []string {
	if name == "X-Api-Key" {
		return r.key
	}
	return nil
}

func (r *benchReq) Query(string) string  { return "" }
func (r *benchReq) Cookie(string) string { return "" }
func (r *benchReq) RemoteAddr() string   { return "127.0.0.1:4000" }

// BenchmarkAPIKeyAuthenticate measures a request's path through the key
// registry in a registry of n keys: APIKey.Authenticate (read the header,
// hash the key, look it up, check it, return its consumer), then, in
// "decide", Engine.Decide of the consumer on the in-process store. Keys
// are taken in turn from 1,024 held keys spread over the registry, each
// used many times, as a steady load of clients would use them.
func BenchmarkAPIKeyAuthenticate(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		recs := benchRecords(n)
		ks, err := identity.NewKeys(recs)
		if err != nil {
			b.Fatal(err)
		}
		a := identity.NewAPIKey(ks, identity.APIKeyOptions{})
		reqs := make([]*benchReq, 1024)
		for i := range reqs {
			reqs[i] = &benchReq{key: []string{strconv.Itoa(i * (n / len(reqs)) % n)}}
		}
		m := memory.New(memory.Options{})
		defer m.Close()
		eng, err := core.NewEngine(m, core.Config{Policies: []core.Policy{{ID: "p",
			Rate: core.Limit{Rate: 1 << 40, Period: time.Hour}}}}, core.Options{})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := a.Authenticate(ctx, reqs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(strconv.Itoa(n)+"/decide", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c, err := a.Authenticate(ctx, reqs[i&1023])
				if err != nil {
					b.Fatal(err)
				}
				if d, err := eng.Decide(ctx, c, "api", 1); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
}

// BenchmarkHashKey is the floor of the key check while keys are known by
// hash only: HashKey (SHA-256) of a presented key of the size given,
// which APIKey.Authenticate does once per request before its lookup.
func BenchmarkHashKey(b *testing.B) {
	for _, n := range []int{6, 32, 64} {
		key := strings.Repeat("k", n)
		b.Run(strconv.Itoa(n)+"B", func(b *testing.B) {
			b.ReportAllocs()
			var sink identity.KeyHash
			for b.Loop() {
				sink = identity.HashKey(key)
			}
			_ = sink
		})
	}
}
