package crosstest

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	fiberrecover "github.com/gofiber/fiber/v2/middleware/recover"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// gate is a slow handler's state: it counts the requests inside it (and
// the most at once), and each waits until open is closed; /panic panics.
type gate struct {
	in, most atomic.Int64
	open     chan struct{}
}

func (g *gate) enter() {
	n := g.in.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
}

// inFlightServers start one server per framework behind its middleware
// over eng, answering GET /x through g and GET /panic with a panic.
var inFlightServers = []struct {
	name  string
	start func(t *testing.T, eng *core.Engine, auth identity.Authenticator, g *gate) string
}{
	{"net/http", func(t *testing.T, eng *core.Engine, auth identity.Authenticator, g *gate) string {
		h := nethttp.Middleware(eng, auth, nethttp.Options{API: "x"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/panic" {
				panic(http.ErrAbortHandler) // net/http's server recovers it
			}
			g.enter()
			defer g.in.Add(-1)
			<-g.open
			io.WriteString(w, "ok")
		}))
		return serveHTTP(t, h)
	}},
	{"gin", func(t *testing.T, eng *core.Engine, auth identity.Authenticator, g *gate) string {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(gin.CustomRecovery(func(c *gin.Context, _ any) { c.AbortWithStatus(500) }))
		r.Use(lpgin.Middleware(eng, auth, lpgin.Options{API: "x"}))
		r.GET("/x", func(c *gin.Context) {
			g.enter()
			defer g.in.Add(-1)
			<-g.open
			c.String(200, "ok")
		})
		r.GET("/panic", func(c *gin.Context) { panic("handler panic") })
		return serveHTTP(t, r)
	}},
	{"fiber", func(t *testing.T, eng *core.Engine, auth identity.Authenticator, g *gate) string {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(fiberrecover.New())
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "x"}))
		app.Get("/x", func(c *fiber.Ctx) error {
			g.enter()
			defer g.in.Add(-1)
			<-g.open
			return c.SendString("ok")
		})
		app.Get("/panic", func(c *fiber.Ctx) error { panic("handler panic") })
		ln := listen(t)
		go app.Listener(ln)
		t.Cleanup(func() { app.ShutdownWithTimeout(5 * time.Second) })
		return "http://" + ln.Addr().String()
	}},
}

// inFlightBody is the body of an in-flight refusal.
const inFlightBody = `{"error":"too many concurrent requests"}` + "\n"

// TestInFlightAcrossFrameworks: cap 5, 50 concurrent slow requests of
// one key: never more than 5 in the handler, exactly 5 admitted while all
// are held, 45 refused with 429, the body and no Retry-After or rate-limit
// fields; every slot back once they are done, and after handler panics.
func TestInFlightAcrossFrameworks(t *testing.T) {
	for _, srv := range inFlightServers {
		t.Run(srv.name, func(t *testing.T) {
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
			g := &gate{open: make(chan struct{})}
			base := srv.start(t, eng, auth, g)
			var once sync.Once
			release := func() { once.Do(func() { close(g.open) }) }
			t.Cleanup(release) // before the server's shutdown, which waits for handlers
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
			do := func(path string) (int, http.Header, string) {
				req, _ := http.NewRequest("GET", base+path, nil)
				req.Header.Set("X-API-Key", "k")
				resp, err := c.Do(req)
				if err != nil {
					if path != "/panic" { // net/http aborts the connection
						t.Error(err)
					}
					return 0, nil, ""
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, resp.Header, string(b)
			}
			var wg sync.WaitGroup
			var ok, refused atomic.Int64
			for i := 0; i < 50; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					status, h, body := do("/x")
					switch status {
					case 200:
						ok.Add(1)
					case 429:
						refused.Add(1)
						if body != inFlightBody || h.Get("Retry-After") != "" || h.Get(response.HeaderRateLimit) != "" || h.Get(response.HeaderPolicy) != "" {
							t.Errorf("refusal: %q %v", body, h)
						}
					default:
						t.Errorf("status %d %q", status, body)
					}
				}()
			}
			// The 45 refusals come back while the 5 are held.
			deadline := time.Now().Add(15 * time.Second)
			for refused.Load() < 45 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if refused.Load() != 45 || g.in.Load() != 5 || store.InFlight(consumer, "") != 5 {
				t.Fatalf("while held: refused %d, in the handler %d, slots %d; want 45, 5, 5", refused.Load(), g.in.Load(), store.InFlight(consumer, ""))
			}
			release()
			wg.Wait()
			if ok.Load() != 5 || refused.Load() != 45 || g.most.Load() != 5 {
				t.Fatalf("admitted %d, refused %d, most at once %d; want 5, 45, 5", ok.Load(), refused.Load(), g.most.Load())
			}
			if n := store.InFlight(consumer, ""); n != 0 {
				t.Fatalf("slots after the responses: %d", n)
			}
			for i := 0; i < 7; i++ { // more panics than the cap
				if status, _, _ := do("/panic"); status == 200 || status == 429 {
					t.Fatalf("panic %d: status %d", i, status)
				}
			}
			if n := store.InFlight(consumer, ""); n != 0 {
				t.Fatalf("slots after handler panics: %d", n)
			}
			if status, _, body := do("/x"); status != 200 || body != "ok" {
				t.Fatalf("after the panics: %d %q", status, body)
			}
		})
	}
}
