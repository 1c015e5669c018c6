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
	"unsafe"

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

// RawQuerier is implemented by Requests that can give their URL's query
// as sent, without the '?' (url.URL.RawQuery). When a Request implements
// it, a query parameter source is read from it by identity's own strict
// reading, the same behind every adapter and both gateway engines (whose
// own query parsers disagree on what follows): pairs are separated by '&';
// a name and a value are unescaped as url.ParseQuery does; the parameter
// given more than once, a value of it that does not unescape ("%zz"), or
// the parameter in a pair that holds a ';' (a separator to some servers
// behind the gateway, not to it: "x=1;api_key=k") is refused as ambiguous,
// 401 ErrInvalidCredentials. The value returned may be lent, as a Peeker's
// are: identity clones what it keeps of it. An HTTP request target has no
// fragment: a '#' is part of the query (url.ParseRequestURI).
type RawQuerier interface {
	RawQuery() string
}

// Peeker is implemented by Requests whose framework keeps header and query
// values in memory it reuses once the request is handled (fasthttp, so
// Fiber), so that an authenticator that only measures, hashes and compares
// a credential (APIKey: a key refused once is refused again with nothing
// copied) reads it without a copy. Every value it returns is lent: valid
// only while the request is being handled; the caller must not keep it, nor
// anything sliced from it, past that, and clones what it keeps (as
// APIKey.Extract and JWT.Extract do before returning a credential).
type Peeker interface {
	// PeekHeader returns the value of the first field line of the named
	// header (case-insensitive name) and the number of its field lines:
	// "" and 0 when absent. The first value is HeaderValues(name)[0], the
	// count len(HeaderValues(name)).
	PeekHeader(name string) (first string, lines int)
	// PeekQuery returns the first value of the named query parameter and
	// the number of times it is given, as QueryValues(name) lists them
	// (unescaped): "" and 0 when absent.
	PeekQuery(name string) (first string, n int)
}

// Authenticator resolves a request to the consumer it is charged to. It
// returns an *Error (match with errors.Is against ErrMissingCredentials,
// ErrInvalidCredentials, or ErrNoClientAddress for Keyless) when the
// request is not authenticated.
type Authenticator interface {
	Authenticate(ctx context.Context, r Request) (*core.Consumer, error)
}

// ConsumerWriter is an Authenticator that can also write the consumer it
// finds into memory its caller provides, for a caller that uses the
// consumer only while it decides the request (the adapters): then finding
// it allocates nothing. Keyless implements it.
type ConsumerWriter interface {
	Authenticator
	// AuthenticateInto answers as Authenticate does, with the consumer
	// written to *c instead of returned. c.ID's bytes may be in id's array,
	// so c and its ID are valid only until the caller reuses id; the
	// caller must not keep them (nor hand them to anything that does).
	AuthenticateInto(ctx context.Context, r Request, c *core.Consumer, id []byte) error
}

// Sentinel errors; *Error values match them with errors.Is.
var (
	// ErrMissingCredentials: the request carries no credential (401).
	ErrMissingCredentials = errors.New("missing credentials")
	// ErrInvalidCredentials: the credential is unknown, expired, inactive
	// or fails verification (403 for API keys as Tyk answers, 401 for
	// tokens).
	ErrInvalidCredentials = errors.New("invalid credentials")
	// ErrNoClientAddress: a keyless authenticator found no IP address to
	// tell the client by, a fault of the server's setup, not of the
	// request (500): a peer on a Unix socket, or a RemoteAddr that is not
	// an address.
	ErrNoClientAddress = errors.New("cannot identify the client")
)

// Error is an authentication failure with the HTTP status to answer with.
type Error struct {
	// Status is the HTTP status code: 401 or 403, or 500 for
	// ErrNoClientAddress.
	Status int
	// Kind is ErrMissingCredentials, ErrInvalidCredentials or
	// ErrNoClientAddress.
	Kind error
	// Reason is a short, client-safe explanation ("unknown API key").
	Reason string
}

// Error returns the kind and reason, e.g. "invalid credentials: token
// expired".
func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Reason }

// Is makes errors.Is(err, ErrMissingCredentials) and the like work.
func (e *Error) Is(target error) bool { return target == e.Kind }

// noClientAddress is Keyless's failure: see ErrNoClientAddress.
func noClientAddress() *Error {
	return &Error{Status: 500, Kind: ErrNoClientAddress, Reason: "no client address"}
}

func missing(reason string) *Error {
	return &Error{Status: 401, Kind: ErrMissingCredentials, Reason: reason}
}

func invalid(status int, reason string) *Error {
	return &Error{Status: status, Kind: ErrInvalidCredentials, Reason: reason}
}

// PeerAddrer is implemented by Requests that hold their transport peer as
// an address rather than text (Fiber's TCP peer), so that PeerAddr reads it
// without RemoteAddr formatting it and PeerAddr parsing it back.
type PeerAddrer interface {
	// PeerAddr returns the transport peer's address, unmapped and
	// unzoned, exactly what PeerAddr would parse from RemoteAddr(). ok
	// false means RemoteAddr() is to be parsed instead.
	PeerAddr() (a netip.Addr, ok bool)
}

// PeerAddr parses r.RemoteAddr() ("host:port", "[v6]:port" or a bare
// address) into an address, unmapping IPv4-mapped IPv6 and dropping any
// zone. A Request that implements PeerAddrer is asked first.
func PeerAddr(r Request) (netip.Addr, error) {
	if pa, ok := r.(PeerAddrer); ok {
		if a, ok := pa.PeerAddr(); ok {
			return a, nil
		}
	}
	s := r.RemoteAddr()
	if a, ok := parseAddrPort(s); ok {
		return a.Unmap().WithZone(""), nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("identity: unparseable peer address %q", s)
	}
	return a.Unmap().WithZone(""), nil
}

// parseAddrPort returns the address of s when netip.ParseAddrPort(s) would
// succeed, and false exactly when it would fail: "ip:port" or
// "[ipv6]:port", the port decimal digits worth at most 65535 (leading
// zeros allowed, as strconv.ParseUint takes them). It is ParseAddrPort
// without its error values and its strconv call, which the per-request
// path of every keyless API pays for.
func parseAddrPort(s string) (netip.Addr, bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 1 || i == len(s)-1 {
		return netip.Addr{}, false
	}
	host, port := s[:i], s[i+1:]
	v6 := host[0] == '['
	if v6 {
		if len(host) < 2 || host[len(host)-1] != ']' {
			return netip.Addr{}, false
		}
		host = host[1 : len(host)-1]
	}
	n := 0
	for j := 0; j < len(port); j++ {
		c := port[j]
		if c < '0' || c > '9' {
			return netip.Addr{}, false
		}
		if n = n*10 + int(c-'0'); n > 0xffff {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil || v6 != a.Is6() {
		return netip.Addr{}, false
	}
	return a, true
}

// Keyless identifies the consumer of a keyless API by client IP: each
// address (or address group, see ClientIPOptions) gets its own counters
// under the given policies. Its consumer IDs are "ip:", ClientIP.Key and
// IDSuffix ("ip:192.0.2.1", "ip:2001:db8:1:2::/64@orders").
type Keyless struct {
	// Policies apply to every client.
	Policies []string
	// ClientIP picks the address; nil means the peer address with the
	// ClientIPOptions defaults (no trusted proxies, IPv6 grouped by /64).
	ClientIP *ClientIP
	// IDSuffix is appended to every consumer ID; "" appends nothing. Two
	// keyless APIs with the same policies count a client apart when their
	// suffixes differ (the gateway uses "@" and the API's ID).
	IDSuffix string
}

// Authenticate implements Authenticator. It fails only when no address can
// be parsed (500 ErrNoClientAddress: a service on a Unix socket has none,
// unless its ClientIP has TrustUnixPeers and the proxy names the client). The consumer and its ID are made
// in one allocation; the ID's bytes are never written again.
func (k *Keyless) Authenticate(_ context.Context, r Request) (*core.Consumer, error) {
	p, err := k.ClientIP.Prefix(r)
	if err != nil {
		return nil, noClientAddress()
	}
	return ipConsumer("ip:", p, k.IDSuffix, k.Policies), nil
}

// AuthenticateInto implements ConsumerWriter: Authenticate's consumer,
// with the same ID, written to c, its ID's bytes in id's array when they
// fit (else in memory of their own).
func (k *Keyless) AuthenticateInto(_ context.Context, r Request, c *core.Consumer, id []byte) error {
	b, err := k.ClientIP.appendKeyOf(append(id[:0], "ip:"...), r)
	if err != nil {
		return noClientAddress()
	}
	b = append(b, k.IDSuffix...)
	*c = core.Consumer{ID: unsafe.String(unsafe.SliceData(b), len(b)), Policies: k.Policies}
	return nil
}

// appendKeyOf appends Key(r) to b: the peer's address as it is written
// when appendPeerKey can take it so, else Prefix's group (appendKey).
func (c *ClientIP) appendKeyOf(b []byte, r Request) ([]byte, error) {
	if kb, ok := c.appendPeerKey(b, r); ok {
		return kb, nil
	}
	p, err := c.Prefix(r)
	if err != nil {
		return b, err
	}
	return appendKey(b, p), nil
}

// appendPeerKey appends Key(r) to b when it is the transport peer's
// address as r.RemoteAddr() writes it: no proxy is trusted, each IPv4
// address is its own group and the peer is "a.b.c.d:port" with the
// address in its canonical form (parseIPv4Port), which is what Key would
// format back. ok false means it is not, and nothing is appended: Prefix
// and appendKey find the key.
func (c *ClientIP) appendPeerKey(b []byte, r Request) ([]byte, bool) {
	if c == nil {
		c = defaultClientIP
	}
	if len(c.trusted) > 0 || c.v4 != 32 {
		return b, false
	}
	if _, ok := r.(PeerAddrer); ok {
		return b, false
	}
	host, ok := parseIPv4Port(r.RemoteAddr())
	if !ok {
		return b, false
	}
	return append(b, host...), true
}

// parseIPv4Port returns the address of s, "a.b.c.d:port", when the
// address is an IPv4 address as netip.Addr.String writes it (four decimal
// octets of at most 255, no leading zeros) and the port is one to five
// decimal digits worth at most 65535: parseAddrPort accepts every such s,
// and its address's String is the host returned. ok is false for
// anything else, which parseAddrPort may still accept.
func parseIPv4Port(s string) (host string, ok bool) {
	i := 0
	for field := range 4 {
		if field > 0 {
			if i == len(s) || s[i] != '.' {
				return "", false
			}
			i++
		}
		start, v := i, 0
		for i < len(s) && i-start < 3 && '0' <= s[i] && s[i] <= '9' {
			v = v*10 + int(s[i]-'0')
			i++
		}
		if n := i - start; n == 0 || v > 255 || (n > 1 && s[start] == '0') {
			return "", false
		}
	}
	host, port := s[:i], s[i:]
	if len(port) < 2 || len(port) > 6 || port[0] != ':' {
		return "", false
	}
	v := 0
	for j := 1; j < len(port); j++ {
		c := port[j]
		if c < '0' || c > '9' {
			return "", false
		}
		v = v*10 + int(c-'0')
	}
	return host, v <= 0xffff
}

// appendKey appends ClientIP.Key's text for the address group p (valid and
// unzoned): the address when p is a single address, else the prefix.
func appendKey(b []byte, p netip.Prefix) []byte {
	if p.IsSingleIP() {
		return p.Addr().AppendTo(b)
	}
	return p.AppendTo(b)
}

// ipConsumerBlock is a consumer and the bytes of its ID in one
// allocation. idBytes holds "ip:" with any IPv6 prefix
// ("ip:ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", 46 bytes) and a short
// suffix; with core.Consumer's 56 bytes the block fills the 112-byte size
// class.
type ipConsumerBlock struct {
	c       core.Consumer
	idBytes [56]byte
}

// ipConsumer returns a fresh consumer with the ID prefix+Key(p)+suffix and
// the given policies: one allocation when the ID fits ipConsumerBlock,
// else two.
func ipConsumer(prefix string, p netip.Prefix, suffix string, policies []string) *core.Consumer {
	var sb [64]byte
	id := appendKey(append(sb[:0], prefix...), p)
	n := len(id) + len(suffix)
	if n <= len(ipConsumerBlock{}.idBytes) {
		blk := new(ipConsumerBlock)
		copy(blk.idBytes[copy(blk.idBytes[:], id):], suffix)
		// The string shares blk's memory, which nothing writes after this.
		blk.c = core.Consumer{ID: unsafe.String(&blk.idBytes[0], n), Policies: policies}
		return &blk.c
	}
	b := make([]byte, 0, n)
	b = append(append(b, id...), suffix...)
	return &core.Consumer{ID: unsafe.String(unsafe.SliceData(b), n), Policies: policies}
}
