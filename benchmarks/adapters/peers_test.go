package adapters

// Peers: limitplane's net/http and Fiber middleware beside the middleware a
// user would pick instead, each on its own in-memory store, on the admitted
// path (limits of 10⁹ per second that no benchmark reaches) and, in the
// Deny benchmarks, on denials (one request an hour). Every library
// keys on the same thing, the client IP taken from the transport peer
// address (RemoteAddr; no forwarding header is read), which is also every
// peer's default key:
//
//	limitplane      adapters/nethttp, identity.Keyless (client IP), core/memory
//	ulule           ulule/limiter v3 drivers/middleware/stdlib, store/memory
//	httprate        go-chi/httprate LimitByIP, its local counter
//	tollbooth       didip/tollbooth v7 LimitHandler, IP lookup RemoteAddr
//	limitplane      (Fiber) adapters/fiber, identity.Keyless, core/memory
//	fiberlimiter    gofiber/fiber/v2/middleware/limiter, its memory storage
//
// Two shapes: keys=1 (every request from one client) and keys=10000
// (requests round-robin over 10,000 distinct client addresses, so each
// limiter holds 10,000 entries once warm). "bare" is the same framework and
// handler with no middleware: added ns/op = row − bare. README.md
// ("Middleware beside its peers") has the numbers.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/didip/tollbooth/v7"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/httprate"
	"github.com/gofiber/fiber/v2"
	fiberlimiter "github.com/gofiber/fiber/v2/middleware/limiter"
	ulule "github.com/ulule/limiter/v3"
	ululegin "github.com/ulule/limiter/v3/drivers/middleware/gin"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	"github.com/valyala/fasthttp"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// peerLimit is every library's limit per second: nobody reaches it.
const peerLimit = 1_000_000_000

// peerShapes are the numbers of distinct clients the benchmarks cycle over.
var peerShapes = []int{1, 10_000}

// clientAddr returns the i-th client's address, 10.a.b.c port 40000: all
// distinct for i < 2²⁴.
func clientAddr(i int) *net.TCPAddr {
	return &net.TCPAddr{IP: net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)), Port: 40000}
}

// peerRate is every library's limit in one benchmark: n requests per
// period per client.
type peerRate struct {
	n   int
	per time.Duration
}

var (
	// admitRate is never reached: every request is admitted.
	admitRate = peerRate{peerLimit, time.Second}
	// denyRate is spent by each client's first (warm-up) request: every
	// timed request is denied.
	denyRate = peerRate{1, time.Hour}
)

// keylessEngine is limitplane as a user sets up a keyless API: one policy
// for every client, each client IP its own counter in the memory store.
func keylessEngine(tb testing.TB) (*core.Engine, *memory.Store, identity.Authenticator) {
	return keylessEngineAt(tb, admitRate)
}

// keylessEngineAt is keylessEngine with the policy's limit at r.
func keylessEngineAt(tb testing.TB, r peerRate) (*core.Engine, *memory.Store, identity.Authenticator) {
	tb.Helper()
	store := memory.New(memory.Options{})
	tb.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "bench", Rate: core.Limit{Rate: int64(r.n), Period: r.per}},
	}}, core.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return eng, store, &identity.Keyless{Policies: []string{"bench"}}
}

// netHTTPPeer is one row: next wrapped in a library's middleware.
type netHTTPPeer struct {
	name string
	wrap func(tb testing.TB, next http.Handler, r peerRate) http.Handler
}

// netHTTPPeers are the net/http rows, in table order: each wraps next in
// its library's middleware.
var netHTTPPeers = []netHTTPPeer{
	{"bare", func(_ testing.TB, next http.Handler, _ peerRate) http.Handler { return next }},
	{"limitplane", func(tb testing.TB, next http.Handler, r peerRate) http.Handler {
		eng, _, auth := keylessEngineAt(tb, r)
		return nethttp.Middleware(eng, auth, nethttp.Options{API: "x"})(next)
	}},
	{"ulule", func(_ testing.TB, next http.Handler, r peerRate) http.Handler {
		lim := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: r.per, Limit: int64(r.n)})
		return stdlib.NewMiddleware(lim).Handler(next)
	}},
	{"httprate", func(_ testing.TB, next http.Handler, r peerRate) http.Handler {
		return httprate.LimitByIP(r.n, r.per)(next)
	}},
	{"tollbooth", func(_ testing.TB, next http.Handler, r peerRate) http.Handler {
		lmt := tollbooth.NewLimiter(float64(r.n)/r.per.Seconds(), nil).SetIPLookups([]string{"RemoteAddr"})
		if r == denyRate {
			lmt.SetBurst(1) // its default burst is the per-second rate, here below 1
		}
		return tollbooth.LimitHandler(lmt, next)
	}},
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

// remoteAddrs returns n distinct client addresses as RemoteAddr strings.
func remoteAddrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = clientAddr(i).String()
	}
	return out
}

// BenchmarkPeersNetHTTP: ServeHTTP with a new httptest.NewRecorder per
// request (in every row), one *http.Request whose RemoteAddr is set to the
// next client's before each call.
func BenchmarkPeersNetHTTP(b *testing.B) { benchPeersNetHTTP(b, admitRate) }

// BenchmarkPeersNetHTTPDeny is BenchmarkPeersNetHTTP at denyRate: every
// timed request is answered 429 by the middleware ("bare" still answers
// "ok").
func BenchmarkPeersNetHTTPDeny(b *testing.B) { benchPeersNetHTTP(b, denyRate) }

func benchPeersNetHTTP(b *testing.B, rate peerRate) {
	benchNetHTTPRows(b, rate, func() func(http.Handler, *http.Request) {
		return func(h http.Handler, r *http.Request) { serveRecorded(h, r) }
	})
}

// ginPeers are the Gin rows, in table order: each a gin.Engine (gin.New,
// no logger or recovery) with its library's middleware in front of the
// handler of /x, served as an http.Handler.
var ginPeers = []netHTTPPeer{
	{"bare", func(_ testing.TB, next http.Handler, _ peerRate) http.Handler { return ginApp(next) }},
	{"limitplane", func(tb testing.TB, next http.Handler, r peerRate) http.Handler {
		eng, _, auth := keylessEngineAt(tb, r)
		return ginApp(next, lpgin.Middleware(eng, auth, lpgin.Options{API: "x"}))
	}},
	{"ulule", func(_ testing.TB, next http.Handler, r peerRate) http.Handler {
		lim := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: r.per, Limit: int64(r.n)})
		return ginApp(next, ululegin.NewMiddleware(lim))
	}},
}

// httpPeers are the rows served as an http.Handler, by framework.
var httpPeers = map[string][]netHTTPPeer{"net/http": netHTTPPeers, "gin": ginPeers}

// ginApp is a gin.Engine that runs mw, then next, for GET /x.
func ginApp(next http.Handler, mw ...gin.HandlerFunc) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	app := gin.New()
	app.Use(mw...)
	app.GET("/x", gin.WrapH(next))
	return app
}

// BenchmarkPeersGin is BenchmarkPeersNetHTTP for Gin: limitplane's Gin
// middleware beside ulule/limiter's Gin driver, each on its in-memory
// store (issue 24).
func BenchmarkPeersGin(b *testing.B) {
	benchRows(b, ginPeers, admitRate, func() func(http.Handler, *http.Request) {
		return func(h http.Handler, r *http.Request) { serveRecorded(h, r) }
	})
}

// BenchmarkPeersGinDeny is BenchmarkPeersGin at denyRate.
func BenchmarkPeersGinDeny(b *testing.B) {
	benchRows(b, ginPeers, denyRate, func() func(http.Handler, *http.Request) {
		return func(h http.Handler, r *http.Request) { serveRecorded(h, r) }
	})
}

// benchNetHTTPRows runs every net/http row at rate, serving each request
// with a server newServe makes for the row.
func benchNetHTTPRows(b *testing.B, rate peerRate, newServe func() func(http.Handler, *http.Request)) {
	benchRows(b, netHTTPPeers, rate, newServe)
}

// benchRows runs every row of peers at rate, serving each request with a
// server newServe makes for the row.
func benchRows(b *testing.B, peers []netHTTPPeer, rate peerRate, newServe func() func(http.Handler, *http.Request)) {
	for _, n := range peerShapes {
		addrs := remoteAddrs(n)
		for _, p := range peers {
			b.Run(fmt.Sprintf("keys=%d/%s", n, p.name), func(b *testing.B) {
				serveClients(b, p.wrap(b, okHandler(), rate), addrs, newServe())
			})
		}
	}
}

// serveClients times serve(h, r) for one request whose RemoteAddr cycles
// over addrs, every client's first request made before timing, and
// reports allocations and cpu-ns/op.
func serveClients(b *testing.B, h http.Handler, addrs []string, serve func(http.Handler, *http.Request)) {
	r := httptest.NewRequest("GET", "/x", nil)
	for _, a := range addrs { // every client known before timing
		r.RemoteAddr = a
		serve(h, r)
	}
	b.ReportAllocs()
	cpu := startCPU(b)
	i := 0
	for b.Loop() {
		r.RemoteAddr = addrs[i]
		if i++; i == len(addrs) {
			i = 0
		}
		serve(h, r)
	}
	cpu.report()
}

// peerRates are the two rates each benchmark that is not split into a
// Deny twin runs: admitted and denied.
var peerRates = []struct {
	name string
	r    peerRate
}{{"admit", admitRate}, {"deny", denyRate}}

// fiberPeer is one Fiber row: use adds its library's middleware to app.
type fiberPeer struct {
	name string
	use  func(tb testing.TB, app *fiber.App, r peerRate)
}

// fiberPeers are the Fiber rows, in table order.
var fiberPeers = []fiberPeer{
	{"bare", func(testing.TB, *fiber.App, peerRate) {}},
	{"limitplane", func(tb testing.TB, app *fiber.App, r peerRate) {
		eng, _, auth := keylessEngineAt(tb, r)
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "x"}))
	}},
	{"fiberlimiter", func(_ testing.TB, app *fiber.App, r peerRate) {
		app.Use(fiberlimiter.New(fiberlimiter.Config{Max: r.n, Expiration: r.per}))
	}},
}

func fiberPeerHandler(tb testing.TB, use func(testing.TB, *fiber.App, peerRate), r peerRate) fasthttp.RequestHandler {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	use(tb, app, r)
	app.Get("/x", func(c *fiber.Ctx) error { return c.SendString("ok") })
	return app.Handler()
}

func fiberPeerCtx() *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod("GET")
	req.SetRequestURI("/x")
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, clientAddr(0), nil)
	return ctx
}

// BenchmarkPeersFiber: app.Handler() on one fasthttp.RequestCtx, its
// response reset and its remote address set to the next client's before
// each call.
func BenchmarkPeersFiber(b *testing.B) { benchPeersFiber(b, admitRate) }

// BenchmarkPeersFiberDeny is BenchmarkPeersFiber at denyRate: every timed
// request is answered 429 by the middleware ("bare" still answers "ok").
func BenchmarkPeersFiberDeny(b *testing.B) { benchPeersFiber(b, denyRate) }

func benchPeersFiber(b *testing.B, rate peerRate) { benchFiberRows(b, fiberPeers, rate) }

// benchFiberRows runs every Fiber row of peers at rate.
func benchFiberRows(b *testing.B, peers []fiberPeer, rate peerRate) {
	for _, n := range peerShapes {
		addrs := make([]net.Addr, n)
		for i := range addrs {
			addrs[i] = clientAddr(i)
		}
		for _, p := range peers {
			b.Run(fmt.Sprintf("keys=%d/%s", n, p.name), func(b *testing.B) {
				h, ctx := fiberPeerHandler(b, p.use, rate), fiberPeerCtx()
				for _, a := range addrs {
					ctx.Response.Reset()
					ctx.SetRemoteAddr(a)
					h(ctx)
				}
				b.ReportAllocs()
				cpu := startCPU(b)
				i := 0
				for b.Loop() {
					ctx.Response.Reset()
					ctx.SetRemoteAddr(addrs[i])
					if i++; i == n {
						i = 0
					}
					h(ctx)
				}
				cpu.report()
			})
		}
	}
}

// peerRemaining names, for each limited row, the response header its
// library reports the client's remaining allowance in, and its values for
// requests from clients 1, 2 and 1 again. The window counters (ulule,
// httprate, Fiber's) count the second request of client 1 against its
// first; the buckets (limitplane's GCRA, tollbooth's x/time/rate) refill
// 10⁹ per second, so a client is full again a nanosecond after a request:
// limitplane reports the limit less the request it is answering,
// tollbooth reads its bucket after the take, refilled by then.
var peerRemaining = map[string]struct {
	header string
	want   [3]string
}{
	"limitplane":   {"RateLimit", [3]string{`"bench";r=999999999;t=1`, `"bench";r=999999999;t=1`, `"bench";r=999999999;t=1`}},
	"ulule":        {"X-RateLimit-Remaining", [3]string{"999999999", "999999999", "999999998"}},
	"httprate":     {"X-RateLimit-Remaining", [3]string{"999999999", "999999999", "999999998"}},
	"tollbooth":    {"RateLimit-Remaining", [3]string{"1000000000", "1000000000", "1000000000"}},
	"fiberlimiter": {"X-RateLimit-Remaining", [3]string{"999999999", "999999999", "999999998"}},
}

// TestPeerSetups checks that every row above answers 200 "ok" with its
// library's rate-limit fields (the window counters count each client
// apart), and that limitplane's store holds
// one entry per client after the 10,000-key warm-up: the benchmarks measure
// admitted, keyed requests.
func TestPeerSetups(t *testing.T) {
	addrs := remoteAddrs(3)
	for fw, peers := range httpPeers {
		for _, p := range peers {
			h := p.wrap(t, okHandler(), admitRate)
			r := httptest.NewRequest("GET", "/x", nil)
			var got []string
			for _, a := range []string{addrs[1], addrs[2], addrs[1]} {
				r.RemoteAddr = a
				w := serveRecorded(h, r)
				if w.Code != 200 || w.Body.String() != "ok" {
					t.Fatalf("%s %s: %d %q, want 200 \"ok\"", fw, p.name, w.Code, w.Body.String())
				}
				if want, ok := peerRemaining[p.name]; ok {
					got = append(got, w.Header().Get(want.header))
				}
			}
			checkRemaining(t, fw+" "+p.name, p.name, got)
		}
	}
	for _, p := range fiberPeers {
		h, ctx := fiberPeerHandler(t, p.use, admitRate), fiberPeerCtx()
		var got []string
		for _, i := range []int{1, 2, 1} {
			ctx.Response.Reset()
			ctx.SetRemoteAddr(clientAddr(i))
			h(ctx)
			if c, body := ctx.Response.StatusCode(), string(ctx.Response.Body()); c != 200 || body != "ok" {
				t.Fatalf("fiber %s: %d %q, want 200 \"ok\"", p.name, c, body)
			}
			if want, ok := peerRemaining[p.name]; ok {
				got = append(got, string(ctx.Response.Header.Peek(want.header)))
			}
		}
		checkRemaining(t, "fiber "+p.name, p.name, got)
	}

	eng, store, auth := keylessEngine(t)
	h := nethttp.Middleware(eng, auth, nethttp.Options{API: "x"})(okHandler())
	r := httptest.NewRequest("GET", "/x", nil)
	for _, a := range remoteAddrs(10_000) {
		r.RemoteAddr = a
		if w := serveRecorded(h, r); w.Code != 200 {
			t.Fatalf("%s: status %d", a, w.Code)
		}
	}
	if n := store.Len(); n != 10_000 {
		t.Fatalf("store holds %d entries after 10,000 clients, want 10000", n)
	}
}

// checkRemaining checks the remaining allowances got of requests from
// clients 1, 2, 1 against peerRemaining.
func checkRemaining(t *testing.T, row, name string, got []string) {
	t.Helper()
	want, ok := peerRemaining[name]
	if !ok {
		return
	}
	if len(got) != 3 || [3]string(got) != want.want {
		t.Errorf("%s: %s %q, want %q", row, want.header, got, want.want)
	}
}

// TestPeerDenials checks that, at denyRate, every limited row answers a
// client's second request 429 (limitplane with its Retry-After field and
// JSON body) and "bare" still 200: the deny benchmarks measure denials.
func TestPeerDenials(t *testing.T) {
	for fw, peers := range httpPeers {
		for _, p := range peers {
			h := p.wrap(t, okHandler(), denyRate)
			r := httptest.NewRequest("GET", "/x", nil)
			r.RemoteAddr = remoteAddrs(2)[1]
			serveRecorded(h, r)
			w := serveRecorded(h, r)
			want := http.StatusTooManyRequests
			if p.name == "bare" {
				want = http.StatusOK
			}
			if w.Code != want {
				t.Errorf("%s %s: second request %d, want %d", fw, p.name, w.Code, want)
			}
			if p.name == "limitplane" {
				if ra, body := w.Header().Get("Retry-After"), w.Body.String(); ra != "3600" || body != "{\"error\":\"rate limit exceeded\",\"retry_after_ms\":3600000}\n" {
					t.Errorf("%s limitplane: Retry-After %q, body %q", fw, ra, body)
				}
			}
		}
	}
	for _, p := range fiberPeers {
		h, ctx := fiberPeerHandler(t, p.use, denyRate), fiberPeerCtx()
		ctx.SetRemoteAddr(clientAddr(1))
		h(ctx)
		ctx.Response.Reset()
		h(ctx)
		want := fiber.StatusTooManyRequests
		if p.name == "bare" {
			want = fiber.StatusOK
		}
		if c := ctx.Response.StatusCode(); c != want {
			t.Errorf("fiber %s: second request %d, want %d", p.name, c, want)
		}
		if p.name == "limitplane" {
			if ra, body := string(ctx.Response.Header.Peek("Retry-After")), string(ctx.Response.Body()); ra != "3600" || body != "{\"error\":\"rate limit exceeded\",\"retry_after_ms\":3600000}\n" {
				t.Errorf("fiber limitplane: Retry-After %q, body %q", ra, body)
			}
		}
	}
}

// BenchmarkFiberDenyBody is what limitplane's JSON body costs on a Fiber
// denial: lpfiber.Write of a rendered denial on a fasthttp response, as
// rendered ("body") and with its Body set to nil ("nobody"; the status,
// the rate-limit fields and the body's two fields are written alike).
func BenchmarkFiberDenyBody(b *testing.B) {
	rend := response.NewRenderer(response.Options{})
	d := core.Decision{DecidedBy: core.KindRate, Limit: 1, ResetAfter: time.Hour, RetryAfter: time.Hour,
		Rate: core.Status{Policy: "bench", Limit: 1, Window: time.Hour, ResetAfter: time.Hour}}
	for _, body := range []bool{true, false} {
		name := "body"
		if !body {
			name = "nobody"
		}
		b.Run(name, func(b *testing.B) {
			app := fiber.New(fiber.Config{DisableStartupMessage: true})
			ctx := fiberPeerCtx()
			c := app.AcquireCtx(ctx)
			defer app.ReleaseCtx(c)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				var buf [8]response.Header
				res := rend.Render(buf[:0], d, nil)
				if !body {
					res.Body = nil
				}
				lpfiber.Write(c, res)
			}
		})
	}
}
