package live

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// State returns the running configuration's state, nil before the first
// Apply. A request that loads it once is decided entirely under it
// (except for its key, which UpdateKeys changes in place).
func (g *Config) State() *State { return g.state.Load() }

// Revision returns the state's revision: the applied snapshot's, or the
// last UpdateKeys's.
func (st *State) Revision() uint64 { return st.revision.Load() }

// Engine returns the state's engine (without the policies ApplyPartial
// left out).
func (st *State) Engine() *core.Engine { return st.engine }

// Limiter returns what decides the state's requests: the engine, or in
// front of it a guard answering 503 for consumers whose limits need a
// policy that is not built.
func (st *State) Limiter() core.RouteDecider { return st.limiter }

// Keys returns the state's key registry. The caller must not change it.
func (st *State) Keys() *identity.Keys { return st.keys }

// Base returns the applied snapshot without its keys (policies, APIs and
// the revision it was applied with). The caller must not change it.
func (st *State) Base() *spec.Snapshot { return st.base }

// API returns the API with id, nil when the state has none.
func (st *State) API(id string) *API { return st.byID[id] }

// APIs returns the state's APIs in the snapshot's order. The caller must
// not change the slice.
func (st *State) APIs() []*API { return st.list }

// Routes returns the state's APIs that have a listen path (not
// ServiceSide), by listen path, longest first (in the
// snapshot's order among equal lengths), for routing a path to the API
// of the longest listen path that is a prefix of it. The caller must not
// change the slice.
func (st *State) Routes() []*API { return st.routes }

// NotBuilt returns the state's objects that are not built, as
// Config.NotBuilt does.
func (st *State) NotBuilt() []NotBuilt { return st.notBuiltList() }

// ErrNotReady is the Kind of the 503 errors of Limiter and Authenticator
// when a request cannot be decided under the running configuration:
// nothing applied yet, SetUnavailable in force, the API not in the
// configuration or not built on this host.
var ErrNotReady = errors.New("service unavailable")

// Authenticator returns an identity.Authenticator for the requests of
// the API with id api, for a service's middleware (adapters/nethttp and
// the others): each request is authenticated as the running
// configuration's definition of api says (API key, JWT or keyless by
// client IP), under the configuration running when it arrives. It fails
// with an *identity.Error of status 503 and Kind ErrNotReady (the
// adapters answer 503, gRPC codes.Unavailable) before the first Apply,
// while SetUnavailable holds, when the configuration has no API api
// (the control plane does not define it, or not for this data plane's
// tags) and while api is not built on this host.
func (g *Config) Authenticator(api string) identity.Authenticator {
	return &apiAuth{g: g, api: api}
}

// Limiter returns a core.Decider deciding with the running
// configuration's engine, for a service's middleware beside
// Authenticator. Like Authenticator it answers 503 (ErrNotReady) before
// the first Apply and while SetUnavailable holds, so a caller that
// brings consumers of its own is held to on_stale too. The API passed to Decide is the one the middleware
// names. Authenticator and Limiter each load the running configuration
// once per call, so a request that arrives during an Apply may be
// authenticated under the previous configuration and decided under the
// new one; snapshots are valid as a whole (a key names only policies its
// snapshot has), so the only mixed outcome is a key whose policy the new
// configuration removes: that one request is refused (403,
// core.ErrUnknownPolicy); the next is decided wholly under the new
// configuration. A gateway's routes do not mix: each is built with its
// state's limiter.
//
// It is also a core.RouteDecider: DecideRoute decides a request at the
// endpoint of the running configuration's API that its route matches
// (spec.API.Endpoints, core.Engine.DecideRoute), so a middleware given a
// route for each request (the adapters' Route options) enforces the
// endpoints the control plane defines. And it is a
// core.CostHeaderSource: a middleware with no CostHeader option reads
// the running API definition's cost_header at each request.
func (g *Config) Limiter(api string) core.RouteDecider { return liveLimiter{g: g} }

type apiAuth struct {
	g   *Config
	api string
	// last is the API's entry in the last state looked up (st.byID[api],
	// nil when it has none), so each request after a swap costs a
	// pointer compare, not a map lookup.
	last atomic.Pointer[authCache]
}

type authCache struct {
	st *State
	e  *API
}

// entry returns st's entry for the API, nil when st has none.
func (a *apiAuth) entry(st *State) *API {
	if c := a.last.Load(); c != nil && c.st == st {
		return c.e
	}
	e := st.byID[a.api]
	a.last.Store(&authCache{st: st, e: e})
	return e
}

// Authenticate implements identity.Authenticator.
func (a *apiAuth) Authenticate(ctx context.Context, r identity.Request) (*core.Consumer, error) {
	st := a.g.state.Load()
	if st == nil {
		return nil, notReady("no configuration applied yet")
	}
	if reason := a.g.unavailable.Load(); reason != nil {
		return nil, notReady(*reason)
	}
	e := a.entry(st)
	if e == nil {
		return nil, notReady(fmt.Sprintf("API %q is not in the running configuration", a.api))
	}
	b := e.built.Load()
	if b == nil {
		// The problem itself is for operators (readiness, the control
		// plane's /api/dataplanes), not for callers.
		return nil, notReady(fmt.Sprintf("API %q is not built on this %s; its operators see why in its readiness", a.api, a.g.opts.Member))
	}
	return b.b.Auth.Authenticate(ctx, r)
}

type liveLimiter struct{ g *Config }

// Decide implements core.Decider.
func (l liveLimiter) Decide(ctx context.Context, c *core.Consumer, api string, cost int64) (core.Decision, error) {
	st := l.g.state.Load()
	if st == nil {
		return core.Decision{}, notReady("no configuration applied yet")
	}
	if reason := l.g.unavailable.Load(); reason != nil {
		return core.Decision{}, notReady(*reason)
	}
	return st.limiter.Decide(ctx, c, api, cost)
}

// DecideRoute implements core.RouteDecider.
func (l liveLimiter) DecideRoute(ctx context.Context, c *core.Consumer, api string, route core.Route, cost int64) (core.Decision, error) {
	st := l.g.state.Load()
	if st == nil {
		return core.Decision{}, notReady("no configuration applied yet")
	}
	if reason := l.g.unavailable.Load(); reason != nil {
		return core.Decision{}, notReady(*reason)
	}
	return st.limiter.DecideRoute(ctx, c, api, route, cost)
}

// CostHeader implements core.CostHeaderSource: api's cost header in the
// running configuration (spec.API.CostHeader), so a middleware given
// this Limiter and no header of its own reads the one the control plane
// defines at each request; none before the first Apply or when api is
// not in the configuration.
func (l liveLimiter) CostHeader(api string) core.CostHeader {
	st := l.g.state.Load()
	if st == nil {
		return core.CostHeader{}
	}
	if a := st.byID[api]; a != nil {
		return a.spec.CoreCostHeader()
	}
	return core.CostHeader{}
}

func notReady(reason string) error {
	return &identity.Error{Status: http.StatusServiceUnavailable, Kind: ErrNotReady, Reason: reason}
}

// StoreFailed reports err, a failure of Options.Store outside the
// engine's decisions (a read-only peek, say), as the engines report
// theirs: to Options.OnStoreError and the rate-limited failure log.
func (g *Config) StoreFailed(err error) { g.onStore(err) }
