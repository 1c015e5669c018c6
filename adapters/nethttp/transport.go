package nethttp

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TransportOptions configure a Transport.
type TransportOptions struct {
	// Base performs the calls; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Store keeps the shared budget: a memory.Store shares it within one
	// process, a Redis store across every process using the same Key.
	Store core.Store
	// Key names the budget (e.g. "api.stripe.com"). Every Transport with
	// the same Store and Key draws on one limit.
	Key string
	// Limit is the third party's rate limit. Required.
	Limit core.Limit
	// Cost returns a call's cost; nil means 1.
	Cost func(*http.Request) int64
	// MaxBackoff caps how long one Retry-After from the third party holds
	// calls back; default one minute.
	MaxBackoff time.Duration
}

// Transport is an http.RoundTripper that holds outbound calls to a
// third-party API under that API's limit, through a core.Throttle. Each
// call waits (core.Wait, honouring the request's context) until the shared
// limit allows it, and fails fast with an error matching
// core.ErrWaitExceedsDeadline when the wait would pass the context's
// deadline. When the third party still answers 429 with Retry-After, the
// Transport holds back every later call for that long, calls already
// waiting for their reserved slots included, and so does every other
// process sharing the Store (core.Store.Penalize; see core.Throttle.Wait).
type Transport struct {
	base     http.RoundTripper
	cost     func(*http.Request) int64
	throttle *core.Throttle
}

// NewTransport returns a Transport for o.
func NewTransport(o TransportOptions) (*Transport, error) {
	th, err := core.NewThrottle(core.ThrottleOptions{Store: o.Store, Key: o.Key, Limit: o.Limit, MaxBackoff: o.MaxBackoff})
	if err != nil {
		return nil, fmt.Errorf("nethttp: NewTransport: %w", err)
	}
	if o.Base == nil {
		o.Base = http.DefaultTransport
	}
	return &Transport{base: o.Base, cost: o.Cost, throttle: th}, nil
}

// RoundTrip implements http.RoundTripper. When the call may not start
// (the errors of core.Throttle.Wait, wrapped as "nethttp: transport
// <key>: ..."), it closes the request body, as the RoundTripper contract
// asks, and returns without calling Base.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	cost := int64(1)
	if t.cost != nil {
		cost = t.cost(r)
	}
	if err := t.throttle.Wait(r.Context(), cost); err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("nethttp: transport %q: %w", t.throttle.Key(), err)
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return resp, err
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		t.throttle.Backoff(r.Context(), d)
	}
	return resp, nil
}

// maxRetryAfter caps a delay-seconds Retry-After before it is a
// time.Duration (Backoff caps it again, at MaxBackoff).
const maxRetryAfter = 365 * 24 * time.Hour

// parseRetryAfter reads a Retry-After value: delay-seconds (digits only;
// more seconds than maxRetryAfter, however many digits, are
// maxRetryAfter) or an HTTP-date (RFC 9110 §10.2.3). false: neither.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		// Digits: ParseInt fails only when they overflow int64.
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil || s > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true
		}
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
