package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

// DefaultAdminPingTimeout bounds the store PING of GET /readyz when
// AdminOptions.PingTimeout is 0.
const DefaultAdminPingTimeout = live.DefaultPingTimeout

// AdminOptions configure the operations endpoint (AdminHandler).
type AdminOptions struct {
	// Token is the bearer token every call must present
	// ("Authorization: Bearer <Token>"), except the reads that
	// ReadsWithoutToken lets through. It is compared in constant time.
	// "" means there is no token: calls that need one are refused with
	// 403, whatever they present.
	Token string
	// ReadsWithoutToken lets GET and HEAD calls through without the token
	// when the connection arrived at a loopback address (127.0.0.0/8,
	// ::1). Calls that change state (POST) always need the token, and so
	// does every call on a connection to any other address. A program sets
	// it when its admin listen address is loopback.
	ReadsWithoutToken bool
	// Reload is what POST /reload calls: it should load the configuration
	// again and apply it, returning why it was refused (each line of the
	// error becomes one entry of the answer's "problems"). nil answers
	// POST /reload with 501.
	Reload func(ctx context.Context) error
	// Gatherer is what GET /metrics exports, in the Prometheus text
	// format; nil answers GET /metrics with 404.
	Gatherer prometheus.Gatherer
	// PingTimeout bounds GET /readyz's store PING; 0 means
	// DefaultAdminPingTimeout.
	PingTimeout time.Duration
	// ControlPlane, if set, is called by every GET /readyz and its result
	// is the answer's "control_plane" member, encoded with encoding/json
	// (a data plane passes its agent's status: dataplane.Agent.Status).
	// It must be safe for concurrent use and quick. nil leaves the member
	// out. When the result is a ControlPlaneStatus whose NotReady is not
	// "", GET /readyz answers 503 with that as "error".
	ControlPlane func() any
}

// ControlPlaneStatus is a control-plane status (AdminOptions.ControlPlane's
// result) that can hold the gateway's readiness back:
// dataplane.Status, which does while the control plane refuses the data
// plane's credentials.
type ControlPlaneStatus interface {
	// NotReady returns why the gateway is not ready, or "" when the
	// control plane does not stop it.
	NotReady() string
}

// AdminHandler returns the gateway's operations endpoint, to be served on
// an address of its own (never the gateway's: its paths would shadow
// APIs). Every answer is JSON except /metrics:
//
//   - GET /metrics: o.Gatherer in the Prometheus text format.
//   - GET /healthz: 200 {"status":"alive"} while the process serves.
//   - GET /readyz: 200 when a configuration is applied and the store
//     answers a PING (a store without a Ping method, the in-process one,
//     always does), or does not but the failure policy is open or
//     fallback, so the gateway serves anyway; otherwise 503. The body
//     says which: {"ready":…,"revision":…,"store":"ok"|"unreachable"|
//     "in-process","failure_policy":…,"error":…}, plus
//     "control_plane":… when o.ControlPlane is set, and
//     "degraded":true,"not_built":[{"api":…,"problem":…},
//     {"policy":…,"problem":…},…] while APIs or policies of the running
//     configuration are not built (Gateway.NotBuilt; still 200:
//     everything else is enforced). While SetUnavailable
//     holds, 503 with its reason as "error".
//   - GET /consumers/{id}?api=ID: the consumer's rate limit and quota
//     state for an API, read with a cost-0 decision that spends nothing
//     and is not reported to Options.Observer. {id} is an API key's hash
//     ("sha256:<64 hex>"), its consumer ID ("key:<32 hex>",
//     identity.KeyHash.ConsumerID), "ip:<address>" (or the client
//     group's prefix, "ip:2001:db8::/64") on a keyless API, or
//     "jwt:<value>" on a jwt API, value being a token's consumer claim
//     (identity.JWTConsumerID names its counters as the API does). api
//     is required for ip: and jwt: consumers and for keys whose limits
//     differ by API (a policy with an apis list, or api_limits). A jwt:
//     consumer has the API's default_policies; on an API with a
//     policy_claim, policies=ID,ID names the ones its tokens carry.
//   - POST /consumers/{id}/reset-quota?api=ID: starts a new quota period
//     for the consumer (core.Engine.ResetQuota) and answers its state
//     afterwards, as the GET does.
//   - POST /reload: calls o.Reload; 200 {"reloaded":true,"revision":…},
//     or 422 {"error":…,"problems":[…]} when it refuses.
//
// Errors: 400 for a malformed consumer ID, an unknown API or one the
// consumer cannot use; 404 for an unknown key or path; 405 (with Allow)
// for a wrong method; 401 (with WWW-Authenticate: Bearer) for a missing or
// wrong token; 403 when a call needs a token and none is configured; 503
// before the first Apply (consumer calls) or when the store does not
// answer a consumer call. The handler is safe for concurrent use.
func (g *Gateway) AdminHandler(o AdminOptions) http.Handler {
	if o.PingTimeout <= 0 {
		o.PingTimeout = DefaultAdminPingTimeout
	}
	a := &admin{g: g, o: o, hasToken: o.Token != ""}
	a.token = sha256.Sum256([]byte(o.Token))
	if o.Gatherer != nil {
		a.metrics = promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	}
	return a
}

// admin is the operations endpoint of one gateway.
type admin struct {
	g        *Gateway
	o        AdminOptions
	token    [sha256.Size]byte // SHA-256 of o.Token: compared at a fixed length
	hasToken bool
	metrics  http.Handler
	// peek is the engine consumer calls use, made for the state it was
	// built from.
	peek atomic.Pointer[peekEngine]
}

// peekEngine is an engine over the gateway's store for one applied state,
// without the gateway's observer (status calls are not decisions) and
// failing closed (a status read during an outage must say so, not report
// an empty state).
type peekEngine struct {
	st  *live.State
	eng *core.Engine
}

func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if !(read && a.o.ReadsWithoutToken && loopbackConn(r)) && !a.authorized(w, r) {
		return
	}
	p := r.URL.Path
	switch {
	case p == "/metrics":
		if a.method(w, r, http.MethodGet) {
			if a.metrics == nil {
				writeError(w, http.StatusNotFound, "metrics are not configured")
				return
			}
			a.metrics.ServeHTTP(w, r)
		}
	case p == "/healthz":
		if a.method(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
		}
	case p == "/readyz":
		if a.method(w, r, http.MethodGet) {
			a.ready(w, r)
		}
	case p == "/reload":
		if a.method(w, r, http.MethodPost) {
			a.reload(w, r)
		}
	case strings.HasPrefix(p, "/consumers/"):
		id := p[len("/consumers/"):]
		if id, ok := strings.CutSuffix(id, "/reset-quota"); ok {
			if a.method(w, r, http.MethodPost) {
				a.consumer(w, r, id, true)
			}
		} else if a.method(w, r, http.MethodGet) {
			a.consumer(w, r, id, false)
		}
	default:
		writeError(w, http.StatusNotFound, "no such admin endpoint")
	}
}

// authorized reports whether r presents the token, answering 401 or 403
// when it does not.
func (a *admin) authorized(w http.ResponseWriter, r *http.Request) bool {
	if !a.hasToken {
		writeError(w, http.StatusForbidden, "this call needs the admin token, and none is configured")
		return false
	}
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limitplane-admin"`)
		writeError(w, http.StatusUnauthorized, "missing admin token: send Authorization: Bearer and the token")
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if subtle.ConstantTimeCompare(got[:], a.token[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limitplane-admin", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, "wrong admin token")
		return false
	}
	return true
}

// method reports whether r uses want (GET also admits HEAD), answering
// 405 when it does not.
func (a *admin) method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want || want == http.MethodGet && r.Method == http.MethodHead {
		return true
	}
	allow := want
	if want == http.MethodGet {
		allow = "GET, HEAD"
	}
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed; use "+want)
	return false
}

// loopbackConn reports whether r's connection arrived at a loopback
// address. A request without one (not from an http.Server) is not.
func loopbackConn(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(la.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// readiness is GET /readyz's answer.
type readiness struct {
	Ready         bool   `json:"ready"`
	Revision      uint64 `json:"revision"`
	Store         string `json:"store,omitempty"`
	FailurePolicy string `json:"failure_policy"`
	Error         string `json:"error,omitempty"`
	// Degraded: APIs or policies of the running configuration are not built
	// (NotBuilt); the rest serves, so the gateway stays ready.
	Degraded     bool       `json:"degraded,omitempty"`
	NotBuilt     []NotBuilt `json:"not_built,omitempty"`
	ControlPlane any        `json:"control_plane,omitempty"`
}

func (a *admin) ready(w http.ResponseWriter, r *http.Request) {
	out := readiness{FailurePolicy: policyName(a.g.opts.FailurePolicy)}
	if a.o.ControlPlane != nil {
		out.ControlPlane = a.o.ControlPlane()
		if cs, ok := out.ControlPlane.(ControlPlaneStatus); ok {
			if reason := cs.NotReady(); reason != "" {
				if st := a.g.State(); st != nil {
					out.Revision = st.Revision()
				}
				out.Error = reason
				writeJSON(w, http.StatusServiceUnavailable, out)
				return
			}
		}
	}
	st := a.g.State()
	if st == nil {
		out.Error = "no configuration applied yet"
		writeJSON(w, http.StatusServiceUnavailable, out)
		return
	}
	out.Revision = st.Revision()
	out.NotBuilt = st.NotBuilt()
	out.Degraded = len(out.NotBuilt) > 0
	if reason := a.g.Unavailable(); reason != "" {
		out.Error = reason
		writeJSON(w, http.StatusServiceUnavailable, out)
		return
	}
	var err error
	out.Store, err = live.PingStore(r.Context(), a.g.opts.Store, a.o.PingTimeout)
	out.Ready = err == nil || a.g.opts.FailurePolicy != core.FailClosed // open or fallback: served meanwhile
	if err != nil {
		out.Error = err.Error()
	}
	if !out.Ready {
		writeJSON(w, http.StatusServiceUnavailable, out)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *admin) reload(w http.ResponseWriter, r *http.Request) {
	if a.o.Reload == nil {
		writeError(w, http.StatusNotImplemented, "reload is not available")
		return
	}
	if err := a.o.Reload(r.Context()); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, struct {
			Error    string   `json:"error"`
			Problems []string `json:"problems"`
		}{"reload refused; the running configuration stays", strings.Split(err.Error(), "\n")})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Reloaded bool   `json:"reloaded"`
		Revision uint64 `json:"revision"`
	}{true, a.g.Revision()})
}

// limitState is one limit's state in a consumer answer.
type limitState struct {
	// Limit is the burst (rate) or the quota's max; 0 when Unlimited.
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// ResetAfterMS is the time until the limit is full again (rate) or
	// the quota period renews, in milliseconds rounded up.
	ResetAfterMS int64  `json:"reset_after_ms"`
	WindowMS     int64  `json:"window_ms"`
	Policy       string `json:"policy,omitempty"`
	Unlimited    bool   `json:"unlimited,omitempty"`
}

// consumerState is the answer of the consumer calls.
type consumerState struct {
	Consumer string      `json:"consumer"`
	KeyHash  string      `json:"key_hash,omitempty"`
	API      string      `json:"api,omitempty"`
	Policies []string    `json:"policies,omitempty"`
	Reset    bool        `json:"quota_reset,omitempty"`
	Rate     *limitState `json:"rate"`
	Quota    *limitState `json:"quota"`
	// Endpoints are the consumer's counters at the API's endpoints that
	// limit it, when the call names the API.
	Endpoints []endpointState `json:"endpoints,omitempty"`
}

// endpointState is a consumer's counters at one endpoint.
type endpointState struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Rate   *limitState `json:"rate"`
	Quota  *limitState `json:"quota"`
}

// consumer answers GET /consumers/{id} and, with reset, POST
// /consumers/{id}/reset-quota.
func (a *admin) consumer(w http.ResponseWriter, r *http.Request, id string, reset bool) {
	st := a.g.State()
	if st == nil {
		writeError(w, http.StatusServiceUnavailable, "no configuration applied yet")
		return
	}
	q := r.URL.Query()
	api := q.Get("api")
	var policies []string // nil: not given
	if vs, ok := q["policies"]; ok {
		if len(vs) != 1 {
			writeError(w, http.StatusBadRequest, "policies is given more than once")
			return
		}
		policies = strings.Split(vs[0], ",")
		if slices.Contains(policies, "") {
			writeError(w, http.StatusBadRequest, "policies: want policy IDs separated by commas")
			return
		}
	}
	c, out, status, msg := a.resolve(st, id, api, policies)
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	eng, err := a.engine(st)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	for _, p := range policies { // checked before a reset changes anything
		if _, ok := eng.Policy(p); !ok {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("policies: no policy %q", p))
			return
		}
	}
	if reset {
		if err := eng.ResetQuota(r.Context(), c, api); err != nil {
			a.g.StoreFailed(err)
			writeError(w, http.StatusServiceUnavailable, "quota reset failed: "+err.Error())
			return
		}
		out.Reset = true
	}
	d, err := eng.Decide(r.Context(), c, api, 0)
	switch {
	case errors.Is(err, core.ErrUnknownPolicy):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("consumer %q: %v", out.Consumer, err))
		return
	case errors.Is(err, core.ErrNoPolicy):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("no policy of consumer %q covers API %q", out.Consumer, api))
		return
	case errors.Is(err, core.ErrStoreUnavailable):
		writeError(w, http.StatusServiceUnavailable, "limit store unavailable: "+strings.TrimPrefix(err.Error(), core.ErrStoreUnavailable.Error()+": "))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	out.Rate, out.Quota = stateOf(d.Rate), stateOf(d.Quota)
	eps, err := eng.EndpointStatuses(r.Context(), c, api)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "limit store unavailable: "+err.Error())
		return
	}
	for _, ep := range eps {
		out.Endpoints = append(out.Endpoints, endpointState{Method: ep.Method, Path: ep.Path, Rate: stateOf(ep.Rate), Quota: stateOf(ep.Quota)})
	}
	writeJSON(w, http.StatusOK, out)
}

// stateOf returns s for an answer: nil when the limit is not configured.
func stateOf(s core.Status) *limitState {
	if s.Limit == 0 && s.Policy == "" {
		return nil
	}
	return &limitState{
		Limit: s.Limit, Remaining: s.Remaining,
		ResetAfterMS: ceilMS(s.ResetAfter), WindowMS: ceilMS(s.Window),
		Policy: s.Policy, Unlimited: s.Limit == 0,
	}
}

// ceilMS returns d in milliseconds, rounded up.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// engine returns the peek engine for st.
func (a *admin) engine(st *live.State) (*core.Engine, error) {
	if p := a.peek.Load(); p != nil && p.st == st {
		return p.eng, nil
	}
	// The endpoints too: a reset starts their quota periods as well, and
	// a state shows their counters.
	base := st.Base()
	eng, err := core.NewEngine(a.g.opts.Store, core.Config{Policies: base.CorePolicies(), Endpoints: base.CoreEndpoints()}, core.Options{
		FailurePolicy: core.FailClosed,
		StoreTimeout:  a.g.opts.StoreTimeout,
		OnStoreError:  a.g.StoreFailed,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: admin: %w", err)
	}
	a.peek.Store(&peekEngine{st: st, eng: eng})
	return eng, nil
}

// resolve finds the consumer id names under st, for API api ("" when not
// given); policies (nil when not given) are a jwt: consumer's, for an API
// that reads them from each token. On failure it returns the status and
// message to answer with.
func (a *admin) resolve(st *live.State, id, api string, policies []string) (*core.Consumer, consumerState, int, string) {
	// Longer than any consumer id or API id: refused without echoing it.
	const maxEcho = 256
	switch {
	case len(id) > maxEcho:
		return nil, consumerState{}, http.StatusBadRequest, fmt.Sprintf("consumer id of %d bytes: too long (at most %d)", len(id), maxEcho)
	case len(api) > maxEcho:
		return nil, consumerState{}, http.StatusBadRequest, fmt.Sprintf("api of %d bytes: too long (at most %d)", len(api), maxEcho)
	}
	out := consumerState{API: api}
	var spa *spec.API
	if api != "" {
		if e := st.API(api); e != nil {
			spa = e.Spec()
		}
		if spa == nil {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("unknown API %q", api)
		}
	}
	kind, rest, _ := strings.Cut(id, ":")
	if policies != nil && kind != "jwt" {
		return nil, out, http.StatusBadRequest, "policies applies only to a jwt: consumer (others' policies are known)"
	}
	switch kind {
	case "sha256", "key":
		var rec *identity.KeyRecord
		if kind == "sha256" {
			h, err := identity.ParseKeyHash(id)
			if err != nil {
				return nil, out, http.StatusBadRequest, fmt.Sprintf("consumer %q: want sha256: and 64 hex digits", id)
			}
			rec = st.Keys().Lookup(h)
		} else {
			b, err := hex.DecodeString(rest)
			if err != nil || len(b) != 16 {
				return nil, out, http.StatusBadRequest, fmt.Sprintf("consumer %q: want key: and 32 hex digits", id)
			}
			rec = keyByConsumerID(st, b)
		}
		if rec == nil {
			return nil, out, http.StatusNotFound, fmt.Sprintf("unknown consumer %q", id)
		}
		c := rec.Consumer()
		out.Consumer, out.KeyHash, out.Policies = c.ID, rec.Hash.String(), c.Policies
		if spa != nil && spa.AuthOrDefault() != spec.AuthAPIKey {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("API %q is %s: API keys are not its consumers", api, spa.AuthOrDefault())
		}
		if spa == nil && perAPI(st, rec) {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("api is required: the limits of consumer %q differ by API", c.ID)
		}
		return c, out, 0, ""
	case "ip":
		if spa == nil {
			return nil, out, http.StatusBadRequest, "api is required for an ip: consumer (the keyless API whose policies apply)"
		}
		if spa.AuthOrDefault() != spec.AuthKeyless {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("API %q is not keyless: its consumers are not client addresses", api)
		}
		group, err := a.clientGroup(rest)
		if err != nil {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("consumer %q: %v", id, err)
		}
		// As live names it (identity.Keyless with IDSuffix "@" and the API):
		// each keyless API counts apart.
		c := &core.Consumer{ID: "ip:" + group + "@" + api, Policies: spa.Policies}
		out.Consumer, out.Policies = c.ID, c.Policies
		return c, out, 0, ""
	case "jwt":
		if spa == nil {
			return nil, out, http.StatusBadRequest, "api is required for a jwt: consumer (the jwt API whose tokens name it)"
		}
		if spa.AuthOrDefault() != spec.AuthJWT || spa.JWT == nil {
			return nil, out, http.StatusBadRequest, fmt.Sprintf("API %q is not a jwt API: its consumers are not token subjects", api)
		}
		// As live names it (spec.JWT.Options): the issuer's namespace, or
		// the API's, and the consumer claim's value.
		c := &core.Consumer{ID: identity.JWTConsumerID(spec.JWTIDPrefix(spa.JWT.Issuer, spa.ID), rest)}
		switch {
		case policies != nil:
			c.Policies = policies
		case spa.JWT.PolicyClaim == "":
			c.Policies = spa.JWT.DefaultPolicies
		default:
			return nil, out, http.StatusBadRequest, fmt.Sprintf("API %q reads each token's policies from its %q claim: name them with policies=ID,ID", api, spa.JWT.PolicyClaim)
		}
		out.Consumer, out.Policies = c.ID, c.Policies
		return c, out, 0, ""
	}
	return nil, out, http.StatusBadRequest, fmt.Sprintf("consumer %q: want sha256: and a key hash, key: and 32 hex digits, ip: and an address, or jwt: and a token's consumer claim", id)
}

// keyByConsumerID returns the key whose consumer ID is "key:" and the hex
// of prefix (the first 16 bytes of its hash: identity.KeyHash.ConsumerID),
// or nil. It scans the registry, comparing hashes, so that no key's
// consumer is made for it.
func keyByConsumerID(st *live.State, prefix []byte) *identity.KeyRecord {
	var found *identity.KeyRecord
	st.Keys().Range(func(r *identity.KeyRecord) bool {
		if bytes.Equal(r.Hash[:len(prefix)], prefix) {
			found = r
		}
		return found == nil
	})
	return found
}

// perAPI reports whether rec's limits depend on the API: it has per-API
// limits, or one of its policies covers only some APIs.
func perAPI(st *live.State, rec *identity.KeyRecord) bool {
	if len(rec.APILimits) > 0 {
		return true
	}
	for _, id := range rec.Policies {
		if p, ok := st.Engine().Policy(id); ok && len(p.APIs) > 0 {
			return true
		}
	}
	return false
}

// clientGroup returns the consumer-ID form of a client address or group
// as identity.ClientIP.Key writes it: an address grouped by the gateway's
// prefix lengths, or a prefix that is exactly such a group.
func (a *admin) clientGroup(s string) (string, error) {
	v4, v6 := a.g.opts.ClientIP.IPv4PrefixLen, a.g.opts.ClientIP.IPv6PrefixLen
	if v4 == 0 {
		v4 = 32
	}
	if v6 == 0 {
		v6 = 64
	}
	bits := func(addr netip.Addr) int {
		if addr.Is4() {
			return v4
		}
		return v6
	}
	var p netip.Prefix
	if addr, err := netip.ParseAddr(s); err == nil && addr.Zone() == "" {
		addr = addr.Unmap()
		p, _ = addr.Prefix(bits(addr))
	} else if q, err := netip.ParsePrefix(s); err == nil {
		if q.Bits() != bits(q.Addr()) || q.Masked() != q {
			return "", fmt.Errorf("%s is not a client group of this gateway (groups are /%d for IPv4, /%d for IPv6)", s, v4, v6)
		}
		p = q
	} else {
		return "", errors.New("want an IP address or a client group prefix")
	}
	if p.IsSingleIP() {
		return p.Addr().String(), nil
	}
	return p.String(), nil
}

// writeJSON answers with status and v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "gateway: admin: "+err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
