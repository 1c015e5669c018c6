// Command gin serves GET /hello behind limitplane's Gin middleware, with the
// in-process store (no Redis) and one demo API key.
//
//	go run ./examples/gin [-addr 127.0.0.1:8080]
//
// It prints curl commands to try, and shuts down cleanly on SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, ln, os.Stdout, nil); err != nil {
		log.Fatal(err)
	}
}

// run serves on ln until ctx is done, then shuts down gracefully. clock is
// the store's clock (nil: the system's; tests freeze it).
func run(ctx context.Context, ln net.Listener, out io.Writer, clock core.Clock) error {
	store := memory.New(memory.Options{Clock: clock, SweepInterval: time.Minute})
	defer store.Close()
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{
		ID:    "demo",
		Rate:  core.Limit{Rate: 5, Period: time.Second},
		Quota: core.Quota{Max: 1000, Renewal: time.Hour},
	}}}, core.Options{})
	if err != nil {
		return err
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("demo-key"), Policies: []string{"demo"}}})
	if err != nil {
		return err
	}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery(), lpgin.Middleware(eng, identity.NewAPIKey(keys, identity.APIKeyOptions{}), lpgin.Options{
		API:      "hello",
		Renderer: response.NewRenderer(response.Options{XRateLimit: true}),
	}))
	r.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello\n") })

	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/hello"
	fmt.Fprintf(out, `limitplane Gin example on %s (policy "demo": 5/s, burst 5; 1000 per hour)
try:
  curl -i -H 'X-API-Key: demo-key' %[1]s        # 200 with RateLimit fields
  for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%%{http_code} ' -H 'X-API-Key: demo-key' %[1]s; done; echo   # 200 until the burst of 5 is spent, then 429 (a 200 again for every 200ms the loop takes)
  curl -i %[1]s                                 # 401: no API key
  curl -i -H 'Authorization: Bearer wrong' %[1]s   # 403: unknown API key
Ctrl-C stops it.
`, url)

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
	fmt.Fprintln(out, "stopped")
	return nil
}
