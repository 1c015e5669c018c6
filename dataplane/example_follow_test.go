package dataplane_test

import (
	"context"
	"io"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"

	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/dataplane"
)

// ExampleFollow makes a service a member of a data plane: its control
// plane (here at 127.0.0.1:7443) sends the policies, keys and API
// definitions, and the service's middleware enforces the API "orders"
// with them, under whatever revision runs when each request arrives.
// Until the first configuration arrives every request answers 503, and
// so does /readyz; /metrics shows the decisions and the link to the
// control plane. (It needs a control plane, so it has no output.)
func ExampleFollow() {
	f, err := dataplane.Follow(context.Background(), dataplane.FollowOptions{
		Address: "127.0.0.1:7443", // the control plane's sync address
		Group:   "orders-eu",      // this data plane: the service's replicas
		Token:   "the data plane's token",
		// Store: a redisstore.Store shares the limits between the
		// replicas and persists the configuration for a restart while
		// the control plane is down; nil is this process's own.
	})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	// net/http.
	limit := nethttp.Middleware(f.Limiter("orders"), f.Authenticator("orders"), nethttp.Options{API: "orders"})
	mux := http.NewServeMux()
	mux.Handle("/orders/", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "orders\n")
	})))
	mux.Handle("GET /readyz", f.ReadyHandler())
	mux.Handle("GET /metrics", f.MetricsHandler())

	// Or gin: the same Limiter and Authenticator.
	r := gin.New()
	r.GET("/orders", lpgin.Middleware(f.Limiter("orders"), f.Authenticator("orders"), lpgin.Options{API: "orders"}),
		func(c *gin.Context) { c.String(http.StatusOK, "orders\n") })

	// In a program: http.ListenAndServe(":8080", mux), or r.Run(":8080").
	_, _ = mux, r
}
