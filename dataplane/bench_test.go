package dataplane

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// benchSnapshot is a snapshot of n keys on one policy, one API.
func benchSnapshot(rev uint64, n int) *spec.Snapshot {
	s := &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{{ID: "free", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute)}, Quota: &spec.Quota{Max: 1000, Renewal: spec.Duration(24 * time.Hour)}}},
		APIs:     []spec.API{{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho}},
		Keys:     make([]spec.Key, n),
	}
	for i := range n {
		s.Keys[i] = spec.Key{KeyHash: identity.HashKey(fmt.Sprintf("key-%d", i)).String(), Policies: []string{"free"}}
	}
	return s
}

// benchAgent returns an agent over a new gateway (an in-process store),
// not running: the benchmarks call its apply methods directly.
func benchAgent(b *testing.B) (*Agent, *gateway.Gateway) {
	b.Helper()
	store := memory.New(memory.Options{})
	b.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { gw.Close() })
	a, err := New(AgentOptions{Target: gw, Address: "127.0.0.1:1", Group: "g", Token: "t", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return a, gw
}

// BenchmarkKeyChange is one key changed by a Changes message on a gateway
// holding 1,000,000 keys, as the agent applies it: decoding, the
// incremental digest check (the key's old version read from the
// registry), gateway.UpdateKeys. The Ack's send is not included. "same"
// changes one key again and again (as gateway's BenchmarkUpdateKeys
// does); "spread" a different key each time, in a different shard of
// the registry (cold caches, as real changes are).
func BenchmarkKeyChange(b *testing.B) {
	const n = 1_000_000
	a, _ := benchAgent(b)
	snap := benchSnapshot(1, n)
	ctx := context.Background()
	if err := a.applySnapshot(ctx, snap, "", ""); err != nil {
		b.Fatal(err)
	}
	dg := protocol.DigesterOf(snap)
	state := make(map[int]spec.Key)
	rev := uint64(1)
	for _, c := range []struct {
		name   string
		stride int
	}{{"same", 0}, {"spread", 7919}} {
		b.Run(c.name, func(b *testing.B) {
			// The messages, with the digests they lead to, made
			// beforehand.
			msgs := make([]*syncpb.Changes, b.N)
			for i := range b.N {
				idx := (n/2 + i*c.stride) % n
				old, ok := state[idx]
				if !ok {
					old = snap.Keys[idx]
				}
				k := old
				k.Inactive = !old.Inactive
				state[idx] = k
				dg.RemoveKey(&old)
				dg.AddKey(&k)
				ch, err := protocol.PutKey(&k)
				if err != nil {
					b.Fatal(err)
				}
				msgs[i] = &syncpb.Changes{FromRevision: rev, Revision: rev + 1, Nonce: "n", Changes: []*syncpb.Change{ch}, Digest: dg.Digest()}
				rev++
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := a.applyChanges(ctx, msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSnapshot1M is a 1,000,000-key snapshot from its chunks to
// applied on a new gateway: assembling, decoding, the digest check,
// gateway.Apply. It reports the heap the applied configuration holds per
// key (B/key: live heap after a GC, the chunks excluded).
func BenchmarkSnapshot1M(b *testing.B) {
	const n = 1_000_000
	snap := benchSnapshot(1, n)
	chunks, err := protocol.Chunks(snap, "n", 0)
	if err != nil {
		b.Fatal(err)
	}
	snap = nil
	ctx := context.Background()
	var perKey float64
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		a, gw := benchAgent(b)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		asm := protocol.NewAssembler(protocol.AssemblerOptions{})
		var got *spec.Snapshot
		var want string
		for _, c := range chunks {
			in := c
			if c.Last {
				want = c.Digest
				in = &syncpb.SnapshotChunk{Revision: c.Revision, Nonce: c.Nonce, Seq: c.Seq, Last: true, Data: c.Data}
			}
			if got, err = asm.Add(in); err != nil {
				b.Fatal(err)
			}
		}
		if err := a.applySnapshot(ctx, got, want, ""); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		got, asm = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		perKey = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
		if gw.Revision() != 1 || a.Status().AppliedRevision != 1 {
			b.Fatal("not applied")
		}
		runtime.KeepAlive(gw)
		runtime.KeepAlive(a)
		gw.Close()
		b.StartTimer()
	}
	b.ReportMetric(perKey, "B/key")
}
