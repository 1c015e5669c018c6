package identity

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/core"
)

func mustClientIP(t testing.TB, o ClientIPOptions) *ClientIP {
	t.Helper()
	c, err := NewClientIP(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func trusted(t testing.TB, specs ...string) []netip.Prefix {
	t.Helper()
	p, err := ParseTrustedProxies(specs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestClientIPXForwardedFor(t *testing.T) {
	c := mustClientIP(t, ClientIPOptions{TrustedProxies: trusted(t, "10.0.0.0/8", "2001:db8:ffff::/48"), IPv6PrefixLen: 128})
	const proxy = "10.1.2.3:443"
	cases := []struct {
		name  string
		peer  string
		lines []string
		want  string
	}{
		{"untrusted peer ignores XFF", "198.51.100.7:5000", []string{"203.0.113.9"}, "198.51.100.7"},
		{"untrusted peer, bare address", "198.51.100.7", []string{"203.0.113.9"}, "198.51.100.7"},
		{"trusted peer, one hop", proxy, []string{"203.0.113.9"}, "203.0.113.9"},
		{"rightmost untrusted wins", proxy, []string{"1.1.1.1, 203.0.113.9, 10.9.9.9"}, "203.0.113.9"},
		{"spoofed left entries ignored", proxy, []string{"6.6.6.6, 7.7.7.7, 203.0.113.9"}, "203.0.113.9"},
		{"lines joined in order", proxy, []string{"6.6.6.6", "203.0.113.9, 10.0.0.1"}, "203.0.113.9"},
		{"client line then proxy line", proxy, []string{"6.6.6.6, garbage", "203.0.113.9"}, "203.0.113.9"},
		{"all trusted: leftmost", proxy, []string{"10.0.0.5, 10.0.0.6"}, "10.0.0.5"},
		{"no header: peer", proxy, nil, "10.1.2.3"},
		{"empty header: peer", proxy, []string{""}, "10.1.2.3"},
		{"only commas: peer", proxy, []string{" , ,"}, "10.1.2.3"},
		{"empty elements skipped", proxy, []string{"203.0.113.9,, ,10.0.0.1,"}, "203.0.113.9"},
		{"tabs and spaces", proxy, []string{"\t203.0.113.9 \t"}, "203.0.113.9"},
		{"garbage rightmost: peer", proxy, []string{"203.0.113.9, nonsense"}, "10.1.2.3"},
		{"garbage under trusted hop: peer", proxy, []string{"203.0.113.9, ???, 10.0.0.1"}, "10.1.2.3"},
		{"IPv4 with port", proxy, []string{"203.0.113.9:8080"}, "203.0.113.9"},
		{"IPv6", proxy, []string{"2001:db8::1"}, "2001:db8::1"},
		{"IPv6 in brackets", proxy, []string{"[2001:db8::1]"}, "2001:db8::1"},
		{"IPv6 in brackets with port", proxy, []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"IPv6 with zone", proxy, []string{"fe80::1%eth0"}, "fe80::1"},
		{"IPv4-mapped IPv6 unmapped", proxy, []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"mapped trusted hop skipped", proxy, []string{"203.0.113.9, ::ffff:10.0.0.1"}, "203.0.113.9"},
		{"trusted IPv6 proxy peer", "[2001:db8:ffff::1]:443", []string{"203.0.113.9"}, "203.0.113.9"},
		{"mapped trusted peer", "[::ffff:10.1.2.3]:443", []string{"203.0.113.9"}, "203.0.113.9"},
		{"unknown is not an address", proxy, []string{"unknown"}, "10.1.2.3"},
		{"port only", proxy, []string{":80"}, "10.1.2.3"},
		{"bad brackets", proxy, []string{"[203.0.113.9]"}, "10.1.2.3"},
		{"port out of range", proxy, []string{"203.0.113.9:70000"}, "10.1.2.3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq(tc.peer)
			for _, l := range tc.lines {
				r.with("X-Forwarded-For", l)
			}
			r.with("Forwarded", "for=9.9.9.9") // never read in XFF mode
			a, err := c.Addr(r)
			if err != nil || a.String() != tc.want {
				t.Fatalf("Addr = %v, %v; want %s", a, err, tc.want)
			}
		})
	}
}

func TestClientIPForwarded(t *testing.T) {
	c := mustClientIP(t, ClientIPOptions{TrustedProxies: trusted(t, "10.0.0.0/8"), Header: Forwarded, IPv6PrefixLen: 128})
	const proxy = "10.1.2.3:443"
	cases := []struct {
		name  string
		lines []string
		want  string
	}{
		{"RFC 7239 example", []string{`for="_gazonk"`}, "10.1.2.3"},
		{"one element", []string{"for=203.0.113.9"}, "203.0.113.9"},
		{"case-insensitive name", []string{"For=203.0.113.9"}, "203.0.113.9"},
		{"with other pairs", []string{"for=203.0.113.9;proto=https;by=10.1.2.3"}, "203.0.113.9"},
		{"pairs before for", []string{"proto=http; for=203.0.113.9"}, "203.0.113.9"},
		{"quoted IPv4", []string{`for="203.0.113.9"`}, "203.0.113.9"},
		{"quoted IPv6 with port", []string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"quoted IPv6 no port", []string{`for="[2001:db8:cafe::17]"`}, "2001:db8:cafe::17"},
		{"IPv4 with port quoted", []string{`for="203.0.113.9:8080"`}, "203.0.113.9"},
		{"rightmost untrusted", []string{"for=6.6.6.6, for=203.0.113.9, for=10.0.0.7"}, "203.0.113.9"},
		{"lines joined", []string{"for=6.6.6.6", "for=203.0.113.9;proto=https, for=10.0.0.7"}, "203.0.113.9"},
		{"comma inside quotes", []string{`for=203.0.113.9;x="a,b"`}, "203.0.113.9"},
		{"semicolon inside quotes", []string{`x="a;for=6.6.6.6";for=203.0.113.9`}, "203.0.113.9"},
		{"escaped quote", []string{`x="a\"b";for=203.0.113.9`}, "203.0.113.9"},
		{"bare IPv6 tolerated", []string{"for=2001:db8::9"}, "2001:db8::9"},
		{"mapped unmapped", []string{`for="[::ffff:203.0.113.9]"`}, "203.0.113.9"},
		{"all trusted: leftmost", []string{"for=10.0.0.5, for=10.0.0.6"}, "10.0.0.5"},
		{"unknown: peer", []string{"for=unknown"}, "10.1.2.3"},
		{"obfuscated: peer", []string{"for=_hidden, for=10.0.0.6"}, "10.1.2.3"},
		{"unknown left of client ignored", []string{"for=unknown, for=203.0.113.9"}, "203.0.113.9"},
		{"element without for: peer", []string{"proto=https"}, "10.1.2.3"},
		{"two for in one element: peer", []string{"for=203.0.113.9;for=6.6.6.6"}, "10.1.2.3"},
		{"unterminated quote: peer", []string{`for="203.0.113.9`}, "10.1.2.3"},
		{"unterminated quote, trailing backslash: peer", []string{`for="203.0.113.9\`}, "10.1.2.3"},
		{"no equals: peer", []string{"for"}, "10.1.2.3"},
		{"bad token name: peer", []string{"f(r=203.0.113.9"}, "10.1.2.3"},
		{"bad unquoted value: peer", []string{"for=203.0.113.9/8"}, "10.1.2.3"},
		{"empty value: peer", []string{"for="}, "10.1.2.3"},
		{"empty quoted value: peer", []string{`for=""`}, "10.1.2.3"},
		{"garbage: peer", []string{"!!!"}, "10.1.2.3"},
		{"empty elements skipped", []string{" , for=203.0.113.9 ,"}, "203.0.113.9"},
		{"no header: peer", nil, "10.1.2.3"},
		{"IPv6 port unquoted brackets tolerated", []string{"for=[2001:db8::9]:80"}, "2001:db8::9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq(proxy)
			for _, l := range tc.lines {
				r.with("Forwarded", l)
			}
			r.with("X-Forwarded-For", "9.9.9.9") // never read in Forwarded mode
			a, err := c.Addr(r)
			if err != nil || a.String() != tc.want {
				t.Fatalf("Addr = %v, %v; want %s", a, err, tc.want)
			}
		})
	}
	// Too many elements is malformed.
	r := newReq(proxy).with("Forwarded", strings.Repeat("for=6.6.6.6, ", maxForwardedElements)+"for=203.0.113.9")
	if a, _ := c.Addr(r); a.String() != "10.1.2.3" {
		t.Fatalf("over-long Forwarded: %v", a)
	}
}

func TestClientIPGrouping(t *testing.T) {
	cases := []struct {
		o    ClientIPOptions
		peer string
		key  string
	}{
		{ClientIPOptions{}, "192.0.2.1:1", "192.0.2.1"},
		{ClientIPOptions{}, "[2001:db8:1:2:3:4:5:6]:1", "2001:db8:1:2::/64"},
		{ClientIPOptions{}, "[::ffff:192.0.2.1]:1", "192.0.2.1"},
		{ClientIPOptions{}, "[fe80::1%eth0]:1", "fe80::/64"},
		{ClientIPOptions{IPv6PrefixLen: 128}, "[2001:db8:1:2:3:4:5:6]:1", "2001:db8:1:2:3:4:5:6"},
		{ClientIPOptions{IPv6PrefixLen: 48}, "[2001:db8:1:2:3:4:5:6]:1", "2001:db8:1::/48"},
		{ClientIPOptions{IPv4PrefixLen: 24}, "192.0.2.77:1", "192.0.2.0/24"},
		{ClientIPOptions{IPv4PrefixLen: 24}, "[::ffff:192.0.2.77]:1", "192.0.2.0/24"},
	}
	for _, tc := range cases {
		c := mustClientIP(t, tc.o)
		if k, err := c.Key(newReq(tc.peer)); err != nil || k != tc.key {
			t.Errorf("%+v %s: Key = %q, %v; want %q", tc.o, tc.peer, k, err, tc.key)
		}
	}
	var nilC *ClientIP
	if k, _ := nilC.Key(newReq("[2001:db8::1]:1")); k != "2001:db8::/64" {
		t.Errorf("nil ClientIP Key = %q", k)
	}
	if p, _ := nilC.Prefix(newReq("192.0.2.1:1")); p.String() != "192.0.2.1/32" {
		t.Errorf("nil ClientIP Prefix = %v", p)
	}
	if _, err := nilC.Key(newReq("@unix")); err == nil {
		t.Error("unparseable peer: no error")
	}
}

// TestXFFSpoofing: with no trusted proxy, a client rotating fake
// X-Forwarded-For values is one consumer, limited as its peer address.
func TestXFFSpoofing(t *testing.T) {
	eng, store, _ := engine(t)
	auth := &Keyless{Policies: []string{"basic"}} // basic: 2 per minute
	var allowed int
	for i := range 50 {
		r := newReq("198.51.100.7:"+fmt.Sprint(40000+i)).
			with("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i)).
			with("Forwarded", fmt.Sprintf("for=203.0.114.%d", i)).
			with("X-Forwarded-For", fmt.Sprintf("10.0.0.%d", i))
		c, d, err := serve(context.Background(), auth, eng, r)
		if err != nil {
			t.Fatal(err)
		}
		if c.ID != "ip:198.51.100.7" {
			t.Fatalf("consumer %q", c.ID)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 || store.Len() != 1 {
		t.Fatalf("allowed %d, store len %d; want 2, 1", allowed, store.Len())
	}
	// The same with a trusted proxy configured that the client is not.
	c := mustClientIP(t, ClientIPOptions{TrustedProxies: trusted(t, "10.0.0.0/8")})
	for i := range 20 {
		r := newReq("198.51.100.7:1").with("X-Forwarded-For", fmt.Sprintf("10.0.0.%d, 203.0.113.%d", i, i))
		if k, _ := c.Key(r); k != "198.51.100.7" {
			t.Fatalf("Key = %q", k)
		}
	}
	// Behind a trusted proxy, a client prepending fake hops is still its
	// own address, the one the proxy appended.
	for i := range 20 {
		r := newReq("10.0.0.1:1").with("X-Forwarded-For", fmt.Sprintf("203.0.113.%d, 10.0.0.%d", i, i)).with("X-Forwarded-For", "198.51.100.7")
		if k, _ := c.Key(r); k != "198.51.100.7" {
			t.Fatalf("Key = %q", k)
		}
	}
}

// TestIPv6RotationOneConsumer: addresses inside one /64 share a limit.
func TestIPv6RotationOneConsumer(t *testing.T) {
	eng, store, _ := engine(t)
	auth := &Keyless{Policies: []string{"basic"}}
	allowed := 0
	for i := range 10 {
		_, d, err := serve(context.Background(), auth, eng, newReq(fmt.Sprintf("[2001:db8:0:1::%x]:443", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 || store.Len() != 1 {
		t.Fatalf("allowed %d, store len %d", allowed, store.Len())
	}
}

func TestClientIPOptionErrors(t *testing.T) {
	for _, o := range []ClientIPOptions{
		{IPv4PrefixLen: 33},
		{IPv4PrefixLen: -1},
		{IPv6PrefixLen: 129},
		{Header: 7},
		{TrustedProxies: []netip.Prefix{{}}},
	} {
		if _, err := NewClientIP(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	for _, s := range []string{"10.0.0.0/33", "nope", "fe80::1%eth0", ""} {
		if _, err := ParseTrustedProxies([]string{s}); err == nil {
			t.Errorf("ParseTrustedProxies(%q): no error", s)
		}
	}
	got := trusted(t, "10.1.2.3/8", " 192.0.2.7 ", "::ffff:192.0.2.8", "2001:db8::/32")
	if fmt.Sprint(got) != "[10.0.0.0/8 192.0.2.7/32 192.0.2.8/32 2001:db8::/32]" {
		t.Fatalf("ParseTrustedProxies = %v", got)
	}
	// A mapped trusted prefix trusts the plain IPv4 network.
	c := mustClientIP(t, ClientIPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}})
	if a, _ := c.Addr(newReq("10.2.3.4:1").with("X-Forwarded-For", "203.0.113.1")); a.String() != "203.0.113.1" {
		t.Fatalf("mapped trusted prefix: %v", a)
	}
}

// TestKeylessUnparseablePeer: a peer that is no IP address (a Unix
// socket's "@" or "", a name) is the server's fault, 500, on both paths.
func TestKeylessUnparseablePeer(t *testing.T) {
	for _, peer := range []string{"@", "", "/run/app.sock", "localhost:80"} {
		_, err := (&Keyless{}).Authenticate(context.Background(), newReq(peer))
		authErr(t, err, 500, ErrNoClientAddress, "no client address")
		var c core.Consumer
		err = (&Keyless{}).AuthenticateInto(context.Background(), newReq(peer), &c, make([]byte, 0, 64))
		authErr(t, err, 500, ErrNoClientAddress, "no client address")
	}
}

// TestTrustUnixPeers: a peer with no IP address is a trusted proxy only
// with TrustUnixPeers; the client is then read from the configured header
// as for any trusted proxy (trusted addresses in it skipped), and a header
// naming no client leaves no address. A TCP peer outside TrustedProxies is
// not trusted by it.
func TestTrustUnixPeers(t *testing.T) {
	on := mustClientIP(t, ClientIPOptions{TrustUnixPeers: true, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	fwd := mustClientIP(t, ClientIPOptions{TrustUnixPeers: true, Header: Forwarded})
	off := mustClientIP(t, ClientIPOptions{})
	for _, tc := range []struct {
		c          *ClientIP
		peer, h, v string
		want       string // "" for an error
	}{
		{on, "@", "X-Forwarded-For", "192.0.2.1", "192.0.2.1"},
		{on, "", "X-Forwarded-For", "203.0.113.5, 192.0.2.1, 10.1.2.3", "192.0.2.1"},
		{on, "/run/app.sock", "X-Forwarded-For", "2001:db8::1", "2001:db8::1"},
		{on, "@", "X-Forwarded-For", "", ""},
		{on, "@", "X-Forwarded-For", "garbage", ""},
		{on, "@", "Forwarded", "for=192.0.2.1", ""}, // not the configured header
		{fwd, "@", "Forwarded", "for=192.0.2.1", "192.0.2.1"},
		{on, "192.0.2.9:1", "X-Forwarded-For", "192.0.2.1", "192.0.2.9"}, // a TCP peer that is no trusted proxy
		{off, "@", "X-Forwarded-For", "192.0.2.1", ""},
	} {
		r := newReq(tc.peer)
		if tc.v != "" {
			r = r.with(tc.h, tc.v)
		}
		a, err := tc.c.Addr(r)
		got := ""
		if err == nil {
			got = a.String()
		}
		if got != tc.want {
			t.Errorf("peer %q, %s: %q: Addr = %v, %v; want %q", tc.peer, tc.h, tc.v, a, err, tc.want)
		}
	}
}
