package crosstest

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// shopEngine is issue 23's example: POST /orders 2/min, GET /orders
// 10/min and GET /orders/{id} 3/min on API shop, the key k1's own policy
// apiRate a minute across the API.
func shopEngine(t *testing.T, apiRate int64) (*core.Engine, identity.Authenticator) {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	eng, err := core.NewEngine(store, core.Config{
		Policies: []core.Policy{
			{ID: "api", Rate: core.PerMinute(apiRate)},
			{ID: "post-orders", Rate: core.PerMinute(2)},
			{ID: "get-orders", Rate: core.PerMinute(10)},
			{ID: "get-order", Rate: core.PerMinute(3)},
		},
		Endpoints: map[string][]core.Endpoint{"shop": {
			{Method: "POST", Path: "/orders", Policies: []string{"post-orders"}},
			{Method: "GET", Path: "/orders", Policies: []string{"get-orders"}},
			{Method: "GET", Path: "/orders/{id}", Policies: []string{"get-order"}},
		}},
	}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{"api"}}})
	if err != nil {
		t.Fatal(err)
	}
	return eng, identity.NewAPIKey(keys, identity.APIKeyOptions{})
}

func ok(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }

// shopServers start one server per framework and way of naming the
// route, each routing POST /orders, GET /orders and GET /orders/{id}
// behind its middleware with a Route option.
var shopServers = []struct {
	name  string
	start func(t *testing.T, eng core.Decider, auth identity.Authenticator) string
}{
	{"net/http PathRoute outside a ServeMux", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /orders", ok)
		mux.HandleFunc("GET /orders", ok)
		mux.HandleFunc("GET /orders/{id}", ok)
		return serveHTTP(t, nethttp.Middleware(eng, auth, nethttp.Options{API: "shop", Route: nethttp.PathRoute})(mux))
	}},
	{"net/http PatternRoute inside a ServeMux", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		mw := nethttp.Middleware(eng, auth, nethttp.Options{API: "shop", Route: nethttp.PatternRoute})
		mux := http.NewServeMux()
		mux.Handle("POST /orders", mw(http.HandlerFunc(ok)))
		mux.Handle("GET /orders", mw(http.HandlerFunc(ok)))
		mux.Handle("GET /orders/{id}", mw(http.HandlerFunc(ok)))
		return serveHTTP(t, mux)
	}},
	{"gin FullPathRoute", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(lpgin.Middleware(eng, auth, lpgin.Options{API: "shop", Route: lpgin.FullPathRoute}))
		h := func(c *gin.Context) { c.String(http.StatusOK, "ok") }
		r.POST("/orders", h)
		r.GET("/orders", h)
		r.GET("/orders/:id", h)
		return serveHTTP(t, r)
	}},
	{"fiber PathRoute in Use", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "shop", Route: lpfiber.PathRoute}))
		h := func(c *fiber.Ctx) error { return c.SendString("ok") }
		app.Post("/orders", h)
		app.Get("/orders", h)
		app.Get("/orders/:id", h)
		return serveFiber(t, app)
	}},
	{"fiber RoutePathRoute on the routes", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		mw := lpfiber.Middleware(eng, auth, lpfiber.Options{API: "shop", Route: lpfiber.RoutePathRoute})
		h := func(c *fiber.Ctx) error { return c.SendString("ok") }
		app.Post("/orders", mw, h)
		app.Get("/orders", mw, h)
		app.Get("/orders/:id", mw, h)
		return serveFiber(t, app)
	}},
	{"fasthttp PathRoute", func(t *testing.T, eng core.Decider, auth identity.Authenticator) string {
		return serveFast(t, lpfasthttp.Middleware(eng, auth, lpfasthttp.Options{API: "shop", Route: lpfasthttp.PathRoute})(func(ctx *fasthttp.RequestCtx) {
			ctx.SetBodyString("ok")
		}))
	}},
}

func serveFiber(t *testing.T, app *fiber.App) string {
	ln := listen(t)
	go app.Listener(ln)
	t.Cleanup(func() { app.Shutdown() })
	return "http://" + ln.Addr().String()
}

// admittedOf sends n requests of method to url with key k1 and returns
// how many got 200; an answer other than 200 or 429 fails the test.
func admittedOf(t *testing.T, method, url string, n int) int {
	t.Helper()
	got := 0
	for range n {
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("X-API-Key", "k1")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			got++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("%s %s: status %d", method, url, resp.StatusCode)
		}
	}
	return got
}

// TestEndpointsAcrossFrameworks: through every framework, one key gets
// exactly 2 POST /orders and 10 GET /orders a minute (and 3 GET
// /orders/{id}, any id), each endpoint on counters of its own; and the
// key's API-wide limit still applies: at 11 a minute the 12th request
// across both is refused.
func TestEndpointsAcrossFrameworks(t *testing.T) {
	for _, s := range shopServers {
		t.Run(s.name, func(t *testing.T) {
			eng, auth := shopEngine(t, 1000)
			base := s.start(t, eng, auth)
			if got := admittedOf(t, "POST", base+"/orders", 5); got != 2 {
				t.Errorf("POST /orders: %d admitted, want 2", got)
			}
			if got := admittedOf(t, "GET", base+"/orders", 15); got != 10 {
				t.Errorf("GET /orders: %d admitted, want 10", got)
			}
			if got := admittedOf(t, "GET", base+"/orders/1", 2) + admittedOf(t, "GET", base+"/orders/2", 3); got != 3 {
				t.Errorf("GET /orders/{id}: %d admitted, want 3", got)
			}
		})
		t.Run(s.name+" API-wide 11", func(t *testing.T) {
			eng, auth := shopEngine(t, 11)
			base := s.start(t, eng, auth)
			if got := admittedOf(t, "POST", base+"/orders", 4); got != 2 {
				t.Errorf("POST /orders: %d admitted, want 2", got)
			}
			if got := admittedOf(t, "GET", base+"/orders", 12); got != 9 {
				t.Errorf("GET /orders: %d admitted, want 9 (11 across both)", got)
			}
		})
	}
}
