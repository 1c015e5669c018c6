package grpc_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// slowHealth answers Check once open is closed, counting the calls inside
// it; a call whose service is "panic" panics (recovered by an
// interceptor outside limitplane's).
type slowHealth struct {
	healthpb.UnimplementedHealthServer
	in, most atomic.Int64
	open     chan struct{}
}

func (h *slowHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.Service == "panic" {
		panic("handler panic")
	}
	n := h.in.Add(1)
	defer h.in.Add(-1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
	<-h.open
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// recoverUnary turns a handler's panic into Internal, outside limitplane's
// interceptor (as grpc-ecosystem's recovery interceptor does).
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if recover() != nil {
			err = status.Error(codes.Internal, "panic")
		}
	}()
	return handler(ctx, req)
}

// TestInFlightUnary: cap 5, 50 concurrent slow calls of one key: exactly 5
// in the handler, 45 refused with ResourceExhausted "too many concurrent
// requests" and no RetryInfo; every slot back after the calls and after
// handler panics; a stream holds its slot until it ends.
func TestInFlightUnary(t *testing.T) {
	store := memory.New(memory.Options{})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "conc", InFlight: 5, Rate: core.PerMinute(1000)}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k"), Policies: []string{"conc"}}})
	if err != nil {
		t.Fatal(err)
	}
	auth := identity.NewAPIKey(keys, identity.APIKeyOptions{})
	consumer := identity.HashKey("k").ConsumerID()
	h := &slowHealth{open: make(chan struct{})}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recoverUnary, lpgrpc.UnaryServerInterceptor(eng, auth, lpgrpc.Options{})),
		grpc.ChainStreamInterceptor(lpgrpc.StreamServerInterceptor(eng, auth, lpgrpc.Options{})),
	)
	healthpb.RegisterHealthServer(srv, h)
	m := &meter{}
	srv.RegisterService(&meterDesc, m)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	var once sync.Once
	release := func() { once.Do(func() { close(h.open) }) }
	t.Cleanup(release)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	ctx := withKey("k")

	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			switch st := status.Convert(err); {
			case err == nil:
				ok.Add(1)
			case st.Code() == codes.ResourceExhausted && st.Message() == "too many concurrent requests":
				refused.Add(1)
				ri, qf := details(t, err)
				if ri != nil || qf == nil || qf.Violations[0].QuotaMetric != "in_flight" || qf.Violations[0].QuotaValue != 5 || qf.Violations[0].QuotaId != "conc" {
					t.Errorf("details: %v %v", ri, qf)
				}
			default:
				t.Errorf("call: %v", err)
			}
		}()
	}
	deadline := time.Now().Add(15 * time.Second)
	for refused.Load() < 45 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if refused.Load() != 45 || h.in.Load() != 5 || store.InFlight(consumer, "") != 5 {
		t.Fatalf("while held: refused %d, in the handler %d, slots %d; want 45, 5, 5", refused.Load(), h.in.Load(), store.InFlight(consumer, ""))
	}
	release()
	wg.Wait()
	if ok.Load() != 5 || h.most.Load() != 5 || store.InFlight(consumer, "") != 0 {
		t.Fatalf("admitted %d, most at once %d, slots after %d; want 5, 5, 0", ok.Load(), h.most.Load(), store.InFlight(consumer, ""))
	}
	for i := 0; i < 7; i++ {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "panic"}); status.Code(err) != codes.Internal {
			t.Fatalf("panic %d: %v", i, err)
		}
	}
	if n := store.InFlight(consumer, ""); n != 0 {
		t.Fatalf("slots after handler panics: %d", n)
	}

	// Streams: 5 open streams hold the 5 slots; the 6th is refused
	// when it opens; closing one frees one.
	var streams []grpc.ClientStream
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := 0; i < 5; i++ {
		cs, err := conn.NewStream(sctx, &meterDesc.Streams[0], uploadMethod)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, cs)
	}
	for deadline := time.Now().Add(5 * time.Second); store.InFlight(consumer, "") != 5 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := store.InFlight(consumer, ""); n != 5 {
		t.Fatalf("slots with 5 streams open: %d", n)
	}
	cs, err := conn.NewStream(sctx, &meterDesc.Streams[0], uploadMethod)
	if err == nil {
		err = cs.RecvMsg(new(struct{}))
	}
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "too many concurrent requests") {
		t.Fatalf("6th stream: %v", err)
	}
	cancel() // the client goes away: the streams end
	for deadline := time.Now().Add(5 * time.Second); store.InFlight(consumer, "") != 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := store.InFlight(consumer, ""); n != 0 {
		t.Fatalf("slots after the streams were cancelled: %d", n)
	}
	_ = streams
}
