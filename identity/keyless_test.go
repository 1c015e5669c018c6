package identity

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/limitplane/limitplane/core"
)

// parseAddrPortCases are peer addresses netip.ParseAddrPort accepts and
// refuses; parseAddrPort must agree on every one.
var parseAddrPortCases = []string{
	"192.0.2.1:80", "192.0.2.1:0", "192.0.2.1:65535", "192.0.2.1:65536",
	"192.0.2.1:00080", "192.0.2.1:0000000000065535", "192.0.2.1:99999999999999999999",
	"192.0.2.1:", ":80", ":", "", "192.0.2.1", "192.0.2.1:+80", "192.0.2.1:-1",
	"192.0.2.1:8_0", "192.0.2.1:0x50", "192.0.2.1: 80", "192.0.2.1:80 ",
	"[2001:db8::1]:443", "[2001:db8::1]:", "[2001:db8::1]", "2001:db8::1",
	"2001:db8::1:443", "[192.0.2.1]:80", "[::ffff:192.0.2.1]:80", "::ffff:192.0.2.1:80",
	"[fe80::1%eth0]:80", "[fe80::1%eth0]", "192.0.2.1%eth0:80", "[]:80", "[:80",
	"[2001:db8::1:80", "2001:db8::1]:80", "[[2001:db8::1]]:80", "@", "a.b.c.d:80",
	"256.0.0.1:80", "1.2.3:80", "[::]:1", "0.0.0.0:1",
}

func checkParseAddrPort(t *testing.T, s string) {
	t.Helper()
	want, werr := netip.ParseAddrPort(s)
	got, ok := parseAddrPort(s)
	if ok != (werr == nil) || (ok && got != want.Addr()) {
		t.Fatalf("parseAddrPort(%q) = %v, %v; netip.ParseAddrPort: %v, %v", s, got, ok, want, werr)
	}
}

func TestParseAddrPortAgreesWithNetip(t *testing.T) {
	for _, s := range parseAddrPortCases {
		checkParseAddrPort(t, s)
	}
}

func FuzzParseAddrPort(f *testing.F) {
	for _, s := range parseAddrPortCases {
		f.Add(s)
	}
	f.Fuzz(checkParseAddrPort)
}

// parseIPv4PortCases are peer addresses for parseIPv4Port beside
// parseAddrPortCases: canonical and non-canonical IPv4 forms and ports.
var parseIPv4PortCases = []string{
	"10.0.0.1:40000", "255.255.255.255:65535", "0.0.0.0:0", "1.2.3.4:00000",
	"01.2.3.4:80", "1.2.3.04:80", "1.2.3.4567:80", "1.2.3.256:80", "1.2.3.4:000080",
	"1.2.3.4:65536", "1.2.3.4:99999", "1.2.3.4::80", "1.2.3.4.5:80", "1.2.3:4:80",
	"1..3.4:80", ".1.2.3:80", "1.2.3.4.:80", "1.2.3.4", "1.2.3.4:", "1.2.3.4:8a",
	"1000.2.3.4:80", "1.2.3.4:80:80", "1.2.3.4%z:80", "[1.2.3.4]:80",
}

// checkParseIPv4Port: every address parseIPv4Port takes, parseAddrPort
// takes too, as an IPv4 address whose String is the host returned.
func checkParseIPv4Port(t *testing.T, s string) {
	t.Helper()
	host, ok := parseIPv4Port(s)
	if !ok {
		return
	}
	a, aok := parseAddrPort(s)
	if !aok || !a.Is4() || a.String() != host {
		t.Fatalf("parseIPv4Port(%q) = %q; parseAddrPort: %v, %v", s, host, a, aok)
	}
}

func TestParseIPv4Port(t *testing.T) {
	took := 0
	for _, s := range append(parseAddrPortCases, parseIPv4PortCases...) {
		checkParseIPv4Port(t, s)
		if _, ok := parseIPv4Port(s); ok {
			took++
		}
	}
	for _, s := range []string{"10.0.0.1:40000", "255.255.255.255:65535", "0.0.0.0:0", "1.2.3.4:00000", "192.0.2.1:80"} {
		if host, ok := parseIPv4Port(s); !ok || host+s[len(host):] != s {
			t.Fatalf("parseIPv4Port(%q) = %q, %v", s, host, ok)
		}
	}
	if took == 0 {
		t.Fatal("parseIPv4Port took none of the cases")
	}
}

func FuzzParseIPv4Port(f *testing.F) {
	for _, s := range append(parseAddrPortCases, parseIPv4PortCases...) {
		f.Add(s)
	}
	f.Fuzz(checkParseIPv4Port)
}

// AuthenticateInto, which reads a plain IPv4 peer's key from its text,
// writes the ID Authenticate finds, for every peer address and ClientIP.
func TestKeylessAuthenticateIntoAgrees(t *testing.T) {
	grouped := mustClientIP(t, ClientIPOptions{IPv4PrefixLen: 24})
	proxied := mustClientIP(t, ClientIPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for _, ip := range []*ClientIP{nil, grouped, proxied} {
		for _, peer := range append(parseAddrPortCases, parseIPv4PortCases...) {
			r := newReq(peer).with("X-Forwarded-For", "192.0.2.9")
			k := &Keyless{Policies: []string{"basic"}, ClientIP: ip, IDSuffix: "@s"}
			c, err := k.Authenticate(context.Background(), r)
			var into core.Consumer
			var id [64]byte
			ierr := k.AuthenticateInto(context.Background(), r, &into, id[:0])
			if (err == nil) != (ierr == nil) || err == nil && into.ID != c.ID {
				t.Fatalf("%q: AuthenticateInto %q, %v; Authenticate %v, %v", peer, into.ID, ierr, c, err)
			}
		}
	}
}

func TestKeylessConsumerIDs(t *testing.T) {
	grouped := mustClientIP(t, ClientIPOptions{IPv4PrefixLen: 24, IPv6PrefixLen: 128})
	long := strings.Repeat("x", 60)
	for _, tc := range []struct {
		peer, suffix string
		ip           *ClientIP
		want         string
	}{
		{"192.0.2.1:80", "", nil, "ip:192.0.2.1"},
		{"192.0.2.1:80", "@orders", nil, "ip:192.0.2.1@orders"},
		{"[::ffff:192.0.2.1]:80", "", nil, "ip:192.0.2.1"},
		{"192.0.2.1", "@a", nil, "ip:192.0.2.1@a"},
		{"[2001:db8:1:2:3:4:5:6]:443", "", nil, "ip:2001:db8:1:2::/64"},
		{"[2001:db8:1:2:3:4:5:6]:443", "@api", nil, "ip:2001:db8:1:2::/64@api"},
		{"[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1", "@0123456789", grouped, "ip:ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff@0123456789"},
		{"192.0.2.200:1", "@b", grouped, "ip:192.0.2.0/24@b"},
		{"192.0.2.1:80", long, nil, "ip:192.0.2.1" + long},                                                                                 // longer than the one-allocation block
		{"[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1", "@0123456789a", grouped, "ip:ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff@0123456789a"}, // 57 bytes
	} {
		k := &Keyless{Policies: []string{"basic"}, ClientIP: tc.ip, IDSuffix: tc.suffix}
		c, err := k.Authenticate(context.Background(), newReq(tc.peer))
		if err != nil {
			t.Fatalf("%s %q: %v", tc.peer, tc.suffix, err)
		}
		if c.ID != tc.want || len(c.Policies) != 1 || c.Policies[0] != "basic" || c.APILimits != nil || c.QuotaEpoch != 0 {
			t.Fatalf("%s %q: consumer %+v, want ID %q", tc.peer, tc.suffix, *c, tc.want)
		}
		// AuthenticateInto writes the same consumer, in the caller's
		// buffer when it fits.
		var into core.Consumer
		var id [64]byte
		if err := k.AuthenticateInto(context.Background(), newReq(tc.peer), &into, id[:0]); err != nil {
			t.Fatalf("%s %q: AuthenticateInto: %v", tc.peer, tc.suffix, err)
		}
		if into.ID != c.ID || len(into.Policies) != 1 || into.Policies[0] != "basic" || into.APILimits != nil || into.QuotaEpoch != 0 {
			t.Fatalf("%s %q: AuthenticateInto wrote %+v, Authenticate gave %+v", tc.peer, tc.suffix, into, *c)
		}
		if inBuf := unsafe.StringData(into.ID) == &id[0]; inBuf != (len(into.ID) <= len(id)) {
			t.Fatalf("%s %q: ID of %d bytes in the caller's buffer: %v", tc.peer, tc.suffix, len(into.ID), inBuf)
		}
		// The ID is what "ip:" + ClientIP.Key + the suffix was before.
		key, _ := tc.ip.Key(newReq(tc.peer))
		if c.ID != "ip:"+key+tc.suffix {
			t.Fatalf("%s: ID %q, Key %q", tc.peer, c.ID, key)
		}
	}
	// Each request gets a consumer of its own.
	k := &Keyless{}
	a, _ := k.Authenticate(context.Background(), newReq("192.0.2.1:1"))
	b, _ := k.Authenticate(context.Background(), newReq("192.0.2.1:1"))
	if a == b || a.ID != b.ID {
		t.Fatalf("consumers %p %q, %p %q", a, a.ID, b, b.ID)
	}
}

func TestKeylessAllocations(t *testing.T) {
	k := &Keyless{Policies: []string{"basic"}, IDSuffix: "@orders"}
	for _, peer := range []string{"192.0.2.1:40000", "[2001:db8::1]:443"} {
		r := newReq(peer)
		n := testing.AllocsPerRun(100, func() {
			if _, err := k.Authenticate(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		})
		if n != 1 {
			t.Fatalf("%s: %v allocations per Authenticate, want 1 (the consumer and its ID together)", peer, n)
		}
	}
}

// AuthenticateInto fails as Authenticate does (500 ErrNoClientAddress), and writes a consumer
// without allocating.
func TestKeylessAuthenticateInto(t *testing.T) {
	k := &Keyless{Policies: []string{"basic"}, IDSuffix: "@x"}
	var c core.Consumer
	var id [64]byte
	_, want := k.Authenticate(context.Background(), newReq("@"))
	if err := k.AuthenticateInto(context.Background(), newReq("@"), &c, id[:0]); err == nil || err.Error() != want.Error() || !errors.Is(err, ErrNoClientAddress) {
		t.Fatalf("unparseable peer: %v, want %v", err, want)
	}
	r := newReq("[2001:db8::1]:443")
	if n := testing.AllocsPerRun(100, func() { k.AuthenticateInto(context.Background(), r, &c, id[:0]) }); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
	if c.ID != "ip:2001:db8::/64@x" {
		t.Fatalf("ID %q", c.ID)
	}
}
