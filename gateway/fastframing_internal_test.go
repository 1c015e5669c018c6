package gateway

import (
	"bufio"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkFastFraming is fastFraming on a browser-like request of nine
// header lines (about 450 bytes): what the fasthttp engine's framing and
// field checks cost per request.
func BenchmarkFastFraming(b *testing.B) {
	raw := "GET /api/orders?id=7 HTTP/1.1\r\nHost: gw.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\r\n" +
		"Accept: application/json, text/plain, */*\r\nAccept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n" +
		"X-Api-Key: 3f2b9c7e5d1a4b6c8e0f2a4c6e8b0d2f\r\nConnection: keep-alive\r\nReferer: https://app.example.com/orders\r\n" +
		"Cookie: session=abc123; theme=dark\r\n\r\n"
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	if status, _ := fastFraming(&h); status != 0 {
		b.Fatalf("refused with %d", status)
	}
	b.ReportAllocs()
	for b.Loop() {
		fastFraming(&h)
	}
}

// TestValidFieldValue: validFieldValue agrees with a byte-by-byte check
// (no byte below a space but a tab, no DEL) on every byte value at every
// position of values of 0 to 24 bytes, so each lane of the eight-byte
// words and the tail are covered.
func TestValidFieldValue(t *testing.T) {
	want := func(v []byte) bool {
		for _, c := range v {
			if c < ' ' && c != '\t' || c == 0x7f {
				return false
			}
		}
		return true
	}
	for n := 0; n <= 24; n++ {
		v := []byte(strings.Repeat("a", n))
		if !validFieldValue(v) {
			t.Fatalf("%q refused", v)
		}
		for i := range v {
			for c := 0; c < 256; c++ {
				v[i] = byte(c)
				if got := validFieldValue(v); got != want(v) {
					t.Fatalf("%q: %v, want %v", v, got, want(v))
				}
			}
			v[i] = 'a'
		}
	}
	// Words of bytes near the edges, where a subtraction's borrow runs
	// from one byte into the next.
	edge := []byte{0x00, 0x01, '\t', 0x1f, ' ', 0x21, 0x7e, 0x7f, 0x80, 0x81, 0xff}
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]byte, 16)
	for range 200_000 {
		for i := range v {
			v[i] = edge[rng.IntN(len(edge))]
		}
		if got := validFieldValue(v); got != want(v) {
			t.Fatalf("%q: %v, want %v", v, got, want(v))
		}
	}
}
