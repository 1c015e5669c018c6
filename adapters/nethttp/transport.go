package nethttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
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
// third-party API under that API's limit. Each call waits (core.Wait,
// honouring the request's context) until the shared limit allows it, and
// fails fast with an error matching core.ErrWaitExceedsDeadline when the
// wait would pass the context's deadline. When the third party still answers
// 429 with Retry-After, the Transport holds back every later call for that
// long, and, when the Store is a core.Penalizer, so does every other
// process sharing the Store.
type Transport struct {
	o         TransportOptions
	req       core.Request
	notBefore atomic.Int64 // Unix ns before which no call is sent
	now       func() time.Time
}

// NewTransport returns a Transport for o.
func NewTransport(o TransportOptions) (*Transport, error) {
	if o.Store == nil || o.Key == "" {
		return nil, errors.New("limitplane: NewTransport: Store and Key are required")
	}
	if o.Limit.IsUnlimited() {
		return nil, errors.New("limitplane: NewTransport: a Limit is required")
	}
	if err := o.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("limitplane: NewTransport: %w", err)
	}
	if o.Base == nil {
		o.Base = http.DefaultTransport
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	return &Transport{o: o, req: core.Request{Consumer: o.Key, Rate: o.Limit, Cost: 1}, now: time.Now}, nil
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if err := t.holdBack(r); err != nil {
		return nil, err
	}
	req := t.req
	if t.o.Cost != nil {
		req.Cost = t.o.Cost(r)
	}
	if _, err := core.Wait(ctx, t.o.Store, req); err != nil {
		return nil, fmt.Errorf("limitplane transport %s: %w", t.o.Key, err)
	}
	resp, err := t.o.Base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return resp, err
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), t.now()); ok {
		d = min(d, t.o.MaxBackoff)
		until := t.now().Add(d).UnixNano()
		for {
			cur := t.notBefore.Load()
			if cur >= until || t.notBefore.CompareAndSwap(cur, until) {
				break
			}
		}
		if p, ok := t.o.Store.(core.Penalizer); ok {
			// Best effort: the response is returned either way.
			_ = p.Penalize(ctx, t.o.Key, "", t.o.Limit, d)
		}
	}
	return resp, nil
}

// holdBack sleeps until a third party's Retry-After has passed.
func (t *Transport) holdBack(r *http.Request) error {
	d := time.Duration(t.notBefore.Load() - t.now().UnixNano())
	if d <= 0 {
		return nil
	}
	ctx := r.Context()
	if dl, ok := ctx.Deadline(); ok && t.now().Add(d).After(dl) {
		return fmt.Errorf("limitplane transport %s: third party asked to wait %v: %w (%w)", t.o.Key, d, core.ErrWaitExceedsDeadline, context.DeadlineExceeded)
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		if s > int64(365*24*time.Hour/time.Second) {
			s = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
