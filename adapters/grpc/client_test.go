package grpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// limitedServer is a real gRPC server (health service) that enforces rate
// on every caller by peer address, with limitplane's own interceptor.
func limitedServer(t *testing.T, rate core.Limit) string {
	t.Helper()
	eng, err := core.NewEngine(memory.New(memory.Options{}), core.Config{Policies: []core.Policy{{ID: "server", Rate: rate}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(eng, &identity.Keyless{Policies: []string{"server"}}, lpgrpc.Options{})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func dialThrough(t *testing.T, addr string, c *lpgrpc.Client) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(c.UnaryClientInterceptor()), grpc.WithStreamInterceptor(c.StreamClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestClientKeepsServerUnderItsLimit(t *testing.T) {
	// The server allows 20/s with a burst of 5 (slack for scheduling jitter);
	// the client is held at 20/s burst 1: 60 calls from 30 goroutines.
	addr := limitedServer(t, core.Limit{Rate: 20, Period: time.Second, Burst: 5})
	c, err := lpgrpc.NewClient(lpgrpc.ClientOptions{Store: memory.New(memory.Options{}), Key: "health", Limit: core.Limit{Rate: 20, Period: time.Second, Burst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	hc := dialThrough(t, addr, c)
	var ok, exhausted, next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < 30; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= 60 {
				_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					exhausted.Add(1)
				default:
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 60 || exhausted.Load() != 0 {
		t.Fatalf("server answered %d OK and %d ResourceExhausted; want 60 and 0", ok.Load(), exhausted.Load())
	}
	if el := time.Since(start); el < 59*50*time.Millisecond {
		t.Fatalf("60 calls at 20/s took %v, faster than the limit allows", el)
	}
}

func TestClientBacksOffOnRetryInfo(t *testing.T) {
	// The server allows 1 a minute: the second call comes back
	// ResourceExhausted with RetryInfo ≈ 1 min, capped here at 1s.
	addr := limitedServer(t, core.Limit{Rate: 1, Period: time.Minute})
	store := memory.New(memory.Options{})
	opts := lpgrpc.ClientOptions{Store: store, Key: "health", Limit: core.PerSecond(100), MaxBackoff: time.Second}
	a, _ := lpgrpc.NewClient(opts)
	b, _ := lpgrpc.NewClient(opts) // another client sharing the store
	ha, hb := dialThrough(t, addr, a), dialThrough(t, addr, b)
	ctx := context.Background()
	if _, err := ha.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ha.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	// A short deadline fails fast with DeadlineExceeded, without calling.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := ha.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("short deadline: %v, want DeadlineExceeded", err)
	}
	// The other client sharing the store is held back too (Penalize).
	t0 := time.Now()
	_, err := hb.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third call: %v (the server still refuses)", err)
	}
	if el := time.Since(t0); el < 900*time.Millisecond {
		t.Fatalf("a client sharing the store waited %v after RetryInfo, want about 1s", el)
	}
}

func TestNewClientValidates(t *testing.T) {
	for _, o := range []lpgrpc.ClientOptions{{}, {Store: memory.New(memory.Options{}), Key: "k"}, {Store: memory.New(memory.Options{}), Key: "k", Limit: core.Limit{Rate: 5}}} {
		if _, err := lpgrpc.NewClient(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
