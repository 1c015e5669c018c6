// Command grpc serves the gRPC health service behind limitplane's unary and
// stream interceptors, with the in-process store (no Redis) and one demo API
// key; with -client it is a tiny client that calls it and prints what
// limitplane answered.
//
//	go run ./examples/grpc                # server on 127.0.0.1:50051
//	go run ./examples/grpc -client        # in another terminal: 7 calls
//
// The server shuts down cleanly (GracefulStop) on SIGINT/SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "server address")
	client := flag.Bool("client", false, "run the client against -addr instead of the server")
	key := flag.String("key", "demo-key", "API key the client sends (x-api-key metadata)")
	calls := flag.Int("n", 7, "number of calls the client makes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *client {
		err = runClient(ctx, *addr, *key, *calls, os.Stdout)
	} else {
		var ln net.Listener
		if ln, err = net.Listen("tcp", *addr); err == nil {
			err = run(ctx, ln, os.Stdout, nil)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

// run serves on ln until ctx is done, then stops gracefully. clock is the
// store's clock (nil: the system's; tests freeze it).
func run(ctx context.Context, ln net.Listener, out io.Writer, clock core.Clock) error {
	store := memory.New(memory.Options{Clock: clock, SweepInterval: time.Minute})
	defer store.Close()
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "demo", Rate: core.Limit{Rate: 5, Period: time.Second}},
	}}, core.Options{})
	if err != nil {
		return err
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("demo-key"), Policies: []string{"demo"}}})
	if err != nil {
		return err
	}
	auth := identity.NewAPIKey(keys, identity.APIKeyOptions{})
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(eng, auth, lpgrpc.Options{})),
		grpc.ChainStreamInterceptor(lpgrpc.StreamServerInterceptor(eng, auth, lpgrpc.Options{})),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(out, `limitplane gRPC example on %s: grpc.health.v1.Health, policy "demo": 5/s, burst 5
try, in another terminal:
  go run ./examples/grpc -client -addr %[1]s              # 5 x OK, then ResourceExhausted with RetryInfo
  go run ./examples/grpc -client -addr %[1]s -key wrong   # PermissionDenied: unknown API key
Ctrl-C stops it.
`, ln.Addr())

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop() // streams still open: cut them
	}
	if err := <-errc; err != nil {
		return err
	}
	fmt.Fprintln(out, "stopped")
	return nil
}

// runClient makes n health checks with key and prints, for each, the status
// code, the rate-limit metadata and, when denied, the RetryInfo delay.
func runClient(ctx context.Context, addr, key string, n int, out io.Writer) error {
	if n < 1 {
		return fmt.Errorf("-n %d: the client makes at least one call", n)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	for i := 1; i <= n; i++ {
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		st := status.Convert(err)
		if st.Code() == codes.Unavailable {
			return fmt.Errorf("call %d: %w", i, err) // no server there: not a limiter answer
		}
		line := fmt.Sprintf("call %d: %v", i, st.Code())
		if err != nil {
			line += fmt.Sprintf(" %q", st.Message())
		}
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				line += fmt.Sprintf(" retry in %v", ri.RetryDelay.AsDuration())
			}
		}
		if v := md.Get("ratelimit"); len(v) > 0 {
			line += "  ratelimit: " + strings.Join(v, ", ")
		}
		fmt.Fprintln(out, line)
	}
	return nil
}
