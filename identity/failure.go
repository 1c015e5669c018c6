package identity

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/limitplane/limitplane/core"
)

// ErrTooManyFailures is matched (errors.Is) by *LimitError.
var ErrTooManyFailures = errors.New("too many failed authentication attempts")

// LimitError is FailureLimited's answer to a client that has used up its
// budget of failed authentication attempts. Adapters answer it like a
// denied Decision (429, Retry-After and the rate-limit fields of the
// failure policy); adapters/response renders it.
type LimitError struct {
	// Decision is the failure policy's denying decision (Allowed false).
	Decision core.Decision
}

// Error returns ErrTooManyFailures' text and the retry delay in ms.
func (e *LimitError) Error() string {
	return ErrTooManyFailures.Error() + "; retry after " + strconv.FormatInt(int64(e.Decision.RetryAfter/time.Millisecond), 10) + "ms"
}

// Is makes errors.Is(err, ErrTooManyFailures) work.
func (e *LimitError) Is(target error) bool { return target == ErrTooManyFailures }

// FailureIDPrefix starts the consumer IDs FailureLimited charges, followed
// by ClientIP.Key ("authfail:ip:192.0.2.1"). No authenticator produces IDs
// in this namespace.
const FailureIDPrefix = "authfail:ip:"

// FailureLimited wraps an Authenticator with brute-force protection: each
// failed authentication (an *Error from Auth, missing or invalid
// credentials alike) costs the client address one unit of Policy, under the
// consumer ID FailureIDPrefix + ClientIP.Key, never under the identity the
// request claimed. A request that authenticates costs nothing.
//
// While the client's budget is spent, every request from that client is
// answered with a *LimitError before Auth is called, valid credentials or
// not; otherwise a guesser would still learn which guess was right. Clients
// sharing an address group (NAT, ClientIPOptions prefix lengths) share the
// budget, so size Policy for the busiest legitimate group.
//
// Policy must be in the engine's config and cover API (a policy with no
// APIs does); its Decide errors (e.g. core.ErrUnknownPolicy, or
// core.ErrStoreUnavailable when the engine fails closed) are returned as
// they are. Requests whose peer address cannot be parsed are passed to
// Auth unlimited.
//
// Cost: one zero-cost Decide (a peek, which stores nothing) per request,
// and one more per failure; with a Redis store each is a round trip. An
// Observer on the engine sees each failure's charge, as a decision of
// Policy for API, and not the peeks (core.Observer).
//
// Use it as the adapters' Authenticator:
//
//	auth := &identity.FailureLimited{Auth: jwtAuth, Limiter: engine, Policy: "authfail"}
//	h := nethttp.Middleware(engine, auth, nethttp.Options{})
type FailureLimited struct {
	// Auth is the wrapped authenticator.
	Auth Authenticator
	// Limiter charges failures; normally the same *core.Engine (or
	// live.Config.Limiter) that limits authenticated consumers.
	Limiter core.Decider
	// Policy is the ID of the failure policy, e.g. a rate of 10 per
	// minute.
	Policy string
	// ClientIP says which address is charged; nil means the peer address
	// (see ClientIP).
	ClientIP *ClientIP
	// API is the API the charges are decided for, so an Observer reports
	// them under it; "" for none. A client has one budget whatever API it
	// fails on: Policy's counters are not per API.
	API string
}

// Authenticate implements Authenticator: Auth's result, or a *LimitError
// when the client's failure budget is spent.
func (f *FailureLimited) Authenticate(ctx context.Context, r Request) (*core.Consumer, error) {
	key, err := f.ClientIP.Key(r)
	if err != nil {
		return f.Auth.Authenticate(ctx, r)
	}
	fc := &core.Consumer{ID: FailureIDPrefix + key, Policies: []string{f.Policy}}

	// A zero-cost peek changes nothing. Remaining < 1 on a configured limit
	// means a unit-cost request would be denied; spend one to get the
	// store's own denying Decision (a denial stores nothing).
	d, err := f.Limiter.Decide(ctx, fc, f.API, 0)
	if err != nil {
		return nil, err
	}
	if spent(d.Rate) || spent(d.Quota) {
		if d, err = f.Limiter.Decide(ctx, fc, f.API, 1); err != nil {
			return nil, err
		}
		if !d.Allowed {
			return nil, &LimitError{Decision: d}
		}
		// The budget refilled between the two calls; this request has
		// paid its unit, so it is not charged again.
		return f.Auth.Authenticate(ctx, r)
	}

	c, err := f.Auth.Authenticate(ctx, r)
	var ae *Error
	if err == nil || !errors.As(err, &ae) {
		return c, err
	}
	d, derr := f.Limiter.Decide(ctx, fc, f.API, 1)
	if derr != nil {
		return nil, derr
	}
	if !d.Allowed {
		return nil, &LimitError{Decision: d}
	}
	return nil, err
}

func spent(s core.Status) bool { return s.Limit > 0 && s.Remaining < 1 }
