// Package live holds a data-plane member's running configuration: the
// policies in an engine, the key registry, each API's authenticator (API
// key, JWT with its JWKS refreshes, keyless per client IP), the revision,
// and an unavailable state, swapped atomically by Apply and changed in
// place by UpdateKeys.
//
// A Config is what a control plane's agent (package dataplane) keeps in
// step, whatever serves the requests: limitplane's gateway (package
// gateway builds its routes and proxies on a Config), or a service of
// its own behind the adapters (adapters/nethttp, adapters/gin,
// adapters/fiber, adapters/grpc), which take Limiter(api) and
// Authenticator(api): both decide each request under the configuration
// running when it arrives.
//
// Each gateway request is decided under one snapshot (a service's, see
// Limiter, almost always): requests in flight finish under the one they
// started with, and counters are kept (a changed rate
// takes effect on the next request without resetting anyone). An API
// that only this host fails to build (a JWT secret or JWKS it cannot
// get) is left out of a snapshot applied by ApplyPartial (a data
// plane's): it answers 503, NotBuilt lists it, and the Config retries it
// by itself; so is a policy its store cannot enforce (its consumers get
// 503); Apply (a local file's) refuses the snapshot instead. How it runs
// is local and fixed at New (Options): the counter store, the failure
// policy, trusted proxies, secrets.
package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/cenkalti/backoff/v5"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
)

// ErrStaleRevision is returned by Apply for a snapshot whose revision is
// lower than the one running (a revision of 0, a local file's, is never
// stale).
var ErrStaleRevision = errors.New("live: snapshot revision is older than the running one")

// Options are a Config's local settings: they are fixed for its lifetime
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
	// NewFallback) and starts from empty counters. To have it carry on
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
	// QuotaObserver, if set, is told of quota thresholds reached
	// (core.Options.QuotaObserver: a dataplane/threshold.Notifier).
	QuotaObserver core.QuotaObserver
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
	// Resolver resolves the secret references of a snapshot's JWT keys
	// (secret_env, secret_file, pem_file); nil means the process
	// environment and files relative to the working directory.
	Resolver spec.Resolver
	// Logger receives the Config's own log lines (store failures, JWKS
	// refresh failures, APIs and policies not built); nil means
	// slog.Default().
	Logger *slog.Logger
	// Seams freeze the clocks and timers in this module's tests (see
	// internal/seams; only this module can make one); nil means the system
	// clock, time.Now and time.AfterFunc.
	Seams *seams.Seams
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
	// Attach, if set, is called for each API when it is built (by Apply,
	// or later by a retry of an API ApplyPartial could not build), with
	// what enforces it; the handler it returns is the API's Handler (the
	// gateway's route: its proxy behind the rate-limit middleware). An
	// error leaves the API not built, as a failed build does. It is
	// called with the Config's lock held: it must not call the Config.
	Attach func(a *spec.API, b Built) (http.Handler, error)
	// Member names what the Config runs in, in the messages of its 503
	// answers ("policy %q is not built on this <Member>"); "" means
	// "service".
	Member string
}

// Built is what enforces one API of the running configuration, given to
// Options.Attach: Auth identifies its consumers (the key registry, a JWT
// authenticator or keyless by client IP; behind its failure limit when
// it has one), Sources are where Auth reads credentials (to strip them
// before an upstream sees the request; nil for keyless), and Limiter
// decides them (the state's engine).
type Built struct {
	Auth    identity.Authenticator
	Sources []identity.Source
	Limiter core.RouteDecider
}

// NotBuilt is an API or a policy of the running configuration that the
// gateway could not build, for a reason of its host, while everything
// else in the configuration is enforced. An API (an unset environment
// variable, a missing or short secret file, a JWKS it cannot fetch)
// answers 503 naming it and the problem, and the gateway keeps trying to
// build it. A policy (one its counter store cannot enforce, such as a
// sliding window on the in-process store) makes every request whose
// limits need it answer 503 naming it and the problem, never admitted
// and never counted; it is not retried, since the store will not change,
// and a later revision that changes it builds it. Exactly one of API and
// Policy is set.
type NotBuilt struct {
	// API is the API's id, "" for a policy.
	API string `json:"api,omitempty"`
	// Policy is the policy's id, "" for an API.
	Policy string `json:"policy,omitempty"`
	// Problem is why it is not built, as the last attempt failed (the
	// error of the secret's resolution or the JWKS fetch, or the store's
	// refusal of the policy's rate limit).
	Problem string `json:"problem"`
}

// Config is a running configuration: the last applied snapshot's
// policies in an engine, its keys in a registry and its APIs'
// authenticators, swapped together by Apply and changed in place by
// UpdateKeys. Until the first Apply it enforces nothing: every request
// through Limiter and Authenticator answers 503. It is safe for
// concurrent use.
type Config struct {
	opts     Options
	log      *slog.Logger
	now      func() time.Time // the wall clock (Options.Seams)
	fallback core.Store
	closers  []func() error
	onStore  func(error) // the engines' OnStoreError
	clientIP *identity.ClientIP

	state atomic.Pointer[State]
	// unavailable, when set, is the reason every API request is answered
	// 503 (SetUnavailable).
	unavailable atomic.Pointer[string]

	mu     sync.Mutex // serialises Apply and Close
	jwks   map[spec.JWKS]*identity.JWKS
	closed bool
	// stopRebuild stops the retries of the running state's APIs that are
	// not built (nil when none run); rebuilds counts them, for Close.
	stopRebuild context.CancelFunc
	rebuilds    sync.WaitGroup
	// ctx bounds the JWKS refreshes; cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc
}

// State is one applied snapshot, ready to serve: every request loads it
// once and is decided entirely by it, except for its keys, which
// UpdateKeys changes in place (each request looks its key up once, so it
// is decided under one version of that key).
type State struct {
	// base is the applied snapshot without its keys: its revision,
	// policies and APIs (shared with it). The keys are held only by keys,
	// in records from which keyOf makes each spec.Key again, so a gateway
	// does not hold a million keys twice (see Snapshot).
	base *spec.Snapshot
	// applied is the snapshot given to Apply, for as long as its caller
	// keeps it.
	applied weak.Pointer[spec.Snapshot]
	engine  *core.Engine
	keys    *identity.Keys
	apiKey  *identity.APIKey
	// list is every API in the snapshot's order, routes the same longest
	// listen path first (stable), and byID by id.
	list, routes []*API
	byID         map[string]*API
	// notBuilt are the APIs that could not be built, in the snapshot's
	// order; each becomes built at most once (a retry).
	notBuilt []*API
	// unenforced are the policies this host's store cannot enforce, left
	// out of engine by ApplyPartial, in the snapshot's order; they are
	// built again only by a later Apply (the store will not change).
	unenforced []NotBuilt
	// limiter decides the routes' requests: engine, or a policyGuard
	// over it when unenforced is not empty.
	limiter  core.RouteDecider
	apis     map[string]*spec.API
	policies map[string]*spec.Policy

	revision atomic.Uint64 // base.Revision, raised by UpdateKeys
	edited   atomic.Bool   // UpdateKeys has changed keys
	// current is the snapshot Snapshot last made for revision, for as
	// long as a caller keeps it; zero when out of date. Guarded by
	// Config.mu.
	current weak.Pointer[spec.Snapshot]
}

// New returns a Config with opts and no snapshot: everything it decides
// answers 503 until Apply succeeds. Close releases what it starts. It
// fails when Options.Store is nil or Options.ClientIP is invalid.
func New(opts Options) (*Config, error) {
	if opts.Store == nil {
		return nil, errors.New("live: Options.Store is nil")
	}
	sm := opts.Seams.Or()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Resolver == nil {
		opts.Resolver = osResolver{}
	}
	if opts.Member == "" {
		opts.Member = "service"
	}
	g := &Config{opts: opts, log: opts.Logger, now: sm.Now, jwks: map[spec.JWKS]*identity.JWKS{}}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	failures := failurelog.New(g.log, failurelog.Options{Msg: "limit store failed", AfterFunc: sm.AfterFunc})
	g.closers = append(g.closers, failures.Close)
	g.onStore = func(err error) {
		if opts.OnStoreError != nil {
			opts.OnStoreError(err)
		}
		failures.Failed(err)
	}
	g.fallback = opts.Fallback
	if opts.FailurePolicy == core.FailFallback && g.fallback == nil {
		fb := NewFallback(sm.Clock, opts.FallbackMaxKeys)
		g.closers = append(g.closers, fb.Close)
		g.fallback = fb
	}
	ip, err := identity.NewClientIP(opts.ClientIP)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("live: %w", err)
	}
	g.clientIP = ip
	return g, nil
}

// Apply validates snap and, if it is valid and every API in it can be
// built, makes it the gateway's configuration: policies, keys and routes
// change together for the next request; requests in flight finish under
// the previous snapshot; counters are kept. Kept counters meet the new
// limits as they stand: a quota count is compared with the new maximum (5
// spent of 5 an hour, raised to 10, leaves exactly 5), and a GCRA
// theoretical arrival time with the new burst tolerance (a burst of 5 a
// minute spent, raised to 10 a minute, leaves the bucket empty at the new
// rate too: it refills at one every 6 s from then). Otherwise it returns
// an error and the running configuration stays: a spec.Errors for an
// invalid snapshot, ErrStaleRevision for one older than the running one, or the
// problem building an API (an unresolvable secret, a JWKS that cannot be
// fetched within ctx, an algorithm the store lacks). Apply keeps snap's
// policies and APIs, and Snapshot may return snap itself: the caller must
// not change it afterwards. It does not keep snap's list of keys (the key
// registry holds them, about 180 bytes a key), so a caller that drops snap
// after Apply frees that memory. A local file's caller uses it: a file
// that does not work as a whole is refused.
func (g *Config) Apply(ctx context.Context, snap *spec.Snapshot) error {
	return g.apply(ctx, snap, applyMode{})
}

// ApplyPartial is Apply for a data plane's delivery, where one API must
// not hold up the rest (a key delete above all): an API that only this
// host can fail to build (a JWT secret from an environment variable or
// file it lacks or holds too short, a JWKS it cannot fetch within ctx
// and JWKSApplyTimeout) does not stop the rest. snap is applied without
// it, the API answers 503 naming it and the problem, NotBuilt lists it,
// and the gateway retries it with backoff (RebuildInitial, RebuildMax)
// until it builds or the next Apply or Close. A JWKS the running
// configuration could not fetch is not fetched again within
// ApplyPartial (its retry goes on). Likewise a policy this host's store
// (or fallback) cannot enforce (core.CheckSupport: an algorithm the
// in-process store lacks, a limit the Redis store cannot count exactly)
// is left out: a request whose limits need it answers 503 naming the
// policy and the problem, neither admitted nor counted, and NotBuilt
// lists it; it is not retried (the store does not change), the next
// ApplyPartial checks it again. The other errors are Apply's: an invalid
// or stale snapshot.
func (g *Config) ApplyPartial(ctx context.Context, snap *spec.Snapshot) error {
	return g.apply(ctx, snap, applyMode{partial: true})
}

// Replace is ApplyPartial without the revision check: snap replaces the
// running configuration whatever their revisions, and its revision is the
// one running from then on. A data-plane agent calls it for a snapshot of
// another control-plane history (a control plane restored from a copy
// numbers revisions anew), where a lower revision is not an older
// configuration.
func (g *Config) Replace(ctx context.Context, snap *spec.Snapshot) error {
	return g.apply(ctx, snap, applyMode{partial: true, replace: true})
}

// applyMode says how apply treats a snapshot: partial leaves out the APIs
// only this host cannot build (ApplyPartial), replace skips the revision
// check (Replace).
type applyMode struct{ partial, replace bool }

func (g *Config) apply(ctx context.Context, snap *spec.Snapshot, mode applyMode) (err error) {
	if g.opts.OnApply != nil {
		// Deferred first, so it runs after the unlock below.
		defer func() {
			var rev uint64
			if snap != nil {
				rev = snap.Revision
			}
			g.opts.OnApply(rev, err)
		}()
	}
	if snap == nil {
		return errors.New("live: Apply: nil snapshot")
	}
	if err := snap.Validate(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("live: Apply after Close")
	}
	if cur := g.state.Load(); !mode.replace && cur != nil && snap.Revision != 0 && snap.Revision < cur.revision.Load() {
		return fmt.Errorf("%w (%d < %d)", ErrStaleRevision, snap.Revision, cur.revision.Load())
	}
	st, jwks, err := g.build(ctx, snap, g.jwks, mode.partial)
	if err != nil {
		// JWKS fetched for this snapshot only are not needed after all.
		for k, j := range jwks {
			if g.jwks[k] != j {
				j.Close()
			}
		}
		return err
	}
	g.state.Store(st)
	for k, j := range g.jwks {
		if jwks[k] != j {
			// Requests in flight may still use j: its cached keys stay
			// usable after Close, only its refresh stops.
			j.Close()
		}
	}
	g.jwks = jwks
	if g.stopRebuild != nil {
		g.stopRebuild()
		g.stopRebuild = nil
	}
	for _, p := range st.unenforced {
		g.log.Warn("live: policy not built; requests that need it answer 503", "policy", p.Policy, "revision", snap.Revision, "err", p.Problem)
	}
	if len(st.notBuilt) > 0 {
		for _, p := range st.notBuilt {
			g.log.Warn("live: API not built; it answers 503 and is retried", "api", p.spec.ID, "revision", snap.Revision, "err", p.problem())
		}
		rctx, cancel := context.WithCancel(g.ctx)
		g.stopRebuild = cancel
		g.rebuilds.Go(func() { g.rebuild(rctx, st) })
	}
	if g.opts.OnNotBuilt != nil {
		g.opts.OnNotBuilt(st.notBuiltList())
	}
	return nil
}

// NotBuilt returns the objects of the running configuration that are not
// built, or nil when all are (or nothing is applied): first the policies
// the store cannot enforce, then the APIs, each in the snapshot's order.
// Each API answers 503 until a retry builds it; each policy until a later
// Apply changes it.
func (g *Config) NotBuilt() []NotBuilt {
	if st := g.state.Load(); st != nil {
		return st.notBuiltList()
	}
	return nil
}

func (st *State) notBuiltList() []NotBuilt {
	out := slices.Clone(st.unenforced)
	for _, p := range st.notBuilt {
		if p.built.Load() == nil {
			out = append(out, NotBuilt{API: p.spec.ID, Problem: p.problem()})
		}
	}
	return out
}

// API is one API of a running configuration: its definition and, once
// built, what enforces it. An API that ApplyPartial could not build has
// no Built until a retry builds it (Problem says why meanwhile).
type API struct {
	spec   *spec.API
	prefix string // the listen path without its final slash: "" for "/"
	built  atomic.Pointer[builtAPI]
	last   atomic.Pointer[string] // the last attempt's problem
}

// builtAPI is a built API: what enforces it, and Attach's handler.
type builtAPI struct {
	b Built
	h http.Handler
}

// Spec returns the API's definition. The caller must not change it.
func (a *API) Spec() *spec.API { return a.spec }

// ID returns the API's id.
func (a *API) ID() string { return a.spec.ID }

// Prefix returns the API's listen path without its final slash ("" for
// "/"), for routing by path prefix.
func (a *API) Prefix() string { return a.prefix }

// Built returns what enforces the API, and false when it is not built.
func (a *API) Built() (Built, bool) {
	if b := a.built.Load(); b != nil {
		return b.b, true
	}
	return Built{}, false
}

// Handler returns the handler Options.Attach made for the API, nil when
// the API is not built or there is no Attach.
func (a *API) Handler() http.Handler {
	if b := a.built.Load(); b != nil {
		return b.h
	}
	return nil
}

// Problem returns why the API is not built (the last attempt's error), ""
// when it is built.
func (a *API) Problem() string {
	if a.built.Load() != nil {
		return ""
	}
	if p := a.last.Load(); p != nil {
		return *p
	}
	return ""
}

func (a *API) problem() string { return *a.last.Load() }

// Default retry intervals of APIs not built (Options.RebuildInitial,
// RebuildMax).
const (
	defaultRebuildInitial = 250 * time.Millisecond
	defaultRebuildMax     = 30 * time.Second
	// rebuildTimeout bounds one attempt (a JWKS fetch).
	rebuildTimeout = 10 * time.Second
	// defaultJWKSApplyTimeout is Options.JWKSApplyTimeout's default.
	defaultJWKSApplyTimeout = time.Second
)

// rebuild retries st's APIs that are not built, with backoff, until all
// are built or ctx ends (the next Apply, Close).
func (g *Config) rebuild(ctx context.Context, st *State) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = cmpOr(g.opts.RebuildInitial, defaultRebuildInitial)
	b.MaxInterval = cmpOr(g.opts.RebuildMax, defaultRebuildMax)
	b.Reset()
	for {
		t := time.NewTimer(min(b.NextBackOff(), b.MaxInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		left, changed := 0, false
		for _, p := range st.notBuilt {
			if p.built.Load() != nil {
				continue
			}
			switch built, err := g.rebuildOne(ctx, st, p); {
			case ctx.Err() != nil, errors.Is(err, errSuperseded):
				return
			case built:
				changed = true
				g.log.Info("live: API built on retry", "api", p.spec.ID, "revision", st.base.Revision)
			default:
				left++
				if err.Error() != p.problem() {
					changed = true
					p.last.Store(new(err.Error()))
				}
			}
		}
		if changed && g.opts.OnNotBuilt != nil {
			g.mu.Lock()
			if g.state.Load() == st {
				g.opts.OnNotBuilt(st.notBuiltList())
			}
			g.mu.Unlock()
		}
		if left == 0 {
			return
		}
	}
}

// rebuildOne tries to build p's route for st once, outside the gateway's
// lock (a JWKS fetch must not hold up UpdateKeys), and installs it when
// st still runs. It reports whether p is built now.
func (g *Config) rebuildOne(ctx context.Context, st *State, p *API) (bool, error) {
	g.mu.Lock()
	if g.closed || g.state.Load() != st {
		g.mu.Unlock()
		return false, errSuperseded
	}
	running := maps.Clone(g.jwks)
	g.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, rebuildTimeout)
	defer cancel()
	jwks := map[spec.JWKS]*identity.JWKS{}
	b, err := g.buildAPI(actx, st, p.spec, jwks, running)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil && (g.closed || g.state.Load() != st) {
		err = errSuperseded
	}
	if err != nil {
		for k, j := range jwks {
			if running[k] != j {
				j.Close()
			}
		}
		return false, err
	}
	for k, j := range jwks {
		if g.jwks[k] == nil {
			g.jwks[k] = j
		}
	}
	p.built.Store(b)
	return true, nil
}

// checkSupport returns the error of the first of the gateway's stores
// (Store, the fallback) that cannot enforce l, nil when both can.
func (g *Config) checkSupport(l core.Limit) error {
	for _, st := range []core.Store{g.opts.Store, g.fallback} {
		if err := core.CheckSupport(st, l); err != nil {
			return err
		}
	}
	return nil
}

// errPolicyNotBuilt is the Kind of the 503 a policyGuard answers with.
var errPolicyNotBuilt = errors.New("policy not built")

// policyNotBuilt is a policy left out of the engine, and the 503's reason.
type policyNotBuilt struct {
	policy *spec.Policy
	msg    string
}

// policyGuard decides for an engine that lacks the policies of bad: a
// consumer whose limits for the API need one of them (not overridden by
// its per-API limits, and the policy covers the API) gets an error that
// answers 503 naming the policy, before anything is counted; one that
// names them only for other APIs is decided without them.
type policyGuard struct {
	engine *core.Engine
	bad    map[string]*policyNotBuilt
}

// Decide implements core.Decider.
func (pg *policyGuard) Decide(ctx context.Context, c *core.Consumer, api string, cost int64) (core.Decision, error) {
	cc, err := pg.consumer(c, api)
	if err != nil {
		return core.Decision{}, err
	}
	return pg.engine.Decide(ctx, cc, api, cost)
}

// DecideRoute implements core.RouteDecider; an endpoint that needs a
// policy that is not built refuses by itself (core.Endpoint.Refuse).
func (pg *policyGuard) DecideRoute(ctx context.Context, c *core.Consumer, api string, route core.Route, cost int64) (core.Decision, error) {
	cc, err := pg.consumer(c, api)
	if err != nil {
		return core.Decision{}, err
	}
	return pg.engine.DecideRoute(ctx, cc, api, route, cost)
}

// consumer returns c as the engine may decide it for api: c itself, a
// copy without the policies that are not built and do not cover api, or
// the 503 of one that does.
func (pg *policyGuard) consumer(c *core.Consumer, api string) (*core.Consumer, error) {
	if c == nil {
		return c, nil
	}
	if _, own := c.APILimits[api]; own {
		return c, nil
	}
	n := 0
	for _, id := range c.Policies {
		b := pg.bad[id]
		if b == nil {
			continue
		}
		if len(b.policy.APIs) == 0 || slices.Contains(b.policy.APIs, api) {
			return nil, &identity.Error{Status: http.StatusServiceUnavailable, Kind: errPolicyNotBuilt, Reason: b.msg}
		}
		n++
	}
	if n == 0 {
		return c, nil
	}
	cc := *c
	cc.Policies = make([]string, 0, len(c.Policies)-n)
	for _, id := range c.Policies {
		if pg.bad[id] == nil {
			cc.Policies = append(cc.Policies, id)
		}
	}
	return &cc, nil
}

// errSuperseded ends a retry whose state no longer runs.
var errSuperseded = errors.New("live: the configuration was replaced")

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// build makes the state for snap, reusing the JWKS in running (the
// running configuration's) of the same URL and refresh interval. It
// returns the JWKS the state uses. An API whose route cannot be built is
// an error, or when partial gets a pending handler and is listed in the
// state's notBuilt.
func (g *Config) build(ctx context.Context, snap *spec.Snapshot, running map[spec.JWKS]*identity.JWKS, partial bool) (*State, map[spec.JWKS]*identity.JWKS, error) {
	jwks := map[spec.JWKS]*identity.JWKS{}
	policies := snap.CorePolicies()
	var unenforced []NotBuilt
	if partial {
		// A policy this host's store cannot enforce is left out of the
		// engine; the consumers that need it get 503 (policyGuard).
		kept := policies[:0]
		for _, p := range policies {
			err := g.checkSupport(p.Rate)
			for i := 0; err == nil && i < len(p.Endpoints); i++ {
				if err = g.checkSupport(p.Endpoints[i].Rate); err != nil {
					err = fmt.Errorf("its limit at endpoint %s of API %q: %w", core.EndpointKey(p.Endpoints[i].Method, p.Endpoints[i].Path), p.Endpoints[i].API, err)
				}
			}
			if err != nil {
				unenforced = append(unenforced, NotBuilt{Policy: p.ID, Problem: err.Error()})
				continue
			}
			kept = append(kept, p)
		}
		policies = kept
	}
	endpoints := snap.CoreEndpoints()
	if len(unenforced) > 0 {
		// An endpoint that needs a policy left out answers 503 naming
		// it, as the consumers that need one do.
		for api, eps := range endpoints {
			for i := range eps {
				ep := &eps[i]
				for _, nb := range unenforced {
					if slices.Contains(ep.Policies, nb.Policy) {
						ep.Refuse = &identity.Error{Status: http.StatusServiceUnavailable, Kind: errPolicyNotBuilt,
							Reason: fmt.Sprintf("policy %q of this endpoint of API %q is not built on this %s: %s", nb.Policy, api, g.opts.Member, nb.Problem)}
						ep.Policies = slices.DeleteFunc(ep.Policies, func(id string) bool {
							return slices.ContainsFunc(unenforced, func(nb NotBuilt) bool { return nb.Policy == id })
						})
						break
					}
				}
			}
		}
	}
	engine, err := core.NewEngine(g.opts.Store, core.Config{Policies: policies, Endpoints: endpoints}, core.Options{
		FailurePolicy: g.opts.FailurePolicy,
		Fallback:      g.fallback,
		StoreTimeout:  g.opts.StoreTimeout,
		Shadow:        g.opts.Shadow,
		OnStoreError:  g.onStore,
		Observer:      g.opts.Observer,
		QuotaObserver: g.opts.QuotaObserver,
	})
	if err != nil {
		return nil, jwks, fmt.Errorf("live: %w", err)
	}
	records, err := snap.KeyRecords()
	if err != nil {
		return nil, jwks, fmt.Errorf("live: %w", err)
	}
	for i := range records {
		keepData(&records[i], &snap.Keys[i])
	}
	keys, err := identity.NewKeys(records)
	if err != nil {
		return nil, jwks, fmt.Errorf("live: %w", err)
	}
	base := *snap
	base.Keys = nil
	st := &State{base: &base, applied: weak.Make(snap), engine: engine, keys: keys,
		apis: make(map[string]*spec.API, len(snap.APIs)), policies: make(map[string]*spec.Policy, len(snap.Policies))}
	st.revision.Store(snap.Revision)
	for i := range snap.Policies {
		st.policies[snap.Policies[i].ID] = &snap.Policies[i]
	}
	st.limiter = engine
	if len(unenforced) > 0 {
		pg := &policyGuard{engine: engine, bad: make(map[string]*policyNotBuilt, len(unenforced))}
		for _, nb := range unenforced {
			pg.bad[nb.Policy] = &policyNotBuilt{policy: st.policies[nb.Policy],
				msg: fmt.Sprintf("policy %q is not built on this %s: %s", nb.Policy, g.opts.Member, nb.Problem)}
		}
		st.limiter, st.unenforced = pg, unenforced
	}
	st.apiKey = identity.NewAPIKey(keys, identity.APIKeyOptions{Now: g.now})
	// A JWKS the running configuration could not fetch is not fetched
	// again here: its retry goes on in the background, so a host that
	// does not answer delays no later revision.
	failing := map[spec.JWKS]string{}
	if cur := g.state.Load(); cur != nil && partial {
		for _, p := range cur.notBuilt {
			if j := p.spec.JWT; j != nil && j.JWKS != nil && p.built.Load() == nil {
				failing[*j.JWKS] = p.problem()
			}
		}
	}
	st.byID = make(map[string]*API, len(snap.APIs))
	for i := range snap.APIs {
		a := &snap.APIs[i]
		st.apis[a.ID] = a
		e := &API{spec: a, prefix: strings.TrimSuffix(a.ListenPath, "/")}
		var b *builtAPI
		var err error
		switch j := a.JWT; {
		case !partial:
			b, err = g.buildAPI(ctx, st, a, jwks, running)
		case j != nil && j.JWKS != nil && running[*j.JWKS] == nil && failing[*j.JWKS] != "":
			err = errors.New(failing[*j.JWKS])
		default:
			actx, cancel := context.WithTimeout(ctx, cmpOr(g.opts.JWKSApplyTimeout, defaultJWKSApplyTimeout))
			b, err = g.buildAPI(actx, st, a, jwks, running)
			cancel()
		}
		if err != nil && !partial {
			return nil, jwks, fmt.Errorf("live: API %q: %w", a.ID, err)
		}
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				// Apply's own deadline, not this API's problem.
				return nil, jwks, fmt.Errorf("live: API %q: %w", a.ID, cerr)
			}
			e.last.Store(new(err.Error()))
			st.notBuilt = append(st.notBuilt, e)
		} else {
			e.built.Store(b)
		}
		st.list = append(st.list, e)
		st.byID[a.ID] = e
	}
	for _, e := range st.list {
		if !e.spec.ServiceSide() {
			st.routes = append(st.routes, e)
		}
	}
	slices.SortStableFunc(st.routes, func(a, b *API) int { return len(b.prefix) - len(a.prefix) })
	return st, jwks, nil
}

// buildAPI builds what enforces one API: its authenticator (behind its
// failure limit, if any) and the state's limiter, then Options.Attach's
// handler. JWKS in running are reused; those it uses are added to jwks.
func (g *Config) buildAPI(ctx context.Context, st *State, a *spec.API, jwks, running map[spec.JWKS]*identity.JWKS) (*builtAPI, error) {
	var auth identity.Authenticator = st.apiKey
	sources := st.apiKey.Sources()
	switch a.AuthOrDefault() {
	case spec.AuthKeyless:
		// Each client address counts apart on each keyless API: two
		// keyless APIs with the same policy limit a client separately.
		auth, sources = &identity.Keyless{Policies: a.Policies, ClientIP: g.clientIP, IDSuffix: "@" + a.ID}, nil
	case spec.AuthJWT:
		j, err := g.newJWT(ctx, a, jwks, running)
		if err != nil {
			return nil, err
		}
		auth, sources = j, j.Sources()
	}
	if a.FailureLimit != nil {
		auth = &identity.FailureLimited{Auth: auth, Limiter: st.limiter, Policy: a.FailureLimit.Policy, ClientIP: g.clientIP, API: a.ID}
	}
	b := &builtAPI{b: Built{Auth: auth, Sources: sources, Limiter: st.limiter}}
	if g.opts.Attach != nil {
		h, err := g.opts.Attach(a, b.b)
		if err != nil {
			return nil, err
		}
		b.h = h
	}
	return b, nil
}

// newJWT returns a jwt API's authenticator. A key set fetched from a URL
// is fetched now (the API is not built without it) unless running (the
// running configuration's sets) already has it, and refreshed in the
// background until it is no longer used or the gateway closes.
func (g *Config) newJWT(ctx context.Context, a *spec.API, jwks, running map[spec.JWKS]*identity.JWKS) (*identity.JWT, error) {
	o, jo, err := a.JWT.Options(a.ID, g.opts.Resolver)
	if err != nil {
		return nil, err
	}
	o.Now = g.now
	if jo != nil {
		k := *a.JWT.JWKS
		set := jwks[k]
		if set == nil {
			set = running[k]
		}
		if set == nil {
			jo.OnError = func(err error) { g.log.Warn("JWKS refresh failed", "api", a.ID, "url", k.URL, "err", err) }
			// The set outlives this call: its refreshes are bound to the
			// gateway, its first fetch to ctx.
			set, err = newJWKS(ctx, g.ctx, *jo)
			if err != nil {
				return nil, err
			}
		}
		jwks[k] = set
		o.JWKS = set
	}
	return identity.NewJWT(o)
}

// newJWKS starts a key set whose first fetch is bounded by ctx and whose
// refreshes run until life ends or the set is closed.
func newJWKS(ctx, life context.Context, o identity.JWKSOptions) (*identity.JWKS, error) {
	fctx, cancel := context.WithCancel(life)
	stop := context.AfterFunc(ctx, cancel)
	set, err := identity.NewJWKS(fctx, o)
	if !stop() && err == nil {
		// ctx ended just as the fetch succeeded: the set's refreshes
		// would already be cancelled.
		set.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return set, nil
}

// ErrNotApplied is returned by UpdateKeys before the first Apply.
var ErrNotApplied = errors.New("live: no configuration applied yet")

// UpdateKeys changes keys of the running configuration without rebuilding
// it, for a data plane applying a control plane's changes: it adds or
// replaces the keys of put and deletes the keys whose hashes
// ("sha256:<hex>", any case) are in del, and raises the running revision
// to revision. Policies, APIs, the engine and the routes stay as they are,
// and so do counters: a key whose policies change meets its new limits on
// its next request with what it has spent (as under Apply).
//
// Its cost is proportional to the change, not to the keys held: each key
// is validated against the running policies and APIs, and the key
// registry copies only the shards the change touches (about 128 keys
// each; see identity.Keys.Update). One key changed on a gateway holding a
// million keys takes microseconds (BenchmarkUpdateKeys).
//
// Atomicity: each request looks its key up once, so it is decided
// entirely under the old or entirely under the new version of its key;
// the registry swaps the whole change at once, so no request sees part of
// it. (Apply's stronger rule, one snapshot for the whole request, is kept
// too: policies, APIs and routes do not change here.)
//
// The whole call is refused, and nothing changes, when: revision is not
// above the running one (ErrStaleRevision; 0 is never above); no
// snapshot was applied yet (ErrNotApplied); a put key is invalid as
// spec.ValidateKey says against the running policies and APIs (a
// spec.Errors with paths "put[i]..." and "delete[i]"); a hash is put
// twice, or both put and deleted; or a deleted key is not held
// (identity.ErrUnknownKey: drift, which a fresh snapshot repairs). ctx is
// checked before anything is done. UpdateKeys keeps put's contents
// (slices, maps, times): the caller must not change them afterwards.
// Options.OnApply is told the outcome as for Apply, with revision.
func (g *Config) UpdateKeys(ctx context.Context, revision uint64, put []spec.Key, del []string) (err error) {
	if g.opts.OnApply != nil {
		defer func() { g.opts.OnApply(revision, err) }()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("live: update keys: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("live: UpdateKeys after Close")
	}
	st := g.state.Load()
	if st == nil {
		return ErrNotApplied
	}
	if cur := st.revision.Load(); revision <= cur {
		return fmt.Errorf("%w (%d <= %d)", ErrStaleRevision, revision, cur)
	}
	var errs spec.Errors
	records := make([]identity.KeyRecord, 0, len(put))
	for i := range put {
		if err := spec.ValidateKey(fmt.Sprintf("put[%d]", i), &put[i], st.policies, st.apis); err != nil {
			var ve spec.Errors
			if !errors.As(err, &ve) {
				return fmt.Errorf("live: put[%d]: %w", i, err)
			}
			errs = append(errs, ve...)
			continue
		}
		rec, err := put[i].Record()
		if err != nil { // ValidateKey checked the hash
			return fmt.Errorf("live: %w", err)
		}
		keepData(&rec, &put[i])
		records = append(records, rec)
	}
	hashes := make([]identity.KeyHash, 0, len(del))
	for i, s := range del {
		h, err := identity.ParseKeyHash(s)
		if err != nil {
			errs = append(errs, &spec.Error{Path: fmt.Sprintf("delete[%d]", i), Problem: fmt.Sprintf("%q is not sha256:<64 hex digits>", s)})
			continue
		}
		hashes = append(hashes, h)
	}
	if len(errs) > 0 {
		return errs
	}
	if err := st.keys.Update(records, hashes); err != nil {
		return fmt.Errorf("live: %w", err)
	}
	st.revision.Store(revision)
	st.edited.Store(true)
	st.current = weak.Pointer[spec.Snapshot]{}
	return nil
}

// keepData sets rec.Data to a copy of k, the key rec was made from, when
// keyOf could not make k again from rec alone: when k has per-API limits
// (the record holds them converted for the engine), an upper-case hex
// digit in its hash, an empty but non-nil list of policies, or an expiry
// that is the zero time. Otherwise Data stays nil and the key costs only
// its record.
func keepData(rec *identity.KeyRecord, k *spec.Key) {
	plain := k.APILimits == nil && (k.Policies == nil || len(k.Policies) > 0) &&
		(k.Expires == nil || !k.Expires.IsZero()) && !strings.ContainsAny(k.KeyHash, "ABCDEF")
	if !plain {
		c := *k
		rec.Data = &c
	}
}

// keyOf returns the spec.Key a record of the running keys was made from
// (by Apply or UpdateKeys): the copy keepData kept, or the key made again
// from the record's fields. Its slices and maps are the record's: the
// caller must not change them.
func keyOf(rec *identity.KeyRecord) spec.Key {
	if k, ok := rec.Data.(*spec.Key); ok {
		return *k
	}
	k := spec.Key{KeyHash: rec.Hash.String(), Policies: rec.Policies, Inactive: rec.Inactive, QuotaEpoch: rec.QuotaEpoch}
	if !rec.Expires.IsZero() {
		e := rec.Expires
		k.Expires = &e
	}
	return k
}

// Revision returns the running configuration's revision: the applied
// snapshot's, or the last UpdateKeys's; 0 before the first Apply.
func (g *Config) Revision() uint64 {
	if st := g.state.Load(); st != nil {
		return st.revision.Load()
	}
	return 0
}

// Snapshot returns the running configuration, or nil before the first
// Apply. The caller must not change it.
//
// Until UpdateKeys changes keys, it is the snapshot given to Apply, at no
// cost, as long as Apply's caller (or anyone) still holds that snapshot.
// Otherwise (the gateway does not keep the applied snapshot's keys: see
// Apply) it is made on demand: the applied snapshot's policies and APIs
// (shared), the running revision, and the keys as Apply and the changes
// since left them, equal to the keys applied (reflect.DeepEqual) and in
// the order protocol.ApplyChanges gives (a changed key keeps its place,
// new keys go last, in the order they were put). Made so, it is kept and
// returned again, until the next change, for as long as a caller holds
// it. Making it costs O(n) for n keys held (O(n log n) once many more
// keys were added over time than are held: see identity.Keys.Records),
// about half a second for a million, and about 150 bytes a key (a
// spec.Key and its key_hash string; its slices and maps are shared with
// the registry); it waits for an UpdateKeys or Apply in progress.
func (g *Config) Snapshot() *spec.Snapshot {
	st := g.state.Load()
	if st == nil {
		return nil
	}
	if !st.edited.Load() {
		if s := st.applied.Value(); s != nil {
			return s
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st = g.state.Load()
	if !st.edited.Load() {
		if s := st.applied.Value(); s != nil {
			return s
		}
	}
	if s := st.current.Value(); s != nil {
		return s
	}
	s := *st.base
	s.Revision = st.revision.Load()
	recs := st.keys.Records()
	if len(recs) > 0 {
		s.Keys = make([]spec.Key, len(recs))
		for i, r := range recs {
			s.Keys[i] = keyOf(r)
		}
	}
	st.current = weak.Make(&s)
	return &s
}

// Key returns the running version of the key whose hash is hash
// ("sha256:<64 hex>", any case), or nil when it is not held, the hash does
// not parse, or nothing is applied yet. It is one registry lookup, as a
// request's: a data plane reads the old version of each key a change
// touches (to keep its configuration's digest up to date) without
// materialising a snapshot. The caller must not change the key.
func (g *Config) Key(hash string) *spec.Key {
	st := g.state.Load()
	if st == nil {
		return nil
	}
	h, err := identity.ParseKeyHash(hash)
	if err != nil {
		return nil
	}
	rec := st.keys.Lookup(h)
	if rec == nil {
		return nil
	}
	k := keyOf(rec)
	return &k
}

// SetUnavailable makes the gateway answer every API request 503 with
// {"error": reason} (and GET /readyz of its AdminHandler 503 with the
// same error) while reason is not "", whatever configuration it runs; ""
// lifts it. A data plane configured to fail closed sets it when it has
// been without its control plane for too long (dataplane's on_stale:
// fail_closed). The running configuration and counters are kept, so
// lifting it serves exactly as before. Safe for concurrent use; requests
// in flight are not affected.
func (g *Config) SetUnavailable(reason string) {
	if reason == "" {
		g.unavailable.Store(nil)
		return
	}
	g.unavailable.Store(&reason)
}

// Unavailable returns the reason given to SetUnavailable, "" when the
// gateway serves.
func (g *Config) Unavailable() string {
	if r := g.unavailable.Load(); r != nil {
		return *r
	}
	return ""
}

// Engine returns the engine of the running snapshot, or nil before the
// first Apply. Each Apply makes a new engine over the same store.
func (g *Config) Engine() *core.Engine {
	if st := g.state.Load(); st != nil {
		return st.engine
	}
	return nil
}

// Close stops the JWKS refreshes, the retries of APIs not built and the
// fallback store it made. Requests still being served finish with the
// configuration they have. Close does not close Options.Store.
func (g *Config) Close() error {
	// The retries take the lock: wait for them after releasing it.
	defer g.rebuilds.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	g.cancel()
	for _, j := range g.jwks {
		j.Close()
	}
	var errs []error
	for i := len(g.closers) - 1; i >= 0; i-- {
		errs = append(errs, g.closers[i]())
	}
	return errors.Join(errs...)
}
