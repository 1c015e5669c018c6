package protocol_test

import (
	"context"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// benchSnapshot returns a snapshot of n keys as a control plane holds
// them: two policies, one API, and keys with one or two policies, a
// quota epoch, and on one key in four an expiry.
func benchSnapshot(n int) *spec.Snapshot {
	s := &spec.Snapshot{
		Revision: 42,
		Policies: []spec.Policy{
			{ID: "gold", Rate: &spec.Rate{Requests: 100, Per: spec.Duration(time.Second)}, Quota: &spec.Quota{Max: 1000, Renewal: spec.Duration(24 * time.Hour)}},
			{ID: "free", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute), Burst: 5}},
		},
		APIs: []spec.API{{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho}},
		Keys: make([]spec.Key, n),
	}
	free, both := []string{"free"}, []string{"free", "gold"}
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range n {
		k := spec.Key{KeyHash: identity.HashKey("key-" + strconv.Itoa(i)).String(), Policies: free, QuotaEpoch: uint64(i % 1000)}
		if i%2 == 1 {
			k.Policies = both
		}
		if i%4 == 0 {
			k.Expires = &exp
		}
		s.Keys[i] = k
	}
	return s
}

// BenchmarkSnapshot1M measures what a snapshot of a million keys costs on
// its way to a new gateway, stage by stage: "chunks" is the control
// plane's protocol.Chunks (JSON encoding, cutting, and the digest);
// "assemble" is the gateway's Assembler.Add of every chunk (JSON decoding
// and the digest check); "apply" is gateway.Apply of the decoded snapshot
// to a new gateway (validation and the key registry). The stream between
// them is not included. Run with -benchtime=1x: one op is one whole stage.
// Each stage starts with the memory the ones before left free given back
// to the system (debug.FreeOSMemory), as on a new gateway, so that it pays
// for the memory it touches whatever ran before it.
func BenchmarkSnapshot1M(b *testing.B) {
	const n = 1_000_000
	snap := benchSnapshot(n)
	chunks, err := protocol.Chunks(snap, "nonce", 0)
	if err != nil {
		b.Fatal(err)
	}
	assemble := func(b *testing.B, chunks []*syncpb.SnapshotChunk) *spec.Snapshot {
		a := protocol.NewAssembler(protocol.AssemblerOptions{})
		for _, c := range chunks {
			got, err := a.Add(c)
			if err != nil {
				b.Fatal(err)
			}
			if got != nil {
				return got
			}
		}
		b.Fatal("no snapshot after the last chunk")
		return nil
	}
	decoded := assemble(b, chunks)
	b.Run("chunks", func(b *testing.B) {
		debug.FreeOSMemory()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := protocol.Chunks(snap, "nonce", 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(chunks)), "chunks")
	})
	b.Run("assemble", func(b *testing.B) {
		debug.FreeOSMemory()
		b.ReportAllocs()
		for b.Loop() {
			assemble(b, chunks)
		}
	})
	b.Run("apply", func(b *testing.B) {
		debug.FreeOSMemory()
		m := memory.New(memory.Options{})
		defer m.Close()
		b.ReportAllocs()
		for b.Loop() {
			g, err := gateway.New(gateway.Options{Store: m})
			if err != nil {
				b.Fatal(err)
			}
			if err := g.Apply(context.Background(), decoded); err != nil {
				b.Fatal(err)
			}
			g.Close()
		}
	})
}
