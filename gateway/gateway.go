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
	"strings"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
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
// and never part of a snapshot.
type Options struct {
	// Store holds the counters; required. The gateway does not close it
	// (see OpenStore for one that the caller closes).
	Store core.Store
	// FailurePolicy is what the engine does when Store fails.
	FailurePolicy core.FailurePolicy
	// Fallback is the store used under core.FailFallback; nil means an
	// in-process store that the gateway creates, which enforces window
	// algorithms as GCRA with the same requests per period (see
	// WindowsAsGCRA) and starts from empty counters. To have it carry on
	// from the Redis store's counts (a quota spent before an outage stays
	// spent), create it with NewFallback, set it here and give it to the
	// Redis store as StoreOptions.Redis.Seed; the caller closes it, after
	// the gateway.
	Fallback core.Store
	// FallbackMaxKeys caps the keys of the in-process fallback the
	// gateway creates (memory.Options.MaxKeys); 0 means unbounded. Unused
	// when Fallback is set.
	FallbackMaxKeys int
	// StoreTimeout bounds each store call; 0 means no bound.
	StoreTimeout time.Duration
	// Shadow makes every policy a shadow policy: limits are computed and
	// reported, nothing is denied.
	Shadow bool
	// Observer, if set, is told about every decision (metrics.Collector).
	Observer core.Observer
	// OnStoreError, if set, is called with every store error (for
	// metrics: metrics.Collector.ObserveStoreError); it must be safe for
	// concurrent use and must not block. The gateway also logs store
	// errors to Logger itself, without flooding it: the first of an
	// outage at once, then one line per 5 s with the number since the
	// last line (failures) and since start (total).
	OnStoreError func(error)
	// OnApply, if set, is told the outcome of every Apply and UpdateKeys
	// call, after it has taken effect: the snapshot's revision (0 for a nil
	// snapshot) or UpdateKeys's, and the error, nil when it now runs
	// (metrics.Gateway.ObserveApply). It must be safe for concurrent use.
	OnApply func(revision uint64, err error)
	// ClientIP says how keyless APIs and failure limits find a client's
	// address.
	ClientIP identity.ClientIPOptions
	// Response configures status codes and header fields. Now is filled
	// from Options.Now when nil.
	Response response.Options
	// Resolver resolves the secret references of a snapshot's JWT keys
	// (secret_env, secret_file, pem_file); nil means the process
	// environment and files relative to the working directory.
	Resolver spec.Resolver
	// Transport carries requests to http(s) upstreams; nil means a clone
	// of http.DefaultTransport keeping up to 256 idle connections per
	// upstream, which Close releases.
	Transport http.RoundTripper
	// Logger receives the gateway's own log lines (upstream failures,
	// JWKS refresh failures); nil means slog.Default().
	Logger *slog.Logger
	// Clock is the in-process fallback store's clock; nil means the
	// system clock. A test seam.
	Clock core.Clock
	// Now is the wall clock for key expiry, JWT validation and
	// X-RateLimit-Reset; nil means time.Now. A test seam.
	Now func() time.Time
	// AfterFunc times the store-failure log's intervals; nil means
	// time.AfterFunc. A test seam.
	AfterFunc AfterFunc
	// RebuildInitial and RebuildMax bound the retries of APIs that
	// ApplyPartial could not build (see NotBuilt): the first retry comes after
	// RebuildInitial, each next one after twice as long (with ±20%
	// jitter), never more than RebuildMax apart. 0 means 250 ms and 30 s.
	RebuildInitial, RebuildMax time.Duration
	// JWKSApplyTimeout bounds the first fetch of a new JWKS within
	// ApplyPartial; 0 means 1 s. A set not fetched by then leaves its API not built
	// (retried in the background, each attempt bounded by 10 s), so a
	// JWKS host that does not answer holds up no revision for longer. A
	// JWKS that the running configuration could not fetch is not fetched
	// within ApplyPartial at all.
	JWKSApplyTimeout time.Duration
	// OnNotBuilt, if set, is called with NotBuilt's list after every
	// Apply and ApplyPartial (nil when every API is built) and whenever a
	// retry changes it. It must be safe for
	// concurrent use and must not block or call the gateway.
	OnNotBuilt func([]NotBuilt)
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
}

// New returns a gateway with opts and no snapshot: it answers 503 until
// Apply succeeds. Close releases what it starts.
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil {
		return nil, errors.New("gateway: Options.Store is nil")
	}
	if opts.Now == nil {
		opts.Now = time.Now
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
		OnStoreError:     opts.OnStoreError,
		OnApply:          opts.OnApply,
		ClientIP:         opts.ClientIP,
		Resolver:         opts.Resolver,
		Logger:           opts.Logger,
		Clock:            opts.Clock,
		Now:              opts.Now,
		AfterFunc:        opts.AfterFunc,
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
		ro.Now = opts.Now
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
	if a.Target == spec.BuiltinEcho {
		up = strip.handler(echo(a.ID))
	} else {
		target, err := spec.ParseTarget(a.Target)
		if err != nil {
			return nil, err
		}
		up = newProxy(a.ID, target, strip, g.transport, &g.buffers, g.opts.ClientIP.TrustedProxies, g.log)
	}
	return nethttp.Middleware(b.Limiter, b.Auth, nethttp.Options{API: a.ID, Renderer: g.render})(up), nil
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
	return err
}
