package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/pgtest"
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

// BenchmarkSnapshotToNewGateway measures a snapshot of n keys on its way
// from a store (Bolt, or PostgreSQL with fsync on, vacuumed and
// checkpointed after the load) to a new gateway, in steps, each reported
// in seconds:
// load-s, the keys written by Updates of 100,000 (not part of the rest); read-s,
// Store.Snapshot; chunks-s, protocol.ChunksDigester (the JSON, the chunks
// and the digest state the sync server keeps); assemble-s, a gateway's
// protocol.Assembler over every chunk (decoding and checking the digest);
// apply-s, gateway.Apply of the result on a new gateway. total-s is
// read-s to apply-s. Also: snapshot-B/key, the JSON's size; gw-heap-B/key,
// the live heap the applied snapshot costs the gateway (Go heap after a
// GC, the snapshot included; indicative: other helpers change it).
// digest-s is protocol.Digest of the snapshot alone, what the sync server
// spent again before ChunksDigester.
func BenchmarkSnapshotToNewGateway(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("bolt/%d", n), func(b *testing.B) {
			s, _ := open(b, controlplane.BoltOptions{})
			benchSnapshotToGateway(b, s, nil, n)
		})
		b.Run(fmt.Sprintf("postgres/%d", n), func(b *testing.B) {
			srv := pgtest.Start(b, pgtest.Options{Durable: true})
			s := openPostgres(b, srv.ConnString(), controlplane.PostgresOptions{})
			// What autovacuum and the checkpointer would do after the
			// load, done before the timing instead of during it.
			settle := func() {
				pgExec(b, srv.ConnString(), "VACUUM ANALYZE")
				pgExec(b, srv.ConnString(), "CHECKPOINT")
			}
			benchSnapshotToGateway(b, s, settle, n)
		})
	}
}

// benchSnapshotToGateway loads n keys into s, calls settle (when not nil),
// and measures the snapshot's way to a new gateway.
func benchSnapshotToGateway(b *testing.B, s controlplane.Store, settle func(), n int) {
	ctx := context.Background()
	if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
		if err := tx.PutAPI(spec.API{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho}); err != nil {
			return err
		}
		return tx.PutPolicy(policy("gold", 10))
	}); err != nil {
		b.Fatal(err)
	}
	keys := bulkKeys(n)
	start := time.Now()
	for lo := 0; lo < n; lo += 100_000 {
		if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
			for _, k := range keys[lo:min(lo+100_000, n)] {
				if err := tx.PutKey(k); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	load := time.Since(start)
	keys = nil
	if settle != nil {
		settle()
	}
	var read, chunking, digest, assemble, apply time.Duration
	var jsonBytes, gwHeap float64
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		snap, err := s.Snapshot(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		chunks, d, err := protocol.ChunksDigester(snap, "bench", 0)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if got := protocol.Digest(snap); got != d.Digest() {
			b.Fatalf("digest %s, ChunksDigester %s", got, d.Digest())
		}
		t3 := time.Now()
		snap = nil
		b.StopTimer()
		base := liveHeap()
		b.StartTimer()
		t4 := time.Now()
		a := protocol.NewAssembler(protocol.AssemblerOptions{})
		var got *spec.Snapshot
		for _, c := range chunks {
			if got, err = a.Add(c); err != nil {
				b.Fatal(err)
			}
		}
		t5 := time.Now()
		store := memory.New(memory.Options{})
		gw, err := gateway.New(gateway.Options{Store: store})
		if err != nil {
			b.Fatal(err)
		}
		if err := gw.Apply(ctx, got); err != nil {
			b.Fatal(err)
		}
		t6 := time.Now()
		b.StopTimer()
		a, got = nil, nil
		gwHeap += float64(liveHeap()-base) / float64(n)
		for _, c := range chunks {
			jsonBytes += float64(len(c.Data)) / float64(n)
		}
		gw.Close()
		store.Close()
		b.StartTimer()
		read += t1.Sub(t0)
		chunking += t2.Sub(t1)
		digest += t3.Sub(t2)
		assemble += t5.Sub(t4)
		apply += t6.Sub(t5)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) }
	b.ReportMetric(load.Seconds(), "load-s")
	b.ReportMetric(per(read), "read-s")
	b.ReportMetric(per(chunking), "chunks-s")
	b.ReportMetric(per(digest), "digest-s")
	b.ReportMetric(per(assemble), "assemble-s")
	b.ReportMetric(per(apply), "apply-s")
	b.ReportMetric(per(read+chunking+assemble+apply), "total-s")
	b.ReportMetric(jsonBytes/float64(b.N), "snapshot-B/key")
	b.ReportMetric(gwHeap/float64(b.N), "gw-heap-B/key")
}

// liveHeap is the Go heap in use after two full collections (the first
// moves sync.Pool contents to the victim cache, the second frees them),
// in bytes.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
