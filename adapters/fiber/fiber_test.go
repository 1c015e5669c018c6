package fiber_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// recorder is an Authenticator that keeps everything it reads, as a
// caching authenticator might, and a Limiter that keeps every cost.
type recorder struct {
	mu    sync.Mutex
	seen  [][]string // the strings themselves, not copies
	costs []int64
}

func (r *recorder) Authenticate(_ context.Context, q identity.Request) (*core.Consumer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := []string{q.Header("X-API-Key"), q.Query("q"), q.Cookie("c")}
	seen = append(seen, q.(identity.QueryValuer).QueryValues("q")...)
	r.seen = append(r.seen, append(seen, q.HeaderValues("X-Forwarded-For")...))
	if _, err := identity.PeerAddr(q); err != nil {
		return nil, err
	}
	return &core.Consumer{ID: "c"}, nil
}

func (r *recorder) Decide(_ context.Context, _ *core.Consumer, api string, cost int64) (core.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.costs = append(r.costs, cost)
	return core.Decision{Allowed: true}, nil
}

// TestRequestOutlivesHandler sends requests over one keep-alive connection,
// so fasthttp reuses its buffers between them, and checks that what the
// Authenticator kept from earlier requests is unchanged.
func TestRequestOutlivesHandler(t *testing.T) {
	rec := &recorder{}
	var decisions int
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(lpfiber.Middleware(rec, rec, lpfiber.Options{
		Cost:       func(c *fiber.Ctx) int64 { return int64(len(c.Query("q"))) },
		OnDecision: func(*fiber.Ctx, core.Decision, error) { decisions++ },
	}))
	app.Get("/", func(c *fiber.Ctx) error { return c.SendString("ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Listener(ln)
	defer app.Shutdown()

	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	var want [][]string
	for i, v := range []string{"aaaa", "bbbb", "cccc"} {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/?q="+v+"&q=2"+v, nil)
		req.Header.Set("X-API-Key", "key-"+v)
		req.Header.Add("X-Forwarded-For", "192.0.2."+fmt.Sprint(i))
		req.Header.Add("X-Forwarded-For", "198.51.100.1")
		req.AddCookie(&http.Cookie{Name: "c", Value: "cookie-" + v})
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want = append(want, []string{"key-" + v, v, "cookie-" + v, v, "2" + v, fmt.Sprint("192.0.2.", i), "198.51.100.1"})
	}
	if fmt.Sprint(rec.seen) != fmt.Sprint(want) {
		t.Fatalf("kept values changed:\n got %q\nwant %q", rec.seen, want)
	}
	if fmt.Sprint(rec.costs) != "[4 4 4]" || decisions != 3 {
		t.Fatalf("costs %v, %d decisions", rec.costs, decisions)
	}
}

// TestRemoteAddr checks that Request.RemoteAddr writes every kind of peer
// address as net.TCPAddr.String does, and a TCP peer in one allocation.
func TestRemoteAddr(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	cases := []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}, "192.0.2.1:40000"}, // 16-byte form
		{&net.TCPAddr{IP: net.IP{192, 0, 2, 1}, Port: 80}, "192.0.2.1:80"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 1}, "192.0.2.1:1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}, "[2001:db8::1]:443"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 443, Zone: "eth0"}, "[fe80::1%eth0]:443"},
		{&net.TCPAddr{Port: 8080}, ":8080"},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 70000}, "192.0.2.1:70000"},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "/tmp/s"},
	}
	for _, c := range cases {
		if c.addr.String() != c.want {
			t.Fatalf("case %q: net writes %q", c.want, c.addr.String())
		}
		fctx := new(fasthttp.RequestCtx)
		fctx.Init(new(fasthttp.Request), c.addr, nil)
		ctx := app.AcquireCtx(fctx)
		if got := (lpfiber.Request{C: ctx}).RemoteAddr(); got != c.want {
			t.Errorf("RemoteAddr of %#v: %q, want %q", c.addr, got, c.want)
		}
		app.ReleaseCtx(ctx)
	}
	fctx := new(fasthttp.RequestCtx)
	fctx.Init(new(fasthttp.Request), &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}, nil)
	ctx := app.AcquireCtx(fctx)
	defer app.ReleaseCtx(ctx)
	q := lpfiber.Request{C: ctx}
	if n := testing.AllocsPerRun(100, func() { q.RemoteAddr() }); n != 1 {
		t.Errorf("RemoteAddr of a TCP peer: %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { identity.PeerAddr(q) }); n != 0 {
		t.Errorf("identity.PeerAddr of a TCP peer: %v allocations, want 0", n)
	}
}

// remoteAddrOnly hides every method of a Request but identity.Request's,
// so identity.PeerAddr parses its RemoteAddr.
type remoteAddrOnly struct{ identity.Request }

// TestPeerAddr checks that Request.PeerAddr gives identity.PeerAddr the
// address, or the error, it parses from RemoteAddr, for every kind of peer.
func TestPeerAddr(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	cases := []struct {
		addr   net.Addr
		want   string // identity.PeerAddr's address, "" for an error
		direct bool   // PeerAddr answers without RemoteAddr
	}{
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}, "192.0.2.1", true},
		{&net.TCPAddr{IP: net.IP{192, 0, 2, 1}, Port: 80}, "192.0.2.1", true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 1}, "192.0.2.1", true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}, "2001:db8::1", true},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 443, Zone: "eth0"}, "fe80::1", false},
		{&net.TCPAddr{Port: 8080}, "", false},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 70000}, "", false},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: -1}, "", false},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "", false},
	}
	for _, c := range cases {
		fctx := new(fasthttp.RequestCtx)
		fctx.Init(new(fasthttp.Request), c.addr, nil)
		ctx := app.AcquireCtx(fctx)
		q := lpfiber.Request{C: ctx}
		a, err := identity.PeerAddr(q)
		pa, perr := identity.PeerAddr(remoteAddrOnly{q})
		got := ""
		if err == nil {
			got = a.String()
		}
		if got != c.want || a != pa || (err == nil) != (perr == nil) {
			t.Errorf("PeerAddr of %#v: %v, %v; parsed from RemoteAddr %v, %v; want %q", c.addr, a, err, pa, perr, c.want)
		}
		if _, ok := q.PeerAddr(); ok != c.direct {
			t.Errorf("Request.PeerAddr of %#v: ok %v, want %v", c.addr, ok, c.direct)
		}
		app.ReleaseCtx(ctx)
	}
}

// TestWriteSetsAsCtxSet checks that Write leaves the response header as
// c.Set would for every field, those it hands to fasthttp as they are and
// those it does not (a name fasthttp normalizes, a value with CR or LF, a
// field fasthttp treats specially), under both of Fiber's name settings.
func TestWriteSetsAsCtxSet(t *testing.T) {
	res := response.Result{Status: 429, Body: []byte("{}\n"), Headers: []response.Header{
		{Name: response.HeaderPolicy, Value: `"basic";q=5;w=60`},
		{Name: response.HeaderRateLimit, Value: `"basic";r=0;t=12`},
		{Name: response.HeaderRetryAfter, Value: "12"},
		{Name: response.HeaderXLimit, Value: "5"}, {Name: response.HeaderXRemaining, Value: "a\r\nb\nc\rd"}, {Name: response.HeaderXReset, Value: ""},
		{Name: "x-custom-field", Value: "v"}, {Name: "Content-Type", Value: "text/plain"}, {Name: "Server", Value: "s"},
	}}
	testWriteSetsAsCtxSet(t, "by hand", res, []string{"Ratelimit: \"basic\";r=0;t=12\r\n", "X-Ratelimit-Remaining: a  b c d\r\n", "Retry-After: 12\r\n", "X-Content-Type-Options: nosniff\r\n"})

	// Rendered answers (Canonical: set as they are), a policy ID with CR
	// and LF in it among them.
	rend := response.NewRenderer(response.Options{XRateLimit: true, XRateLimitReset: response.ResetSeconds})
	st := core.Status{Policy: "basic\r\nX: y", Limit: 5, ResetAfter: 12 * time.Second, Window: time.Minute}
	var s response.Scratch
	denied := rend.RenderScratch(&s, core.Decision{DecidedBy: core.KindRate, Limit: 5, ResetAfter: 12 * time.Second, RetryAfter: 12 * time.Second, Rate: st}, nil)
	testWriteSetsAsCtxSet(t, "denied", denied, []string{
		"Ratelimit-Policy: \"basic__X: y\";q=5;w=60\r\n", "Ratelimit: \"basic__X: y\";r=0;t=12\r\n", "X-Ratelimit-Limit: 5\r\n",
		"X-Ratelimit-Remaining: 0\r\n", "X-Ratelimit-Reset: 12\r\n", "Retry-After: 12\r\n", "Content-Type: application/json\r\n",
		"X-Content-Type-Options: nosniff\r\n", "\r\n\r\n{\"error\":\"rate limit exceeded\",\"retry_after_ms\":12000}\n"})
	st.Remaining = 4
	admitted := rend.RenderScratch(&s, core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 5, Remaining: 4, ResetAfter: 12 * time.Second, Rate: st}, nil)
	testWriteSetsAsCtxSet(t, "admitted", admitted, []string{"Ratelimit: \"basic__X: y\";r=4;t=12\r\n", "X-Ratelimit-Remaining: 4\r\n"})
	failed := rend.RenderScratch(&s, core.Decision{}, &identity.Error{Status: 403, Kind: identity.ErrInvalidCredentials, Reason: "unknown API key"})
	testWriteSetsAsCtxSet(t, "403", failed, []string{"HTTP/1.1 403 Forbidden\r\n", "Content-Type: application/json\r\n", "\r\n\r\n{\"error\":\"unknown API key\"}\n"})
}

// testWriteSetsAsCtxSet checks that lpfiber.Write writes res as c.Set
// writes it, byte for byte, with Fiber's header normalizing on and off,
// and that the response holds each of lines.
func testWriteSetsAsCtxSet(t *testing.T, name string, res response.Result, lines []string) {
	t.Helper()
	for _, disable := range []bool{false, true} {
		app := fiber.New(fiber.Config{DisableStartupMessage: true, DisableHeaderNormalizing: disable})
		render := func(write func(*fiber.Ctx)) string {
			fctx := new(fasthttp.RequestCtx)
			fctx.Init(new(fasthttp.Request), &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}, nil)
			ctx := app.AcquireCtx(fctx)
			defer app.ReleaseCtx(ctx)
			write(ctx)
			return ctx.Response().String()
		}
		got := render(func(c *fiber.Ctx) {
			if lpfiber.Write(c, res) != res.Pass {
				t.Fatalf("%s: Write's pass is not %v", name, res.Pass)
			}
		})
		want := render(func(c *fiber.Ctx) {
			for _, f := range res.Headers {
				c.Set(f.Name, f.Value)
			}
			if res.Pass {
				return
			}
			for _, f := range response.BodyHeaders() {
				c.Set(f.Name, f.Value)
			}
			c.Status(res.Status)
			c.Response().SetBody(res.Body)
		})
		if got != want {
			t.Errorf("%s, DisableHeaderNormalizing %v: Write wrote\n%s\nc.Set writes\n%s", name, disable, got, want)
		}
		for _, line := range lines {
			if !strings.Contains(got, line) {
				t.Errorf("%s, DisableHeaderNormalizing %v: no %q in\n%s", name, disable, line, got)
			}
		}
	}
}

// keylessApp is a Fiber app behind the middleware on a keyless API whose
// clients may make 3 requests an hour each, on the memory store.
func keylessApp(t *testing.T) fasthttp.RequestHandler {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "ip", Rate: core.Limit{Rate: 3, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(lpfiber.Middleware(eng, &identity.Keyless{Policies: []string{"ip"}}, lpfiber.Options{}))
	app.Get("/", func(c *fiber.Ctx) error { return c.SendString("ok") })
	return app.Handler()
}

func keylessCtx(i int) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.SetRequestURI("/")
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, byte(i>>8), byte(i)), Port: 40000}, nil)
	return ctx
}

// Clients answered at once, each consumer written into memory the next
// request reuses, are still counted apart: each gets exactly its 3
// requests, with the exact fields, and then the exact 429.
func TestKeylessClientsConcurrently(t *testing.T) {
	h := keylessApp(t)
	const clients = 64
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := keylessCtx(g)
			for i := range 4 {
				ctx.Response.Reset()
				h(ctx)
				res := &ctx.Response
				got := fmt.Sprintf("%d %s|%s|%s|%s", res.StatusCode(), res.Header.Peek("Ratelimit-Policy"),
					res.Header.Peek("Ratelimit"), res.Header.Peek("Retry-After"), res.Body())
				want := fmt.Sprintf(`200 "ip";q=3;w=3600|"ip";r=%d;t=%d||ok`, 2-i, 1200*(i+1))
				if i == 3 {
					want = `429 "ip";q=3;w=3600|"ip";r=0;t=1200|1200|{"error":"rate limit exceeded","retry_after_ms":1200000}` + "\n"
				}
				if got != want {
					t.Errorf("client %d, request %d: %s, want %s", g, i+1, got, want)
				}
			}
		}()
	}
	wg.Wait()
}

// An admitted request and a denial on a keyless API allocate nothing in
// the middleware: as many allocations as the same app without it.
func TestKeylessAllocations(t *testing.T) {
	bare := fiber.New(fiber.Config{DisableStartupMessage: true})
	bare.Get("/", func(c *fiber.Ctx) error { return c.SendString("ok") })
	bh, bctx := bare.Handler(), keylessCtx(999)
	bh(bctx)
	base := testing.AllocsPerRun(200, func() {
		bctx.Response.Reset()
		bh(bctx)
	})
	h := keylessApp(t)
	for _, tc := range []struct {
		name   string
		before int
		status int
	}{{"admitted", 0, 200}, {"denied", 3, 429}} {
		ctx := keylessCtx(1000 + tc.before)
		for range tc.before {
			h(ctx)
		}
		h(ctx) // warm the policy cache and Fiber's pools
		if ctx.Response.StatusCode() != tc.status && tc.before > 0 {
			t.Fatalf("%s: status %d", tc.name, ctx.Response.StatusCode())
		}
		n := testing.AllocsPerRun(200, func() {
			ctx.Response.Reset()
			h(ctx)
		})
		if c := ctx.Response.StatusCode(); c != 429 && tc.before > 0 {
			t.Fatalf("%s: status %d", tc.name, c)
		}
		if n != base {
			t.Errorf("%s: %v allocations per request, want %v (Fiber's own)", tc.name, n, base)
		}
	}
}

// apiKeyApp is a Fiber app behind the middleware with identity.APIKey over
// one known key ("good-key", policy "k", 100 requests an hour).
func apiKeyApp(t *testing.T) fasthttp.RequestHandler {
	t.Helper()
	app := apiKeyFiber(t)
	app.Get("/", func(c *fiber.Ctx) error { return c.SendString("ok") })
	return app.Handler()
}

// apiKeyFiber is a Fiber app whose middleware admits the key "good-key"
// (100 an hour on a manual clock) and refuses any other.
func apiKeyFiber(t *testing.T) *fiber.App {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "k", Rate: core.Limit{Rate: 100, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("good-key"), Policies: []string{"k"}}})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(lpfiber.Middleware(eng, identity.NewAPIKey(keys, identity.APIKeyOptions{}), lpfiber.Options{}))
	return app
}

// TestAPIKeyRefusals checks the exact answers of the key check on Fiber,
// which reads the key through Request's identity.Peeker methods (no copy),
// and the allocations of a refusal repeated: an unknown key (64 bytes,
// over the 32 that []byte(key) could keep on the stack) refused again
// allocates only its *identity.Error; a key header given twice, the error
// and its reason.
func TestAPIKeyRefusals(t *testing.T) {
	h := apiKeyApp(t)
	unknown := strings.Repeat("u", 64)
	for _, tc := range []struct {
		name   string
		header [][2]string
		uri    string
		status int
		body   string
		allocs float64
	}{
		{"unknown key", [][2]string{{"X-API-Key", unknown}}, "/", 403, `{"error":"unknown API key"}` + "\n", 1},
		{"unknown bearer key", [][2]string{{"Authorization", "Bearer " + unknown}}, "/", 403, `{"error":"unknown API key"}` + "\n", 1},
		{"unknown query key", nil, "/?api_key=" + unknown, 403, `{"error":"unknown API key"}` + "\n", 1},
		{"key header twice", [][2]string{{"X-API-Key", unknown}, {"X-API-Key", unknown}}, "/", 401,
			`{"error":"ambiguous credentials: more than one X-API-Key header"}` + "\n", 2},
		{"query key twice", nil, "/?api_key=a&api_key=a", 401,
			`{"error":"ambiguous credentials: more than one api_key query parameter"}` + "\n", 2},
		{"header and query differ", [][2]string{{"X-API-Key", "good-key"}}, "/?api_key=other", 401,
			`{"error":"ambiguous credentials: X-API-Key header and api_key query parameter differ"}` + "\n", 2},
		{"no key", nil, "/", 401, `{"error":"no API key"}` + "\n", 1},
		{"good key", [][2]string{{"X-API-Key", " good-key "}}, "/?api_key=good-key", 200, "ok", 0},
	} {
		var req fasthttp.Request
		req.Header.SetMethod("GET") // else fasthttp allocates "GET" per Method()
		req.SetRequestURI(tc.uri)
		for _, kv := range tc.header {
			req.Header.Add(kv[0], kv[1])
		}
		ctx := new(fasthttp.RequestCtx)
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 40000}, nil)
		h(ctx)
		if c, b := ctx.Response.StatusCode(), string(ctx.Response.Body()); c != tc.status || b != tc.body {
			t.Errorf("%s: %d %q, want %d %q", tc.name, c, b, tc.status, tc.body)
		}
		n := testing.AllocsPerRun(200, func() {
			ctx.Response.Reset()
			h(ctx)
		})
		if n != tc.allocs && !raceEnabled {
			t.Errorf("%s: %v allocations per request, want %v", tc.name, n, tc.allocs)
		}
	}
}

// TestPeekAgreesWithValues checks Request's identity.Peeker methods
// against HeaderValues and QueryValues: the first value and the count,
// for absent, empty, single and repeated headers and query parameters.
func TestPeekAgreesWithValues(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	for _, tc := range []struct {
		uri    string
		header [][2]string
	}{
		{"/", nil},
		{"/?k=", [][2]string{{"K", ""}}},
		{"/?k=a%20b&x=1", [][2]string{{"K", " a b "}}},
		{"/?k=a&k=b&k", [][2]string{{"K", "a"}, {"k", "b"}}},
		{"/?K=a&k", [][2]string{{"k", "a"}, {"X", "b"}, {"K", ""}}},
	} {
		var req fasthttp.Request
		req.SetRequestURI(tc.uri)
		for _, kv := range tc.header {
			req.Header.Add(kv[0], kv[1])
		}
		ctx := new(fasthttp.RequestCtx)
		ctx.Init(&req, nil, nil)
		c := app.AcquireCtx(ctx)
		q := lpfiber.Request{C: c}
		hv, qv := q.HeaderValues("K"), q.QueryValues("k")
		first := func(vs []string) string {
			if len(vs) == 0 {
				return ""
			}
			return vs[0]
		}
		if v, n := q.PeekHeader("K"); v != first(hv) || n != len(hv) {
			t.Errorf("%s %q: PeekHeader %q %d, HeaderValues %q", tc.uri, tc.header, v, n, hv)
		}
		if v, n := q.PeekQuery("k"); v != first(qv) || n != len(qv) {
			t.Errorf("%s: PeekQuery %q %d, QueryValues %q", tc.uri, v, n, qv)
		}
		if n := testing.AllocsPerRun(100, func() { q.PeekHeader("K"); q.PeekQuery("k") }); n != 0 {
			t.Errorf("%s: Peek allocates %v", tc.uri, n)
		}
		app.ReleaseCtx(c)
	}
}

// TestKeylessDenialBytes: the whole response to a keyless client over its
// limit, and to an admitted one, byte for byte (as at 4afa043, before the
// rendering and writing were made cheaper).
func TestKeylessDenialBytes(t *testing.T) {
	h := keylessApp(t)
	ctx := keylessCtx(7)
	ctx.Request.Header.SetMethod("GET")
	want := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\nRatelimit-Policy: \"ip\";q=3;w=3600\r\nRatelimit: \"ip\";r=2;t=1200\r\n\r\nok",
		"", "",
		"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 57\r\nRatelimit-Policy: \"ip\";q=3;w=3600\r\nRatelimit: \"ip\";r=0;t=1200\r\nRetry-After: 1200\r\nX-Content-Type-Options: nosniff\r\n\r\n" +
			`{"error":"rate limit exceeded","retry_after_ms":1200000}` + "\n",
	}
	for i, w := range want {
		ctx.Response.Reset()
		h(ctx)
		got := ctx.Response.String()
		if d := strings.Index(got, "\r\nDate: "); d > 0 { // fasthttp's, of the wall clock
			got = got[:d] + got[d+len("\r\nDate: Sun, 06 Dec 2026 21:27:17 GMT"):]
		}
		if w != "" && got != w {
			t.Errorf("request %d:\n got %q\nwant %q", i+1, got, w)
		}
	}
}

// ctxDecider records the context each decision is asked with.
type ctxDecider struct{ got []context.Context }

func (d *ctxDecider) Decide(ctx context.Context, _ *core.Consumer, _ string, _ int64) (core.Decision, error) {
	d.got = append(d.got, ctx)
	return core.Decision{Allowed: true}, nil
}

type ctxKey struct{}

// TestUserContext: the decider is asked with the user context an earlier
// handler set, its values and its cancellation, also among other user
// values (Locals); with none set, context.Background, and the request's
// own c.UserContext() is still context.Background.
func TestUserContext(t *testing.T) {
	dec := &ctxDecider{}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	cancelled, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "set"))
	cancel()
	app.Use(func(c *fiber.Ctx) error {
		if c.Get("X-Local") != "" {
			c.Locals("other", 1)
		}
		if c.Get("X-Set") != "" {
			c.SetUserContext(cancelled)
		}
		return c.Next()
	})
	app.Use(lpfiber.Middleware(dec, &identity.Keyless{}, lpfiber.Options{}))
	var after []context.Context
	app.Get("/", func(c *fiber.Ctx) error {
		after = append(after, c.UserContext())
		return nil
	})
	h := app.Handler()
	for i, hdr := range [][2]string{{}, {"X-Local", "1"}, {"X-Set", "1"}, {"X-Set", "1"}} {
		ctx := keylessCtx(i)
		if i == 3 {
			ctx.Request.Header.Set("X-Local", "1")
		}
		if hdr[0] != "" {
			ctx.Request.Header.Set(hdr[0], hdr[1])
		}
		h(ctx)
		if ctx.Response.StatusCode() != http.StatusOK {
			t.Fatalf("request %d: status %d", i, ctx.Response.StatusCode())
		}
	}
	if len(dec.got) != 4 {
		t.Fatalf("%d decisions, want 4", len(dec.got))
	}
	for i, ctx := range dec.got {
		if set := i >= 2; set {
			if ctx.Value(ctxKey{}) != "set" || ctx.Err() != context.Canceled {
				t.Errorf("request %d: decided with %v (value %v, err %v), want the user context set", i, ctx, ctx.Value(ctxKey{}), ctx.Err())
			}
		} else if ctx != context.Background() || after[i] != context.Background() {
			t.Errorf("request %d: decided with %v, handler's UserContext %v, want context.Background", i, ctx, after[i])
		}
	}
}

// TestTrailerFieldsAreNoHeaderFields: fasthttp adds a chunked request's
// trailer fields to its header once the body is read; Request reads the
// header section only, so a key sent in a trailer authenticates nothing
// (401 "no API key"), a key in both places is one key (not "more than
// one X-API-Key header"), and a trailer's X-Forwarded-For or other field
// is no header value. Real requests over TCP.
func TestTrailerFieldsAreNoHeaderFields(t *testing.T) {
	app := apiKeyFiber(t)
	app.Post("/", func(c *fiber.Ctx) error {
		q := lpfiber.Request{C: c}
		return c.SendString(fmt.Sprintf("xff=%q t=%q", q.HeaderValues("X-Forwarded-For"), q.Header("X-T")))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Listener(ln)
	defer app.Shutdown()
	for _, tc := range []struct{ name, header, trailer, want string }{
		{"key in the trailer only", "", "X-API-Key: good-key\r\n", "401 {\"error\":\"no API key\"}\n"},
		{"key in both", "X-API-Key: good-key\r\n", "X-API-Key: good-key\r\nX-Forwarded-For: 10.9.9.9\r\nX-T: v\r\n",
			`200 xff=["192.0.2.1"] t=""`},
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: 192.0.2.1\r\n%sConnection: close\r\n\r\n5\r\nhello\r\n0\r\n%s\r\n", tc.header, tc.trailer)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if got := fmt.Sprintf("%d %s", resp.StatusCode, body); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
