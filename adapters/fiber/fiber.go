// Package fiber is limitplane's Fiber v2 middleware: the same identity,
// decision, header fields and 401/403/429/503 answers as adapters/nethttp,
// rendered by adapters/response, as a fiber.Handler.
//
// Import it under a name that does not clash with Fiber itself:
//
//	import lpfiber "github.com/limitplane/limitplane/adapters/fiber"
//
//	app := fiber.New()
//	app.Use(lpfiber.Middleware(engine, auth, lpfiber.Options{API: "orders"}))
package fiber

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/gofiber/fiber/v2"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	"github.com/limitplane/limitplane/adapters/internal/admit"
	"github.com/limitplane/limitplane/adapters/internal/fastresp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// Options configure the middleware. The zero value limits every request at
// cost 1 under API "" with the default Renderer.
type Options struct {
	// API is the API ID the engine decides for (policies may be scoped to
	// APIs).
	API string
	// Cost returns a request's cost; nil means 1. An endpoint with a
	// cost of its own overrides it (core.Endpoint.Cost). 0 admits the
	// request without spending anything (a peek, core.Request.Cost); a
	// cost below 0 or above core.MaxCost is answered 400 ("invalid
	// request cost"), so clamp what comes from the request.
	Cost func(*fiber.Ctx) int64
	// CostHeader, when it names a header, reads a request's cost from
	// it (core.CostHeader: bounded, a malformed value answered 400 with
	// a JSON body naming the header, before authentication, nothing
	// counted); a request without it costs what Cost says. When Name is
	// "" and l is a core.CostHeaderSource (a data-plane member's
	// Limiter), the header of the running API definition is read.
	CostHeader core.CostHeader
	// Route, when set, says where a request goes within API, so that a
	// core.RouteDecider (an engine with endpoints, the Limiter(api) of a
	// data-plane member) decides it at the endpoint it matches: PathRoute
	// (the request's method and path; for middleware given to Use) or
	// RoutePathRoute (the route's path, "/orders/:id"; for middleware
	// given to the route itself). nil decides every request for the API
	// as a whole (Decide).
	Route func(*fiber.Ctx) core.Route
	// Renderer renders answers; nil means response.NewRenderer with zero
	// Options.
	Renderer *response.Renderer
	// OnDecision, if set, is called once per request with the decision or
	// error (for metrics and logs). It must not retain c.
	OnDecision func(c *fiber.Ctx, d core.Decision, err error)
	// SettleHeader, when set, names the response header (or trailer) in
	// which the handler (or the upstream) gives a request's actual cost,
	// e.g. "X-Usage-Tokens": once the handler returns, a policy that
	// settles (core.Policy.Settle) charges or refunds the difference from
	// the estimate (the request's cost) in the quota period it charged. A
	// response without it, or with a value that is not an integer in
	// [0, 2^53), keeps the estimate.
	SettleHeader string
}

// Middleware returns Fiber middleware that authenticates each request with
// auth and limits it with l. An allowed request goes on to the next handler
// with the rate-limit fields already set on its response; any other answer
// (429, 401, 403, 503) is sent with its JSON body and the chain stops.
// Requests that fail authentication never reach the engine, so they create
// no limiter state.
//
// The engine is asked with c.UserContext(), which is context.Background
// unless an earlier handler set one (c.SetUserContext); when none was set,
// the middleware does not store the context.Background it uses.
//
// l is any core.Decider: a *core.Engine, or the Limiter(api) of a
// data-plane member (live.Config, dataplane.Follower). Middleware panics
// when l or auth is nil.
func Middleware(l core.Decider, auth identity.Authenticator, opts Options) fiber.Handler {
	admit.Require("fiber.Middleware", l, auth)
	rend := opts.Renderer
	if rend == nil {
		rend = response.NewRenderer(response.Options{})
	}
	// fasthttp copies every header value and the body it is given, so a
	// request's consumer and answer are rendered into memory reused by
	// later requests.
	pool := &sync.Pool{New: func() any { return new(scratch) }}
	// A request can give its cost in a header only when opts names one or
	// l may know one for the API (admit.HeaderCost finds none otherwise).
	readCost := admit.ReadsCostHeader(l, opts.CostHeader)
	return func(c *fiber.Ctx) error {
		ctx := userContext(c)
		var cost func() int64
		if opts.Cost != nil {
			cost = func() int64 { return opts.Cost(c) }
		}
		if readCost {
			if n, err := admit.HeaderCost(l, opts.API, opts.CostHeader, Request{c}.HeaderValues); err != nil {
				if opts.OnDecision != nil {
					opts.OnDecision(c, core.Decision{}, err)
				}
				Write(c, rend.Render(nil, core.Decision{}, err))
				return nil
			} else if n > 0 {
				cost = func() int64 { return n }
			}
		}
		var route func() core.Route
		if opts.Route != nil {
			route = func() core.Route { return opts.Route(c) }
		}
		s := pool.Get().(*scratch)
		var d core.Decision
		err := admit.DecideInto(ctx, l, auth, Request{c}, opts.API, route, cost, &s.consumer, &d)
		if opts.OnDecision != nil {
			opts.OnDecision(c, d, err)
		}
		pass := fastresp.Write(c.Response(), rend.RenderDecision(&s.answer, &d, err))
		pool.Put(s)
		if !pass {
			return nil
		}
		// The in-flight slot is held until the rest of the chain returns,
		// however it ends (a panic too).
		defer d.Hold.Release()
		err = c.Next()
		if opts.SettleHeader != "" && d.Hold.Held() {
			admit.Finish(d.Hold, string(c.Response().Header.Peek(opts.SettleHeader)))
		}
		return err
	}
}

// userContext is c.UserContext() without what that does when no user
// context was set: store the context.Background it returns among the
// request's user values, for a later call to find. Fiber keeps a user
// context there (SetUserContext), so a request without user values has
// none, and its context is context.Background; one with user values is
// asked c.UserContext(). TestUserContext checks that an earlier handler's
// context (its values, its cancellation) still reaches the decider.
func userContext(c *fiber.Ctx) context.Context {
	none := true
	c.Context().VisitUserValuesAll(func(any, any) { none = false })
	if none {
		return context.Background()
	}
	return c.UserContext()
}

// PathRoute is an Options.Route: the request's method and path
// (c.Path(), as Fiber routes it).
func PathRoute(c *fiber.Ctx) core.Route {
	return core.Route{Method: c.Method(), Path: c.Path()}
}

// RoutePathRoute is an Options.Route for middleware given to a route
// (app.Get("/orders/:id", mw, h)): the request's method and the route's
// path, its parameters written as an endpoint's (":id", ":id?", "*" and
// "+" segments as {param}), so that an endpoint's {param} segments match
// them. In middleware given to Use, c.Route() is the Use's own route:
// use PathRoute there.
func RoutePathRoute(c *fiber.Ctx) core.Route {
	p := c.Route().Path
	if strings.ContainsAny(p, ":*+") {
		segs := strings.Split(p, "/")
		for i, s := range segs {
			if len(s) > 0 && (s[0] == ':' || s[0] == '*' || s[0] == '+') {
				segs[i] = "{p" + strconv.Itoa(i) + "}"
			}
		}
		p = strings.Join(segs, "/")
	}
	return core.Route{Method: c.Method(), Path: p}
}

// scratch is one request's memory in Middleware.
type scratch struct {
	consumer admit.Consumer
	answer   response.Scratch
}

// Write sets res's header fields on c's response and, when res does not
// pass, its status and JSON body. It reports whether the request should go
// on to the next handler. It is adapters/fasthttp's Write on c's
// response.
func Write(c *fiber.Ctx, res response.Result) bool {
	return fastresp.Write(c.Response(), &res)
}

// Request adapts *fiber.Ctx to identity.Request.
//
// fasthttp reuses its request buffers once the handler returns, and Fiber's
// getters return strings that point into them. Every method of
// identity.Request therefore returns a copy, so an Authenticator may keep
// what it reads (as a cache key, say) without it changing under it; the
// identity.Peeker methods lend the values instead, for an Authenticator
// that keeps nothing (identity.APIKey).
type Request struct{ C *fiber.Ctx }

var (
	_ identity.QueryValuer = Request{}
	_ identity.RawQuerier  = Request{}
	_ identity.PeerAddrer  = Request{}
	_ identity.Peeker      = Request{}
)

// PeekHeader implements identity.Peeker: HeaderValues' first value and
// count without the copies, as adapters/fasthttp's Request reads them;
// the value is valid only until the handler returns.
func (q Request) PeekHeader(name string) (first string, lines int) {
	return lpfasthttp.Request{Ctx: q.C.Context()}.PeekHeader(name)
}

// PeekQuery implements identity.Peeker: QueryValues' first value and
// count without the copies, as adapters/fasthttp's Request reads them;
// the value is valid only until the handler returns.
func (q Request) PeekQuery(name string) (first string, n int) {
	return lpfasthttp.Request{Ctx: q.C.Context()}.PeekQuery(name)
}

// Header implements identity.Request: the first value of the named
// field, as adapters/fasthttp's Request reads it (a chunked request's
// trailer fields are not header fields).
func (q Request) Header(name string) string {
	return lpfasthttp.Request{Ctx: q.C.Context()}.Header(name)
}

// HeaderValues returns every value of the named header, one per header
// line, in the order received (nil when absent), as adapters/fasthttp's
// Request reads them.
func (q Request) HeaderValues(name string) []string {
	return lpfasthttp.Request{Ctx: q.C.Context()}.HeaderValues(name)
}

// Query implements identity.Request.
func (q Request) Query(name string) string { return strings.Clone(q.C.Query(name)) }

// QueryValues implements identity.QueryValuer: every value of the named
// query parameter, in the order given (nil when absent), so that identity
// refuses a credential parameter given twice.
func (q Request) QueryValues(name string) []string {
	var vs []string
	for _, v := range q.C.Request().URI().QueryArgs().PeekMulti(name) {
		vs = append(vs, string(v))
	}
	return vs
}

// RawQuery implements identity.RawQuerier, as adapters/fasthttp's Request
// reads it; the value is valid only until the handler returns.
func (q Request) RawQuery() string { return lpfasthttp.Request{Ctx: q.C.Context()}.RawQuery() }

// Cookie implements identity.Request.
func (q Request) Cookie(name string) string { return strings.Clone(q.C.Cookies(name)) }

// RemoteAddr implements identity.Request: the TCP peer of the connection,
// as net.TCPAddr.String writes it ("192.0.2.1:40000", "[2001:db8::1]:443"),
// as adapters/fasthttp's Request reads it.
func (q Request) RemoteAddr() string { return lpfasthttp.Request{Ctx: q.C.Context()}.RemoteAddr() }

// PeerAddr implements identity.PeerAddrer: the address of a TCP peer that
// RemoteAddr writes, with no text in between; false for any other peer (a
// zoned or out-of-range TCP address, a Unix socket), whose RemoteAddr
// identity parses as before.
func (q Request) PeerAddr() (netip.Addr, bool) {
	return lpfasthttp.Request{Ctx: q.C.Context()}.PeerAddr()
}
