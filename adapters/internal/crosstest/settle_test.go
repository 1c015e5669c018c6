package crosstest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// settleServers answer GET /x?usage=N with "X-Usage-Tokens: N" (none
// when usage is empty) behind their middleware with SettleHeader.
var settleServers = []struct {
	name  string
	start func(t *testing.T, eng *core.Engine, auth identity.Authenticator) string
}{
	{"net/http", func(t *testing.T, eng *core.Engine, auth identity.Authenticator) string {
		return serveHTTP(t, nethttp.Middleware(eng, auth, nethttp.Options{API: "x", Cost: func(*http.Request) int64 { return 100 }, SettleHeader: "X-Usage-Tokens"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.URL.Query().Get("usage"); u != "" {
				w.Header().Set("X-Usage-Tokens", u)
			}
			io.WriteString(w, "ok")
		})))
	}},
	{"gin", func(t *testing.T, eng *core.Engine, auth identity.Authenticator) string {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(lpgin.Middleware(eng, auth, lpgin.Options{API: "x", Cost: func(*gin.Context) int64 { return 100 }, SettleHeader: "X-Usage-Tokens"}))
		r.GET("/x", func(c *gin.Context) {
			if u := c.Query("usage"); u != "" {
				c.Header("X-Usage-Tokens", u)
			}
			c.String(200, "ok")
		})
		return serveHTTP(t, r)
	}},
	{"fiber", func(t *testing.T, eng *core.Engine, auth identity.Authenticator) string {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "x", Cost: func(*fiber.Ctx) int64 { return 100 }, SettleHeader: "X-Usage-Tokens"}))
		app.Get("/x", func(c *fiber.Ctx) error {
			if u := c.Query("usage"); u != "" {
				c.Set("X-Usage-Tokens", u)
			}
			return c.SendString("ok")
		})
		ln := listen(t)
		go app.Listener(ln)
		t.Cleanup(func() { app.ShutdownWithTimeout(5 * time.Second) })
		return "http://" + ln.Addr().String()
	}},
}

// TestSettleAcrossFrameworks: estimate 100, the handler's X-Usage-Tokens
// 1,000 / 10 / absent / malformed, 16 concurrent clients, a budget of
// 10,000 per minute: the quota's count is exactly the sum of the actual
// costs (100 where absent or malformed).
func TestSettleAcrossFrameworks(t *testing.T) {
	usages := []string{"1000", "10", "", "12x"}
	for _, srv := range settleServers {
		t.Run(srv.name, func(t *testing.T) {
			store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
			eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "tokens", Quota: core.Quota{Max: 10_000, Renewal: time.Minute}, Settle: true}}}, core.Options{})
			if err != nil {
				t.Fatal(err)
			}
			keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k"), Policies: []string{"tokens"}}})
			if err != nil {
				t.Fatal(err)
			}
			base := srv.start(t, eng, identity.NewAPIKey(keys, identity.APIKeyOptions{}))
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			var sum atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 16; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					u := usages[g%len(usages)]
					req, _ := http.NewRequest("GET", base+"/x?usage="+u, nil)
					req.Header.Set("X-API-Key", "k")
					resp, err := c.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("status %d", resp.StatusCode)
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
			d, err := eng.Decide(context.Background(), &core.Consumer{ID: identity.HashKey("k").ConsumerID(), Policies: []string{"tokens"}}, "x", 0)
			if err != nil || d.Quota.Remaining != 10_000-sum.Load() {
				t.Fatalf("remaining %d, want 10,000 - %d: %+v %v", d.Quota.Remaining, sum.Load(), d, err)
			}
			if sum.Load() != 4*(1000+10+100+100) {
				t.Fatalf("sum %d", sum.Load())
			}
		})
	}
}
