// Package nethttp is limitplane's net/http middleware: it identifies the
// consumer, asks the engine for a decision and writes the rate-limit header
// fields, 429/401/403/503 answers and JSON bodies rendered by
// adapters/response.
package nethttp

import (
	"bytes"
	"net/http"
	"strings"
	"sync"

	"github.com/limitplane/limitplane/adapters/internal/admit"
	"github.com/limitplane/limitplane/adapters/internal/httpresp"
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
	Cost func(*http.Request) int64
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
	// (the method and the request's path) or PatternRoute (the ServeMux
	// pattern that routed it). nil decides every request for the API as
	// a whole (Decide).
	Route func(*http.Request) core.Route
	// Renderer renders answers; nil means response.NewRenderer with zero
	// Options.
	Renderer *response.Renderer
	// OnDecision, if set, is called once per request with the decision or
	// error (for metrics and logs). It must not retain r.
	OnDecision func(r *http.Request, d core.Decision, err error)
	// SettleHeader, when set, names the response header (or trailer) in
	// which the handler (or the upstream) gives a request's actual cost,
	// e.g. "X-Usage-Tokens": once the handler returns, a policy that
	// settles (core.Policy.Settle) charges or refunds the difference from
	// the estimate (the request's cost) in the quota period it charged. A
	// response without it, or with a value that is not an integer in
	// [0, 2^53), keeps the estimate.
	SettleHeader string
}

// Middleware returns net/http middleware that authenticates each request
// with auth and limits it with l. Requests that fail authentication are
// answered (401/403) before the engine is asked, so they create no limiter
// state.
//
// l is any core.Decider: a *core.Engine, or the Limiter(api) of a
// data-plane member (live.Config, dataplane.Follower). Middleware panics
// when l or auth is nil.
func Middleware(l core.Decider, auth identity.Authenticator, opts Options) func(http.Handler) http.Handler {
	admit.Require("nethttp.Middleware", l, auth)
	rend := opts.Renderer
	if rend == nil {
		rend = response.NewRenderer(response.Options{})
	}
	// A request's consumer and answer are rendered into memory reused by
	// later requests; httpresp.Write copies what the header map keeps.
	pool := &sync.Pool{New: func() any { return new(httpresp.Scratch) }}
	// A request's cost header is looked for only when there may be one:
	// opts names it, or l knows one per API (admit.HeaderCost).
	costHeader := admit.ReadsCostHeader(l, opts.CostHeader)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var cost func() int64
			if opts.Cost != nil {
				cost = func() int64 { return opts.Cost(r) }
			}
			if costHeader {
				if n, err := admit.HeaderCost(l, opts.API, opts.CostHeader, r.Header.Values); err != nil {
					if opts.OnDecision != nil {
						opts.OnDecision(r, core.Decision{}, err)
					}
					Write(w, rend.Render(nil, core.Decision{}, err))
					return
				} else if n > 0 {
					cost = func() int64 { return n }
				}
			}
			var route func() core.Route
			if opts.Route != nil {
				route = func() core.Route { return opts.Route(r) }
			}
			s := pool.Get().(*httpresp.Scratch)
			// The decision stays in d: decided into it, rendered from it.
			var d core.Decision
			err := admit.DecideInto(r.Context(), l, auth, Request{r}, opts.API, route, cost, &s.Consumer, &d)
			if opts.OnDecision != nil {
				opts.OnDecision(r, d, err)
			}
			pass := httpresp.Write(w, s, rend.RenderDecision(&s.Answer, &d, err))
			pool.Put(s)
			if pass {
				// The in-flight slot is held until next returns, however
				// it ends (a panic, a client gone, a timeout).
				defer d.Hold.Release()
				next.ServeHTTP(w, r)
				if opts.SettleHeader != "" && d.Hold.Held() {
					admit.Finish(d.Hold, settleValue(w.Header(), opts.SettleHeader))
				}
			}
		})
	}
}

// settleValue is the value of the header or trailer name in h, as a
// handler sets it after its response (or httputil.ReverseProxy copies the
// upstream's trailers: under their names, or with http.TrailerPrefix).
func settleValue(h http.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	return h.Get(http.TrailerPrefix + name)
}

// PathRoute is an Options.Route: the request's method and its path as
// the client escaped it (URL.EscapedPath), matched against the endpoints'
// patterns segment by segment, each decoded (core.Route.Path): an encoded
// "/" stays inside its segment, as ServeMux's patterns see it, so
// "/orders/1%2F2/items" is at "/orders/{id}/items".
func PathRoute(r *http.Request) core.Route {
	return core.Route{Method: r.Method, Path: r.URL.EscapedPath()}
}

// PatternRoute is an Options.Route for a middleware inside a ServeMux
// (mux.Handle("GET /orders/{id}", mw(h))): the request's method and the
// path of the pattern that routed it (r.Pattern without its method and
// host: "/orders/{id}"), whose {param} segments an endpoint's {param}
// segments match; PathRoute when r.Pattern is empty (the middleware is
// outside the mux, or no mux routed r).
func PatternRoute(r *http.Request) core.Route {
	p := r.Pattern
	if p == "" {
		return PathRoute(r)
	}
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:] // a host
	}
	return core.Route{Method: r.Method, Path: p}
}

// Write sets res's header fields on w and, when res does not pass, writes
// its status and JSON body. It reports whether the request should go on to
// the handler.
func Write(w http.ResponseWriter, res response.Result) bool {
	h := w.Header()
	if n := len(res.Headers); n > 0 {
		vals := make([]string, n) // one allocation for every field's value slice
		for i, f := range res.Headers {
			vals[i] = f.Value
			h[f.Name] = vals[i : i+1 : i+1]
		}
	}
	if res.Pass {
		return true
	}
	bh := response.BodyHeaders()
	vals := make([]string, len(bh)) // one allocation for both fields' value slices
	for i, f := range bh {
		vals[i] = f.Value
		h[f.Name] = vals[i : i+1 : i+1]
	}
	w.WriteHeader(res.Status)
	// Writing a copy keeps res from escaping (w.Write is an interface
	// call), so callers may render into a stack buffer: one allocation on
	// a denial instead of one on every request.
	w.Write(bytes.Clone(res.Body))
	return false
}

// Request adapts *http.Request to identity.Request.
type Request struct{ R *http.Request }

var (
	_ identity.QueryValuer = Request{}
	_ identity.RawQuerier  = Request{}
)

// Header implements identity.Request.
func (q Request) Header(name string) string { return q.R.Header.Get(name) }

// HeaderValues returns every value of the named header, in the order
// received (nil when absent); identity.ClientIP reads X-Forwarded-For with it.
func (q Request) HeaderValues(name string) []string { return q.R.Header.Values(name) }

// Query implements identity.Request.
func (q Request) Query(name string) string {
	if q.R.URL == nil || q.R.URL.RawQuery == "" {
		return ""
	}
	return q.R.URL.Query().Get(name)
}

// QueryValues implements identity.QueryValuer: every value of the named
// query parameter, in the order given (nil when absent), so that identity
// refuses a credential parameter given twice.
func (q Request) QueryValues(name string) []string {
	if q.R.URL == nil || q.R.URL.RawQuery == "" {
		return nil
	}
	return q.R.URL.Query()[name]
}

// RawQuery implements identity.RawQuerier: the URL's query as sent, so
// that identity reads a credential parameter by its own strict rules.
func (q Request) RawQuery() string {
	if q.R.URL == nil {
		return ""
	}
	return q.R.URL.RawQuery
}

// Cookie implements identity.Request.
func (q Request) Cookie(name string) string {
	c, err := q.R.Cookie(name)
	if err != nil {
		return ""
	}
	return c.Value
}

// RemoteAddr implements identity.Request.
func (q Request) RemoteAddr() string { return q.R.RemoteAddr }
