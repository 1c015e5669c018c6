package adapters

// Each benchmark has two sub-benchmarks over the same request: "bare" (the
// framework and handler alone) and "limitplane" (the same, behind the
// adapter). Compare them with benchstat; README.md ("Adapter overhead") has
// the numbers.
//
//	net/http, Gin: ServeHTTP with httptest.NewRecorder per request.
//	Fiber:         app.Handler() on one reused fasthttp.RequestCtx, reset
//	               per request as fasthttp does (app.Test would measure a
//	               whole in-memory connection instead).
//	gRPC:          the unary interceptor called directly with a handler
//	               that returns at once, on a context carrying incoming
//	               metadata, a peer and a server transport stream (so
//	               grpc.SetHeader works as in a server).

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

const key = "bench-key-0123456789"

// wantPolicy is the RateLimit-Policy field of every allowed request:
// T = 1ns and a burst of 1e9, which no benchmark can spend.
const wantPolicy = `"bench";q=1000000000;w=1`

// limiter returns an engine over a fresh in-memory store whose only policy
// admits every request a benchmark can make, and an API-key authenticator
// knowing key.
func limiter(tb testing.TB) (*core.Engine, identity.Authenticator) {
	tb.Helper()
	store := memory.New(memory.Options{})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "bench", Rate: core.Limit{Rate: 1_000_000_000, Period: time.Second}},
	}}, core.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey(key), Policies: []string{"bench"}}})
	if err != nil {
		tb.Fatal(err)
	}
	return eng, identity.NewAPIKey(keys, identity.APIKeyOptions{})
}

func newRequest() *http.Request {
	r := httptest.NewRequest("GET", "/x", nil)
	r.Header.Set("X-API-Key", key)
	return r
}

// net/http

func netHTTPHandler(limited bool, tb testing.TB) http.Handler {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	if limited {
		eng, auth := limiter(tb)
		h = nethttp.Middleware(eng, auth, nethttp.Options{API: "x"})(h)
	}
	return h
}

func serveRecorded(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func BenchmarkNetHTTP(b *testing.B) {
	for _, limited := range []bool{false, true} {
		b.Run(variant(limited), func(b *testing.B) {
			h, r := netHTTPHandler(limited, b), newRequest()
			b.ReportAllocs()
			for b.Loop() {
				serveRecorded(h, r)
			}
		})
	}
}

// Gin

func ginEngine(limited bool, tb testing.TB) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	if limited {
		eng, auth := limiter(tb)
		e.Use(lpgin.Middleware(eng, auth, lpgin.Options{API: "x"}))
	}
	e.GET("/x", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
	return e
}

func BenchmarkGin(b *testing.B) {
	for _, limited := range []bool{false, true} {
		b.Run(variant(limited), func(b *testing.B) {
			h, r := ginEngine(limited, b), newRequest()
			b.ReportAllocs()
			for b.Loop() {
				serveRecorded(h, r)
			}
		})
	}
}

// Fiber

func fiberHandler(limited bool, tb testing.TB) fasthttp.RequestHandler {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	if limited {
		eng, auth := limiter(tb)
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "x"}))
	}
	app.Get("/x", func(c *fiber.Ctx) error { return c.SendString("ok") })
	return app.Handler()
}

func newFiberCtx() *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod("GET")
	req.SetRequestURI("/x")
	req.Header.Set("X-API-Key", key)
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	return ctx
}

func BenchmarkFiber(b *testing.B) {
	for _, limited := range []bool{false, true} {
		b.Run(variant(limited), func(b *testing.B) {
			h, ctx := fiberHandler(limited, b), newFiberCtx()
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				h(ctx)
			}
		})
	}
}

// gRPC

// transportStream is the minimal grpc.ServerTransportStream a unary call's
// context carries; it keeps the header metadata as a server would until it
// is sent.
type transportStream struct{ header metadata.MD }

func (s *transportStream) Method() string { return "/bench.Service/Call" }
func (s *transportStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}
func (s *transportStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }
func (s *transportStream) SetTrailer(metadata.MD) error    { return nil }

func grpcCall(limited bool, tb testing.TB) (func() (any, error), *transportStream) {
	return grpcCallOpts(limited, lpgrpc.Options{}, tb)
}

func grpcCallOpts(limited bool, opts lpgrpc.Options, tb testing.TB) (func() (any, error), *transportStream) {
	if !limited {
		return grpcUnary(nil)
	}
	eng, auth := limiter(tb)
	return grpcUnary(lpgrpc.UnaryServerInterceptor(eng, auth, opts))
}

// grpcUnary returns a unary call through icpt (the handler alone when
// icpt is nil), on a context as a server gives one (the API key in the
// incoming metadata, a peer, a transport stream), and its stream.
func grpcUnary(icpt grpc.UnaryServerInterceptor) (func() (any, error), *transportStream) {
	ts := &transportStream{}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", key))
	ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}})
	ctx = grpc.NewContextWithServerTransportStream(ctx, ts)
	info := &grpc.UnaryServerInfo{FullMethod: ts.Method()}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	req := new(int)
	if icpt == nil {
		return func() (any, error) { return handler(ctx, req) }, ts
	}
	return func() (any, error) { return icpt(ctx, req, info, handler) }, ts
}

// BenchmarkGRPCUnary also runs "limitplane-nofields": the interceptor with
// response.Options{NoRateLimitFields: true}, which sends no header metadata
// on allowed calls, to show what the metadata costs (grpc.SetHeader copies
// it with metadata.Join).
func BenchmarkGRPCUnary(b *testing.B) {
	run := func(name string, call func() (any, error), ts *transportStream) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ts.header = nil // a new call
				call()
			}
		})
	}
	for _, limited := range []bool{false, true} {
		call, ts := grpcCall(limited, b)
		run(variant(limited), call, ts)
	}
	call, ts := grpcCallOpts(true, lpgrpc.Options{Renderer: response.NewRenderer(response.Options{NoRateLimitFields: true})}, b)
	run("limitplane-nofields", call, ts)
}

func variant(limited bool) string {
	if limited {
		return "limitplane"
	}
	return "bare"
}

// TestSetups checks that every limited setup above takes the allowed path
// and answers with the rate-limit fields, so the benchmarks measure what
// they claim to.
func TestSetups(t *testing.T) {
	check := func(name, status, policy string) {
		t.Helper()
		if status != "200" || policy != wantPolicy {
			t.Errorf("%s: status %s, RateLimit-Policy %q; want 200 and %q", name, status, policy, wantPolicy)
		}
	}
	w := serveRecorded(netHTTPHandler(true, t), newRequest())
	check("net/http", strconv.Itoa(w.Code), w.Header().Get("RateLimit-Policy"))
	w = serveRecorded(ginEngine(true, t), newRequest())
	check("gin", strconv.Itoa(w.Code), w.Header().Get("RateLimit-Policy"))
	ctx := newFiberCtx()
	fiberHandler(true, t)(ctx)
	check("fiber", strconv.Itoa(ctx.Response.StatusCode()), string(ctx.Response.Header.Peek("RateLimit-Policy")))
	call, ts := grpcCall(true, t)
	resp, err := call()
	status := "200"
	if err != nil || resp == nil {
		status = "error " + err.Error()
	}
	check("grpc", status, first(ts.header.Get("ratelimit-policy")))
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// BenchmarkParts times the shared steps every adapter takes, alone: API
// key authentication (extract, SHA-256, registry lookup), the engine's
// decision (memory store, one key) and rendering the rate-limit fields.
func BenchmarkParts(b *testing.B) {
	eng, auth := limiter(b)
	req := nethttp.Request{R: newRequest()}
	ctx := context.Background()
	c, err := auth.Authenticate(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("authenticate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			auth.Authenticate(ctx, req)
		}
	})
	b.Run("decide", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			eng.Decide(ctx, c, "x", 1)
		}
	})
	d, _ := eng.Decide(ctx, c, "x", 1)
	rend := response.NewRenderer(response.Options{})
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		var buf [8]response.Header
		for b.Loop() {
			rend.Render(buf[:0], d, nil)
		}
	})
}

// BenchmarkGRPCUnaryDeny times the unary interceptor denying a call (API
// key, a policy of 1 call an hour already spent, on a manual clock):
// "again" says what the previous denial said (the same RetryInfo: a denial
// storm within a millisecond), "anew" advances the clock a millisecond
// before each call, so every denial's RetryInfo differs and its status is
// built.
func BenchmarkGRPCUnaryDeny(b *testing.B) {
	for _, tc := range []struct {
		name    string
		advance time.Duration
	}{{"again", 0}, {"anew", time.Millisecond}} {
		b.Run(tc.name, func(b *testing.B) {
			call, ts, clock := grpcDenyCall(b)
			b.ReportAllocs()
			for b.Loop() {
				ts.header = nil // a new call
				clock.Advance(tc.advance)
				call()
			}
		})
	}
}

// grpcDenyCall returns a unary call that the interceptor denies, its
// transport stream and the engine's clock.
func grpcDenyCall(tb testing.TB) (func() (any, error), *transportStream, *core.ManualClock) {
	tb.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
		{ID: "bench", Rate: core.Limit{Rate: 1, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	_, auth := limiter(tb)
	call, ts := grpcUnary(lpgrpc.UnaryServerInterceptor(eng, auth, lpgrpc.Options{}))
	if _, err := call(); err != nil {
		tb.Fatalf("first call: %v", err)
	}
	if _, err := call(); err == nil {
		tb.Fatal("second call admitted, want a denial")
	}
	return call, ts, clock
}
