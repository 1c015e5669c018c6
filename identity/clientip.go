package identity

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ForwardedHeader names the header trusted proxies record the client chain
// in.
type ForwardedHeader uint8

const (
	// XForwardedFor is the de-facto "X-Forwarded-For: client, proxy1,
	// proxy2" list; each proxy appends the address it received the request
	// from. The default.
	XForwardedFor ForwardedHeader = iota
	// Forwarded is RFC 7239's "Forwarded: for=client, for=proxy1"; only
	// the for= parameter is read.
	Forwarded
)

// String returns the header's name.
func (h ForwardedHeader) String() string {
	if h == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// ClientIPOptions configure a ClientIP. The zero value believes no
// forwarding header (the client is the transport peer), keeps every IPv4
// address apart and groups IPv6 clients by /64.
type ClientIPOptions struct {
	// TrustedProxies are the networks of the proxies in front of the
	// service. A forwarding header is read only when the transport peer is
	// in one of them; empty means never. Use ParseTrustedProxies for
	// configuration strings.
	TrustedProxies []netip.Prefix
	// Header is the one forwarding header the trusted proxies write;
	// default XForwardedFor. Only that header is read: a proxy that
	// appends to X-Forwarded-For passes a client's own Forwarded header
	// through untouched, so believing both would let the client pick its
	// address.
	Header ForwardedHeader
	// IPv4PrefixLen groups IPv4 clients into networks of this many bits;
	// 0 means 32 (each address is its own client).
	IPv4PrefixLen int
	// IPv6PrefixLen groups IPv6 clients into networks of this many bits;
	// 0 means 64, the block one subscriber usually holds, so a client
	// cannot escape its limit by rotating addresses inside its own /64.
	// 128 keeps every address apart.
	IPv6PrefixLen int
	// TrustUnixPeers trusts a transport peer that has no IP address, the
	// proxy in front of a service that listens on a Unix socket (nginx's
	// proxy_pass http://unix:/path): the client is read from Header as
	// for a trusted proxy. Set it only when nothing but that proxy can
	// connect to the socket. A request whose header names no client
	// still has no address (ErrNoClientAddress, for Keyless).
	TrustUnixPeers bool
}

// ClientIP finds the address a request came from: the transport peer, or,
// only when the peer is a trusted proxy, the rightmost address in the
// forwarding header that is not itself a trusted proxy. Everything left of
// that address was written by the client and is ignored.
//
// Every header line is read (X-Forwarded-For lines are joined in order, as
// RFC 9110 §5.3 joins repeated fields). When the walk from the right meets
// an entry that is not an address (garbage, an empty header, RFC 7239's
// "unknown" or an obfuscated "_name"), or a Forwarded header is not valid
// RFC 7239 syntax, the peer address is used. When every entry is a trusted
// proxy, the leftmost entry is the client. IPv4-mapped IPv6 addresses
// ("::ffff:192.0.2.1") are unmapped, zones dropped and ports ignored.
//
// A nil *ClientIP behaves as NewClientIP(ClientIPOptions{}). A ClientIP is
// immutable and safe for concurrent use.
type ClientIP struct {
	trusted   []netip.Prefix
	header    ForwardedHeader
	v4, v6    int
	trustUnix bool
}

var defaultClientIP = &ClientIP{v4: 32, v6: 64}

// NewClientIP returns a ClientIP for o. Errors: an invalid trusted prefix,
// an unknown Header, or a prefix length outside 1..32 (IPv4) or 1..128
// (IPv6).
func NewClientIP(o ClientIPOptions) (*ClientIP, error) {
	c := &ClientIP{header: o.Header, v4: o.IPv4PrefixLen, v6: o.IPv6PrefixLen, trustUnix: o.TrustUnixPeers}
	if c.v4 == 0 {
		c.v4 = 32
	}
	if c.v6 == 0 {
		c.v6 = 64
	}
	if c.v4 < 1 || c.v4 > 32 {
		return nil, fmt.Errorf("identity: IPv4 prefix length %d outside 1..32", o.IPv4PrefixLen)
	}
	if c.v6 < 1 || c.v6 > 128 {
		return nil, fmt.Errorf("identity: IPv6 prefix length %d outside 1..128", o.IPv6PrefixLen)
	}
	if o.Header > Forwarded {
		return nil, fmt.Errorf("identity: unknown forwarding header %d", o.Header)
	}
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return nil, errors.New("identity: invalid trusted proxy prefix")
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			// Client addresses are unmapped, so trust ::ffff:a.b.c.d/n
			// as a.b.c.d/(n-96).
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	return c, nil
}

// ParseTrustedProxies parses CIDRs ("10.0.0.0/8", "2001:db8::/32") and bare
// addresses ("192.0.2.7", taken as /32 or /128) for
// ClientIPOptions.TrustedProxies.
func ParseTrustedProxies(specs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(specs))
	for _, s := range specs {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("identity: trusted proxy %q: want an address or CIDR", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Addr returns the client's address (see ClientIP). It fails only when the
// transport peer address cannot be parsed (e.g. a Unix socket), unless
// TrustUnixPeers is set and the forwarding header names the client.
func (c *ClientIP) Addr(r Request) (netip.Addr, error) {
	if c == nil {
		c = defaultClientIP
	}
	peer, err := PeerAddr(r)
	if err != nil {
		if c.trustUnix {
			if a, ok := c.forwarded(r); ok {
				return a, nil
			}
		}
		return netip.Addr{}, err
	}
	if !c.isTrusted(peer) {
		return peer, nil
	}
	if a, ok := c.forwarded(r); ok {
		return a, nil
	}
	return peer, nil
}

// forwarded returns the client the forwarding header names, as written by
// a trusted peer; false when it names none.
func (c *ClientIP) forwarded(r Request) (netip.Addr, bool) {
	if c.header == Forwarded {
		return c.fromForwarded(r.HeaderValues("Forwarded"))
	}
	return c.fromXFF(r.HeaderValues("X-Forwarded-For"))
}

// Prefix returns the client's address group: its address masked to
// IPv4PrefixLen or IPv6PrefixLen bits.
func (c *ClientIP) Prefix(r Request) (netip.Prefix, error) {
	if c == nil {
		c = defaultClientIP
	}
	a, err := c.Addr(r)
	if err != nil {
		return netip.Prefix{}, err
	}
	return c.group(a), nil
}

// Key returns the client's address group as text for a consumer ID: the
// address itself when the group is a single address ("192.0.2.1"),
// otherwise the masked prefix ("2001:db8:1:2::/64").
func (c *ClientIP) Key(r Request) (string, error) {
	var buf [64]byte
	b, err := c.appendKeyOf(buf[:0], r)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (c *ClientIP) group(a netip.Addr) netip.Prefix {
	bits := c.v6
	if a.Is4() {
		bits = c.v4
	}
	p, _ := a.Prefix(bits) // a is valid, unzoned and bits within range
	return p
}

func (c *ClientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// pick walks hops from the right and returns the first untrusted address,
// the leftmost hop when all are trusted, or false on a non-address hop or
// an empty list. next returns hops right to left ("", false at the end).
func (c *ClientIP) pick(next func() (string, bool)) (netip.Addr, bool) {
	var last netip.Addr
	for {
		h, more := next()
		if !more {
			return last, last.IsValid()
		}
		a, ok := parseNode(h)
		if !ok {
			return netip.Addr{}, false
		}
		if !c.isTrusted(a) {
			return a, true
		}
		last = a
	}
}

// fromXFF reads X-Forwarded-For lines right to left. Empty list elements
// (", ,") are skipped, as RFC 9110 §5.6.1 asks of list recipients; entries
// left of the client's address are never parsed.
func (c *ClientIP) fromXFF(lines []string) (netip.Addr, bool) {
	i := len(lines) - 1
	var rest string
	if i >= 0 {
		rest = lines[i]
	}
	return c.pick(func() (string, bool) {
		for i >= 0 {
			if rest == "" {
				if i--; i < 0 {
					break
				}
				rest = lines[i]
				continue
			}
			j := strings.LastIndexByte(rest, ',')
			elem := rest[j+1:]
			rest = rest[:max(j, 0)]
			if elem = trimOWS(elem); elem != "" {
				return elem, true
			}
		}
		return "", false
	})
}

// maxForwardedElements bounds the hops kept from Forwarded headers; more
// is treated as malformed.
const maxForwardedElements = 1024

// fromForwarded reads RFC 7239 Forwarded lines. Elements are split at
// commas outside quoted strings; each element's for= value is then parsed
// lazily, right to left.
func (c *ClientIP) fromForwarded(lines []string) (netip.Addr, bool) {
	var elems []string
	for _, l := range lines {
		var ok bool
		if elems, ok = splitForwarded(elems, l); !ok {
			return netip.Addr{}, false
		}
	}
	i := len(elems)
	var bad bool
	a, ok := c.pick(func() (string, bool) {
		if i--; i < 0 {
			return "", false
		}
		v, ok := forwardedFor(elems[i])
		if !ok {
			bad = true
			return "", false
		}
		return v, true
	})
	return a, ok && !bad
}

// splitQuoted calls fn with each sep-separated part of s, OWS-trimmed and
// skipping empty ones; sep inside RFC 9110 quoted strings does not split.
// It stops when fn returns false, and fails on an unterminated quoted
// string.
func splitQuoted(s string, sep byte, fn func(part string) bool) bool {
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quoted && ch == '\\':
			i++ // quoted-pair: the next octet is literal
		case ch == '"':
			quoted = !quoted
		case !quoted && ch == sep:
			if p := trimOWS(s[start:i]); p != "" && !fn(p) {
				return true
			}
			start = i + 1
		}
	}
	if quoted {
		return false
	}
	if p := trimOWS(s[start:]); p != "" {
		fn(p)
	}
	return true
}

// splitForwarded appends line's comma-separated elements to dst. It fails
// on an unterminated quoted string or more than maxForwardedElements
// elements.
func splitForwarded(dst []string, line string) ([]string, bool) {
	ok := true
	if !splitQuoted(line, ',', func(e string) bool {
		if len(dst) == maxForwardedElements {
			ok = false
			return false
		}
		dst = append(dst, e)
		return true
	}) {
		return dst, false
	}
	return dst, ok
}

// forwardedFor returns the (unquoted) for= value of one RFC 7239
// forwarded-element: pairs "token=value" separated by ';', each value a
// token or a quoted-string. It fails on bad syntax, a missing for= or two
// of them.
func forwardedFor(elem string) (string, bool) {
	var val string
	found, ok := false, true
	splitQuoted(elem, ';', func(pair string) bool {
		name, v, _ := strings.Cut(pair, "=")
		switch {
		case !isToken(name):
			ok = false
		case len(v) > 0 && v[0] == '"':
			v, ok = unquote(v)
		default:
			// RFC 7239 §6 wants IPv6 nodes quoted; accept them bare too.
			ok = isToken(v) || isNodeText(v)
		}
		if ok && strings.EqualFold(name, "for") {
			ok = !found
			val, found = v, true
		}
		return ok
	})
	return val, ok && found
}

// unquote decodes an RFC 9110 quoted-string that spans all of s.
func unquote(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	s = s[1 : len(s)-1]
	if strings.IndexByte(s, '\\') < 0 {
		return s, strings.IndexByte(s, '"') < 0
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i++; i == len(s) {
				return "", false
			}
		case '"':
			return "", false
		}
		b.WriteByte(s[i])
	}
	return b.String(), true
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// isNodeText reports whether s is made only of the characters of an
// address with an optional port: hex digits, '.', ':', '[' and ']'.
func isNodeText(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || strings.IndexByte(".:[]", c) >= 0) {
			return false
		}
	}
	return true
}

// parseNode parses an address as forwarding headers write it: "192.0.2.1",
// "192.0.2.1:8080", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:8080".
// The result is unmapped and unzoned.
func parseNode(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// trimOWS trims RFC 9110 optional white space (spaces and tabs).
func trimOWS(s string) string { return strings.Trim(s, " \t") }
