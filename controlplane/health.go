package controlplane

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// HealthOptions configure Health.
type HealthOptions struct {
	// Store is the store whose readiness /readyz reports. Required.
	Store Store
	// Timeout bounds the readiness check; 0 means 2s.
	Timeout time.Duration
	// CacheFor is how long a readiness answer is reused: the endpoints
	// take no token, and each check is a write transaction (a disk
	// sync), so probes must not decide how often the store writes. 0
	// means one second.
	CacheFor time.Duration
}

// Health returns the handler of the control plane's probes, meant to be
// served without the admin token (they reveal the revision only):
//
//	GET /healthz  200 {"ok":true}: the process answers (liveness)
//	GET /readyz   200 {"ready":true,"revision":N} when the store is open
//	              and a write transaction commits within Timeout;
//	              503 {"ready":false,"error":"..."} otherwise, the error
//	              saying why: "the store's database is unavailable ..."
//	              when the store fails with ErrStoreUnavailable (its
//	              database is down or failing over), "the store does
//	              not take writes: ..." for any other failure
//
// A replica whose database is unavailable is not ready for admin calls,
// but its sync streams stay open and serve what they were sent: take
// /readyz out of rotation for the admin port only, not the sync port (a
// load balancer that drops every replica's sync port during a database
// outage only makes data planes reconnect, with nothing new to get).
//
// The readiness check is an empty Store.Update: it writes nothing and
// leaves the revision alone, but goes through the store's write path (a
// bbolt commit syncs the file). HEAD is answered like GET. It fails when
// Store is nil.
func Health(o HealthOptions) (http.Handler, error) {
	if o.Store == nil {
		return nil, errors.New("controlplane: health: no store")
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.CacheFor <= 0 {
		o.CacheFor = time.Second
	}
	h := &health{o: o}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
	mux.HandleFunc("GET /readyz", h.ready)
	return mux, nil
}

type health struct {
	o HealthOptions

	mu      sync.Mutex // held during a check: one at a time
	checked time.Time  // when the cached answer was made
	rev     uint64
	err     error
}

// readiness is /readyz's answer when ready: the revision always, 0
// included.
type readiness struct {
	Ready    bool   `json:"ready"`
	Revision uint64 `json:"revision"`
}

// unreadiness is /readyz's answer when not ready: no revision (the check
// failed), the reason.
type unreadiness struct {
	Ready bool   `json:"ready"`
	Error string `json:"error"`
}

func (h *health) ready(w http.ResponseWriter, r *http.Request) {
	rev, err := h.check(r.Context())
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, unreadiness{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, readiness{Ready: true, Revision: rev})
}

// check returns the cached answer when it is fresh, and runs the check
// otherwise.
func (h *health) check(ctx context.Context) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.checked.IsZero() && time.Since(h.checked) < h.o.CacheFor {
		return h.rev, h.err
	}
	// One caller's answer serves the others: its going away must not
	// fail the check.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.o.Timeout)
	defer cancel()
	h.rev, h.err = h.o.Store.Update(ctx, func(Tx) error { return nil })
	switch {
	case errors.Is(h.err, ErrStoreUnavailable):
		h.err = wrap("the store's database is unavailable (admin calls answer 503 until it returns; open sync streams keep serving what they have)", h.err)
	case h.err != nil:
		h.err = wrap("the store does not take writes", h.err)
	}
	h.checked = time.Now()
	return h.rev, h.err
}
