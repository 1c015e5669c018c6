package fasthttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// limiter is an engine over a frozen memory store allowing key k1 rate
// a minute, and its API-key authenticator.
func limiter(t *testing.T, rate int64) (*core.Engine, identity.Authenticator) {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	p := core.Policy{ID: "p", Rate: core.Limit{Rate: rate, Period: time.Minute}}
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{p}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{"p"}}})
	if err != nil {
		t.Fatal(err)
	}
	return eng, identity.NewAPIKey(keys, identity.APIKeyOptions{})
}

// exchange sends GET /x with header fields (name, value pairs) to base
// and renders the answer: status, fields but Date (sorted), body.
func exchange(t *testing.T, base string, hdr ...string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/x", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var names []string
	for k := range resp.Header {
		if k != "Date" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var out strings.Builder
	fmt.Fprintf(&out, "%d\n", resp.StatusCode)
	for _, k := range names {
		fmt.Fprintf(&out, "%s: %q\n", k, resp.Header[k])
	}
	out.WriteString(string(b))
	return out.String()
}

// TestSameAnswersAsNetHTTP: the middleware answers as adapters/nethttp's
// over the same kind of engine, over real TCP: admitted (with the IETF
// and X-RateLimit fields), denied with Retry-After and the JSON body,
// missing, unknown and repeated keys.
func TestSameAnswersAsNetHTTP(t *testing.T) {
	rend := response.NewRenderer(response.Options{XRateLimit: true, XRateLimitReset: response.ResetSeconds})

	eng, auth := limiter(t, 2)
	nh := httptest.NewServer(nethttp.Middleware(eng, auth, nethttp.Options{API: "a", Renderer: rend})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "ok")
		})))
	defer nh.Close()

	eng2, auth2 := limiter(t, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fasthttp.Server{
		NoDefaultServerHeader: true,
		Handler: lpfasthttp.Middleware(eng2, auth2, lpfasthttp.Options{API: "a", Renderer: rend})(func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/plain; charset=utf-8")
			ctx.SetBodyString("ok")
		}),
	}
	go fs.Serve(ln)
	defer fs.Shutdown()
	fh := "http://" + ln.Addr().String()

	for _, c := range []struct {
		name   string
		status string
		hdr    []string
	}{
		{"admitted", "200", []string{"X-API-Key", "k1"}},
		{"admitted, last", "200", []string{"X-API-Key", "k1"}},
		{"denied", "429", []string{"X-API-Key", "k1"}},
		{"missing", "401", nil},
		{"unknown", "403", []string{"X-API-Key", "k2"}},
		{"repeated", "401", []string{"X-API-Key", "k1", "X-API-Key", "k1"}},
	} {
		want := exchange(t, nh.URL, c.hdr...)
		if !strings.HasPrefix(want, c.status+"\n") {
			t.Errorf("%s: net/http answered\n%s\nwant status %s", c.name, want, c.status)
		}
		if got := exchange(t, fh, c.hdr...); got != want {
			t.Errorf("%s:\nfasthttp:\n%s\nnet/http:\n%s", c.name, got, want)
		}
	}
}

// TestRequestPeer: Request reads the TCP peer without text in between and
// writes it as net.TCPAddr does.
func TestRequestPeer(t *testing.T) {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 4000}, nil)
	q := lpfasthttp.Request{Ctx: &ctx}
	if a, ok := q.PeerAddr(); !ok || a.String() != "192.0.2.7" {
		t.Errorf("PeerAddr %v %v, want 192.0.2.7 true", a, ok)
	}
	if got := q.RemoteAddr(); got != "192.0.2.7:4000" {
		t.Errorf("RemoteAddr %q, want 192.0.2.7:4000", got)
	}
}

// TestTrailerFields: over a real connection, a chunked request's trailer
// fields (which fasthttp appends to the header) are no key to the
// middleware, and DropTrailerFields leaves the header section as it was
// sent: a name sent in both keeps the header section's values, a name only
// in the trailer is gone, and a request that is not chunked is untouched.
func TestTrailerFields(t *testing.T) {
	eng, auth := limiter(t, 100)
	seen := make(chan string, 1)
	mw := lpfasthttp.Middleware(eng, auth, lpfasthttp.Options{API: "a"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/keyed" {
			mw(func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("admitted") })(ctx)
			return
		}
		lpfasthttp.DropTrailerFields(&ctx.Request.Header)
		// The fields by name; one name's values in their order.
		var fields [][2]string
		ctx.Request.Header.VisitAll(func(k, v []byte) {
			switch string(k) {
			case "X-Forwarded-For", "X-Api-Key", "X-Tag":
				fields = append(fields, [2]string{string(k), string(v)})
			}
		})
		sort.SliceStable(fields, func(i, j int) bool { return fields[i][0] < fields[j][0] })
		var b strings.Builder
		for _, f := range fields {
			fmt.Fprintf(&b, "%s=%s;", f[0], f[1])
		}
		seen <- b.String()
	}}
	go fs.Serve(ln)
	defer fs.Shutdown()

	send := func(req string) string {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	chunked := func(path, head, trailer string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + head +
			"Connection: close\r\n\r\n2\r\nhi\r\n0\r\n" + trailer + "\r\n"
	}

	if got := send(chunked("/keyed", "", "X-Api-Key: k1\r\n")); !strings.HasPrefix(got, "401 ") {
		t.Errorf("key in a trailer: %s, want 401", got)
	}
	if got := send(chunked("/keyed", "X-Api-Key: k1\r\n", "X-Api-Key: k1\r\n")); got != "200 admitted" {
		t.Errorf("key in the header and again in the trailer: %s, want 200 admitted (one line in the header section)", got)
	}

	for _, c := range []struct{ name, req, want string }{
		{"both", chunked("/", "X-Forwarded-For: 192.0.2.1\r\nX-Tag: a\r\n", "X-Forwarded-For: 198.51.100.9\r\nX-Api-Key: k1\r\n"),
			"X-Forwarded-For=192.0.2.1;X-Tag=a;"},
		{"trailer only", chunked("/", "", "X-Forwarded-For: 198.51.100.9\r\n"), ""},
		{"two lines kept", chunked("/", "X-Tag: a\r\nX-Tag: b\r\n", "X-Tag: c\r\n"), "X-Tag=a;X-Tag=b;"},
		{"not chunked", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Tag: a\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\nhi",
			"X-Api-Key=k1;X-Tag=a;"},
	} {
		if got := send(c.req); !strings.HasPrefix(got, "200 ") {
			t.Errorf("%s: answer %s, want 200", c.name, got)
			continue
		}
		if got := <-seen; got != c.want {
			t.Errorf("%s: header after DropTrailerFields %q, want %q", c.name, got, c.want)
		}
	}
}
