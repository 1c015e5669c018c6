package grpc_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// usageHealth answers Check with the trailer x-usage-tokens set to the
// request's service name (none when empty).
type usageHealth struct {
	healthpb.UnimplementedHealthServer
}

func (usageHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.Service != "" {
		grpc.SetTrailer(ctx, metadata.Pairs("x-usage-tokens", req.Service))
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestSettleTrailer: estimate 100 (Options.Cost), the handler's trailer
// x-usage-tokens 1,000 / 10 / absent, 16 concurrent calls, 10,000 per
// minute: the quota's count is exactly the sum of the actual costs.
func TestSettleTrailer(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(start)})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "tokens", Quota: core.Quota{Max: 10_000, Renewal: time.Minute}, Settle: true}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k"), Policies: []string{"tokens"}}})
	if err != nil {
		t.Fatal(err)
	}
	opts := lpgrpc.Options{Cost: func(context.Context, string) int64 { return 100 }, SettleTrailer: "x-usage-tokens"}
	auth := identity.NewAPIKey(keys, identity.APIKeyOptions{})
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(eng, auth, opts)))
	healthpb.RegisterHealthServer(srv, usageHealth{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	usages := []string{"1000", "10", ""}
	var sum atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := usages[g%3]
			if _, err := hc.Check(withKey("k"), &healthpb.HealthCheckRequest{Service: u}); err != nil {
				t.Error(err)
				return
			}
			if n, err := strconv.ParseInt(u, 10, 64); err == nil {
				sum.Add(n)
			} else {
				sum.Add(100)
			}
		}()
	}
	wg.Wait()
	d, err := eng.Decide(context.Background(), &core.Consumer{ID: identity.HashKey("k").ConsumerID(), Policies: []string{"tokens"}}, checkMethod, 0)
	if err != nil || d.Quota.Remaining != 10_000-sum.Load() || sum.Load() != 6*1000+5*10+5*100 {
		t.Fatalf("remaining %d, sum %d: %+v %v", d.Quota.Remaining, sum.Load(), d, err)
	}
}
