// Package admit is the one sequence every adapter runs before it renders an
// answer: authenticate, then (only when that succeeds) decide. The adapters
// nethttp, gin, fiber and grpc call it; adapters/response renders what it
// returns.
package admit

import (
	"context"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// Check authenticates r with auth and, only when that succeeds, decides
// cost units for api with l (cost nil means 1; it is only called for an
// authenticated request). A request that fails authentication never reaches
// l, so it creates no limiter state: the error is auth's and the consumer
// nil. Otherwise the consumer is returned with l's decision and error. Pass
// the decision and error to response.Renderer.Render.
//
// route, when not nil, says where the request goes within api: when l is
// a core.RouteDecider the request is decided at the endpoint it matches
// (DecideRoute), else route is not called and l.Decide decides it.
func Check(ctx context.Context, l core.Decider, auth identity.Authenticator, r identity.Request, api string, route func() core.Route, cost func() int64) (*core.Consumer, core.Decision, error) {
	c, err := auth.Authenticate(ctx, r)
	if err != nil {
		return nil, core.Decision{}, err
	}
	n := int64(1)
	if cost != nil {
		n = cost()
	}
	if route != nil {
		if rd, ok := l.(core.RouteDecider); ok {
			d, err := rd.DecideRoute(ctx, c, api, route(), n)
			return c, d, err
		}
	}
	d, err := l.Decide(ctx, c, api, n)
	return c, d, err
}
