// Command service is a service of your own — an "orders" API on Gin,
// Fiber, net/http or gRPC — whose limits come from a limitplane control
// plane: it joins a data-plane group as a member (dataplane.Follow), and
// every request goes through the framework's limitplane middleware with
// the follower's Limiter and Authenticator for the API it is. Policies,
// keys, revocations, quota resets and the API's authentication (API key,
// JWT, keyless) are the control plane's; the service holds no
// configuration of its own. The middleware is given each request's route
// (its method and path, Gin's route, or the gRPC method), so the API's
// endpoints, if the control plane gives it any (per-method and per-path
// limits and costs: README, apis[].endpoints), apply too.
//
// Walk-through, with a control plane on 127.0.0.1:7070 (admin) and
// 127.0.0.1:7071 (sync) whose -dataplanes file gives group "orders" the
// token in $LIMITPLANE_TOKEN (see cmd/limitplane-controlplane):
//
//  1. Define the API at the control plane. An API with neither
//     listen_path nor target is a service's own (gateways do not route
//     it); its auth section says how callers are identified (API keys by
//     default):
//
//     curl -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' -X PUT -d '{"id":"orders"}' http://127.0.0.1:7070/api/apis/orders
//     curl -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' -X PUT -d '{"id":"basic","rate":{"requests":10,"per":"1s"},"quota":{"max":1000,"renewal":"1h"}}' http://127.0.0.1:7070/api/policies/basic
//     curl -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' -X POST -d '{"key":"my-key","policies":["basic"]}' http://127.0.0.1:7070/api/keys
//
//  2. Run two replicas on one Redis: they share their counters, so the
//     quota of 1000 is 1000 over both:
//
//     go run ./examples/service -framework gin -listen 127.0.0.1:8081 -api orders \
//     -control-plane 127.0.0.1:7071 -group orders -id orders-1 -redis redis://127.0.0.1:6380/0
//     go run ./examples/service -framework fiber -listen 127.0.0.1:8082 -api orders \
//     -control-plane 127.0.0.1:7071 -group orders -id orders-2 -redis redis://127.0.0.1:6380/0
//
//  3. Call it:
//
//     curl -i -H 'X-API-Key: my-key' http://127.0.0.1:8081/orders/42   # 200 {"consumer":"key:…","ok":true}
//     curl -i http://127.0.0.1:8081/orders                           # 401: no API key
//     curl -i http://127.0.0.1:8081/readyz                           # 200 once a configuration is applied
//
//     A key deleted at the control plane answers 403 on every replica
//     within moments; a quota reset there gives the key its quota again.
//
// Until the first configuration is applied, every request answers 503
// (gRPC Unavailable). If the control plane goes away the service keeps
// enforcing the last configuration; one restarted meanwhile enforces the
// persisted one (in Redis with -redis, else in -state-file) after
// -start-timeout. With -max-stale and -on-stale fail_closed it answers 503
// once the control plane has been gone that long.
//
// Flags:
//
//	-framework gin|fiber|nethttp|grpc   required
//	-listen ADDR          the service (127.0.0.1:0); the first line on stdout is "listening on ADDR"
//	-ops ADDR             grpc only: HTTP for /readyz and /metrics (127.0.0.1:0; "ops on ADDR");
//	                      the HTTP frameworks serve them on -listen, outside the limiter
//	-api ID               the API this service is (orders)
//	-control-plane ADDR   the control plane's sync address, required
//	-group NAME           the data-plane group (orders); -token (or $LIMITPLANE_TOKEN) its token
//	-id NAME              this member's id ("" means hostname-pid)
//	-redis URL            the group's Redis ("" counts in this process)
//	-state-file PATH      without -redis: where the last configuration is kept
//	-max-stale D, -on-stale keep|fail_closed, -start-timeout D
//
// SIGINT or SIGTERM stops it gracefully.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	lpnethttp "github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
)

// flags are the command line.
type flags struct {
	framework, listen, ops, api    string
	controlPlane, group, token, id string
	redis, stateFile, onStale      string
	maxStale, startTimeout         time.Duration
}

func main() {
	var fl flags
	flag.StringVar(&fl.framework, "framework", "", "gin, fiber, nethttp or grpc (required)")
	flag.StringVar(&fl.listen, "listen", "127.0.0.1:0", "the service's address")
	flag.StringVar(&fl.ops, "ops", "127.0.0.1:0", "grpc only: HTTP address of /readyz and /metrics")
	flag.StringVar(&fl.api, "api", "orders", "the API id this service is")
	flag.StringVar(&fl.controlPlane, "control-plane", "", "the control plane's sync address, host:port (required)")
	flag.StringVar(&fl.group, "group", "orders", "the data-plane group")
	flag.StringVar(&fl.token, "token", "", "the data plane's token (\"\" reads $LIMITPLANE_TOKEN)")
	flag.StringVar(&fl.id, "id", "", `this member's id ("" means hostname-pid)`)
	flag.StringVar(&fl.redis, "redis", "", `the group's Redis URL ("" counts in this process)`)
	flag.StringVar(&fl.stateFile, "state-file", "", "without -redis: file keeping the last configuration")
	flag.DurationVar(&fl.maxStale, "max-stale", 0, "how long without the control plane before -on-stale applies (0: never)")
	flag.StringVar(&fl.onStale, "on-stale", "keep", "keep or fail_closed")
	flag.DurationVar(&fl.startTimeout, "start-timeout", 0, "wait this long for the control plane before enforcing the persisted configuration (0: the default)")
	flag.Parse()
	if fl.token == "" {
		fl.token = os.Getenv("LIMITPLANE_TOKEN")
	}
	switch {
	case flag.NArg() > 0:
		fmt.Fprintf(os.Stderr, "unexpected argument %q\n", flag.Arg(0))
		flag.Usage()
		os.Exit(2)
	case fl.token == "":
		log.Fatal("no token: give -token or set $LIMITPLANE_TOKEN")
	case fl.framework != "gin" && fl.framework != "fiber" && fl.framework != "nethttp" && fl.framework != "grpc":
		log.Fatalf("-framework must be gin, fiber, nethttp or grpc, not %q", fl.framework)
	case fl.controlPlane == "":
		log.Fatal("-control-plane is required")
	case fl.startTimeout < 0:
		log.Fatalf("-start-timeout %v is negative (0: the default)", fl.startTimeout)
	}
	// go-redis logs each failed dial of its pool (dozens a second while
	// Redis is down); the program, not a library (the logger is
	// process-wide), sends them to slog at most once per interval, as
	// the gateway does.
	rl := gateway.NewRedisLogger(slog.Default(), nil)
	redis.SetLogger(rl)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, fl)
	rl.Close() // its last interval's count; log.Fatal runs no deferred call
	if err != nil {
		log.Fatal(err)
	}
	slog.Info("stopped")
}

// run follows the control plane and serves until ctx is done.
func run(ctx context.Context, fl flags) error {
	// The counters: in the group's Redis, shared by every replica, or in
	// this process.
	opts := dataplane.FollowOptions{
		Address: fl.controlPlane, Group: fl.group, Token: fl.token, ID: fl.id, Version: "examples/service",
		FailurePolicy: core.FailClosed, MaxStale: fl.maxStale, OnStale: dataplane.OnStale(fl.onStale),
		StartTimeout: fl.startTimeout,
	}
	if fl.redis != "" {
		store, closeStore, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: fl.redis, FailurePolicy: core.FailClosed})
		if err != nil {
			return err
		}
		defer closeStore()
		opts.Store = store // Follow persists the configuration in this Redis too
	} else if fl.stateFile != "" {
		opts.Persister = dataplane.FilePersister{Path: fl.stateFile}
	}
	f, err := dataplane.Follow(ctx, opts)
	if err != nil {
		return err
	}
	defer f.Close()
	limiter, auth := f.Limiter(fl.api), recordConsumer{f.Authenticator(fl.api)}

	ln, err := net.Listen("tcp", fl.listen)
	if err != nil {
		return err
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	switch fl.framework {
	case "grpc":
		return serveGRPC(ctx, ln, fl.ops, f, fl.api, limiter, auth)
	case "fiber":
		return serveFiber(ctx, ln, f, fl.api, limiter, auth)
	case "gin":
		return serveHTTP(ctx, ln, ginHandler(f, fl.api, limiter, auth))
	default:
		return serveHTTP(ctx, ln, netHTTPHandler(f, fl.api, limiter, auth))
	}
}

// orders is the service's answer to every admitted request: the
// consumer limitplane identified.
func orders(ctx context.Context) map[string]any {
	consumer, _ := ctx.Value(consumerKey{}).(*string)
	out := map[string]any{"ok": true, "consumer": ""}
	if consumer != nil {
		out["consumer"] = *consumer
	}
	return out
}

// consumerKey is the context key of the slot recordConsumer fills.
type consumerKey struct{}

// withConsumerSlot returns ctx with an empty slot for the consumer's id.
func withConsumerSlot(ctx context.Context) context.Context {
	return context.WithValue(ctx, consumerKey{}, new(string))
}

// recordConsumer is the follower's authenticator that also writes the
// consumer's id into the request context's slot, for the handler to
// name (the middleware passes the consumer to the engine, not on).
type recordConsumer struct{ identity.Authenticator }

// Authenticate implements identity.Authenticator.
func (a recordConsumer) Authenticate(ctx context.Context, r identity.Request) (*core.Consumer, error) {
	c, err := a.Authenticator.Authenticate(ctx, r)
	if slot, ok := ctx.Value(consumerKey{}).(*string); ok && c != nil {
		*slot = c.ID
	}
	return c, err
}

// netHTTPHandler: /readyz and /metrics open, /orders and below behind
// the limiter.
func netHTTPHandler(f *dataplane.Follower, api string, l core.Decider, auth identity.Authenticator) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", f.ReadyHandler())
	mux.Handle("GET /metrics", f.MetricsHandler())
	limited := lpnethttp.Middleware(l, auth, lpnethttp.Options{API: api, Route: lpnethttp.PathRoute})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(orders(r.Context()))
	}))
	withSlot := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limited.ServeHTTP(w, r.WithContext(withConsumerSlot(r.Context())))
	})
	for _, p := range []string{"GET /orders", "POST /orders", "GET /orders/", "POST /orders/"} {
		mux.Handle(p, withSlot)
	}
	return mux
}

// ginHandler is netHTTPHandler on Gin.
func ginHandler(f *dataplane.Follower, api string, l core.Decider, auth identity.Authenticator) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery())
	r.GET("/readyz", gin.WrapH(f.ReadyHandler()))
	r.GET("/metrics", gin.WrapH(f.MetricsHandler()))
	g := r.Group("/orders", func(c *gin.Context) {
		c.Request = c.Request.WithContext(withConsumerSlot(c.Request.Context()))
	}, lpgin.Middleware(l, auth, lpgin.Options{API: api, Route: lpgin.FullPathRoute}))
	handle := func(c *gin.Context) { c.JSON(http.StatusOK, orders(c.Request.Context())) }
	for _, p := range []string{"", "/*rest"} {
		g.GET(p, handle)
		g.POST(p, handle)
	}
	return r
}

// serveHTTP serves h on ln until ctx is done, then shuts down gracefully.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// serveFiber is netHTTPHandler on Fiber, served on ln until ctx is done.
func serveFiber(ctx context.Context, ln net.Listener, f *dataplane.Follower, api string, l core.Decider, auth identity.Authenticator) error {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ReadTimeout: 5 * time.Second})
	app.Get("/readyz", adaptor.HTTPHandler(f.ReadyHandler()))
	app.Get("/metrics", adaptor.HTTPHandler(f.MetricsHandler()))
	g := app.Group("/orders", func(c *fiber.Ctx) error {
		c.SetUserContext(withConsumerSlot(c.UserContext()))
		return c.Next()
	}, lpfiber.Middleware(l, auth, lpfiber.Options{API: api, Route: lpfiber.PathRoute}))
	handle := func(c *fiber.Ctx) error { return c.JSON(orders(c.UserContext())) }
	for _, p := range []string{"", "/*"} {
		g.Get(p, handle)
		g.Post(p, handle)
	}
	errc := make(chan error, 1)
	go func() { errc <- app.Listener(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if err := app.ShutdownWithTimeout(5 * time.Second); err != nil {
		return err
	}
	return <-errc
}

// serveGRPC serves the gRPC health service on ln behind the limiter
// (every method is API api), and /readyz and /metrics over HTTP on ops,
// until ctx is done.
func serveGRPC(ctx context.Context, ln net.Listener, ops string, f *dataplane.Follower, api string, l core.Decider, auth identity.Authenticator) error {
	o := lpgrpc.Options{API: func(string) string { return api }, Route: lpgrpc.MethodRoute}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(l, auth, o)),
		grpc.ChainStreamInterceptor(lpgrpc.StreamServerInterceptor(l, auth, o)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	opsLn, err := net.Listen("tcp", ops)
	if err != nil {
		return err
	}
	fmt.Printf("ops on %s\n", opsLn.Addr())
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", f.ReadyHandler())
	mux.Handle("GET /metrics", f.MetricsHandler())
	opsCtx, stopOps := context.WithCancel(ctx)
	defer stopOps()
	opsDone := make(chan error, 1)
	go func() { opsDone <- serveHTTP(opsCtx, opsLn, mux) }()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop() // streams still open: cut them
		}
		err = <-errc
	}
	stopOps()
	return errors.Join(err, <-opsDone)
}
