package controlplane_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// BenchmarkSyncPropagation measures how long one key change takes to
// reach a gateway: from the start of the write (Store.Update on a Bolt
// file, durable when it returns) to the arrival of the Changes carrying
// it at a raw client connected over loopback gRPC; also from the write's
// return. One write at a time; reported as p50 and p99 in milliseconds
// (run with -benchtime=1000x for 1,000 changes). "identity" is a data
// plane whose tags select every API, "filtered" one whose tags leave an
// API out (each key change is mapped by Select's rule).
func BenchmarkSyncPropagation(b *testing.B) {
	for _, c := range []struct {
		name string
		tags []string
	}{{"identity", []string{"eu", "us"}}, {"filtered", []string{"eu"}}} {
		b.Run(c.name, func(b *testing.B) { benchPropagation(b, c.tags) })
	}
}

func benchPropagation(b *testing.B, tags []string) {
	ctx := context.Background()
	s, _ := open(b, controlplane.BoltOptions{})
	if _, err := s.Update(ctx, func(tx controlplane.Tx) error {
		for _, a := range []spec.API{
			{ID: "eu", ListenPath: "/eu/", Target: spec.BuiltinEcho, Tags: []string{"eu"}},
			{ID: "us", ListenPath: "/us/", Target: spec.BuiltinEcho, Tags: []string{"us"}},
		} {
			if err := tx.PutAPI(a); err != nil {
				return err
			}
		}
		return tx.PutPolicy(policy("global", 100))
	}); err != nil {
		b.Fatal(err)
	}
	srv, err := controlplane.NewSyncServer(controlplane.SyncOptions{
		Store:  s,
		Tokens: []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(syncToken), Group: "g", Tags: tags}},
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	syncpb.RegisterSyncServiceServer(gs, srv)
	go gs.Serve(lis)
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	sctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(sctx)
	if err != nil {
		b.Fatal(err)
	}
	hello := &syncpb.Hello{Group: "g", Tags: tags, Token: syncToken, GatewayId: "bench"}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil {
		b.Fatal(err)
	}
	a := protocol.NewAssembler(protocol.AssemblerOptions{})
	for snap := (*spec.Snapshot)(nil); snap == nil; {
		m, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if snap, err = a.Add(m.GetSnapshotChunk()); err != nil {
			b.Fatal(err)
		}
	}
	total := make([]time.Duration, 0, b.N)
	afterCommit := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		k := spec.Key{KeyHash: hash(fmt.Sprint("bench-", i)), Policies: []string{"global"}}
		start := time.Now()
		rev, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutKey(k) })
		if err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		for {
			m, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			ch := m.GetChanges()
			if ch == nil {
				b.Fatalf("got %v, want Changes", m)
			}
			if ch.Revision >= rev {
				break
			}
		}
		now := time.Now()
		total = append(total, now.Sub(start))
		afterCommit = append(afterCommit, now.Sub(committed))
	}
	b.StopTimer()
	pct := func(d []time.Duration, p float64) float64 {
		s := slices.Sorted(slices.Values(d))
		return float64(s[min(len(s)-1, int(p*float64(len(s))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(total, 0.50), "p50-ms")
	b.ReportMetric(pct(total, 0.99), "p99-ms")
	b.ReportMetric(pct(afterCommit, 0.50), "p50-after-commit-ms")
	b.ReportMetric(pct(afterCommit, 0.99), "p99-after-commit-ms")
}
