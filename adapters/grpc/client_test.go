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
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// limitedServer is a real gRPC server (health service) that enforces rate
// on every caller by peer address, with limitplane's own interceptor, on
// clock.
func limitedServer(t *testing.T, rate core.Limit, clock core.Clock) string {
	t.Helper()
	eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{{ID: "server", Rate: rate}}}, core.Options{})
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

// TestClientKeepsServerUnderItsLimit: client and server read one frozen
// ManualClock, so the outcome does not depend on scheduling. Both allow 5
// an hour (burst 5); of 60 calls from 30 goroutines with a one-minute
// deadline exactly 5 reach the server and 55 fail at once with
// DeadlineExceeded (the next slot is 12 minutes away); twelve minutes
// later exactly one more passes.
func TestClientKeepsServerUnderItsLimit(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	limit := core.Limit{Rate: 5, Period: time.Hour}
	addr := limitedServer(t, limit, clock)
	c, err := lpgrpc.NewClient(lpgrpc.ClientOptions{Store: memory.New(memory.Options{Clock: clock}), Key: "health", Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	hc := dialThrough(t, addr, c)
	const wantMsg = `grpc: client "health": core: Wait(cost=1) needs 12m0s: wait would exceed context deadline (context deadline exceeded)`
	round := func() (ok, refused int64) {
		var nok, nrefused, next atomic.Int64
		var wg sync.WaitGroup
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= 60 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
					cancel()
					st := status.Convert(err)
					switch {
					case st.Code() == codes.OK:
						nok.Add(1)
					case st.Code() == codes.DeadlineExceeded && st.Message() == wantMsg:
						nrefused.Add(1)
					default:
						t.Errorf("status %v, want OK or DeadlineExceeded %q", err, wantMsg)
					}
				}
			}()
		}
		wg.Wait()
		return nok.Load(), nrefused.Load()
	}
	if ok, refused := round(); ok != 5 || refused != 55 {
		t.Fatalf("server answered %d OK, the client refused %d; want 5 and 55", ok, refused)
	}
	clock.Advance(12 * time.Minute)
	if ok, refused := round(); ok != 1 || refused != 59 {
		t.Fatalf("12 minutes later: server answered %d OK, the client refused %d; want 1 and 59", ok, refused)
	}
}

// TestClientBacksOffOnRetryInfo: the server allows 1 a minute, so the
// second call comes back ResourceExhausted with RetryInfo of exactly one
// minute (its store reads a frozen ManualClock). That holds back the client
// that got it and, through the shared store (Store.Penalize), another
// client; each fails at once with DeadlineExceeded, without calling, when
// its deadline is inside the hold. The hold ends when the test moves the
// clock.
func TestClientBacksOffOnRetryInfo(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	addr := limitedServer(t, core.Limit{Rate: 1, Period: time.Minute}, clock)
	store := memory.New(memory.Options{Clock: clock})
	opts := lpgrpc.ClientOptions{Store: store, Key: "health", Limit: core.PerSecond(100)}
	a, err := lpgrpc.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := lpgrpc.NewClient(opts) // another client sharing the store
	if err != nil {
		t.Fatal(err)
	}
	ha, hb := dialThrough(t, addr, a), dialThrough(t, addr, b)
	ctx := context.Background()
	if _, err := ha.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ha.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// a holds itself back (its own Backoff, on the real clock).
	_, err = ha.Check(short, &healthpb.HealthCheckRequest{})
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || !strings.HasPrefix(st.Message(), `grpc: client "health": core: throttle "health" backing off for `) {
		t.Fatalf("the client that got RetryInfo, inside the hold: %v", err)
	}
	// The store holds b for exactly the minute.
	_, err = hb.Check(short, &healthpb.HealthCheckRequest{})
	if st, want := status.Convert(err), `grpc: client "health": core: Wait(cost=1) needs 1m0s: wait would exceed context deadline (context deadline exceeded)`; st.Code() != codes.DeadlineExceeded || st.Message() != want {
		t.Fatalf("a client sharing the store, inside the hold: %v; want DeadlineExceeded %q", err, want)
	}
	clock.Advance(time.Minute)
	if _, err := hb.Check(short, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after the hold: %v", err)
	}
}

func TestNewClientValidates(t *testing.T) {
	for _, c := range []struct {
		o    lpgrpc.ClientOptions
		want string
	}{
		{lpgrpc.ClientOptions{}, "grpc: NewClient: core: NewThrottle: Store and Key are required"},
		{lpgrpc.ClientOptions{Store: memory.New(memory.Options{}), Key: "k"}, "grpc: NewClient: core: NewThrottle: a Limit is required"},
		{lpgrpc.ClientOptions{Store: memory.New(memory.Options{}), Key: "k", Limit: core.Limit{Rate: 5}}, "grpc: NewClient: core: NewThrottle: rate: invalid limit: period 0s must be > 0"},
	} {
		if _, err := lpgrpc.NewClient(c.o); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %s", c.o, err, c.want)
		}
	}
}
