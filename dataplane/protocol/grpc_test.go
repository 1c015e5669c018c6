package protocol

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// snapshotServer is a test-only SyncService: after a Hello it sends its
// snapshot in chunks and passes every later client message to got.
type snapshotServer struct {
	syncpb.UnimplementedSyncServiceServer
	snap  *spec.Snapshot
	hello chan *syncpb.Hello
	got   chan *syncpb.ClientMessage
}

func (s *snapshotServer) Sync(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetHello() == nil {
		return status.Error(codes.InvalidArgument, "first message must be Hello")
	}
	s.hello <- first.GetHello()
	chunks, err := Chunks(s.snap, "nonce-1", 0)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	for _, c := range chunks {
		if err := stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: c}}); err != nil {
			return err
		}
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		s.got <- m
	}
}

// A 50,000-key snapshot (over gRPC's default 4 MiB message limit as one
// piece) crosses a real gRPC stream in chunks and assembles to the same
// snapshot; the client's Ack reaches the server.
func TestSyncStreamSnapshotRoundTrip(t *testing.T) {
	snap := snapshotWithKeys(77, 50_000)
	want := jsonOf(t, snap)
	if len(want) <= 4<<20 {
		t.Fatalf("snapshot JSON is %d bytes, want over 4 MiB", len(want))
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	impl := &snapshotServer{snap: snap, hello: make(chan *syncpb.Hello, 1), got: make(chan *syncpb.ClientMessage, 1)}
	syncpb.RegisterSyncServiceServer(srv, impl)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello := &syncpb.Hello{Group: "eu-1", Tags: []string{"eu"}, Token: "t0ken", GatewayId: "gw-a", Version: "test", Digest: Digest(nil)}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	if h := <-impl.hello; h.GetGroup() != "eu-1" || h.GetGatewayId() != "gw-a" || len(h.GetTags()) != 1 || h.GetTags()[0] != "eu" {
		t.Fatalf("server got Hello %v", h)
	}

	a := NewAssembler(AssemblerOptions{})
	var got *spec.Snapshot
	chunks := 0
	for got == nil {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d chunks: %v", chunks, err)
		}
		c := m.GetSnapshotChunk()
		if c == nil {
			t.Fatalf("got %v, want a snapshot chunk", m)
		}
		chunks++
		if got, err = a.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	if wantChunks := (len(want) + DefaultChunkBytes - 1) / DefaultChunkBytes; chunks != wantChunks {
		t.Fatalf("%d chunks, want %d", chunks, wantChunks)
	}
	if jsonOf(t, got) != want {
		t.Fatal("assembled snapshot differs from the one sent")
	}

	ack := &syncpb.Ack{Revision: got.Revision, Nonce: "nonce-1"}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: ack}}); err != nil {
		t.Fatal(err)
	}
	if m := <-impl.got; m.GetAck().GetRevision() != 77 || m.GetAck().GetNonce() != "nonce-1" {
		t.Fatalf("server got %v, want Ack 77 nonce-1", m)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, want EOF", err)
	}
}
