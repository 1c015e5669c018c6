// Package admit is the one sequence every adapter runs before it renders an
// answer: authenticate, then (only when that succeeds) decide. The adapters
// nethttp, gin, fiber and grpc call it; adapters/response renders what it
// returns.
package admit

import (
	"context"
	"strings"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// Require panics when l or auth is nil, naming the constructor (who): a
// middleware built without them could only fail every request, so it
// fails where it is built, as net/http's Handle does for a nil handler.
func Require(who string, l core.Decider, auth identity.Authenticator) {
	if l == nil {
		panic(who + ": nil core.Decider (a *core.Engine, or a data-plane member's Limiter(api))")
	}
	if auth == nil {
		panic(who + ": nil identity.Authenticator (&identity.Keyless{} limits by client address)")
	}
}

// Check authenticates r with auth and, only when that succeeds, decides
// cost units for api with l (cost nil means 1; it is only called for an
// authenticated request). A request that fails authentication never reaches
// l, so it creates no limiter state: the error is auth's and the consumer
// nil. Otherwise the consumer is returned with l's decision and error. Pass
// the decision and error to response.Renderer.Render. An admitted
// decision's Hold (its in-flight slots) is the caller's to release, with
// defer, once the response is done; a refusal or an error holds nothing
// (a hold a decider returned with one is released here).
//
// route, when not nil, says where the request goes within api: when l is
// a core.RouteDecider the request is decided at the endpoint it matches
// (DecideRoute), else route is not called and l.Decide decides it.
func Check(ctx context.Context, l core.Decider, auth identity.Authenticator, r identity.Request, api string, route func() core.Route, cost func() int64) (*core.Consumer, core.Decision, error) {
	c, err := auth.Authenticate(ctx, r)
	if err != nil {
		return nil, core.Decision{}, err
	}
	d, err := decide(ctx, l, c, api, route, cost)
	return c, d, err
}

// decide decides for c: at route's endpoint when route is set and l is a
// core.RouteDecider, else with l.Decide.
func decide(ctx context.Context, l core.Decider, c *core.Consumer, api string, route func() core.Route, cost func() int64) (d core.Decision, err error) {
	err = decideInto(ctx, l, c, api, route, cost, &d)
	return d, err
}

// decideInto is decide writing the decision into *d.
func decideInto(ctx context.Context, l core.Decider, c *core.Consumer, api string, route func() core.Route, cost func() int64, d *core.Decision) (err error) {
	n := int64(1)
	if cost != nil {
		n = cost()
	}
	var rd core.RouteDecider
	if route != nil { // without a route, l needs no type check
		rd, _ = l.(core.RouteDecider)
	}
	if rd != nil {
		*d, err = rd.DecideRoute(ctx, c, api, route(), n)
	} else {
		*d, err = l.Decide(ctx, c, api, n)
	}
	if err != nil || !d.Allowed {
		// Only an admitted request holds a slot: a decider that returned
		// one with a refusal gets it back here, so no adapter leaks it.
		d.Hold.Release()
		d.Hold = core.Hold{}
	}
	return err
}

// Consumer is the memory Decide writes a consumer into. Its zero value is
// ready; an adapter keeps it in a sync.Pool with the rest of a request's
// scratch memory.
type Consumer struct {
	c  core.Consumer
	id [64]byte
}

// DecideInto is Check for an adapter that does not keep the consumer,
// writing the decision into *d, which must be the zero Decision (it is
// left so when authentication fails): when auth is an
// identity.ConsumerWriter, the consumer is written into s and used only by
// l, so finding it allocates nothing, and s may be reused once DecideInto
// returns; otherwise it is Check. The adapter keeps the decision in a
// variable of its own and renders it from there
// (response.Renderer.RenderDecision), so it is not copied on its way back.
func DecideInto(ctx context.Context, l core.Decider, auth identity.Authenticator, r identity.Request, api string, route func() core.Route, cost func() int64, s *Consumer, d *core.Decision) error {
	w, ok := auth.(identity.ConsumerWriter)
	if !ok {
		var err error
		_, *d, err = Check(ctx, l, auth, r, api, route, cost)
		return err
	}
	if err := w.AuthenticateInto(ctx, r, &s.c, s.id[:0]); err != nil {
		return err
	}
	err := decideInto(ctx, l, &s.c, api, route, cost, d)
	s.c = core.Consumer{}
	return err
}

// DecideID is DecideInto returning the decision, and the consumer's ID
// too ("" when authentication failed), for an answer that names it
// (gRPC's QuotaFailure). The ID may be in s: it is valid only until s is used
// again, so a caller that keeps it clones it.
func DecideID(ctx context.Context, l core.Decider, auth identity.Authenticator, r identity.Request, api string, route func() core.Route, cost func() int64, s *Consumer) (core.Decision, string, error) {
	w, ok := auth.(identity.ConsumerWriter)
	if !ok {
		c, d, err := Check(ctx, l, auth, r, api, route, cost)
		id := ""
		if c != nil {
			id = c.ID
		}
		return d, id, err
	}
	if err := w.AuthenticateInto(ctx, r, &s.c, s.id[:0]); err != nil {
		return core.Decision{}, "", err
	}
	d, err := decide(ctx, l, &s.c, api, route, cost)
	id := s.c.ID
	s.c = core.Consumer{}
	return d, id, err
}

// HeaderCost is a request's cost from the cost header of api (costHeader
// chooses it; values(name) gives the request's values of a header): 0
// when there is no such header or the request does not give it, and an
// error (core.ErrMalformedCost) for a malformed value, which the adapter
// renders (400) without authenticating or deciding.
func HeaderCost(l core.Decider, api string, h core.CostHeader, values func(name string) []string) (int64, error) {
	ch := costHeader(l, api, h)
	if ch.Name == "" {
		return 0, nil
	}
	return ch.Cost(values(ch.Name))
}

// ReadsCostHeader reports whether a request to l may give its cost in a
// header, so that HeaderCost is worth calling: h names one, or l may know
// one per API (core.CostHeaderSource). An adapter asks once, when it is
// built, and skips HeaderCost on every request when it is false.
func ReadsCostHeader(l core.Decider, h core.CostHeader) bool {
	_, src := l.(core.CostHeaderSource)
	return h.Name != "" || src
}

// costHeader returns the cost header of a request for api: h when it
// names one, else the one l knows for api (core.CostHeaderSource: a
// data-plane member's running API definition), else none. The adapter
// reads the request's values of it with core.CostHeader.Cost, before
// Check: a malformed one is rendered (400) without authenticating or
// deciding, and a cost it gives replaces the adapter's own.
func costHeader(l core.Decider, api string, h core.CostHeader) core.CostHeader {
	if h.Name != "" {
		return h
	}
	if src, ok := l.(core.CostHeaderSource); ok {
		return src.CostHeader(api)
	}
	return core.CostHeader{}
}

// Finish ends h once the response is done: with the actual cost in value
// (a response header's or trailer's value: a decimal integer in
// [0, core.MaxCost], surrounding spaces allowed) it settles h to it
// (core.Hold.Settle); with none (value empty) or a malformed one it
// releases h, keeping the estimate.
func Finish(h core.Hold, value string) {
	if n, ok := ParseCost(value); ok {
		h.Settle(n)
		return
	}
	h.Release()
}

// ParseCost reads an actual cost: a decimal integer in [0, core.MaxCost],
// surrounding spaces and tabs allowed; ok is false for anything else.
func ParseCost(s string) (n int64, ok bool) {
	s = strings.Trim(s, " \t")
	if s == "" || len(s) > 16 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n <= core.MaxCost
}
