package identity

import (
	"net/url"
	"strings"
	"testing"
	"unsafe"
)

// TestQueryParam: the one strict reading of a credential parameter
// (RawQuerier): values unescaped as url.ParseQuery unescapes them, every
// occurrence counted however its name is escaped, and refusals for a
// value that does not unescape or the name in a pair holding a ';'.
func TestQueryParam(t *testing.T) {
	s := Source{InQuery, "api_key"}
	const semi = "ambiguous credentials: the api_key query parameter beside a ';'"
	const malformed = "malformed api_key query parameter"
	for _, tc := range []struct {
		raw    string
		first  string
		n      int
		reason string
	}{
		{"", "", 0, ""},
		{"x=1", "", 0, ""},
		{"api_key=k1", "k1", 1, ""},
		{"api_key", "", 1, ""},
		{"api_key=", "", 1, ""},
		{"x=1&api_key=k1&y=2", "k1", 1, ""},
		{"api_key=k1&api_key=k2", "k1", 2, ""},
		{"api%5Fkey=k1&api_key=k1", "k1", 2, ""},
		{"api%5fkey=a+b%2Bc", "a b+c", 1, ""},
		{"api_key=k%2D1", "k-1", 1, ""},
		{"&&api_key=k1&", "k1", 1, ""},
		{"api_key2=k1&xapi_key=k2", "", 0, ""},
		{"x=1;y=2&api_key=k1", "k1", 1, ""},     // a ';' pair not naming it: skipped, as url.ParseQuery skips it
		{"x=%zz&api_key=k1", "k1", 1, ""},       // another parameter's bad escape is not ours
		{"api%zzkey=k&api_key=k1", "k1", 1, ""}, // a name that does not unescape names nothing
		{"api_key=%zz", "", 0, malformed},
		{"api_key=k1&api_key=%", "", 0, malformed},
		{"api%5Fkey=%z1", "", 0, malformed},
		{"api_key=k1;x=1", "", 0, semi},
		{"x=1;api_key=k1", "", 0, semi},
		{"x=1;api%5Fkey", "", 0, semi},
		{"api_key=k1&x;api_key=k1", "", 0, semi},
	} {
		first, n, err := queryParam(tc.raw, s)
		reason := ""
		if err != nil {
			e, ok := err.(*Error)
			if !ok || e.Status != 401 || e.Kind != ErrInvalidCredentials {
				t.Fatalf("%q: error %#v, want a 401 *Error", tc.raw, err)
			}
			reason = e.Reason
		}
		if first != tc.first || n != tc.n || reason != tc.reason {
			t.Errorf("queryParam(%q) = %q, %d, %q; want %q, %d, %q", tc.raw, first, n, reason, tc.first, tc.n, tc.reason)
		}
		// Where url.ParseQuery reads the query without an error, the two
		// agree on the values.
		if q, err := url.ParseQuery(tc.raw); err == nil && tc.reason == "" {
			vs := q["api_key"]
			if len(vs) != tc.n || len(vs) > 0 && vs[0] != tc.first {
				t.Errorf("%q: url.ParseQuery gives %q", tc.raw, vs)
			}
		}
	}
	// A configured name is matched as url.ParseQuery reads names: "a+b"
	// written as it is reads "a b".
	plus := Source{InQuery, "a+b"}
	for _, tc := range []struct {
		raw   string
		first string
		n     int
	}{{"a+b=K", "", 0}, {"a%2Bb=K", "K", 1}, {"a b=K", "", 0}} {
		if first, n, err := queryParam(tc.raw, plus); first != tc.first || n != tc.n || err != nil {
			t.Errorf("name a+b, %q: %q, %d, %v; want %q, %d", tc.raw, first, n, err, tc.first, tc.n)
		}
	}
	// No allocation for a query with no escape.
	raw := "x=1&api_key=" + strings.Repeat("k", 40) + "&y=2"
	if a := testing.AllocsPerRun(100, func() { queryParam(raw, s) }); a != 0 {
		t.Errorf("queryParam allocates %v times", a)
	}
}

// lentQuery is a Request whose raw query lives in a buffer the framework
// reuses once the request is handled, and that is no Peeker.
type lentQuery struct {
	*testReq
	buf []byte
}

func (r lentQuery) RawQuery() string { return unsafe.String(unsafe.SliceData(r.buf), len(r.buf)) }

// TestExtractClonesRawQuery: a key read through a RawQuerier that is no
// Peeker is still the caller's own: reusing the buffer afterwards leaves
// it as it was.
func TestExtractClonesRawQuery(t *testing.T) {
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("k1"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	r := lentQuery{newReq("192.0.2.1:1"), []byte("x=1&api_key=k1")}
	got, err := NewAPIKey(ks, APIKeyOptions{}).Extract(r)
	if err != nil || got != "k1" {
		t.Fatalf("Extract = %q, %v", got, err)
	}
	copy(r.buf, "zzzzzzzzzzzzzz")
	if got != "k1" {
		t.Fatalf("the key changed with the buffer: %q", got)
	}
}
