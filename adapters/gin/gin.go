// Package gin is limitplane's Gin middleware: the same identity, decision,
// header fields and 401/403/429/503 answers as adapters/nethttp, rendered
// by adapters/response, as a gin.HandlerFunc.
//
// Import it under a name that does not clash with Gin itself:
//
//	import lpgin "github.com/limitplane/limitplane/adapters/gin"
//
//	r := gin.New()
//	r.Use(lpgin.Middleware(engine, auth, lpgin.Options{API: "orders"}))
package gin

import (
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/limitplane/limitplane/adapters/internal/admit"
	"github.com/limitplane/limitplane/adapters/internal/httpresp"
	"github.com/limitplane/limitplane/adapters/nethttp"
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
	Cost func(*gin.Context) int64
	// CostHeader, when it names a header, reads a request's cost from
	// it (core.CostHeader: bounded, a malformed value answered 400 with
	// a JSON body naming the header, before authentication, nothing
	// counted); a request without it costs what Cost says. When Name is
	// "" and l is a core.CostHeaderSource (a data-plane member's
	// Limiter), the header of the running API definition is read.
	CostHeader core.CostHeader
	// Route, when set, says where a request goes within API, so that a
	// core.RouteDecider (an engine with endpoints, the Limiter(api) of a
	// data-plane member) decides it at the endpoint it matches:
	// FullPathRoute (the route Gin matched, "/orders/:id") or PathRoute
	// (the request's path). nil decides every request for the API as a
	// whole (Decide).
	Route func(*gin.Context) core.Route
	// Renderer renders answers; nil means response.NewRenderer with zero
	// Options.
	Renderer *response.Renderer
	// OnDecision, if set, is called once per request with the decision or
	// error (for metrics and logs). It must not retain c.
	OnDecision func(c *gin.Context, d core.Decision, err error)
	// SettleHeader, when set, names the response header (or trailer) in
	// which the handler (or the upstream) gives a request's actual cost,
	// e.g. "X-Usage-Tokens": once the handler returns, a policy that
	// settles (core.Policy.Settle) charges or refunds the difference from
	// the estimate (the request's cost) in the quota period it charged. A
	// response without it, or with a value that is not an integer in
	// [0, 2^53), keeps the estimate.
	SettleHeader string
}

// Middleware returns Gin middleware that authenticates each request with
// auth and limits it with l. An allowed request goes on to the next handler
// with the rate-limit fields already set on its response; any other answer
// (429, 401, 403, 503) is written with its JSON body and the chain is
// aborted. Requests that fail authentication never reach the engine, so they
// create no limiter state.
//
// l is any core.Decider: a *core.Engine, or the Limiter(api) of a
// data-plane member (live.Config, dataplane.Follower). Middleware panics
// when l or auth is nil.
func Middleware(l core.Decider, auth identity.Authenticator, opts Options) gin.HandlerFunc {
	admit.Require("gin.Middleware", l, auth)
	rend := opts.Renderer
	if rend == nil {
		rend = response.NewRenderer(response.Options{})
	}
	// As nethttp.Middleware: a request's consumer and answer are rendered
	// into memory reused by later requests, and the cost header is looked
	// for only when there may be one.
	pool := &sync.Pool{New: func() any { return new(httpresp.Scratch) }}
	costHeader := admit.ReadsCostHeader(l, opts.CostHeader)
	return func(c *gin.Context) {
		var cost func() int64
		if opts.Cost != nil {
			cost = func() int64 { return opts.Cost(c) }
		}
		if costHeader {
			if n, err := admit.HeaderCost(l, opts.API, opts.CostHeader, c.Request.Header.Values); err != nil {
				if opts.OnDecision != nil {
					opts.OnDecision(c, core.Decision{}, err)
				}
				nethttp.Write(c.Writer, rend.Render(nil, core.Decision{}, err))
				c.Abort()
				return
			} else if n > 0 {
				cost = func() int64 { return n }
			}
		}
		var route func() core.Route
		if opts.Route != nil {
			route = func() core.Route { return opts.Route(c) }
		}
		s := pool.Get().(*httpresp.Scratch)
		var d core.Decision
		err := admit.DecideInto(c.Request.Context(), l, auth, nethttp.Request{R: c.Request}, opts.API, route, cost, &s.Consumer, &d)
		if opts.OnDecision != nil {
			opts.OnDecision(c, d, err)
		}
		// gin's ResponseWriter is an http.ResponseWriter, so the net/http
		// writer sets the same fields, status and body.
		pass := httpresp.Write(c.Writer, s, rend.RenderDecision(&s.Answer, &d, err))
		pool.Put(s)
		if !pass {
			c.Abort()
			return
		}
		// The in-flight slot is held until the rest of the chain returns,
		// however it ends (a panic too).
		defer d.Hold.Release()
		c.Next()
		if opts.SettleHeader != "" && d.Hold.Held() {
			admit.Finish(d.Hold, c.Writer.Header().Get(opts.SettleHeader))
		}
	}
}

// PathRoute is an Options.Route: the request's method and path.
func PathRoute(c *gin.Context) core.Route { return nethttp.PathRoute(c.Request) }

// FullPathRoute is an Options.Route: the request's method and the path
// of the route Gin matched (c.FullPath()), its parameters written as an
// endpoint's ("/orders/:id" is "/orders/{id}", "/files/*rest" is
// "/files/{rest}"), so that an endpoint's {param} segments match them;
// PathRoute when no route matched. Gin matches routes before any
// handler runs, so it works in middleware given to Use.
func FullPathRoute(c *gin.Context) core.Route {
	fp := c.FullPath()
	if fp == "" {
		return PathRoute(c)
	}
	return core.Route{Method: c.Request.Method, Path: braceParams(fp)}
}

// braceParams rewrites a router's ":name" and "*name" segments as
// "{name}".
func braceParams(p string) string {
	if !strings.ContainsAny(p, ":*") {
		return p
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if len(s) > 0 && (s[0] == ':' || s[0] == '*') {
			segs[i] = "{" + s[1:] + "}"
		}
	}
	return strings.Join(segs, "/")
}
