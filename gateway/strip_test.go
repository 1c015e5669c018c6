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
