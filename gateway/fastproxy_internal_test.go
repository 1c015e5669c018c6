package gateway

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestScrubProxyFieldsMasks: scrubProxyFields keeps one bit a field in a
// uint16.
func TestScrubProxyFieldsMasks(t *testing.T) {
	if len(hopHeaders) > 16 || len(forwardedFields) > 16 {
		t.Fatalf("%d hop-by-hop and %d forwarded fields: more than a uint16's bits", len(hopHeaders), len(forwardedFields))
	}
}

// TestScrubProxyFields: what scrubProxyFields leaves of a request, field
// by field, for requests with no such field, with a Connection field
// naming others, and with forwarded fields from a trusted and an
// untrusted peer.
func TestScrubProxyFields(t *testing.T) {
	for _, c := range []struct {
		name, fields string
		trusted      bool
		want         string // the fields left, as VisitAll gives them
		wantXFF      []string
	}{
		{"none", "X-Api-Key: k\r\nAccept: */*\r\n", false, "Host: gw.test|X-Api-Key: k|Accept: */*|", nil},
		{"keep-alive", "Connection: keep-alive\r\nKeep-Alive: 5\r\nX-A: 1\r\n", false, "Host: gw.test|X-A: 1|", nil},
		{"Connection names fields", "Connection: X-Drop, te\r\nX-Drop: 1\r\nTe: trailers, deflate\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\nX-Keep: 2\r\n", false, "Host: gw.test|X-Keep: 2|Te: trailers|", nil},
		{"forwarded, untrusted", "X-Forwarded-For: 192.0.2.1\r\nForwarded: for=192.0.2.1\r\nX-Forwarded-Host: h\r\nX-Forwarded-Proto: https\r\nX-B: 3\r\n", false, "Host: gw.test|X-B: 3|", nil},
		{"forwarded, trusted", "X-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 198.51.100.2, 192.0.2.3\r\n", true, "Host: gw.test|", []string{"192.0.2.1", "198.51.100.2, 192.0.2.3"}},
		{"Connection: close, Transfer-Encoding, Trailer", "Connection: close\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nX-C: 4\r\n", false, "Host: gw.test|X-C: 4|", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := readHeader(t, "POST /x HTTP/1.1\r\nHost: gw.test\r\n"+c.fields+"\r\n")
			xff := scrubProxyFields(h, func() bool { return c.trusted })
			var got strings.Builder
			h.VisitAll(func(k, v []byte) { got.WriteString(string(k) + ": " + string(v) + "|") })
			if got.String() != c.want {
				t.Errorf("fields left %q, want %q", got.String(), c.want)
			}
			if strings.Join(xff, "\n") != strings.Join(c.wantXFF, "\n") || len(xff) != len(c.wantXFF) {
				t.Errorf("X-Forwarded-For %q, want %q", xff, c.wantXFF)
			}
			if h.ConnectionClose() {
				t.Error("Connection: close kept")
			}
		})
	}
}

func readHeader(tb testing.TB, raw string) *fasthttp.RequestHeader {
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		tb.Fatal(err)
	}
	return &h
}

// BenchmarkScrubProxyFields is what the fasthttp engine's proxy does to a
// request's fields before it adds its X-Forwarded-* ones: a request from
// an API client (no Connection field), one from a browser (Connection:
// keep-alive), and one with several hop-by-hop and forwarded fields. Each
// run copies the request's fields first (CopyTo, timed too), so that it
// finds them all again.
func BenchmarkScrubProxyFields(b *testing.B) {
	for _, c := range []struct{ name, fields string }{
		{"api-client", "X-Api-Key: 3f2b9c7e5d1a4b6c8e0f2a4c6e8b0d2f\r\nUser-Agent: Go-http-client/1.1\r\nAccept: */*\r\n"},
		{"browser", "X-Api-Key: 3f2b9c7e5d1a4b6c8e0f2a4c6e8b0d2f\r\nUser-Agent: Mozilla/5.0\r\nAccept: */*\r\nConnection: keep-alive\r\n"},
		{"hop-and-forwarded", "X-Api-Key: k\r\nConnection: X-Drop\r\nX-Drop: 1\r\nTe: trailers\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-Proto: https\r\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			src := readHeader(b, "GET /x HTTP/1.1\r\nHost: gw.test\r\n"+c.fields+"\r\n")
			var h fasthttp.RequestHeader
			b.ReportAllocs()
			for b.Loop() {
				src.CopyTo(&h)
				scrubProxyFields(&h, func() bool { return false })
			}
		})
	}
}
