// Package gateway is limitplane's API gateway as a library: an http.Handler
// that routes each request by its path to an API, identifies the consumer
// (API key, JWT or client IP), decides it with the engine, and proxies what
// passes to the API's upstream.
//
// What it enforces comes from a spec.Snapshot, applied with Apply at any
// time: policies, keys and routes are swapped together, atomically, so each
// request is decided entirely under one snapshot; requests in flight finish
// under the one they started with, and counters are kept (a changed rate
// takes effect on the next request without resetting anyone). An API
// that only this host fails to build (a JWT secret or JWKS it cannot
// get) is left out of a snapshot applied by ApplyPartial (a data
// plane's): it answers 503, NotBuilt lists it, and the gateway retries it
// by itself; so is a policy its store cannot enforce (its consumers get
// 503); Apply (a local file's) refuses the snapshot instead. A change
// of keys only (a control plane's usual change) goes through UpdateKeys
// instead, which changes the running key registry in place at a cost
// proportional to the change, not to the keys held. How it runs
// is local and fixed at New (Options): the counter store, the failure
// policy, the response format, trusted proxies, secrets.
//
// cmd/limitplane-gateway is the runnable program around it (its wiring is
// package gateway/server): it reads a YAML file
// (package gateway/config), calls New and Apply, serves, and applies the
// file again on SIGHUP.
package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

// ErrStaleRevision is returned by Apply for a snapshot whose revision is
// lower than the one running (a revision of 0, a local file's, is never
// stale); it is live.ErrStaleRevision.
var ErrStaleRevision = live.ErrStaleRevision

// ErrNotApplied is returned by UpdateKeys before the first Apply; it is
// live.ErrNotApplied.
var ErrNotApplied = live.ErrNotApplied

// Options are a gateway's local settings: they are fixed for its lifetime
// and never part of a snapshot. Most are its live configuration's and
// mean what live.Options says of the field of the same name; Response and
// Transport are the gateway's own.
type Options struct {
	// Store holds the counters; required. The gateway does not close it
	// (see OpenStore for one that the caller closes).
	Store core.Store
	// FailurePolicy, Fallback (nil: an in-process store the gateway
	// creates, see NewFallback for one the Redis store seeds),
	// FallbackMaxKeys, StoreTimeout, Shadow, Observer, QuotaObserver,
	// OnStoreError, OnApply, ClientIP (also the proxies' trusted proxies) and Resolver:
	// as live.Options.
	FailurePolicy   core.FailurePolicy
	Fallback        core.Store
	FallbackMaxKeys int
	StoreTimeout    time.Duration
	Shadow          bool
	Observer        core.Observer
	QuotaObserver   core.QuotaObserver
	OnStoreError    func(error)
	OnApply         func(revision uint64, err error)
	ClientIP        identity.ClientIPOptions
	Resolver        spec.Resolver
	// Response configures status codes and header fields. Now is filled
	// from Seams (time.Now outside tests) when nil.
	Response response.Options
	// Transport carries requests to http(s) upstreams; nil means a clone
	// of http.DefaultTransport keeping up to 256 idle connections per
	// upstream, which Close releases.
	Transport http.RoundTripper
	// Logger receives the gateway's own log lines (upstream failures,
	// JWKS refresh failures, store failures); nil means slog.Default().
	Logger *slog.Logger
	// Seams freeze the clocks and timers in this module's tests, as
	// live.Options.Seams (Now is also the clock of X-RateLimit-Reset when
	// Response.Now is nil); nil means the system's.
	Seams *seams.Seams
	// RebuildInitial, RebuildMax, JWKSApplyTimeout and OnNotBuilt: as
	// live.Options (the retries of APIs ApplyPartial could not build).
	RebuildInitial, RebuildMax time.Duration
	JWKSApplyTimeout           time.Duration
	OnNotBuilt                 func([]NotBuilt)
}

// NotBuilt is an API or a policy of the running configuration that the
// gateway could not build, for a reason of its host (live.NotBuilt).
type NotBuilt = live.NotBuilt

// Gateway is an http.Handler enforcing the last applied snapshot. Until
// the first Apply it answers every request 503. It is safe for concurrent
// use.
//
// Its running configuration is a *live.Config, embedded: Apply,
// ApplyPartial, Replace, UpdateKeys, Snapshot, Key, NotBuilt, Revision,
// SetUnavailable and the rest are the Config's, documented there; the
// Gateway adds the routes (each API's listen path) and the proxies, built
// by the Config as each API is (live.Options.Attach).
type Gateway struct {
	*live.Config
	opts      Options
	log       *slog.Logger
	transport http.RoundTripper
	ownsTrans *http.Transport // closed by Close when the gateway made it
	render    *response.Renderer
	buffers   bufferPool // the proxies' copy buffers, shared by every state
	// fast and fastRequests serve the fasthttp engine (ServeFastHTTP):
	// its upstreams' clients and its requests' parsed targets.
	fast         fastClients
	fastRequests sync.Pool
}

// New returns a gateway with opts and no snapshot: it answers 503 until
// Apply succeeds. Close releases what it starts.
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil {
		return nil, errors.New("gateway: Options.Store is nil")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Gateway{opts: opts, log: opts.Logger}
	cfg, err := live.New(live.Options{
		Store:            opts.Store,
		FailurePolicy:    opts.FailurePolicy,
		Fallback:         opts.Fallback,
		FallbackMaxKeys:  opts.FallbackMaxKeys,
		StoreTimeout:     opts.StoreTimeout,
		Shadow:           opts.Shadow,
		Observer:         opts.Observer,
		QuotaObserver:    opts.QuotaObserver,
		OnStoreError:     opts.OnStoreError,
		OnApply:          opts.OnApply,
		ClientIP:         opts.ClientIP,
		Resolver:         opts.Resolver,
		Logger:           opts.Logger,
		Seams:            opts.Seams,
		RebuildInitial:   opts.RebuildInitial,
		RebuildMax:       opts.RebuildMax,
		JWKSApplyTimeout: opts.JWKSApplyTimeout,
		OnNotBuilt:       opts.OnNotBuilt,
		Attach:           g.attach,
		Member:           "gateway",
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.Config = cfg
	g.transport = opts.Transport
	if g.transport == nil {
		g.ownsTrans = newTransport()
		g.transport = g.ownsTrans
	}
	ro := opts.Response
	if ro.Now == nil {
		ro.Now = opts.Seams.Or().Now
	}
	g.render = response.NewRenderer(ro)
	return g, nil
}

// attach builds one API's handler (live.Options.Attach): the rate-limit
// middleware over b, and the upstream, which gets the request with the
// listen path and the credentials stripped as the API says.
func (g *Gateway) attach(a *spec.API, b live.Built) (http.Handler, error) {
	if a.ServiceSide() {
		return nil, nil // not routed
	}
	var strip outbound
	if a.StripsListenPath() {
		strip.prefix = strings.TrimSuffix(a.ListenPath, "/")
	}
	if a.StripsAuthData() {
		strip.sources = b.Sources
	}
	var up http.Handler
	var fastUp fasthttp.RequestHandler
	if a.Target == spec.BuiltinEcho {
		up = strip.handler(echo(a.ID))
		fastUp = strip.fastUpstream(fastEcho(a.ID))
	} else {
		target, err := spec.ParseTarget(a.Target)
		if err != nil {
			return nil, err
		}
		up = newProxy(a.ID, target, strip, g.transport, &g.buffers, g.opts.ClientIP.TrustedProxies, g.log)
		fp := &fastProxy{api: a.ID, target: target, client: g.fast.get(target), trusted: g.opts.ClientIP.TrustedProxies, log: g.log}
		fastUp = strip.fastUpstream(fp.serve)
	}
	mo := nethttp.Options{API: a.ID, Renderer: g.render, CostHeader: a.CoreCostHeader(), SettleHeader: a.SettleHeader}
	fo := lpfasthttp.Options{API: a.ID, Renderer: g.render, CostHeader: a.CoreCostHeader(), SettleHeader: a.SettleHeader}
	if len(a.Endpoints) > 0 {
		// Endpoints' paths are relative to the listen path: the path
		// the upstream sees when the listen path is stripped. Request
		// paths are clean here (route redirects others).
		prefix := strings.TrimSuffix(a.ListenPath, "/")
		mo.Route = func(r *http.Request) core.Route {
			return core.Route{Method: r.Method, Path: endpointPath(r.URL, prefix)}
		}
		fo.Route = func(ctx *fasthttp.RequestCtx) core.Route {
			fr := fastRequestOf(ctx)
			return core.Route{Method: fr.method, Path: endpointPath(&fr.url, prefix)}
		}
	}
	return &apiHandler{
		Handler: nethttp.Middleware(b.Limiter, b.Auth, mo)(up),
		fast:    lpfasthttp.Middleware(b.Limiter, b.Auth, fo)(fastUp),
	}, nil
}

// endpointPath is the path u's endpoint is found by: the path after
// prefix as the upstream gets it (cutListenPath), escaped as the client
// sent it where it is sent so, so that an encoded "/" (%2F) stays inside
// its segment, where the upstream's router sees it (core.Route.Path).
func endpointPath(u *url.URL, prefix string) string {
	path, raw := cutListenPath(u, prefix)
	if raw != "" {
		return raw
	}
	return path
}

// Close stops the JWKS refreshes and the fallback store, and drops idle
// upstream connections of a transport the gateway made. Requests still
// being served finish with the configuration they have. Close does not
// close Options.Store.
func (g *Gateway) Close() error {
	err := g.Config.Close()
	if g.ownsTrans != nil {
		g.ownsTrans.CloseIdleConnections()
	}
	g.fast.closeIdle()
	return err
}
