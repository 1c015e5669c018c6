package core

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Route is where a request goes within its API, for endpoint limits
// (Config.Endpoints): its HTTP method and its path relative to the API (a
// gateway's path after the listen path, a service's own path, a gRPC full
// method name). Path may also be a router's pattern for the request
// ("/orders/{id}"): a {param} segment of an endpoint matches any segment,
// that pattern's text included.
type Route struct {
	// Method is the request's method ("GET"); "" matches only endpoints
	// of any method. It is matched without regard to case: HTTP methods
	// are case-sensitive, but an upstream may take "post" for POST, so a
	// request sent as "post" counts against POST's endpoint rather than
	// escaping it.
	Method string
	// Path is the request's path; empty segments ("//") are skipped. It
	// may be escaped as the client sent it (url.URL.RawPath, EscapedPath):
	// each segment is decoded before it is compared with a literal, so an
	// encoded "/" (%2F) stays inside its segment, as routers that split
	// the escaped path see it (net/http's ServeMux among them), and a
	// {param} matches it whole. Give the escaped path when the service
	// behind routes on it, so that "/orders/1%2F2/items" cannot leave
	// "/orders/{id}/items" by splitting one segment in two.
	Path string
}

// RouteDecider decides requests at the endpoint their route matches.
// *Engine implements it, and so do the deciders of a data-plane member
// (live.Config.Limiter); adapters given a route for each request call it
// instead of Decider.Decide.
type RouteDecider interface {
	Decider
	// DecideRoute decides a request of c to route within api: as Decide
	// when route matches none of api's endpoints, else at the endpoint
	// (see Engine.DecideRoute).
	DecideRoute(ctx context.Context, c *Consumer, api string, route Route, cost int64) (Decision, error)
}

// Endpoint is a part of an API, by method and path, whose requests are
// also limited by policies of its own (Config.Endpoints).
type Endpoint struct {
	// Method is an HTTP method (GET, HEAD, POST, PUT, PATCH, DELETE,
	// OPTIONS, TRACE; any case), or "" or "ANY" for every method. A GET
	// endpoint also takes HEAD requests when no HEAD endpoint does, as
	// net/http's ServeMux does.
	Method string
	// Path is a path prefix of literal segments and {name} segments, each
	// a whole segment ("/orders/{id}/items"): it matches a request whose
	// path starts with as many segments, each literal equal and each
	// {name} anything; "/" matches every path, and a final "/" (or a
	// final "{name...}", as ServeMux writes a rest) changes nothing.
	// See CheckEndpoint.
	Path string
	// Policies are the IDs of the policies the endpoint's requests are
	// limited by, per consumer, on counters of their own (see
	// EndpointScope), merged as a consumer's are: the most generous rate
	// and quota win, the largest in-flight cap (Policy.InFlight) holds a
	// slot at the endpoint, and the winning quota's policy brings its
	// settling (Policy.Settle) and its thresholds (Policy.Thresholds,
	// reported with ThresholdReached.Endpoint set). None: the endpoint
	// only sets a cost.
	Policies []string
	// Cost, when > 0, is what every request to the endpoint costs, on the
	// endpoint's limits and the API's, whatever cost the caller asked; 0
	// keeps the caller's.
	Cost int64
	// Refuse, when set, is returned for every request the endpoint
	// matches, before anything is counted: a data-plane member sets it on
	// an endpoint that needs a policy its store cannot enforce.
	Refuse error
}

// EndpointScope returns the scope of the counters an endpoint's policies
// keep for each consumer (LimitSet.Scope): the API's id, the method
// ("*" for any) and the endpoint's path in canonical form (its {param}
// segments written "{}"), separated by spaces, which no API id and no
// method holds; so the same consumer's counters on POST /orders, GET
// /orders and the API's own policies are three different keys in every
// store. It assumes a valid endpoint (CheckEndpoint).
func EndpointScope(api string, ep Endpoint) string {
	m, _ := canonicalMethod(ep.Method)
	segs, _ := parseEndpointPath(ep.Path)
	return api + " " + m + " " + canonicalPath(segs)
}

// endpointMethods are the methods an Endpoint may name.
var endpointMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}

// ErrInvalidEndpoint is wrapped by CheckEndpoint's errors and so by
// SetConfig's refusal of an endpoint.
var ErrInvalidEndpoint = errors.New("invalid endpoint")

// CheckEndpoint reports why method and path cannot name an endpoint
// (Endpoint): CheckEndpointMethod's error, else CheckEndpointPath's.
func CheckEndpoint(method, path string) error {
	if err := CheckEndpointMethod(method); err != nil {
		return err
	}
	return CheckEndpointPath(path)
}

// CheckEndpointMethod reports why method cannot be an endpoint's
// (Endpoint.Method), wrapping ErrInvalidEndpoint, or nil.
func CheckEndpointMethod(method string) error {
	if _, ok := canonicalMethod(method); !ok {
		return fmt.Errorf("%w: unknown method %q (want %s, or any)", ErrInvalidEndpoint, method, strings.Join(endpointMethods, ", "))
	}
	return nil
}

// CheckEndpointPath reports why path cannot be an endpoint's
// (Endpoint.Path), wrapping ErrInvalidEndpoint, or nil.
func CheckEndpointPath(path string) error {
	if _, err := parseEndpointPath(path); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEndpoint, err)
	}
	return nil
}

// EndpointKey returns what two endpoints of one API must not share: the
// method ("*" for any) and the canonical path ("/orders/{}"), so that
// "/orders/{id}" and "/orders/{name}/" are the same endpoint. It assumes
// a valid endpoint (CheckEndpoint).
func EndpointKey(method, path string) string {
	m, _ := canonicalMethod(method)
	segs, _ := parseEndpointPath(path)
	return m + " " + canonicalPath(segs)
}

// canonicalMethod returns method in upper case, "*" for any, and whether
// it is one an endpoint may name.
func canonicalMethod(method string) (string, bool) {
	if method == "" || strings.EqualFold(method, "any") {
		return "*", true
	}
	for _, m := range endpointMethods {
		if strings.EqualFold(method, m) {
			return m, true
		}
	}
	return "", false
}

// segment is one segment of an endpoint's path: a literal, or a {param}.
type segment struct {
	lit   string
	param bool
}

// parseEndpointPath splits an endpoint's path into its segments.
func parseEndpointPath(p string) ([]segment, error) {
	switch {
	case p == "":
		return nil, errors.New(`missing (a path like "/orders" or "/orders/{id}")`)
	case p[0] != '/':
		return nil, fmt.Errorf("%q must start with \"/\"", p)
	}
	rest := strings.TrimSuffix(p[1:], "/")
	if rest == "" {
		return nil, nil
	}
	parts := strings.Split(rest, "/")
	segs := make([]segment, 0, len(parts))
	names := map[string]bool{}
	for i, s := range parts {
		switch {
		case s == "":
			return nil, fmt.Errorf("%q has an empty segment (\"//\")", p)
		case s == "." || s == "..":
			return nil, fmt.Errorf("%q is not a clean path (a %q segment)", p, s)
		case strings.ContainsAny(s, "?#% \t\r\n"):
			return nil, fmt.Errorf("%q: a segment holds no '?', '#', '%%' or white space (write characters as they are, not %%-escaped)", p)
		case s[0] == '{' && s[len(s)-1] == '}':
			name := s[1 : len(s)-1]
			if rest, ok := strings.CutSuffix(name, "..."); ok {
				if i != len(parts)-1 {
					return nil, fmt.Errorf("%q: {%s} may only be the last segment", p, name)
				}
				name = rest
			}
			if !validParamName(name) {
				return nil, fmt.Errorf("%q: {%s} is not a parameter (a name of letters, digits and '_', not starting with a digit)", p, name)
			}
			if names[name] {
				return nil, fmt.Errorf("%q: {%s} is named twice", p, name)
			}
			names[name] = true
			if i == len(parts)-1 && strings.HasSuffix(s, "...}") {
				// A rest: every path is a prefix already.
				return segs, nil
			}
			segs = append(segs, segment{param: true})
		case strings.ContainsAny(s, "{}"):
			return nil, fmt.Errorf("%q: a {param} must be a whole segment, like /orders/{id}", p)
		default:
			segs = append(segs, segment{lit: s})
		}
	}
	return segs, nil
}

func validParamName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// canonicalPath writes segs with every param as "{}".
func canonicalPath(segs []segment) string {
	if len(segs) == 0 {
		return "/"
	}
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		if s.param {
			b.WriteString("{}")
		} else {
			b.WriteString(s.lit)
		}
	}
	return b.String()
}

// endpointEntry is an endpoint prepared: its rule, its cost and how
// specific it is.
type endpointEntry struct {
	resolved
	method string // canonical; "*" for any
	cost   int64
	refuse error
	// literals, segments and mask order endpoints by path: more literal
	// segments first, then more segments, then literals further left
	// (mask has bit 63−i set for a literal segment i).
	literals, segments int
	mask               uint64
	// plans are the policies' own limits here (Policy.Endpoints) by
	// policy id, nil when none has any; pairs caches the rules of a rate
	// from one plan with a quota from another ([2]*endpointPlan →
	// *resolved), prepared on first use.
	plans map[string]*endpointPlan
	pairs sync.Map
	scope string
	// key is the endpoint's EndpointKey ("POST /orders/{}"), which
	// threshold events name (ThresholdReached.Endpoint); path is its path
	// as the configuration wrote it.
	key, path string
}

// endpointPlan is one policy's own limits at an endpoint, prepared.
type endpointPlan struct {
	PolicyEndpoint
	policy *policyEntry
	solo   resolved
}

// morePath reports whether a's path is more specific than b's.
func (a *endpointEntry) morePath(b *endpointEntry) bool {
	switch {
	case a.literals != b.literals:
		return a.literals > b.literals
	case a.segments != b.segments:
		return a.segments > b.segments
	}
	return a.mask > b.mask
}

// methodScore is how well e's method matches m, a request's method as
// requestMethod returns it: 3 exact, 2 a GET endpoint for HEAD, 1 any, 0
// not at all.
func (e *endpointEntry) methodScore(m string) int {
	switch {
	case e.method == m:
		return 3
	case e.method == "*":
		return 1
	case e.method == "GET" && m == "HEAD":
		return 2
	}
	return 0
}

// requestMethod returns m as endpoints' methods are written when it is
// one of them in any case ("post" → "POST"), else m: so endpoints compare
// it exactly. It allocates nothing.
func requestMethod(m string) string {
	for _, c := range endpointMethods {
		if c == m {
			return c
		}
	}
	for _, c := range endpointMethods {
		if strings.EqualFold(c, m) {
			return c
		}
	}
	return m
}

// litChild is a literal child of an endpoint node.
type litChild struct {
	seg string
	n   *endpointNode
}

// endpointNode is a node of an API's endpoint tree: the endpoints whose
// path ends here, and the children by the next segment.
type endpointNode struct {
	eps []*endpointEntry
	// lits are the literal children; byLit indexes them when they are
	// more than maxLinearLits (a linear scan of a few short strings
	// beats hashing).
	lits  []litChild
	byLit litTable
	param *endpointNode
}

// maxLinearLits is how many literal children a node scans before it
// indexes them in a litTable.
const maxLinearLits = 8

func (n *endpointNode) lit(seg string) *endpointNode {
	if n.byLit.slots != nil {
		return n.byLit.find(seg)
	}
	for i := range n.lits {
		if n.lits[i].seg == seg {
			return n.lits[i].n
		}
	}
	return nil
}

// litTable finds a node's literal child by its segment: an open-addressed
// table of at least twice as many slots as children, probed linearly
// from the segment's FNV-1a hash. It is built once (set) and only read
// by requests, so a request's segment, however chosen, probes at most
// every child once; a segment longer than every child's is not hashed.
// Map lookups hashed each segment with the runtime's string hash and
// cost twice as much here.
type litTable struct {
	slots  []litChild // seg "" and n nil: empty
	mask   uint32
	maxLen int
}

// add indexes the last of lits, the others being indexed already (or
// none, for the first call): it doubles the table when half full, so
// building n children costs O(n).
func (t *litTable) add(lits []litChild) {
	if 2*len(lits) <= len(t.slots) {
		t.put(lits[len(lits)-1])
		return
	}
	size := 1
	for size < 4*len(lits) {
		size <<= 1
	}
	t.slots, t.mask = make([]litChild, size), uint32(size-1)
	for _, l := range lits {
		t.put(l)
	}
}

func (t *litTable) put(l litChild) {
	t.maxLen = max(t.maxLen, len(l.seg))
	i := segHash(l.seg) & t.mask
	for t.slots[i].n != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i] = l
}

func (t *litTable) find(seg string) *endpointNode {
	if len(seg) > t.maxLen {
		return nil
	}
	for i := segHash(seg) & t.mask; ; i = (i + 1) & t.mask {
		switch sl := &t.slots[i]; {
		case sl.n == nil:
			return nil
		case sl.seg == seg:
			return sl.n
		}
	}
}

// segHash is FNV-1a of s.
func segHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// endpointMatcher finds the most specific endpoint of an API for a route.
type endpointMatcher struct {
	root endpointNode
	// all are the API's endpoints in order, for quota resets.
	all []*endpointEntry
}

// add inserts e, whose path is segs.
func (m *endpointMatcher) add(segs []segment, e *endpointEntry) {
	n := &m.root
	for i, s := range segs {
		if s.param {
			if n.param == nil {
				n.param = &endpointNode{}
			}
			n = n.param
			continue
		}
		e.literals++
		if i < 64 {
			e.mask |= 1 << (63 - i)
		}
		c := n.lit(s.lit)
		if c == nil {
			c = &endpointNode{}
			n.lits = append(n.lits, litChild{s.lit, c})
			if len(n.lits) > maxLinearLits {
				n.byLit.add(n.lits)
			}
		}
		n = c
	}
	e.segments = len(segs)
	n.eps = append(n.eps, e)
	m.all = append(m.all, e)
}

// match returns the most specific endpoint for (method, path), nil for
// none: the most specific path (more literal segments, then more
// segments, then literals further left), then the best method (exact,
// GET for HEAD, any).
func (m *endpointMatcher) match(method, path string) *endpointEntry {
	var best *endpointEntry
	bestScore := 0
	m.root.match(requestMethod(method), path, &best, &bestScore)
	return best
}

func (n *endpointNode) match(method, path string, best **endpointEntry, bestScore *int) {
	for _, e := range n.eps {
		s := e.methodScore(method)
		if s == 0 {
			continue
		}
		if b := *best; b == nil || e.morePath(b) || !b.morePath(e) && s > *bestScore {
			*best, *bestScore = e, s
		}
	}
	for len(path) > 0 && path[0] == '/' {
		path = path[1:]
	}
	if path == "" {
		return
	}
	seg, rest := path, ""
	escaped := false
	for i := 0; i < len(path); i++ { // segments are short: no call to IndexByte
		if path[i] == '/' {
			seg, rest = path[:i], path[i:]
			break
		}
		escaped = escaped || path[i] == '%'
	}
	if escaped {
		// A literal is compared decoded ("ord%65rs" is "orders"); an
		// encoded "/" stays in its segment, which only a {param} matches.
		if u, err := url.PathUnescape(seg); err == nil {
			seg = u
		}
	}
	if c := n.lit(seg); c != nil {
		c.match(method, rest, best, bestScore)
	}
	if n.param != nil {
		n.param.match(method, rest, best, bestScore)
	}
}

// compileEndpoints prepares an API's endpoints (the endpoint at index i
// refused with an error naming it), and the limits the policies of order
// have at them, into a matcher; found records the policies' endpoint limits it places.
func (e *Engine) compileEndpoints(s *snapshot, order []*policyEntry, api string, eps []Endpoint, found map[*PolicyEndpoint]bool) (*endpointMatcher, error) {
	m := &endpointMatcher{}
	seen := make(map[string]bool, len(eps))
	for i := range eps {
		ep := &eps[i]
		if err := CheckEndpoint(ep.Method, ep.Path); err != nil {
			return nil, fmt.Errorf("API %q endpoint %d: %w", api, i, err)
		}
		key := EndpointKey(ep.Method, ep.Path)
		if seen[key] {
			return nil, fmt.Errorf("API %q endpoint %d: %w: %s is listed twice", api, i, ErrInvalidEndpoint, key)
		}
		seen[key] = true
		if ep.Cost < 0 || ep.Cost > MaxCost {
			return nil, fmt.Errorf("API %q endpoint %d (%s): %w: cost %d", api, i, key, ErrInvalidCost, ep.Cost)
		}
		segs, _ := parseEndpointPath(ep.Path)
		method, _ := canonicalMethod(ep.Method)
		ent := &endpointEntry{method: method, cost: ep.Cost, refuse: ep.Refuse}
		var rate, quota, inFlight *policyEntry
		for _, id := range ep.Policies {
			p, ok := s.policies[id]
			if !ok {
				return nil, fmt.Errorf("API %q endpoint %d (%s): %w %q", api, i, key, ErrUnknownPolicy, id)
			}
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
		ent.scope = EndpointScope(api, *ep)
		ent.key, ent.path = key, ep.Path
		ls := LimitSet{Scope: ent.scope}
		if rate != nil {
			ls.Rate, ls.Distributed = rate.Rate, rate.Distributed
			ent.ratePolicy, ent.rateShadow = rate.ID, rate.Shadow
		}
		if quota != nil {
			if quota.Quota.Global.Mode != NotGlobal {
				return nil, fmt.Errorf("API %q endpoint %d (%s): policy %q: quota: %w: an endpoint's quota cannot be global", api, i, key, quota.ID, ErrInvalidLimit)
			}
			// The quota policy's settling and thresholds come with its
			// quota, as they do at the API (pairRule).
			ls.Quota, ls.Settle = quota.Quota, quota.Settle
			ent.quotaPolicy, ent.quotaShadow, ent.thresholds = quota.ID, quota.Shadow, quota.solo.thresholds
		}
		if inFlight != nil {
			ls.InFlight = inFlight.InFlight
			ent.inFlightPolicy, ent.inFlightShadow = inFlight.ID, inFlight.Shadow
		}
		var err error
		if ent.prepared, err = e.prepare(ls); err != nil {
			return nil, fmt.Errorf("API %q endpoint %d (%s): %w", api, i, key, err)
		}
		for _, p := range order {
			for j := range p.Endpoints {
				pe := &p.Endpoints[j]
				if pe.API != api || CheckEndpoint(pe.Method, pe.Path) != nil || EndpointKey(pe.Method, pe.Path) != key {
					continue
				}
				if ent.plans[p.ID] != nil {
					return nil, fmt.Errorf("%w: policy %q has two limits at endpoint %s of API %q", ErrInvalidEndpoint, p.ID, key, api)
				}
				if pe.Quota.Global.Mode != NotGlobal {
					return nil, fmt.Errorf("policy %q at endpoint %s of API %q: quota: %w: an endpoint's quota cannot be global", p.ID, key, api, ErrInvalidLimit)
				}
				pl := &endpointPlan{PolicyEndpoint: *pe, policy: p}
				if pl.solo.prepared, err = e.prepare(LimitSet{Rate: pe.Rate, Quota: pe.Quota, Scope: ent.scope, Distributed: p.Distributed}); err != nil {
					return nil, fmt.Errorf("policy %q at endpoint %s of API %q: %w", p.ID, key, api, err)
				}
				if !pe.Rate.IsZero() {
					pl.solo.ratePolicy, pl.solo.rateShadow = p.ID, p.Shadow
				}
				if !pe.Quota.IsZero() {
					pl.solo.quotaPolicy, pl.solo.quotaShadow = p.ID, p.Shadow
				}
				if ent.plans == nil {
					ent.plans = map[string]*endpointPlan{}
				}
				ent.plans[p.ID] = pl
				found[pe] = true
			}
		}
		m.add(segs, ent)
	}
	return m, nil
}

// checkPolicyEndpoints reports a policy's limits at an endpoint that no
// API of cfg has (found holds those compileEndpoints placed).
func checkPolicyEndpoints(cfg *Config, found map[*PolicyEndpoint]bool) error {
	for i := range cfg.Policies {
		p := &cfg.Policies[i]
		for j := range p.Endpoints {
			pe := &p.Endpoints[j]
			if found[pe] {
				continue
			}
			if err := CheckEndpoint(pe.Method, pe.Path); err != nil {
				return fmt.Errorf("policy %q endpoint %d: %w", p.ID, j, err)
			}
			return fmt.Errorf("%w: policy %q has limits at %s of API %q, which is not one of the API's endpoints", ErrInvalidEndpoint, p.ID, EndpointKey(pe.Method, pe.Path), pe.API)
		}
	}
	return nil
}

// endpointRule returns the rule c's request at ep takes: the most generous of c's
// policies' own limits there (Policy.Endpoints), else e's own. A
// consumer with its own limits for the API (Consumer.APILimits) takes e's
// own.
func (e *Engine) endpointRule(ep *endpointEntry, c *Consumer) (*resolved, error) {
	if ep.plans == nil || len(c.APILimits) > 0 {
		return &ep.resolved, nil
	}
	var rate, quota *endpointPlan
	for _, id := range c.Policies {
		pl := ep.plans[id]
		if pl == nil {
			continue
		}
		if !pl.Rate.IsZero() && (rate == nil || ratePerNs(pl.Rate) > ratePerNs(rate.Rate)) {
			rate = pl
		}
		if !pl.Quota.IsZero() && (quota == nil || quotaPerNs(pl.Quota) > quotaPerNs(quota.Quota)) {
			quota = pl
		}
	}
	switch {
	case rate == nil && quota == nil:
		return &ep.resolved, nil
	case rate == nil:
		return &quota.solo, nil
	case quota == nil || quota == rate:
		return &rate.solo, nil
	}
	k := [2]*endpointPlan{rate, quota}
	if v, ok := ep.pairs.Load(k); ok {
		return v.(*resolved), nil
	}
	pr, err := e.prepare(LimitSet{Rate: rate.Rate, Quota: quota.Quota, Scope: ep.scope, Distributed: rate.policy.Distributed})
	if err != nil {
		return nil, fmt.Errorf("policies %q and %q at %s: %w", rate.policy.ID, quota.policy.ID, ep.scope, err)
	}
	r := &resolved{prepared: pr, ratePolicy: rate.policy.ID, quotaPolicy: quota.policy.ID, rateShadow: rate.policy.Shadow, quotaShadow: quota.policy.Shadow}
	v, _ := ep.pairs.LoadOrStore(k, r)
	return v.(*resolved), nil
}

// DecideRoute decides a request of c to route within api. When route
// matches none of api's endpoints (Config.Endpoints) it is Decide. When
// it matches one (the most specific: see Endpoint), the request costs the
// endpoint's Cost when it has one, and both limits apply: the endpoint's
// policies (or, when c's policies have limits of their own there, the
// most generous of those: Policy.Endpoints), on c's counters of the
// endpoint's scope (EndpointScope), and c's own limits for api, as Decide
// applies them. c's limits for api are
// resolved first, so a consumer refused there (ErrNoPolicy) spends
// nothing; the endpoint's limits are taken next and, only when they
// allow, the API's. A request the endpoint refuses therefore spends none
// of the API's units; one the API refuses has spent the endpoint's
// (stores take one rule per call). The decision returned is the one that
// refused, or when both allow the one with fewer units remaining (the
// endpoint's on a tie), named after its policies. The endpoint's quota
// counters have c's key-wide quota epoch, so raising it resets them too.
// Options.Observer is told once, with the decision returned.
func (e *Engine) DecideRoute(ctx context.Context, c *Consumer, api string, route Route, cost int64) (d Decision, err error) {
	snap := e.snap.Load()
	var ep *endpointEntry
	if m := snap.endpoints[api]; m != nil {
		ep = m.match(route.Method, route.Path)
	}
	if ep == nil {
		err = e.decideInto(ctx, snap, c, api, cost, &d)
		return d, err
	}
	var start time.Time
	observe := e.opts.Observer != nil && (cost != 0 || ep.cost > 0)
	if observe {
		start = time.Now()
	}
	if err = e.decideEndpoint(ctx, snap, c, api, ep, cost, &d); err != nil {
		d = Decision{}
	}
	if observe {
		e.opts.Observer.ObserveDecision(api, d, err, time.Since(start))
	}
	return d, err
}

// decideEndpoint is DecideRoute at the endpoint ep, without the
// Observer: it writes the decision into *d (the zero Decision with an
// error). Both store calls go through takeInto, so no Decision is
// returned by value on the way (see decideInto).
func (e *Engine) decideEndpoint(ctx context.Context, snap *snapshot, c *Consumer, api string, ep *endpointEntry, cost int64, d *Decision) error {
	if ep.refuse != nil {
		return ep.refuse
	}
	if ep.cost > 0 {
		cost = ep.cost
	}
	if cost < 0 || cost > MaxCost {
		return fmt.Errorf("%w: got %d", ErrInvalidCost, cost)
	}
	if c == nil {
		return ErrNoConsumer
	}
	r, epoch, err := e.resolveIn(snap, c, api)
	if err != nil {
		return err
	}
	er, err := e.endpointRule(ep, c)
	if err != nil {
		return err
	}
	// The endpoint's limits, into *d.
	if err := e.takeInto(ctx, Request{Consumer: c.ID, Rule: er.rule, Cost: cost, QuotaEpoch: c.QuotaEpoch}, er.fallback, d); err != nil {
		return err
	}
	er.label(d, e.opts.Shadow)
	if !d.Allowed {
		return nil
	}
	if len(er.thresholds) > 0 && e.opts.QuotaObserver != nil {
		e.observeThresholds(c, api, ep.key, er, c.QuotaEpoch, cost, d)
		e.watchSettle(d, c, api, ep.key, er, c.QuotaEpoch, cost)
	}
	// The API's, into da.
	var da Decision
	if err := e.takeInto(ctx, Request{Consumer: c.ID, Rule: r.rule, Cost: cost, QuotaEpoch: epoch}, r.fallback, &da); err != nil {
		d.Hold.Release()
		*d = Decision{}
		return err
	}
	r.label(&da, e.opts.Shadow)
	if len(r.thresholds) > 0 && e.opts.QuotaObserver != nil {
		e.observeThresholds(c, api, "", r, epoch, cost, &da)
		e.watchSettle(&da, c, api, "", r, epoch, cost)
	}
	switch {
	case !da.Allowed:
		d.Hold.Release() // an API refusal gives back the endpoint's slots
		*d = da
	case da.DecidedBy != KindNone && (d.DecidedBy == KindNone || da.Remaining < d.Remaining):
		da.Shadowed = da.Shadowed || d.Shadowed // a shadowed endpoint's refusal is still reported
		da.Hold = JoinHolds(d.Hold, da.Hold)
		*d = da
	default:
		d.Shadowed = d.Shadowed || da.Shadowed
		d.Hold = JoinHolds(d.Hold, da.Hold)
	}
	return nil
}

var _ RouteDecider = (*Engine)(nil)

// EndpointStatus is a consumer's counters at one endpoint of an API
// (Engine.EndpointStatuses).
type EndpointStatus struct {
	// Method is the endpoint's method in upper case, "*" for any; Path
	// its path as the configuration wrote it.
	Method, Path string
	// Rate and Quota are the endpoint's limits for the consumer, as a
	// Decision's are (the zero Status for a limit it does not have).
	Rate, Quota Status
}

// EndpointStatuses returns c's counters at each endpoint of api that
// limits c (Config.Endpoints, Policy.Endpoints), in the order api lists
// them, read as a Decide of cost 0 reads them: nothing is spent and no
// in-flight slot is taken. Errors are the store's, as Decide's.
func (e *Engine) EndpointStatuses(ctx context.Context, c *Consumer, api string) ([]EndpointStatus, error) {
	m := e.snap.Load().endpoints[api]
	if m == nil || c == nil {
		return nil, nil
	}
	ctx = WithoutInFlight(ctx)
	var out []EndpointStatus
	for _, ep := range m.all {
		r, err := e.endpointRule(ep, c)
		if err != nil {
			return nil, err
		}
		if !r.rule.Enforced() {
			continue
		}
		d, err := e.take(ctx, Request{Consumer: c.ID, Rule: r.rule, QuotaEpoch: c.QuotaEpoch}, r.fallback)
		if err != nil {
			return nil, err
		}
		r.label(&d, false)
		out = append(out, EndpointStatus{Method: ep.method, Path: ep.path, Rate: d.Rate, Quota: d.Quota})
	}
	return out, nil
}

// resetEndpointQuotas deletes the quota counters c has at the endpoints
// of api ("": of every API) whose rule for c counts a quota, at c's
// key-wide quota epoch, on the store and, under FailFallback, the
// fallback first (as ResetQuota does). It returns the store's first
// error, else the fallback's.
func (e *Engine) resetEndpointQuotas(ctx context.Context, c *Consumer, api string) error {
	snap := e.snap.Load()
	var ms []*endpointMatcher
	if api != "" {
		if m := snap.endpoints[api]; m != nil {
			ms = append(ms, m)
		}
	} else {
		for _, m := range snap.endpoints {
			ms = append(ms, m)
		}
	}
	var storeErr, fbErr error
	for _, m := range ms {
		for _, ep := range m.all {
			r, err := e.endpointRule(ep, c)
			if err != nil {
				return err
			}
			if !r.rule.QuotaEnforced() {
				continue
			}
			if e.opts.FailurePolicy == FailFallback {
				if err := e.opts.Fallback.ResetQuota(ctx, c.ID, ep.scope, c.QuotaEpoch); err != nil && fbErr == nil {
					fbErr = err
				}
			}
			if err := e.store.ResetQuota(ctx, c.ID, ep.scope, c.QuotaEpoch); err != nil && storeErr == nil {
				storeErr = err
			}
		}
	}
	if storeErr != nil {
		return storeErr
	}
	return fbErr
}
