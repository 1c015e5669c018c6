package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrNoPolicy reports a consumer none of whose policies covers the API
	// (Tyk answers such a key with 403 "access to this API has been
	// disallowed").
	ErrNoPolicy = errors.New("no policy grants access to this API")
	// ErrUnknownPolicy reports a consumer that names a policy the engine's
	// Config does not have.
	ErrUnknownPolicy = errors.New("unknown policy")
	// ErrStoreUnavailable wraps a store failure when the engine fails
	// closed; adapters answer it with 503, never 429.
	ErrStoreUnavailable = errors.New("limit store unavailable")
	// ErrNoConsumer is returned for a nil *Consumer.
	ErrNoConsumer = errors.New("no consumer")
)

// Limits is a rate limit and a quota set directly on a consumer for one API,
// overriding its policies there (Tyk's per-API limits on a key).
type Limits struct {
	Rate  Limit
	Quota Quota
	// QuotaEpoch is the epoch of the consumer's quota counter for this
	// API, apart from Consumer.QuotaEpoch because per-API limits have
	// counters of their own (see Request.QuotaEpoch). Raising it resets
	// this API's quota only.
	QuotaEpoch uint64
}

// Consumer is an authenticated caller as the engine sees it.
type Consumer struct {
	// ID keys the consumer's counters. It must be stable and must not be a
	// raw credential: identity uses a hash of the API key, the JWT subject
	// claim, or "ip:" and the client address.
	ID string
	// Policies are the IDs of the policies that apply. When several cover
	// an API, each limit is chosen separately among the policies that set
	// it: the most generous rate and the most generous quota win (as Tyk
	// combines policies), and Unlimited beats every finite limit. A policy
	// that leaves a limit out (zero) takes no part in choosing it, so one
	// policy may carry the rate and another the quota (Tyk's partitioned
	// policies); when none of them sets a rate there is no rate limit, and
	// likewise for the quota.
	Policies []string
	// APILimits, when it has an entry for an API, replaces the policies
	// for that API and gives the consumer separate counters there.
	APILimits map[string]Limits
	// QuotaEpoch is the epoch of the consumer's key-wide quota counter
	// (see Request.QuotaEpoch): raising it starts a fresh quota period
	// on the consumer's next request, on every store; giving the same
	// value again changes nothing. A control plane raises it to reset a
	// key's quota. The rate limit is not affected.
	QuotaEpoch uint64
}

// Config is the engine's policy set. It is immutable once passed to
// Engine.SetConfig; changes swap in a new Config.
type Config struct {
	Policies []Policy
	// Endpoints are APIs' endpoints by API id: parts of an API, by method
	// and path, with policies of their own that apply besides the
	// consumer's (see Endpoint and Engine.DecideRoute). SetConfig
	// prepares each endpoint's limits and compiles each API's endpoints
	// into a matcher once.
	Endpoints map[string][]Endpoint
}

// snapshot is a validated Config indexed for lookup, with every policy's
// limits prepared on the engine's stores.
type snapshot struct {
	policies map[string]*policyEntry
	// few holds the policies when there are at most maxFewPolicies of
	// them (nil otherwise), for policy: comparing a few IDs costs less
	// than hashing one, and a consumer's IDs usually share their bytes
	// with the configuration's (the registry's records share one list).
	few []*policyEntry
	// none is what a request no limit applies to resolves to.
	none resolved
	// pairs holds the rules of a rate limit from one policy with a quota
	// from another and an in-flight cap from a third
	// ([3]*policyEntry{rate, quota, inFlight} → *resolved), prepared on
	// first use; at most (policies)³ entries, in practice a handful.
	pairs sync.Map
	// limits holds the rules of consumers' per-API Limits (LimitSet →
	// *resolved), prepared on first use; at most maxCachedLimits entries,
	// counted by nLimits. Beyond that, a Limits is prepared per request.
	limits  sync.Map
	nLimits atomic.Int64
	// endpoints are the APIs' endpoint matchers by API id (Config.Endpoints).
	endpoints map[string]*endpointMatcher
}

// maxFewPolicies is the most policies snapshot.few holds.
const maxFewPolicies = 8

// policy returns the policy with the given ID, as s.policies[id].
func (s *snapshot) policy(id string) (*policyEntry, bool) {
	if s.few == nil {
		p, ok := s.policies[id]
		return p, ok
	}
	for _, p := range s.few {
		if p.ID == id {
			return p, true
		}
	}
	return nil, false
}

// maxCachedLimits bounds snapshot.limits: distinct per-API limit sets are
// usually a handful of plans, but keys may carry arbitrary ones.
const maxCachedLimits = 1 << 16

// policyEntry is a policy with its own limits prepared.
type policyEntry struct {
	Policy
	// solo is a consumer of this policy alone: LimitSet{p.Rate, p.Quota,
	// "", p.Distributed}, named after p where it sets the limit.
	solo resolved
}

// resolved is what a consumer's limits for an API come to: the rule to
// take and the policies its decisions name. It is made once (per policy,
// per pair of policies, per per-API limit set) and shared by every request
// that resolves to it, so resolving a request writes nothing; on a store of
// a million keys each store the request path makes costs about a
// nanosecond of the overlap between one request's cache miss and the
// next's (benchmarks/README.md).
type resolved struct {
	prepared
	ratePolicy, quotaPolicy string // "" where no policy set the limit
	inFlightPolicy          string
	rateShadow, quotaShadow bool
	inFlightShadow          bool
	// thresholds are the quota policy's (Policy.Thresholds) in
	// ascending order, nil for none: one length check per request then.
	thresholds []int64
}

// label names the policies of r in the store's decision *d and lets a
// shadowed denial through (Options.Shadow is shadow).
func (r *resolved) label(d *Decision, shadow bool) {
	d.Rate.Policy, d.Quota.Policy = r.ratePolicy, r.quotaPolicy
	switch d.DecidedBy {
	case KindRate:
		d.Policy = r.ratePolicy
		if !d.Allowed && (r.rateShadow || shadow) {
			d.Allowed, d.Shadowed, d.RetryAfter = true, true, 0
		}
	case KindQuota:
		d.Policy = r.quotaPolicy
		if !d.Allowed && (r.quotaShadow || shadow) {
			d.Allowed, d.Shadowed, d.RetryAfter = true, true, 0
		}
	case KindInFlight:
		d.Policy = r.inFlightPolicy
		if !d.Allowed && (r.inFlightShadow || shadow) {
			d.Allowed, d.Shadowed, d.RetryAfter = true, true, 0
		}
	}
}

// prepared is one LimitSet's rule on the engine's store and, under
// FailFallback, on the fallback store.
type prepared struct {
	rule, fallback *Rule
}

// FailurePolicy says what the engine does when its store fails. A store
// error that comes after the caller's context was canceled is not a
// failure: see Options.OnStoreError.
type FailurePolicy uint8

const (
	// FailOpen allows the request; the Decision has DecidedBy KindNone
	// and no remaining counts, and the error goes to Options.OnStoreError.
	FailOpen FailurePolicy = iota
	// FailClosed returns an error wrapping ErrStoreUnavailable; adapters
	// answer 503 (configurable), never 429.
	FailClosed
	// FailFallback applies the request to Options.Fallback (normally an
	// in-process store) instead.
	FailFallback
)

// Options configure an Engine. The zero value is usable: fail open, no store
// timeout, not shadowed.
type Options struct {
	// FailurePolicy applies when the store returns an error. Default
	// FailOpen.
	FailurePolicy FailurePolicy
	// Fallback is the store used under FailFallback.
	Fallback Store
	// StoreTimeout bounds each store call; 0 means the caller's context
	// alone bounds it.
	StoreTimeout time.Duration
	// Shadow, when true, makes every policy a shadow policy: decisions are
	// computed and reported but nothing is denied.
	Shadow bool
	// OnStoreError, if set, is called with every store error (for logs and
	// metrics), but for one that came while the caller's context was
	// canceled: Decide and Wait then return an error wrapping
	// context.Canceled under every FailurePolicy, and adapters answer 499
	// (gRPC: Canceled). It must be safe for concurrent use.
	OnStoreError func(error)
	// Observer, if set, is told about every Decide and every Wait call:
	// once per call, with its final decision and error (see Engine.Wait).
	Observer Observer
	// QuotaObserver, if set, is told when an admitted request's spend
	// reaches a quota threshold of the policy that set its quota
	// (Policy.Thresholds), from the decision the store answered: no
	// store call of its own, and only a length check for a request
	// whose quota policy names none.
	QuotaObserver QuotaObserver
}

// QuotaObserver is told of quota thresholds reached (Options.QuotaObserver).
// ObserveThreshold is called on the request path, once for each threshold
// the request's spend reaches: it must not block (queue the event) and
// must be safe for concurrent use. c, with its ID, may be memory the
// caller reuses once the decision returns (an adapter's pooled consumer):
// an observer copies what it keeps.
type QuotaObserver interface {
	ObserveThreshold(c *Consumer, t ThresholdReached)
}

// ThresholdReached is a quota threshold reached by one request: the
// request whose spend took the quota's count from below the threshold's
// units to at or above them (its cost at Decide or, for a quota that
// settles after the response, its settle's charge beyond the estimate), so in one quota period of one counter only
// one request, on whatever process, reaches each threshold (a counter
// that went down, by a refund, may reach it again: the observer's event
// id makes that the same event).
type ThresholdReached struct {
	// API is the scope of the quota's counter: the API id the request
	// was decided for.
	API string
	// Endpoint is, for the quota of one of the API's endpoints
	// (Config.Endpoints), the endpoint's EndpointKey ("POST /orders",
	// "* /orders/{}"): its counter is apart from the API's; "" for the
	// quota of the API itself.
	Endpoint string
	// Policy is the policy whose quota and thresholds these are.
	Policy string
	// Percent is the threshold, 1 to 100.
	Percent int64
	// Units is the count it stands for: ⌈Max × Percent / 100⌉.
	Units int64
	// Epoch is the quota epoch the counter is named with.
	Epoch uint64
	// Quota is the quota's state after the request: Limit is Max,
	// Limit − Remaining the units spent, ResetAfter the time left in
	// the period, Window its length (so the period started Window −
	// ResetAfter ago).
	Quota Status
}

// observeThresholds tells the QuotaObserver of every threshold of r that
// the admitted request d, of cost units, reached; endpoint is the
// EndpointKey of the endpoint whose counter r is, "" for the API's.
func (e *Engine) observeThresholds(c *Consumer, api, endpoint string, r *resolved, epoch uint64, cost int64, d *Decision) {
	q := d.Quota
	if !d.Allowed || d.Shadowed || q.Limit <= 0 || cost <= 0 {
		return
	}
	used := q.Limit - q.Remaining
	before := used - cost
	units := func(pct int64) int64 { return (q.Limit*pct + 99) / 100 }
	ts := r.thresholds
	// The first threshold above what was spent before; units grow with
	// the percentage.
	lo, hi := 0, len(ts)
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); units(ts[m]) <= before {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for _, pct := range ts[lo:] {
		u := units(pct)
		if u > used {
			break
		}
		e.opts.QuotaObserver.ObserveThreshold(c, ThresholdReached{API: api, Endpoint: endpoint, Policy: r.quotaPolicy, Percent: pct, Units: u, Epoch: epoch, Quota: q})
	}
}

// watchSettle makes the admitted decision d, of cost units under r,
// tell the QuotaObserver of the thresholds its settle reaches, when r's
// quota settles after the response (LimitSet.Settle) and has thresholds:
// a settle that charges more than the estimate can take the count past a
// threshold no Decide crossed. d.Hold then settles through a settleWatch.
func (e *Engine) watchSettle(d *Decision, c *Consumer, api, endpoint string, r *resolved, epoch uint64, cost int64) {
	if !d.Allowed || d.Shadowed || !d.Hold.Held() || !r.rule.Limits().Settle {
		return
	}
	d.Hold = NewHold(&settleWatch{e: e, inner: d.Hold, c: Consumer{ID: strings.Clone(c.ID)}, api: api, endpoint: endpoint,
		r: r, epoch: epoch, estimate: cost, end: time.Now().Add(d.Quota.ResetAfter), quota: d.Quota})
}

// settleWatch is the Settler of a decision watchSettle watches: it
// settles inner and, when the actual cost was above the estimate, tells
// the QuotaObserver of the thresholds between the count before the
// difference and after it, as Decide does for its own cost. The count is
// the one the store reports with the settle (Settler's landed: no store
// call, and on an asynchronous store no wait on the caller's goroutine);
// from a store that cannot say it, it is read (a store call that spends
// nothing, after the settle: stores order a key's later calls after its
// settle). Nothing is told when the quota period is no longer the one
// the estimate went to (the settle changed nothing then), or when the
// read fails.
type settleWatch struct {
	e             *Engine
	inner         Hold
	c             Consumer // its ID copied: the caller's consumer may be reused
	api, endpoint string
	r             *resolved
	epoch         uint64
	estimate      int64
	end           time.Time // when the estimate's quota period ends
	quota         Status    // the estimate's decision's quota status
}

func (w *settleWatch) Release() { w.inner.Release() }

func (w *settleWatch) Settle(actual int64, landed func(used int64, known bool)) {
	extra := actual - w.estimate
	if extra <= 0 {
		w.inner.settle(actual, landed)
		return
	}
	w.inner.settle(actual, func(used int64, known bool) {
		if known {
			w.observe(extra, used)
		} else {
			w.read(extra)
		}
		if landed != nil {
			landed(used, known)
		}
	})
}

// observe tells of the thresholds a settle of extra units beyond the
// estimate reached, the period's count being used after it.
func (w *settleWatch) observe(extra, used int64) {
	left := time.Until(w.end)
	if left <= 0 {
		return // the period ended since
	}
	q := w.quota
	q.Remaining, q.ResetAfter = max(q.Limit-used, 0), left
	d := Decision{Allowed: true, Quota: q}
	w.e.observeThresholds(&w.c, w.api, w.endpoint, w.r, w.epoch, extra, &d)
}

// read is observe for a store that did not say the count: it reads it.
func (w *settleWatch) read(extra int64) {
	ctx, cancel := context.WithTimeout(WithoutInFlight(context.Background()), settleReadTimeout)
	defer cancel()
	d, err := w.e.take(ctx, Request{Consumer: w.c.ID, Rule: w.r.rule, QuotaEpoch: w.epoch}, w.r.fallback)
	if err != nil || d.Quota.Limit <= 0 {
		return
	}
	if end := time.Now().Add(d.Quota.ResetAfter); end.Sub(w.end).Abs() > time.Second {
		return // another period: the settle went nowhere
	}
	d.Allowed, d.Shadowed = true, false // a read: only its quota status counts
	w.e.observeThresholds(&w.c, w.api, w.endpoint, w.r, w.epoch, extra, &d)
}

// settleReadTimeout bounds settleWatch's read of the quota.
const settleReadTimeout = 2 * time.Second

// Observer is told about every decision the engine makes, for metrics and
// logs: once per Engine.Decide, DecideRoute or Wait call that spends
// something. A call of cost 0 (a peek, which spends and stores nothing:
// identity.FailureLimited's check on every request, a status read) is not
// a decision and is not reported; an endpoint's own cost counts as the
// call's. took is the time spent
// deciding, store round trips included; for Wait it is the sum of its store
// calls and leaves out the time slept. Implementations must be safe for
// concurrent use and must not block.
type Observer interface {
	ObserveDecision(api string, d Decision, err error, took time.Duration)
}

// Engine decides requests for consumers against policies, using a Store for
// the counters. It is safe for concurrent use; SetConfig swaps the policy set
// atomically with no lock on the request path.
type Engine struct {
	store Store
	opts  Options
	snap  atomic.Pointer[snapshot]
}

// NewEngine returns an Engine over store with the policies of cfg.
func NewEngine(store Store, cfg Config, opts Options) (*Engine, error) {
	if store == nil {
		return nil, errors.New("core: NewEngine: nil store")
	}
	if opts.FailurePolicy == FailFallback && opts.Fallback == nil {
		return nil, errors.New("core: NewEngine: FailFallback needs Options.Fallback")
	}
	e := &Engine{store: store, opts: opts}
	if err := e.SetConfig(cfg); err != nil {
		return nil, err
	}
	return e, nil
}

// SetConfig validates cfg, prepares every policy's limits on the store (and
// the fallback store), and swaps it in; requests already being decided
// finish with the old config. A policy a store cannot enforce (Prepare's
// error) fails the whole call, naming the policy. Counters are kept: a
// changed rate takes effect on the next request without resetting anyone.
func (e *Engine) SetConfig(cfg Config) error {
	s := &snapshot{policies: make(map[string]*policyEntry, len(cfg.Policies))}
	var err error
	if s.none.prepared, err = e.prepare(LimitSet{}); err != nil {
		return err
	}
	for i := range cfg.Policies {
		p := &policyEntry{Policy: cfg.Policies[i]}
		if err := p.Validate(); err != nil {
			return err
		}
		if _, dup := s.policies[p.ID]; dup {
			return fmt.Errorf("%w: duplicate policy id %q", ErrInvalidLimit, p.ID)
		}
		if p.solo.prepared, err = e.prepare(LimitSet{Rate: p.Rate, Quota: quotaOf(&p.Policy), Distributed: p.Distributed, InFlight: p.InFlight, Settle: p.Settle && !p.Quota.IsZero()}); err != nil {
			return fmt.Errorf("policy %q: %w", p.ID, err)
		}
		if !p.Rate.IsZero() {
			p.solo.ratePolicy, p.solo.rateShadow = p.ID, p.Shadow
		}
		if !p.Quota.IsZero() {
			p.solo.quotaPolicy, p.solo.quotaShadow = p.ID, p.Shadow
			if len(p.Thresholds) > 0 {
				p.solo.thresholds = slices.Clone(p.Thresholds)
				slices.Sort(p.solo.thresholds)
			}
		}
		if p.InFlight > 0 {
			p.solo.inFlightPolicy, p.solo.inFlightShadow = p.ID, p.Shadow
		}
		p.APIs = append([]string(nil), p.APIs...)
		s.policies[p.ID] = p
	}
	order := make([]*policyEntry, 0, len(cfg.Policies))
	for i := range cfg.Policies {
		order = append(order, s.policies[cfg.Policies[i].ID])
	}
	if len(order) <= maxFewPolicies {
		s.few = order
	}
	found := map[*PolicyEndpoint]bool{}
	for api, eps := range cfg.Endpoints {
		if len(eps) == 0 {
			continue
		}
		m, err := e.compileEndpoints(s, order, api, eps, found)
		if err != nil {
			return err
		}
		if s.endpoints == nil {
			s.endpoints = make(map[string]*endpointMatcher, len(cfg.Endpoints))
		}
		s.endpoints[api] = m
	}
	if err := checkPolicyEndpoints(&cfg, found); err != nil {
		return err
	}
	e.snap.Store(s)
	return nil
}

// quotaOf is p's quota as a LimitSet carries it: a global quota names the
// policy (GlobalQuota.Policy), which the ledger entry is kept under.
func quotaOf(p *Policy) Quota {
	q := p.Quota
	if q.Global.Mode != NotGlobal {
		q.Global.Policy = p.ID
	}
	return q
}

// prepare prepares ls on the store and, under FailFallback, the fallback.
func (e *Engine) prepare(ls LimitSet) (prepared, error) {
	var pr prepared
	var err error
	if pr.rule, err = e.store.Prepare(ls); err != nil {
		return prepared{}, err
	}
	if e.opts.FailurePolicy == FailFallback {
		if pr.fallback, err = e.opts.Fallback.Prepare(ls); err != nil {
			return prepared{}, fmt.Errorf("fallback store: %w", err)
		}
	}
	return pr, nil
}

// CheckSupport returns nil when store (nil: none) can enforce the rate
// limit l (its Prepare accepts it), or the error SetConfig refuses a policy
// with: one wrapping ErrUnsupportedAlgorithm or ErrInvalidLimit. A limit
// that is not enforced (zero or unlimited) is always supported. It depends
// on the store alone, so a caller holding many stores' configurations (a
// gateway of a data plane) can leave out just the policies its own store
// cannot enforce.
func CheckSupport(store Store, l Limit) error {
	if store == nil || !l.Enforced() {
		return nil
	}
	_, err := store.Prepare(LimitSet{Rate: l})
	return err
}

// Policy returns the current policy with the given ID.
func (e *Engine) Policy(id string) (Policy, bool) {
	p, ok := e.snap.Load().policies[id]
	if !ok {
		return Policy{}, false
	}
	return p.Policy, true
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// resolveIn returns what c's limits for api come to under snap, and the
// quota epoch of the counter they spend. Nothing is written: the result
// is shared.
func (e *Engine) resolveIn(snap *snapshot, c *Consumer, api string) (*resolved, uint64, error) {
	// The length check skips the map call for the common consumer
	// without per-API limits.
	if len(c.APILimits) > 0 {
		if l, ok := c.APILimits[api]; ok {
			q := l.Quota
			q.Global.Policy = "" // a key's own limit: the ledger entry names no policy
			r, err := e.limitsRule(snap, LimitSet{Rate: l.Rate, Quota: q, Scope: api})
			return r, l.QuotaEpoch, err
		}
	}
	if len(c.Policies) == 1 { // the common consumer: its one policy alone
		p, ok := snap.policy(c.Policies[0])
		switch {
		case !ok:
			return nil, 0, fmt.Errorf("%w %q", ErrUnknownPolicy, c.Policies[0])
		case !p.appliesTo(api):
			return nil, 0, ErrNoPolicy
		}
		return &p.solo, c.QuotaEpoch, nil
	}
	var rate, quota, inFlight *policyEntry
	found := false
	for _, id := range c.Policies {
		p, ok := snap.policy(id)
		if !ok {
			return nil, 0, fmt.Errorf("%w %q", ErrUnknownPolicy, id)
		}
		if !p.appliesTo(api) {
			continue
		}
		found = true
		// A limit the policy leaves out takes no part. On a tie the
		// first policy keeps it.
		if !p.Rate.IsZero() && (rate == nil || ratePerNs(p.Rate) > ratePerNs(rate.Rate)) {
			rate = p
		}
		if !p.Quota.IsZero() && (quota == nil || quotaPerNs(p.Quota) > quotaPerNs(quota.Quota)) {
			quota = p
		}
		if p.InFlight > 0 && (inFlight == nil || p.InFlight > inFlight.InFlight) {
			inFlight = p
		}
	}
	if !found {
		return nil, 0, ErrNoPolicy
	}
	// One policy that wins every limit it sets (the others left out by
	// every policy) is its own rule; a winner that sets a limit it does
	// not win is not.
	var one *policyEntry
	for _, w := range [3]*policyEntry{rate, quota, inFlight} {
		switch {
		case w == nil:
		case one == nil:
			one = w
		case one != w:
			r, err := e.pairRule(snap, rate, quota, inFlight)
			return r, c.QuotaEpoch, err
		}
	}
	if one == nil {
		return &snap.none, c.QuotaEpoch, nil
	}
	return &one.solo, c.QuotaEpoch, nil
}

// pairRule returns the rule of rate's rate limit with quota's quota and
// inFlight's in-flight cap (each nil: none), preparing it on first use.
func (e *Engine) pairRule(snap *snapshot, rate, quota, inFlight *policyEntry) (*resolved, error) {
	k := [3]*policyEntry{rate, quota, inFlight}
	if v, ok := snap.pairs.Load(k); ok {
		return v.(*resolved), nil
	}
	var ls LimitSet
	r := &resolved{}
	var ids []string
	if rate != nil {
		ls.Rate, ls.Distributed = rate.Rate, rate.Distributed
		r.ratePolicy, r.rateShadow = rate.ID, rate.Shadow
		ids = append(ids, rate.ID)
	}
	if quota != nil {
		ls.Quota, ls.Settle = quotaOf(&quota.Policy), quota.Settle
		r.quotaPolicy, r.quotaShadow, r.thresholds = quota.ID, quota.Shadow, quota.solo.thresholds
		ids = append(ids, quota.ID)
	}
	if inFlight != nil {
		ls.InFlight = inFlight.InFlight
		r.inFlightPolicy, r.inFlightShadow = inFlight.ID, inFlight.Shadow
		ids = append(ids, inFlight.ID)
	}
	pr, err := e.prepare(ls)
	if err != nil {
		return nil, fmt.Errorf("policies %q: %w", ids, err)
	}
	r.prepared = pr
	v, _ := snap.pairs.LoadOrStore(k, r)
	return v.(*resolved), nil
}

// limitsRule returns the rule of a consumer's per-API limits, prepared on
// first use and kept while fewer than maxCachedLimits are.
func (e *Engine) limitsRule(snap *snapshot, ls LimitSet) (*resolved, error) {
	if v, ok := snap.limits.Load(ls); ok {
		return v.(*resolved), nil
	}
	pr, err := e.prepare(ls)
	if err != nil {
		return nil, err
	}
	r := &resolved{prepared: pr}
	if snap.nLimits.Add(1) <= maxCachedLimits {
		snap.limits.Store(ls, r)
	}
	return r, nil
}

// Decide spends cost units of c's limits for api and returns the decision.
// cost 0 peeks. Errors: ErrNoConsumer for a nil c, ErrNoPolicy and
// ErrUnknownPolicy (the consumer may not use api: answer 403),
// ErrInvalidCost for a cost outside [0, MaxCost], and under FailClosed an
// error wrapping ErrStoreUnavailable. A denial by a shadow policy (or any
// denial under Options.Shadow) is returned allowed, with Shadowed set.
func (e *Engine) Decide(ctx context.Context, c *Consumer, api string, cost int64) (d Decision, err error) {
	// Small enough to inline: a caller that holds the *Engine gets the
	// decision written into its own variable, with no copy on the way.
	err = e.decideInto(ctx, e.snap.Load(), c, api, cost, &d)
	return d, err
}

// decideInto is Decide under snap, writing the decision into *d (which
// must be the zero Decision; it is left so with an error).
func (e *Engine) decideInto(ctx context.Context, snap *snapshot, c *Consumer, api string, cost int64, d *Decision) (err error) {
	// Nothing is written on the way to the store but the request (the
	// resolved answer is shared), and the store's decision is labelled in
	// place: on a large store every store this path makes shortens the
	// overlap between one request's cache miss and the next's. The
	// store's (Decision, error) result still goes through a temporary
	// (176 bytes since Decision.Hold), a cost of the Store interface's
	// shape (see benchmarks/README.md).
	var start time.Time
	observe := e.opts.Observer != nil && cost != 0
	if observe {
		start = time.Now()
	}
	r, epoch, err := e.planIn(snap, c, api, cost)
	if err == nil {
		req := Request{Consumer: c.ID, Rule: r.rule, Cost: cost, QuotaEpoch: epoch}
		switch {
		case !req.Rule.Enforced():
			d.Allowed = true
		case e.opts.StoreTimeout > 0:
			*d, err = e.takeWithin(ctx, req)
		default:
			*d, err = e.store.Take(ctx, req)
		}
		if err != nil {
			*d, err = e.failed(ctx, req, r.fallback, err)
		}
		if err == nil {
			r.label(d, e.opts.Shadow)
			if len(r.thresholds) > 0 && e.opts.QuotaObserver != nil {
				e.observeThresholds(c, api, "", r, epoch, cost, d)
				e.watchSettle(d, c, api, "", r, epoch, cost)
			}
		}
	}
	if observe {
		e.opts.Observer.ObserveDecision(api, *d, err, time.Since(start))
	}
	return err
}

// plan checks a Decide or Wait call and resolves c's limits for api.
func (e *Engine) plan(c *Consumer, api string, cost int64) (*resolved, uint64, error) {
	return e.planIn(e.snap.Load(), c, api, cost)
}

// planIn is plan under snap.
func (e *Engine) planIn(snap *snapshot, c *Consumer, api string, cost int64) (*resolved, uint64, error) {
	if cost < 0 || cost > MaxCost {
		return nil, 0, fmt.Errorf("%w: got %d", ErrInvalidCost, cost)
	}
	if c == nil {
		return nil, 0, ErrNoConsumer
	}
	return e.resolveIn(snap, c, api)
}

// Wait is Decide that, while denied, sleeps and retries, as the package
// function Wait does; it returns Decide's errors and Wait's. Everything
// Decide does applies: the cost is checked (ErrInvalidCost), the decision
// names its policies (Policy, Rate.Policy, Quota.Policy), and a denial by a
// shadow policy (or under Options.Shadow) is returned at once, allowed and
// Shadowed, without waiting; a shadowed rate limit is never reserved, so
// Wait does not sleep for it either. Options.Observer is told once per
// Wait call, with the final decision and error, not about each retry; its
// took is the time spent in store calls, without the time slept.
//
// Wait leaves in-flight limits out (WithoutInFlight): it has no response
// whose end would give a slot back, so it takes no slot and is limited by
// the rate limit and the quota alone, and its Decision holds nothing.
func (e *Engine) Wait(ctx context.Context, c *Consumer, api string, cost int64) (Decision, error) {
	return e.wait(ctx, c, api, cost, time.Now, newStdTimer)
}

// wait is Wait with the clock and timer seams of the package function wait.
func (e *Engine) wait(ctx context.Context, c *Consumer, api string, cost int64, now func() time.Time, newTimer func(time.Duration) timer) (Decision, error) {
	start := time.Now()
	r, epoch, err := e.plan(c, api, cost)
	took := time.Since(start)
	var d Decision
	if err == nil {
		if r.rule.InFlight() > 0 {
			ctx = WithoutInFlight(ctx) // no response bounds a slot: see Wait
		}
		take := func(ctx context.Context, req Request) (Decision, error) {
			start := time.Now()
			d, err := e.take(ctx, req, r.fallback)
			if err == nil {
				r.label(&d, e.opts.Shadow)
			}
			took += time.Since(start)
			return d, err
		}
		req := Request{Consumer: c.ID, Rule: r.rule, Cost: cost, QuotaEpoch: epoch}
		d, err = wait(ctx, take, req, !r.rateShadow && !e.opts.Shadow, now, newTimer)
	}
	if e.opts.Observer != nil && cost != 0 {
		e.opts.Observer.ObserveDecision(api, d, err, took)
	}
	return d, err
}

// ResetQuota deletes the quota counter c has for api (its key-wide counter,
// or its per-API one when c has APILimits for api) at c's current quota
// epoch (Consumer.QuotaEpoch or Limits.QuotaEpoch), with Store.ResetQuota.
// Counters of other epochs are left to expire. Under FailFallback the
// fallback's counter is reset first, the same way, so that a fallback
// seeded with the store's counts (Seeder) does not keep the old count for
// the next outage, and a reset made during one takes effect there; the
// error returned is the store's, else the fallback's. The quota counters
// c has at api's endpoints (Config.Endpoints; every API's when api is "")
// are reset too, at c's key-wide epoch.
func (e *Engine) ResetQuota(ctx context.Context, c *Consumer, api string) error {
	if c == nil {
		return ErrNoConsumer
	}
	scope, epoch := "", c.QuotaEpoch
	if l, ok := c.APILimits[api]; ok {
		scope, epoch = api, l.QuotaEpoch
	}
	var fbErr error
	if e.opts.FailurePolicy == FailFallback {
		fbErr = e.opts.Fallback.ResetQuota(ctx, c.ID, scope, epoch)
	}
	if err := e.store.ResetQuota(ctx, c.ID, scope, epoch); err != nil {
		return err
	}
	if err := e.resetEndpointQuotas(ctx, c, api); err != nil {
		return err
	}
	return fbErr
}

// take applies req to the store under the failure policy; fallback is
// req's rule on the fallback store.
func (e *Engine) take(ctx context.Context, req Request, fallback *Rule) (Decision, error) {
	switch {
	case !req.Rule.Enforced():
		return Decision{Allowed: true}, nil
	case e.opts.StoreTimeout > 0:
		d, err := e.takeWithin(ctx, req)
		if err != nil {
			return e.failed(ctx, req, fallback, err)
		}
		return d, nil
	}
	d, err := e.store.Take(ctx, req)
	if err != nil {
		return e.failed(ctx, req, fallback, err)
	}
	return d, nil
}

// takeInto is take writing the decision into *d (the zero Decision with
// an error), for callers that keep it in place.
func (e *Engine) takeInto(ctx context.Context, req Request, fallback *Rule, d *Decision) (err error) {
	switch {
	case !req.Rule.Enforced():
		*d = Decision{Allowed: true}
		return nil
	case e.opts.StoreTimeout > 0:
		*d, err = e.takeWithin(ctx, req)
	default:
		*d, err = e.store.Take(ctx, req)
	}
	if err != nil {
		*d, err = e.failed(ctx, req, fallback, err)
	}
	return err
}

// failed is the decision on req when the store answered err: err itself
// for a request the store refused, else what the failure policy says
// (fallback is req's rule on the fallback store).
func (e *Engine) failed(ctx context.Context, req Request, fallback *Rule, err error) (Decision, error) {
	if errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrUnsupportedAlgorithm) || errors.Is(err, ErrForeignRule) {
		return Decision{}, err
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		// The caller gave up while the store was deciding (a client that
		// went away): not the store's failure, so it is not reported,
		// no fallback counts a request nobody waits for, and nothing is
		// admitted. A deadline of the caller's that passes is still the
		// store's failure: the store was too slow for it.
		return Decision{}, fmt.Errorf("%w (the store's error: %w)", context.Canceled, err)
	}
	if e.opts.OnStoreError != nil {
		e.opts.OnStoreError(err)
	}
	switch e.opts.FailurePolicy {
	case FailClosed:
		return Decision{}, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	case FailFallback:
		req.Rule = fallback
		return e.opts.Fallback.Take(ctx, req)
	}
	return Decision{Allowed: true}, nil
}

// takeWithin is the store's Take bounded by Options.StoreTimeout.
func (e *Engine) takeWithin(ctx context.Context, req Request) (Decision, error) {
	sctx, cancel := context.WithTimeout(ctx, e.opts.StoreTimeout)
	defer cancel()
	return e.store.Take(sctx, req)
}

// Decider decides requests; *Engine implements it. Adapters depend on this
// one method, so a caller can put its own logic (or a test double) in front
// of an engine.
type Decider interface {
	Decide(ctx context.Context, c *Consumer, api string, cost int64) (Decision, error)
}

var _ Decider = (*Engine)(nil)
