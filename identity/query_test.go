package identity

import (
	"net/url"
	"strings"
	"testing"
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
	// No allocation for a query with no escape.
	raw := "x=1&api_key=" + strings.Repeat("k", 40) + "&y=2"
	if a := testing.AllocsPerRun(100, func() { queryParam(raw, s) }); a != 0 {
		t.Errorf("queryParam allocates %v times", a)
	}
}
