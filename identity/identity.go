// Package identity answers "who is this consumer?" for every adapter: API
// keys (held only as SHA-256 hashes) and the key registry that maps a key to
// its policies (APIKey, Keys), signed JWTs (JWT, JWKS), and the client IP
// for keyless APIs (Keyless, ClientIP), which is also what FailureLimited
// charges failed authentication attempts to.
//
// Adapters wrap their framework's request in a Request and call an
// Authenticator. Authentication failures are *Error values carrying the HTTP
// status to answer with; no limiter state is ever created for the identity a
// caller claimed but failed to prove. FailureLimited adds brute-force
// protection: failures are charged to the client address under their own
// policy, and a client over that budget gets a *LimitError (answered 429).
package identity

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/limitplane/limitplane/core"
)

// Request is the part of an incoming request that identity reads. Adapters
// implement it over net/http, Gin, Fiber and gRPC metadata. Every method
// returns "" when the item is absent.
type Request interface {
	// Header returns the first value of the named header (case-insensitive
	// name; for gRPC, the metadata key).
	Header(name string) string
	// HeaderValues returns every value of the named header, one per
	// header line, in the order received (nil when absent). ClientIP needs
	// all of them: a proxy may append its own X-Forwarded-For line after
	// one the client sent.
	HeaderValues(name string) []string
	// Query returns the first value of the named URL query parameter.
	// A Request that carries a URL query should also implement
	// QueryValuer, so that a credential parameter given twice is refused
	// as ambiguous (see APIKey.Extract) instead of read as its first value.
	Query(name string) string
	// Cookie returns the value of the named cookie.
	Cookie(name string) string
	// RemoteAddr returns the transport peer as "host:port" or "host".
	RemoteAddr() string
}

// QueryValuer is implemented by Requests that can list every value of a
// URL query parameter, as HeaderValues lists a header's. When a Request
// implements it, a query parameter that a credential source names
// (api_key, by default) is read with QueryValues, and a parameter given
// more than once is refused as ambiguous, as a repeated header is. The
// adapters' Requests over net/http (so Gin) and Fiber implement it; gRPC
// calls have no query.
type QueryValuer interface {
	// QueryValues returns every value of the named query parameter, in
	// the order given, after unescaping names and values as
	// url.ParseQuery does (nil when absent). A parameter given without
	// "=" has the value "".
	QueryValues(name string) []string
}

// Authenticator resolves a request to the consumer it is charged to. It
// returns an *Error (match with errors.Is against ErrMissingCredentials,
// ErrInvalidCredentials) when the request is not authenticated.
type Authenticator interface {
	Authenticate(ctx context.Context, r Request) (*core.Consumer, error)
}

// Sentinel errors; *Error values match them with errors.Is.
var (
	// ErrMissingCredentials: the request carries no credential (401).
	ErrMissingCredentials = errors.New("missing credentials")
	// ErrInvalidCredentials: the credential is unknown, expired, inactive
	// or fails verification (403 for API keys as Tyk answers, 401 for
	// tokens).
	ErrInvalidCredentials = errors.New("invalid credentials")
)

// Error is an authentication failure with the HTTP status to answer with.
type Error struct {
	// Status is the HTTP status code (401 or 403).
	Status int
	// Kind is ErrMissingCredentials or ErrInvalidCredentials.
	Kind error
	// Reason is a short, client-safe explanation ("unknown API key").
	Reason string
}

// Error returns the kind and reason, e.g. "invalid credentials: token
// expired".
func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Reason }

// Is makes errors.Is(err, ErrMissingCredentials) and the like work.
func (e *Error) Is(target error) bool { return target == e.Kind }

func missing(reason string) *Error {
	return &Error{Status: 401, Kind: ErrMissingCredentials, Reason: reason}
}

func invalid(status int, reason string) *Error {
	return &Error{Status: status, Kind: ErrInvalidCredentials, Reason: reason}
}

// PeerAddr parses r.RemoteAddr() ("host:port", "[v6]:port" or a bare
// address) into an address, unmapping IPv4-mapped IPv6 and dropping any
// zone.
func PeerAddr(r Request) (netip.Addr, error) {
	s := r.RemoteAddr()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("identity: unparseable peer address %q", s)
	}
	return a.Unmap().WithZone(""), nil
}

// Keyless identifies the consumer of a keyless API by client IP: each
// address (or address group, see ClientIPOptions) gets its own counters
// under the given policies. Its consumer IDs are "ip:" and ClientIP.Key.
type Keyless struct {
	// Policies apply to every client.
	Policies []string
	// ClientIP picks the address; nil means the peer address with the
	// ClientIPOptions defaults (no trusted proxies, IPv6 grouped by /64).
	ClientIP *ClientIP
}

// Authenticate implements Authenticator. It fails only when no address can
// be parsed (401 ErrMissingCredentials).
func (k *Keyless) Authenticate(_ context.Context, r Request) (*core.Consumer, error) {
	key, err := k.ClientIP.Key(r)
	if err != nil {
		return nil, missing("no client address")
	}
	return &core.Consumer{ID: "ip:" + key, Policies: k.Policies}, nil
}
