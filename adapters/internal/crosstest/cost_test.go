package crosstest

import (
	"io"
	"net/http"
	"strings"
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

// sourced is an engine that names its API's cost header itself
// (core.CostHeaderSource), as a data-plane member's Limiter does, so a
// test can change it between requests.
type sourced struct {
	*core.Engine
	header atomic.Pointer[core.CostHeader]
}

func (s *sourced) CostHeader(api string) core.CostHeader {
	if api != "x" {
		return core.CostHeader{}
	}
	return *s.header.Load()
}

// costServers start one server per framework answering GET /x with "ok"
// behind its middleware: key k1 has a quota of 10 an hour; the first
// server of each pair is told X-Cost (bound 5) by its Options, the
// second learns it from its decider (set returns the decider, to change
// the header).
func costServers(t *testing.T, fromDecider bool) map[string]struct {
	url string
	d   *sourced
} {
	out := map[string]struct {
		url string
		d   *sourced
	}{}
	newDecider := func() (*sourced, identity.Authenticator) {
		store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
		t.Cleanup(func() { store.Close() })
		eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
			{ID: "q", Quota: core.Quota{Max: 10, Renewal: time.Hour}},
		}}, core.Options{})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{"q"}}})
		if err != nil {
			t.Fatal(err)
		}
		d := &sourced{Engine: eng}
		d.header.Store(&core.CostHeader{Name: "X-Cost", Max: 5})
		return d, identity.NewAPIKey(keys, identity.APIKeyOptions{})
	}
	opt := core.CostHeader{Name: "X-Cost", Max: 5}
	if fromDecider {
		opt = core.CostHeader{}
	}
	var l core.Decider
	{
		d, auth := newDecider()
		l = d.Engine
		if fromDecider {
			l = d
		}
		h := nethttp.Middleware(l, auth, nethttp.Options{API: "x", CostHeader: opt})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok")
		}))
		out["net/http"] = struct {
			url string
			d   *sourced
		}{serveHTTP(t, h), d}
	}
	{
		d, auth := newDecider()
		l = d.Engine
		if fromDecider {
			l = d
		}
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(lpgin.Middleware(l, auth, lpgin.Options{API: "x", CostHeader: opt}))
		r.GET("/x", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		out["gin"] = struct {
			url string
			d   *sourced
		}{serveHTTP(t, r), d}
	}
	{
		d, auth := newDecider()
		l = d.Engine
		if fromDecider {
			l = d
		}
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(lpfiber.Middleware(l, auth, lpfiber.Options{API: "x", CostHeader: opt}))
		app.Get("/x", func(c *fiber.Ctx) error { return c.SendString("ok") })
		ln := listen(t)
		go app.Listener(ln)
		t.Cleanup(func() { app.Shutdown() })
		out["fiber"] = struct {
			url string
			d   *sourced
		}{"http://" + ln.Addr().String(), d}
	}
	return out
}

// getCost sends GET /x with key k1 and the X-Cost values given.
func getCost(t *testing.T, base string, costs ...string) answer {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "k1")
	for _, c := range costs {
		req.Header.Add("X-Cost", c)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: map[string]string{}, body: string(body)}
	for _, k := range compared {
		if vs := resp.Header.Values(k); vs != nil {
			a.header[k] = strings.Join(vs, " | ")
		}
	}
	return a
}

// TestCostHeaderEveryFramework: through net/http, Gin and Fiber, with the
// header named in Options or by the decider: quota 10 at X-Cost 3 admits
// exactly 3 requests and refuses the 4th; every malformed value is 400
// with the same JSON body naming the header and counts nothing; one unit
// is left for a request without the header. A decider that drops its
// header stops the reading at the next request.
func TestCostHeaderEveryFramework(t *testing.T) {
	const bad = `{"error":"malformed X-Cost header: want a whole number from 1 to 5"}` + "\n"
	const twice = `{"error":"malformed X-Cost header: given more than once"}` + "\n"
	for _, fromDecider := range []bool{false, true} {
		for name, s := range costServers(t, fromDecider) {
			for _, v := range [][]string{{"abc"}, {"-1"}, {"0"}, {"6"}, {"2.5"}, {" "}, {"3", "3"}} {
				a := getCost(t, s.url, v...)
				want := bad
				if len(v) == 2 {
					want = twice
				}
				if a.status != 400 || a.body != want || a.header["Content-Type"] != "application/json" || a.header["Ratelimit"] != "" {
					t.Fatalf("%s (from decider %v) X-Cost %q: %s, want 400 %q", name, fromDecider, v, a, want)
				}
			}
			var got []int
			for range 4 {
				got = append(got, getCost(t, s.url, "3").status)
			}
			if want := []int{200, 200, 200, 429}; !equalInts(got, want) {
				t.Fatalf("%s (from decider %v): cost 3 on quota 10: %v, want %v", name, fromDecider, got, want)
			}
			if a := getCost(t, s.url); a.status != 200 || a.header["Ratelimit"] != `"q/quota";r=0;t=3600` {
				t.Fatalf("%s (from decider %v): without the header: %s", name, fromDecider, a)
			}
			if fromDecider {
				s.d.header.Store(&core.CostHeader{})
				if a := getCost(t, s.url, "abc"); a.status != 429 {
					t.Fatalf("%s: header dropped by the decider: %s, want 429 (the value unread)", name, a)
				}
			}
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
