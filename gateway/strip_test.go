package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/limitplane/limitplane/identity"
)

// upstreamSaw is what a test upstream received.
type upstreamSaw struct {
	query                                string
	authorization, apiKey, cookie, other []string
}

// TestStripCredentialsSources covers the source kinds the gateway's
// authenticators do not use yet: a cookie (other cookies and cookie lines
// stay) and a custom header, with a repeated query parameter.
func TestStripCredentialsSources(t *testing.T) {
	saw := make(chan upstreamSaw, 1)
	srv := httptest.NewServer(outbound{sources: []identity.Source{
		{In: identity.InCookie, Name: "lp_key"}, {In: identity.InHeader, Name: "X-Other"}, {In: identity.InQuery, Name: "t"},
	}}.handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- upstreamSaw{r.URL.RawQuery, r.Header.Values("Authorization"), r.Header.Values("X-Api-Key"),
			r.Header.Values("Cookie"), r.Header.Values("X-Other")}
	})))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/x?t=1&u=2&t=3", nil)
	req.Header["Cookie"] = []string{"a=1; lp_key=k; b=2", "lp_key=k2"}
	req.Header.Set("X-Other", "secret")
	req.Header.Set("Authorization", "Basic eDp5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := upstreamSaw{query: "u=2", authorization: []string{"Basic eDp5"}, cookie: []string{"a=1; b=2"}}
	if got := <-saw; fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
		t.Errorf("handler saw %q, want %q", got, want)
	}
}

// TestBufferPoolPutAllocatesNothing: the proxies' copy buffers go back to
// the pool without an allocation per response.
func TestBufferPoolPutAllocatesNothing(t *testing.T) {
	var p bufferPool
	p.Put(p.Get()) // the pool's first buffer
	if n := testing.AllocsPerRun(100, func() { p.Put(p.Get()) }); n != 0 {
		t.Errorf("Get and Put: %v allocations, want 0", n)
	}
	if got := len(p.Get()); got != 32<<10 {
		t.Errorf("buffer of %d bytes, want %d", got, 32<<10)
	}
}

// TestCutEscapedPrefix: a listen path is cut from the client's escaped
// path segment by segment, each segment decoded before it is compared, so
// an escaped letter is the same segment and an encoded "/" joins two.
func TestCutEscapedPrefix(t *testing.T) {
	for _, c := range []struct {
		raw, prefix, rest string
		ok                bool
	}{
		{"/shop/a%2Fb", "/shop", "/a%2Fb", true},
		{"/shop", "/shop", "", true},
		{"/shop/", "/shop", "/", true},
		{"/sh%6Fp/a%2Fb", "/shop", "/a%2Fb", true},
		{"/a/b%2Fc/d", "/a/b", "", false},
		{"/a%2Fb/c", "/a/b", "", false},
		{"/a/b/c%2F", "/a/b", "/c%2F", true},
		{"/shop%2Freports", "/shop", "", false},
		{"/shopx/a%2Fb", "/shop", "", false},
		{"/sh%zzp/a%2Fb", "/shop", "", false},
		{"/a%2Fb", "", "/a%2Fb", true},
		{"", "/shop", "", false},
	} {
		rest, ok := cutEscapedPrefix(c.raw, c.prefix)
		if rest != c.rest || ok != c.ok {
			t.Errorf("cutEscapedPrefix(%q, %q) = %q, %v; want %q, %v", c.raw, c.prefix, rest, ok, c.rest, c.ok)
		}
	}
}
