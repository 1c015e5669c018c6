// Package fasthttp is limitplane's middleware for valyala/fasthttp: the same
// identity, decision, header fields and 401/403/429/503 answers as
// adapters/nethttp, rendered by adapters/response, around a
// fasthttp.RequestHandler. The gateway's fasthttp engine is built on it.
//
// Import it under a name that does not clash with fasthttp itself:
//
//	import lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
//
//	h := lpfasthttp.Middleware(engine, auth, lpfasthttp.Options{API: "orders"})(next)
//	fasthttp.ListenAndServe(":8080", h)
package fasthttp

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"unsafe"

	"github.com/valyala/fasthttp"

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
	Cost func(*fasthttp.RequestCtx) int64
	// CostHeader, when it names a header, reads a request's cost from
	// it (core.CostHeader: bounded, a malformed value answered 400 with
	// a JSON body naming the header, before authentication, nothing
	// counted); a request without it costs what Cost says. When Name is
	// "" and l is a core.CostHeaderSource (a data-plane member's
	// Limiter), the header of the running API definition is read.
	CostHeader core.CostHeader
	// SettleHeader, when set, names the response header in which the
	// handler (or the upstream) gives a request's actual cost, e.g.
	// "X-Usage-Tokens": once the handler returns, a policy that settles
	// (core.Policy.Settle) charges or refunds the difference from the
	// estimate in the quota period it charged. A response without it, or
	// with a value that is not an integer in [0, 2^53), keeps the
	// estimate. (fasthttp has no trailers.)
	SettleHeader string
	// Route, when set, says where a request goes within API, so that a
	// core.RouteDecider decides it at the endpoint it matches (PathRoute:
	// the request's method and path). nil decides every request for the
	// API as a whole.
	Route func(*fasthttp.RequestCtx) core.Route
	// Renderer renders answers; nil means response.NewRenderer with zero
	// Options.
	Renderer *response.Renderer
	// OnDecision, if set, is called once per request with the decision or
	// error (for metrics and logs). It must not retain ctx.
	OnDecision func(ctx *fasthttp.RequestCtx, d core.Decision, err error)
}

// Middleware returns middleware that authenticates each request with auth
// and limits it with l. An allowed request goes on to next with the
// rate-limit fields already set on its response; any other answer (429,
// 401, 403, 400, 503) is sent with its JSON body and next is not called.
// What an admitted request holds (an in-flight slot) is released when next
// returns, however it ends (a panic too).
// Requests that fail authentication never reach the engine, so they
// create no limiter state.
//
// The engine is asked with context.Background(): a RequestCtx as a
// context is cancelled when the server shuts down, and a request being
// drained then must still be decided.
//
// l is any core.Decider: a *core.Engine, or the Limiter(api) of a
// data-plane member (live.Config, dataplane.Follower). Middleware panics
// when l or auth is nil.
func Middleware(l core.Decider, auth identity.Authenticator, opts Options) func(fasthttp.RequestHandler) fasthttp.RequestHandler {
	admit.Require("fasthttp.Middleware", l, auth)
	rend := opts.Renderer
	if rend == nil {
		rend = response.NewRenderer(response.Options{})
	}
	// fasthttp copies every header value and the body it is given, so a
	// request's consumer and answer are rendered into memory reused by
	// later requests.
	pool := &sync.Pool{New: func() any { return new(scratch) }}
	readCost := admit.ReadsCostHeader(l, opts.CostHeader)
	return func(next fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			var cost func() int64
			if opts.Cost != nil {
				cost = func() int64 { return opts.Cost(ctx) }
			}
			if readCost {
				if n, err := admit.HeaderCost(l, opts.API, opts.CostHeader, Request{ctx}.HeaderValues); err != nil {
					if opts.OnDecision != nil {
						opts.OnDecision(ctx, core.Decision{}, err)
					}
					Write(&ctx.Response, rend.Render(nil, core.Decision{}, err))
					return
				} else if n > 0 {
					cost = func() int64 { return n }
				}
			}
			var route func() core.Route
			if opts.Route != nil {
				route = func() core.Route { return opts.Route(ctx) }
			}
			s := pool.Get().(*scratch)
			var d core.Decision
			err := admit.DecideInto(context.Background(), l, auth, Request{ctx}, opts.API, route, cost, &s.consumer, &d)
			if opts.OnDecision != nil {
				opts.OnDecision(ctx, d, err)
			}
			pass := fastresp.Write(&ctx.Response, rend.RenderDecision(&s.answer, &d, err))
			pool.Put(s)
			if !pass {
				return
			}
			defer d.Hold.Release()
			next(ctx)
			if opts.SettleHeader != "" && d.Hold.Held() {
				admit.Finish(d.Hold, string(ctx.Response.Header.Peek(opts.SettleHeader)))
			}
		}
	}
}

// PathRoute is an Options.Route: the request's method and its path as
// fasthttp normalizes it (decoded, with "." and ".." segments and
// repeated slashes resolved).
func PathRoute(ctx *fasthttp.RequestCtx) core.Route {
	return core.Route{Method: string(ctx.Method()), Path: string(ctx.Path())}
}

// scratch is one request's memory in Middleware.
type scratch struct {
	consumer admit.Consumer
	answer   response.Scratch
}

// Write sets res's header fields on resp and, when res does not pass, its
// status and JSON body (fasthttp copies both). It reports whether the
// request should go on to the next handler.
//
// The fields of a Result a Renderer returned (res.Canonical) are handed
// to fasthttp as they are, and so are the body's Content-Type and
// X-Content-Type-Options: the same bytes as resp.Header.Set, without its
// copy, normalization and checks (TestWriteSetsAsCtxSet).
func Write(resp *fasthttp.Response, res response.Result) bool {
	return fastresp.Write(resp, &res)
}

// Request adapts *fasthttp.RequestCtx to identity.Request.
//
// fasthttp reuses its request buffers once the handler returns. Every
// method of identity.Request therefore returns a copy, so an Authenticator
// may keep what it reads (as a cache key, say) without it changing under
// it; the identity.Peeker methods lend the values instead, for an
// Authenticator that keeps nothing (identity.APIKey).
type Request struct{ Ctx *fasthttp.RequestCtx }

var (
	_ identity.QueryValuer = Request{}
	_ identity.RawQuerier  = Request{}
	_ identity.PeerAddrer  = Request{}
	_ identity.Peeker      = Request{}
)

// PeekHeader implements identity.Peeker: the first field line's value of
// the named header and the number of lines, HeaderValues without the
// copies. The value is fasthttp's request memory: valid only until the
// handler returns.
func (q Request) PeekHeader(name string) (first string, lines int) {
	vs := headerValues(&q.Ctx.Request.Header, name)
	if len(vs) == 0 {
		return "", 0
	}
	return lent(vs[0]), len(vs)
}

// PeekQuery implements identity.Peeker: the first value of the named
// query parameter and the number of times it is given, QueryValues
// without the copies (nor the list). The value is fasthttp's request
// memory: valid only until the handler returns.
func (q Request) PeekQuery(name string) (first string, n int) {
	var v []byte
	q.Ctx.QueryArgs().VisitAll(func(k, val []byte) {
		if string(k) == name {
			if n++; n == 1 {
				v = val
			}
		}
	})
	return lent(v), n
}

// lent returns b's bytes as a string without a copy: b must not change
// while the string is in use.
func lent(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Header implements identity.Request: the first value of the named field.
func (q Request) Header(name string) string {
	if vs := headerValues(&q.Ctx.Request.Header, name); len(vs) > 0 {
		return string(vs[0])
	}
	return ""
}

// HeaderValues returns every value of the named header, one per header
// line, in the order received (nil when absent).
func (q Request) HeaderValues(name string) []string {
	var vs []string
	for _, v := range headerValues(&q.Ctx.Request.Header, name) {
		vs = append(vs, string(v))
	}
	return vs
}

// DropTrailerFields removes from a chunked request's header h the fields
// fasthttp added to it from the request's trailer section: fasthttp (v1.51)
// reads a trailer's fields as header fields, after those of the header
// section, once it has read the body. net/http keeps them apart
// (http.Request.Trailer), and a trailer field is no header field: a proxy
// that forwards h, or code that reads it after the body, would otherwise
// take a key or an X-Forwarded-For sent after the body for one sent before
// it. A name with more values than the header section gave keeps only
// those, in their order; a request that is not chunked is left as it is.
// Call it after the body is read (a fasthttp.Server does so before it
// calls the handler, unless StreamRequestBody is set).
//
// The middleware does not call it (it changes no request): its key check
// and client address read the header section only (see headerValues).
func DropTrailerFields(h *fasthttp.RequestHeader) {
	if h.ContentLength() != -1 {
		return // no chunked body, no trailer
	}
	got := map[string]int{}
	h.VisitAll(func(k, _ []byte) { got[string(k)]++ })
	sent := map[string][]string{} // the header section's fields, as received
	h.VisitAllInOrder(func(k, v []byte) { sent[string(k)] = append(sent[string(k)], string(v)) })
	for name, n := range got {
		vs := sent[name]
		switch name {
		case "Cookie", "Trailer", "Host", "Content-Length":
			// fasthttp refuses these as trailer fields; VisitAll gives
			// Cookie lines as one, Trailer's names joined, and Host
			// and Content-Length as it keeps them.
			continue
		}
		if n <= len(vs) {
			continue
		}
		h.Del(name)
		for _, v := range vs {
			h.Add(name, v)
		}
	}
}

// headerValues returns the values of the named field that h's header
// section gave. fasthttp appends a chunked request's trailer fields to its
// header once it has read the body; they are no header fields (net/http
// keeps them apart, in Request.Trailer), so a key or an X-Forwarded-For
// sent in a trailer is not taken. For a chunked request the header
// section is read again (VisitAllInOrder); otherwise PeekAll.
func headerValues(h *fasthttp.RequestHeader, name string) [][]byte {
	if h.ContentLength() != -1 {
		return h.PeekAll(name)
	}
	var vs [][]byte
	h.VisitAllInOrder(func(k, v []byte) {
		if strings.EqualFold(lent(k), name) {
			vs = append(vs, v)
		}
	})
	return vs
}

// Query implements identity.Request: the first value of the named query
// parameter.
func (q Request) Query(name string) string { return string(q.Ctx.QueryArgs().Peek(name)) }

// QueryValues implements identity.QueryValuer: every value of the named
// query parameter, in the order given (nil when absent), so that identity
// refuses a credential parameter given twice.
func (q Request) QueryValues(name string) []string {
	var vs []string
	for _, v := range q.Ctx.QueryArgs().PeekMulti(name) {
		vs = append(vs, string(v))
	}
	return vs
}

// RawQuery implements identity.RawQuerier: everything after the first '?'
// of the request target as sent, as net/http's url.ParseRequestURI reads
// it (a '#' is part of it: a target has no fragment; fasthttp's
// URI().QueryString() cuts the query there), so that identity reads a
// credential parameter by its own strict rules, as behind the net/http
// adapter. The value is fasthttp's request memory: valid only until the
// handler returns.
func (q Request) RawQuery() string {
	target := q.Ctx.Request.Header.RequestURI()
	i := bytes.IndexByte(target, '?')
	if i < 0 {
		return ""
	}
	return lent(target[i+1:])
}

// Cookie implements identity.Request.
func (q Request) Cookie(name string) string { return string(q.Ctx.Request.Header.Cookie(name)) }

// RemoteAddr implements identity.Request: the TCP peer of the connection,
// as net.TCPAddr.String writes it ("192.0.2.1:40000", "[2001:db8::1]:443").
func (q Request) RemoteAddr() string {
	a := q.Ctx.RemoteAddr()
	if ap, ok := tcpPeer(a); ok {
		return ap.String()
	}
	return a.String()
}

// PeerAddr implements identity.PeerAddrer: the address of a TCP peer,
// with no text in between; false for any other peer (a zoned or
// out-of-range TCP address, a Unix socket), whose RemoteAddr identity
// parses instead.
func (q Request) PeerAddr() (netip.Addr, bool) {
	ap, ok := tcpPeer(q.Ctx.RemoteAddr())
	return ap.Addr(), ok
}

// tcpPeer returns a as a netip.AddrPort, IPv4 unmapped, when a is a
// *net.TCPAddr with an IP, no zone and a port in 0..65535.
func tcpPeer(a net.Addr) (netip.AddrPort, bool) {
	if t, ok := a.(*net.TCPAddr); ok && t.Zone == "" {
		if ip, ok := netip.AddrFromSlice(t.IP); ok && t.Port >= 0 && t.Port <= 0xffff {
			return netip.AddrPortFrom(ip.Unmap(), uint16(t.Port)), true
		}
	}
	return netip.AddrPort{}, false
}
