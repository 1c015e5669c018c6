// Package spec is limitplane's configuration that travels: the policies,
// API keys and APIs a gateway enforces, as plain data that a YAML file, an
// admin API and a control plane all speak.
//
// A Snapshot holds one complete, consistent set of them with a revision
// number. Its JSON form uses the field names of the gateway's YAML file
// (README, "Gateway configuration reference"): "requests", "per",
// "key_hash", "listen_path", "api_limits" and so on; durations are Go
// duration strings ("1m", "24h"; a number is refused, see Duration) and
// times RFC 3339. Validate checks a
// snapshot as a whole and reports every problem with its field path, such
// as policies[1].rate.per.
//
// What travels: policies (rate, quota, the APIs they cover, shadow),
// keys by their SHA-256 only (a plaintext key is hashed where it is read
// and never kept; see identity.HashKey), per-key per-API limits, expiry,
// the inactive flag and quota epochs (a quota reset travels as a raised
// epoch; see Key.QuotaEpoch), and APIs (id, listen path, target, auth
// kind, keyless policies, JWT settings, failure limit, strip flags and
// tags, by which a control plane picks the APIs each data plane serves).
//
// What stays local to each gateway and is never part of a snapshot: its
// listen address, counter store and Redis settings, failure policy,
// timeouts, response format, trusted proxies and admin settings.
//
// Secrets. A snapshot names secrets; it does not carry them. A JWT key is
// a reference resolved where the snapshot is applied, by that gateway's
// Resolver: secret_env (an environment variable holding an HMAC secret),
// secret_file or pem_file (a file on the gateway's disk). So a snapshot can
// be logged, stored and sent without exposing a secret, and each data
// plane keeps its own. The one exception is JWTKey.Secret, an HMAC secret
// written inline: it exists only for an operator who explicitly puts it
// there (an admin API that is the only place the secret lives), and a
// snapshot holding one must be treated as a secret itself. A PEM public
// key is not a secret and may be inline (JWTKey.PEM).
//
// spec imports only core and identity: no YAML, gRPC, Redis or adapter
// package, so anything may import it.
package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Snapshot is one complete, consistent set of policies, keys and APIs.
// Applying a snapshot replaces everything the previous one held.
type Snapshot struct {
	// Revision orders snapshots: a control plane raises it with every
	// change, and a gateway never applies a lower one over a higher. 0 is
	// a snapshot that no control plane numbered (a local file).
	Revision uint64 `json:"revision"`
	// Policies are the named rate limits and quotas, in file order.
	Policies []Policy `json:"policies,omitempty"`
	// Keys are the API keys, by hash.
	Keys []Key `json:"keys,omitempty"`
	// APIs are the routes, in file order.
	APIs []API `json:"apis,omitempty"`
}

// Policy is a named rate limit and quota (core.Policy). A nil Rate or
// Quota is absent: the policy does not limit that and takes no part when
// several policies are merged for it. Requests or Max of -1 is an explicit
// "unlimited", which does take part (and wins).
type Policy struct {
	// ID names the policy; keys, keyless APIs, JWT default policies and
	// failure limits refer to it, and it names its limits in the
	// RateLimit header fields (its quota as ID + "/quota"). Required and
	// unique: 1 to 128 ASCII letters, digits, '.', '_', ':' or '-', and
	// not "." or "..".
	ID string `json:"id"`
	// Rate is the rate limit, or nil for none.
	Rate *Rate `json:"rate,omitempty"`
	// Quota is the quota, or nil for none.
	Quota *Quota `json:"quota,omitempty"`
	// APIs restricts the policy to these API IDs; empty means every API.
	APIs []string `json:"apis,omitempty"`
	// Shadow computes and reports the policy's decisions but never
	// denies.
	Shadow bool `json:"shadow,omitempty"`
	// Distributed splits the policy's rate limit among the gateways of a
	// data plane that run the Distributed Rate Limiter (core/drl):
	// each enforces its demand-weighted share in memory, with no Redis
	// call per request (core.Policy.Distributed). A gateway without DRL
	// enforces the limit exactly, as if it were false. Quotas are never
	// split.
	Distributed bool `json:"distributed,omitempty"`
	// Endpoints are the policy's own limits at endpoints of APIs
	// (API.Endpoints), so that plans differ per endpoint, as Tyk's
	// endpoint-level limits in a policy's access rights
	// (core.PolicyEndpoint): for a consumer with this policy they replace
	// the endpoint's own policies there, on the same counters.
	Endpoints []PolicyEndpoint `json:"endpoints,omitempty"`
	// Thresholds are percentages of the policy's quota (1 to 100, each
	// once; the quota must be set, not -1 and not global), e.g. [80, 100]: a data
	// plane sends one event per key, scope, threshold and quota period
	// to its threshold webhook when the key's spend reaches one
	// (core.Policy.Thresholds).
	Thresholds []int64 `json:"thresholds,omitempty"`
	// InFlight caps each consumer's requests in flight at once
	// (core.Policy.InFlight): a request over it is refused with 429 "too
	// many concurrent requests" and no Retry-After. 0 or absent: none;
	// negative is refused. Merged over a consumer's policies as the other
	// limits are (the largest cap wins).
	InFlight int64 `json:"in_flight,omitempty"`
	// Settle makes the quota's charge an estimate (the request's cost)
	// settled to the actual cost when the response is done, from the
	// response header the API names (API.SettleHeader) or what a service's
	// middleware is given (core.Policy.Settle): the difference is charged
	// or refunded in the quota period the estimate went to. Needs a quota.
	Settle bool `json:"settle,omitempty"`
}

// PolicyEndpoint is a policy's own limits at one endpoint of an API.
type PolicyEndpoint struct {
	// API is the API's id; required, and the policy must cover it.
	API string `json:"api"`
	// Method and Path name one of the API's endpoints as it gives them
	// (Endpoint.Method and Endpoint.Path; {param} names and a final "/"
	// aside, method in any case).
	Method string `json:"method,omitempty"`
	Path   string `json:"path"`
	// Rate is the rate limit there, or nil for none.
	Rate *Rate `json:"rate,omitempty"`
	// Quota is the quota there, or nil for none; not global. At least one
	// of Rate and Quota is set.
	Quota *Quota `json:"quota,omitempty"`
}

// Rate is a rate limit: Requests per Per, in bursts of up to Burst.
type Rate struct {
	// Requests is the number of requests per Per; -1 means unlimited
	// (then Per and Burst are left out). 0 is invalid.
	Requests int64 `json:"requests"`
	// Per is the period; required unless Requests is -1.
	Per Duration `json:"per,omitempty"`
	// Burst is the most requests at once; 0 (left out) means Requests.
	// Only GCRA has one.
	Burst int64 `json:"burst,omitempty"`
	// Algorithm is "gcra" (the default when empty), "sliding_window",
	// "fixed_window" or "sliding_log" (see core.ParseAlgorithm).
	Algorithm string `json:"algorithm,omitempty"`

	// noRequests, zeroPer and zeroBurst record what a rate's JSON wrote
	// that its fields cannot tell apart from what it left out: requests
	// left out, and a per of "0s" or a burst of 0 written out. The
	// gateway's file refuses each with its own words and so Validate
	// does (0 left out is "missing" for per and Requests for burst). They
	// survive MarshalJSON, so a stored rate keeps them.
	noRequests, zeroPer, zeroBurst bool
}

// rateJSON is Rate's JSON form, with each member present or absent.
type rateJSON struct {
	Requests  *int64    `json:"requests,omitempty"`
	Per       *Duration `json:"per,omitempty"`
	Burst     *int64    `json:"burst,omitempty"`
	Algorithm string    `json:"algorithm,omitempty"`
}

// MarshalJSON writes the rate: requests always but when it was read
// without it, per and burst when they are not 0 or were read as 0.
func (r Rate) MarshalJSON() ([]byte, error) {
	v := rateJSON{Algorithm: r.Algorithm}
	if r.Requests != 0 || !r.noRequests {
		v.Requests = &r.Requests
	}
	if r.Per != 0 || r.zeroPer {
		v.Per = &r.Per
	}
	if r.Burst != 0 || r.zeroBurst {
		v.Burst = &r.Burst
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads a rate, refusing unknown fields,
// and keeps what MarshalJSON needs to write it again as it was.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var v rateJSON
	if err := decodeStrict(b, &v); err != nil {
		return err
	}
	*r = Rate{Algorithm: v.Algorithm, noRequests: v.Requests == nil}
	if v.Requests != nil {
		r.Requests = *v.Requests
	}
	if v.Per != nil {
		r.Per, r.zeroPer = *v.Per, *v.Per == 0
	}
	if v.Burst != nil {
		r.Burst, r.zeroBurst = *v.Burst, *v.Burst == 0
	}
	return nil
}

// decodeStrict decodes b into v, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Quota is a budget of Max requests per Renewal period, which starts at
// the consumer's first request.
type Quota struct {
	// Max is the number of requests per period; -1 means unlimited (then
	// Renewal is left out). 0 is invalid.
	Max int64 `json:"max"`
	// Renewal is the period; required unless Max is -1.
	Renewal Duration `json:"renewal,omitempty"`
	// Global makes the quota one budget shared by every data plane that
	// follows the control plane: Σ admitted over all of them stays within
	// Max (by Mode), each data plane spending chunks leased from the
	// control plane's ledger (controlplane/quotaledger). nil: each data
	// plane counts the quota on its own, so N data planes admit up to
	// N × Max (what Tyk's MDCB does). A gateway with no control plane
	// counts a global quota as its own.
	Global *GlobalQuota `json:"global,omitempty"`

	// noMax and zeroRenewal record max left out and a renewal of "0s"
	// written out, as Rate's flags do.
	noMax, zeroRenewal bool
}

// GlobalQuota is a quota's sharing across data planes (Quota.Global).
type GlobalQuota struct {
	// Mode says what a data plane spends when its leases are spent and
	// it cannot get more (cut off from the control plane): "strict"
	// refuses (Σ admitted ≤ Max always), "reserved" spends Floor, taken
	// from Max for each data plane at the period's start (still ≤ Max),
	// "optimistic" spends Floor only while cut off, not taken in advance
	// (Σ ≤ Max + Floor × the data planes that spent it). Required.
	Mode string `json:"mode"`
	// Floor is each data plane's floor per period (requests), in
	// reserved and optimistic modes; 0 (left out) for none. Not allowed
	// in strict mode; at most Max.
	Floor int64 `json:"floor,omitempty"`
	// LeaseDuration is how long a leased chunk may be spent before its
	// unspent part returns to the ledger; 0 (left out) is 10s. At most
	// the quota's Renewal.
	LeaseDuration Duration `json:"lease_duration,omitempty"`
}

// globalModes are GlobalQuota.Mode's values.
var globalModes = []string{"strict", "reserved", "optimistic"}

// quotaJSON is Quota's JSON form, with each member present or absent.
type quotaJSON struct {
	Max     *int64       `json:"max,omitempty"`
	Renewal *Duration    `json:"renewal,omitempty"`
	Global  *GlobalQuota `json:"global,omitempty"`
}

// MarshalJSON writes the quota: max always but when it was read without
// it, renewal when it is not 0 or was read as 0.
func (q Quota) MarshalJSON() ([]byte, error) {
	var v quotaJSON
	if q.Max != 0 || !q.noMax {
		v.Max = &q.Max
	}
	if q.Renewal != 0 || q.zeroRenewal {
		v.Renewal = &q.Renewal
	}
	v.Global = q.Global
	return json.Marshal(v)
}

// UnmarshalJSON reads a quota, refusing unknown fields, and keeps what MarshalJSON needs to write it again as it was.
func (q *Quota) UnmarshalJSON(b []byte) error {
	var v quotaJSON
	if err := decodeStrict(b, &v); err != nil {
		return err
	}
	*q = Quota{noMax: v.Max == nil, Global: v.Global}
	if v.Max != nil {
		q.Max = *v.Max
	}
	if v.Renewal != nil {
		q.Renewal, q.zeroRenewal = *v.Renewal, *v.Renewal == 0
	}
	return nil
}

// Limits are a key's own limits for one API; they replace the key's
// policies there (core.Consumer.APILimits). At least one of Rate and Quota
// is set.
type Limits struct {
	// Rate is the rate limit, or nil for none.
	Rate *Rate `json:"rate,omitempty"`
	// Quota is the quota, or nil for none.
	Quota *Quota `json:"quota,omitempty"`
	// QuotaEpoch is the epoch of the key's quota counter for this API,
	// which is apart from the key-wide one (Key.QuotaEpoch): per-API
	// limits have counters of their own. See Key.QuotaEpoch for what
	// raising it does. 0 (left out) is the epoch of a counter never reset.
	QuotaEpoch uint64 `json:"quota_epoch,omitempty"`
}

// Key is an API key, known by its SHA-256 only.
type Key struct {
	// KeyHash is "sha256:" and the 64 lower- or upper-case hex digits of
	// the key's SHA-256 (identity.KeyHash.String). Required and unique.
	KeyHash string `json:"key_hash"`
	// Policies are the IDs of the key's policies.
	Policies []string `json:"policies,omitempty"`
	// APILimits are per-API limits by API ID, replacing the policies for
	// those APIs. A key needs policies or API limits.
	APILimits map[string]Limits `json:"api_limits,omitempty"`
	// Expires is when the key stops working; nil means never.
	Expires *time.Time `json:"expires,omitempty"`
	// Inactive keys are refused like unknown ones.
	Inactive bool `json:"inactive,omitempty"`
	// QuotaEpoch is the epoch of the key's key-wide quota counter: quota
	// resets travel as data. Quota counters are named with their epoch,
	// so a gateway that applies a snapshot with a higher QuotaEpoch
	// starts the key a fresh quota period on its next request, and
	// applying the same epoch again (a replayed or repeated snapshot)
	// changes nothing; the old epoch's counter expires by its TTL. The
	// rate limit is not affected. A control plane raises it to reset the
	// key's quota, and on every update of the key unless the update says
	// suppress_reset; spec only carries the number. 0 (left out) is the
	// epoch of a key never reset. Per-API limits have their own
	// (Limits.QuotaEpoch).
	QuotaEpoch uint64 `json:"quota_epoch,omitempty"`
}

// Authentication kinds, the values of API.Auth.
const (
	// AuthAPIKey requires a key from the key list; each key's policies
	// apply. The default (an empty Auth means it).
	AuthAPIKey = "api_key"
	// AuthKeyless admits anyone; the API's own policies apply per client
	// IP address.
	AuthKeyless = "keyless"
	// AuthJWT requires a signed JSON Web Token (see JWT).
	AuthJWT = "jwt"
)

// BuiltinEcho is the target of the built-in echo upstream, which answers
// every request with JSON describing it.
const BuiltinEcho = "builtin:echo"

// API is one protected upstream and the path prefix it is served under.
type API struct {
	// ID names the API; policies' apis lists and keys' api_limits refer
	// to it. Required and unique: 1 to 128 ASCII letters, digits, '.',
	// '_', ':' or '-', and not "." or "..".
	ID string `json:"id"`
	// ListenPath is the path prefix, a clean absolute path such as
	// "/orders/" (see CleanListenPath); unique across APIs. An API with
	// neither ListenPath nor Target is a service's own (ServiceSide):
	// a service enforces it in its middleware (dataplane.Follow) and a
	// gateway does not route it; an API with one of them needs both.
	ListenPath string `json:"listen_path"`
	// Target is BuiltinEcho or an http(s) base URL without credentials,
	// query or fragment (see ParseTarget).
	Target string `json:"target"`
	// Auth is AuthAPIKey (the default when empty), AuthKeyless or AuthJWT.
	Auth string `json:"auth,omitempty"`
	// Policies apply per client IP on a keyless API, which needs at least
	// one; other APIs take none.
	Policies []string `json:"policies,omitempty"`
	// JWT configures a jwt API; required for one, refused on others.
	JWT *JWT `json:"jwt,omitempty"`
	// FailureLimit, when set, charges failed authentications to a policy
	// per client address. Not for keyless APIs.
	FailureLimit *FailureLimit `json:"failure_limit,omitempty"`
	// StripListenPath removes ListenPath from the path sent upstream;
	// nil means true.
	StripListenPath *bool `json:"strip_listen_path,omitempty"`
	// StripAuthData removes the credential from requests sent upstream;
	// nil means true for api_key and jwt APIs. Refused on keyless APIs.
	StripAuthData *bool `json:"strip_auth_data,omitempty"`
	// Tags label the API for sharding: a control plane sends an API only
	// to the data planes whose tags select it. Each is non-empty and
	// listed once; none means every data plane.
	Tags []string `json:"tags,omitempty"`
	// Endpoints are parts of the API, by method and path, whose requests
	// are limited by policies of their own besides the consumer's (and
	// may cost more than 1): a request is limited at the most specific
	// endpoint its method and path match (core.Endpoint,
	// core.Engine.DecideRoute). Paths are relative to the API: a
	// gateway matches the path after the listen path, a service its own
	// request's path (or route pattern, or gRPC full method name).
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// CostHeader names a request header (for a gRPC service, a metadata
	// key) whose value is a request's cost (core.CostHeader): a decimal
	// whole number from 1 to MaxCost, given once; any other value is
	// refused 400 (gRPC InvalidArgument) with a JSON body naming the
	// header, before authentication and with nothing counted. A request
	// without it costs 1 (or a service's own cost); an endpoint with a
	// cost charges its own whatever the header asks. Empty: none.
	CostHeader string `json:"cost_header,omitempty"`
	// MaxCost bounds CostHeader's values, 1 to 2^53 − 1; required with
	// CostHeader, refused without it.
	MaxCost *int64 `json:"max_cost,omitempty"`
	// SettleHeader names the response header (or trailer) in which the
	// upstream gives a request's actual cost, e.g. "X-Usage-Tokens", for
	// the policies that settle (Policy.Settle). A response without it (or
	// with a value that is not an integer in [0, 2^53)) keeps the
	// estimate. An HTTP field name.
	SettleHeader string `json:"settle_header,omitempty"`
}

// Endpoint is a part of an API with limits of its own (core.Endpoint).
// Each of its policies applies to every consumer of the API, on counters
// the consumer has for this endpoint alone (core.EndpointScope), and the
// consumer's own limits for the API apply too.
type Endpoint struct {
	// Method is an HTTP method (GET, HEAD, POST, PUT, PATCH, DELETE,
	// OPTIONS or TRACE; any case), or "any" or "" (left out) for every
	// method. A GET endpoint also takes HEAD requests that no HEAD
	// endpoint takes.
	Method string `json:"method,omitempty"`
	// Path is a path prefix of literal segments and {param} segments,
	// each a whole segment ("/orders", "/orders/{id}/items"); required.
	// It matches a path with as many segments or more, each literal
	// equal and each {param} anything. The most specific endpoint wins:
	// more literal segments, then more segments, then literals further
	// left, then an exact method over GET-for-HEAD over any. Two
	// endpoints of an API may not have the same method and path ({param}
	// names aside).
	Path string `json:"path"`
	// Policies are the endpoint's policies, merged as a consumer's are;
	// each must cover the API (no apis list, or one naming it), and none
	// may have a global quota. An endpoint needs policies or a cost.
	Policies []string `json:"policies,omitempty"`
	// Cost, when set, is what each request to the endpoint costs, on the
	// endpoint's limits and the API's: 1 to 2^53 − 1 (0 is refused). Left
	// out (nil), a request costs its own cost (1 unless a service's
	// middleware says otherwise).
	Cost *int64 `json:"cost,omitempty"`
}

// JWT is a jwt API's token checking (identity.JWTOptions).
type JWT struct {
	// Algorithms are the accepted JWS algorithms, at least one (see
	// JWTAlgorithms); "none" is never accepted.
	Algorithms []string `json:"algorithms,omitempty"`
	// Keys are static verification keys; exactly one of Keys and JWKS.
	Keys []JWTKey `json:"keys,omitempty"`
	// JWKS fetches the keys from an identity provider instead.
	JWKS *JWKS `json:"jwks,omitempty"`
	// Issuer, when set, must equal the token's iss.
	Issuer string `json:"issuer,omitempty"`
	// Audience, when set, must share a value with the token's aud.
	Audience []string `json:"audience,omitempty"`
	// Leeway is the clock skew allowed on exp, nbf and iat; >= 0.
	Leeway Duration `json:"leeway,omitempty"`
	// ConsumerClaim names the consumer's claim; "" means "sub".
	ConsumerClaim string `json:"consumer_claim,omitempty"`
	// PolicyClaim names the claim listing a token's policy IDs.
	PolicyClaim string `json:"policy_claim,omitempty"`
	// DefaultPolicies apply to tokens without a policy claim. A JWT needs
	// PolicyClaim or DefaultPolicies.
	DefaultPolicies []string `json:"default_policies,omitempty"`
}

// JWTKey is one verification key, given by reference: exactly one of
// PEMFile, SecretEnv, SecretFile, PEM and Secret is set. References are
// resolved by the gateway that applies the snapshot (see Resolver).
type JWTKey struct {
	// ID is the key ID a token names in its kid header; required when a
	// JWT has several keys, unique among them.
	ID string `json:"id,omitempty"`
	// PEMFile is a file on the gateway holding a PEM public key or
	// certificate (identity.ParseJWTKeyPEM).
	PEMFile string `json:"pem_file,omitempty"`
	// SecretEnv is an environment variable on the gateway holding an HMAC
	// secret of at least identity.MinHMACKeySize bytes.
	SecretEnv string `json:"secret_env,omitempty"`
	// SecretFile is a file on the gateway holding an HMAC secret; a final
	// line ending is not part of it.
	SecretFile string `json:"secret_file,omitempty"`
	// PEM is a PEM public key or certificate written inline. Public keys
	// are not secret.
	PEM string `json:"pem,omitempty"`
	// Secret is an HMAC secret written inline. Only for an operator who
	// explicitly chooses to carry the secret in the snapshot (see the
	// package documentation): prefer SecretEnv or SecretFile.
	Secret string `json:"secret,omitempty"`
}

// JWKS is a JSON Web Key Set to take a JWT's keys from.
type JWKS struct {
	// URL is the set's https URL (http only to a loopback host).
	URL string `json:"url"`
	// RefreshInterval is how often it is fetched again; 0 (left out)
	// means identity.DefaultJWKSRefresh.
	RefreshInterval Duration `json:"refresh_interval,omitempty"`

	// zeroRefresh records a "refresh_interval" of "0s" written out, which
	// the gateway's file refuses and so Validate does. It survives
	// MarshalJSON.
	zeroRefresh bool
}

// jwksJSON is JWKS's JSON form, with RefreshInterval present or absent.
type jwksJSON struct {
	URL             string    `json:"url"`
	RefreshInterval *Duration `json:"refresh_interval,omitempty"`
}

// MarshalJSON writes the set, with a zero refresh_interval only when it
// was read so.
func (j JWKS) MarshalJSON() ([]byte, error) {
	v := jwksJSON{URL: j.URL}
	if j.RefreshInterval != 0 || j.zeroRefresh {
		v.RefreshInterval = &j.RefreshInterval
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads a set, refusing unknown fields.
// A refresh_interval of "0s" written out is kept apart from one left out,
// for Validate to refuse.
func (j *JWKS) UnmarshalJSON(b []byte) error {
	var v jwksJSON
	if err := decodeStrict(b, &v); err != nil {
		return err
	}
	*j = JWKS{URL: v.URL}
	if v.RefreshInterval != nil {
		j.RefreshInterval, j.zeroRefresh = *v.RefreshInterval, *v.RefreshInterval == 0
	}
	return nil
}

// FailureLimit names the policy failed authentications are charged to.
type FailureLimit struct {
	// Policy is a policy's ID; it must have no apis list and must limit
	// something.
	Policy string `json:"policy"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("500ms", "1m", "24h"), and only so: a bare number is refused, since
// nothing says its unit ("per": 3600 read as nanoseconds would be no
// limit at all).
type Duration time.Duration

// String returns the duration as time.Duration formats it ("1m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string. Any other JSON value (a number
// included), and a string that is not a duration (as ParseDuration
// refuses it), is a *json.UnmarshalTypeError, so that encoding/json adds
// the field's path to it (Field: "rate.per"; see DurationTypeProblem).
// Its Value is the JSON value's kind ("number 3600", "bool"), or for a
// string the string and why it is refused (`string "1d" (not a
// duration)`).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		v := jsonKind(b)
		if v == "number" {
			v += " " + string(b)
		}
		return &json.UnmarshalTypeError{Value: v, Type: reflect.TypeFor[Duration]()}
	}
	v, err := ParseDuration(s)
	if err != nil {
		why := "not a duration"
		if durationRE.MatchString(s) {
			why = "out of range"
		}
		return &json.UnmarshalTypeError{Value: "string " + strconv.Quote(s) + " (" + why + ")", Type: reflect.TypeFor[Duration]()}
	}
	*d = Duration(v)
	return nil
}

// DurationTypeProblem returns the problem, worded for a configuration,
// of err when it is Duration's refusal of a value (found with errors.As):
// one that is not a string, or a string ParseDuration refuses (the
// problem then is ParseDuration's, `"1d" is not a duration`), and the path encoding/json gave it ("rate.per";
// without array indexes or map keys, which encoding/json does not
// report; the Go names of embedded structs left out). ok is false for any other error.
func DurationTypeProblem(err error) (path, problem string, ok bool) {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Type != reflect.TypeFor[Duration]() {
		return "", "", false
	}
	return TypeProblem(err)
}

// RefusedDurationString reports whether err is Duration's refusal of a
// string (one ParseDuration refuses, such as "1d"), as opposed to a JSON
// value that is no string at all (3600, true), found with errors.As.
func RefusedDurationString(err error) bool {
	var te *json.UnmarshalTypeError
	return errors.As(err, &te) && te.Type == reflect.TypeFor[Duration]() && strings.HasPrefix(te.Value, "string ")
}

// TypeProblem is DurationTypeProblem for encoding/json's refusal of any
// value of the wrong type ("in_flight": 1e18, "requests": "10"): the
// path, and the value's kind and what the field takes ("number 1e18:
// want an integer"; a Duration's problem as DurationTypeProblem words
// it). ok is false for any other error, and for a type error with no
// field path.
func TypeProblem(err error) (path, problem string, ok bool) {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field == "" {
		return "", "", false
	}
	// encoding/json names an embedded struct by its Go name; spec's JSON
	// names are lower case.
	parts := strings.Split(te.Field, ".")
	parts = slices.DeleteFunc(parts, func(p string) bool { return p != "" && unicode.IsUpper(rune(p[0])) })
	path = strings.Join(parts, ".")
	if te.Type == reflect.TypeFor[Duration]() {
		if q, err := strconv.QuotedPrefix(strings.TrimPrefix(te.Value, "string ")); err == nil && strings.HasPrefix(te.Value, "string ") {
			if s, err := strconv.Unquote(q); err == nil {
				if _, err := ParseDuration(s); err != nil {
					return path, strings.TrimPrefix(err.Error(), "spec: "), true
				}
			}
		}
		return path, fmt.Sprintf("%s: a duration is a string with its unit, like \"1h\" or \"500ms\"", te.Value), true
	}
	var want string
	switch te.Type.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want = "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "an integer ≥ 0"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Slice, reflect.Array:
		want = "a list"
	case reflect.Map, reflect.Struct:
		want = "an object"
	default:
		want = te.Type.String()
	}
	return path, fmt.Sprintf("%s: want %s", te.Value, want), true
}

// jsonKind names the kind of the JSON value b for a message.
func jsonKind(b []byte) string {
	switch {
	case len(b) == 0:
		return "value"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	case b[0] == 'n':
		return "null"
	}
	return "number"
}

// durationRE matches time.ParseDuration's syntax, whatever the magnitude.
var durationRE = regexp.MustCompile(`^[-+]?(0|((\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)$`)

// ParseDuration is time.ParseDuration with the problem worded for a
// configuration: a value written as a duration that does not fit a
// time.Duration (over about 292 years) is out of range, not "not a
// duration". The error starts with "spec: ".
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err == nil:
		return d, nil
	case durationRE.MatchString(s):
		return 0, fmt.Errorf("spec: %q is out of range (durations go up to %v, about 292 years)", s, time.Duration(math.MaxInt64))
	}
	return 0, fmt.Errorf("spec: %q is not a duration", s)
}
