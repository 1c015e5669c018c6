package server_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/gateway/server"
	"github.com/limitplane/limitplane/internal/seams"
)

// engines are the values of server.engine every engine test runs with.
var engines = []string{config.EngineNetHTTP, config.EngineFastHTTP}

// forEngines runs f as a subtest on each engine.
func forEngines(t *testing.T, f func(t *testing.T, engine string)) {
	t.Helper()
	for _, e := range engines {
		t.Run(strings.ReplaceAll(e, "/", ""), func(t *testing.T) { f(t, e) })
	}
}

// onEngine returns the gateway file yaml with server.engine set to
// engine, in its server section if it has one.
func onEngine(yaml, engine string) string {
	switch {
	case strings.Contains(yaml, "\nserver: {"):
		return strings.Replace(yaml, "\nserver: {", "\nserver: {engine: "+engine+", ", 1)
	case strings.Contains(yaml, "\nserver:\n"):
		return strings.Replace(yaml, "\nserver:\n", "\nserver:\n  engine: "+engine+"\n", 1)
	}
	return yaml + "server: {engine: " + engine + "}\n"
}

// engineYAML is the gateway file of the differential test: an upstream
// API with a rate-limited key and a quota-limited key, the built-in echo
// under a longer listen path of it, a keyless API, endpoints, and the
// loopback as a trusted proxy.
func engineYAML(upstream, deadUpstream, engine string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
store: memory
client_ip:
  trusted_proxies: [127.0.0.1]
server:
  engine: %s
  max_header_bytes: 4096
response:
  x_ratelimit: true
  x_ratelimit_reset: epoch
policies:
  - {id: rate, rate: {requests: 3, per: 1m}}
  - {id: quota, rate: {requests: 100, per: 1m}, quota: {max: 2, renewal: 1h}}
  - {id: anon, rate: {requests: 50, per: 1m}}
  - {id: post-orders, rate: {requests: 1, per: 1m}}
keys:
  - {key: k-rate, policies: [rate]}
  - {key: k-quota, policies: [quota]}
apis:
  - {id: up, listen_path: /up/, target: %q, auth: api_key}
  - {id: echo, listen_path: /up/echo/, target: "builtin:echo", auth: api_key}
  - {id: open, listen_path: /open/, target: %q, auth: keyless, policies: [anon]}
  - {id: down, listen_path: /down/, target: %q, auth: keyless, policies: [anon]}
  - id: shop
    listen_path: /shop/
    target: %q
    endpoints:
      - {method: POST, path: /orders, policies: [post-orders]}
  - {id: raw, listen_path: /raw/, target: %q, auth: api_key, strip_listen_path: false, strip_auth_data: false}
`, engine, upstream, upstream+"/base", deadUpstream, upstream, upstream)
}

// mirror is a real upstream that answers with what it received: method,
// target, Host, header fields (sorted; Accept-Encoding left out, see
// README: net/http's transport adds one) and body, and a few fields of
// its own.
func mirror(t *testing.T) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s %s host=%s\n", r.Method, r.RequestURI, r.Proto, r.Host)
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			if k != "Accept-Encoding" {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(&b, "%s: %q\n", k, r.Header[k])
		}
		fmt.Fprintf(&b, "body %q\n", body)
		w.Header().Set("X-Upstream", "mirror")
		w.Header().Add("Set-Cookie", "s=1; Path=/")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "dropped")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if r.URL.Query().Get("status") == "201" {
			w.WriteHeader(http.StatusCreated)
		}
		io.WriteString(w, b.String())
	}))
	t.Cleanup(up.Close)
	return up
}

// rawExchange sends raw on a new TCP connection to addr and reads every
// response until the connection closes (every request set ends with
// Connection: close, or is one the server answers by closing), each
// rendered as text: status, fields but Date (sorted), body. A
// deadline guards against a server that never closes; it is not part of
// what is compared.
func rawExchange(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out strings.Builder
	method := strings.SplitN(raw, " ", 2)[0]
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			if len(out.String()) == 0 {
				fmt.Fprintf(&out, "no response: %v", err)
			}
			break
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			fmt.Fprintf(&out, "body error: %v\n", err)
		}
		fmt.Fprintf(&out, "%d\n", resp.StatusCode)
		names := make([]string, 0, len(resp.Header))
		// The servers' own answers to a request they cannot read have no
		// Content-Length on net/http; fasthttp always sends one.
		own := resp.Header.Get("Content-Type") == "text/plain; charset=utf-8" && resp.Header.Get("Ratelimit-Policy") == "" && resp.StatusCode >= 400
		for k := range resp.Header {
			if k != "Date" && !(own && k == "Content-Length") {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(&out, "%s: %q\n", k, resp.Header[k])
		}
		fmt.Fprintf(&out, "chunked=%v\n%s\n---\n", slices.Contains(resp.TransferEncoding, "chunked"), body)
		if resp.Close {
			break
		}
	}
	return remoteAddr.ReplaceAllString(out.String(), `"remote_addr": "127.0.0.1:PORT"`)
}

// remoteAddr is the echo's client port, which differs per connection.
var remoteAddr = regexp.MustCompile(`"remote_addr": "127\.0\.0\.1:\d+"`)

// req is a raw HTTP/1.1 request to the gateway "gw.test" that closes its
// connection, with extra header lines.
func req(method, target string, lines ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gw.test\r\n", method, target)
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	return b.String()
}

// openEngines opens one gateway per engine from yaml(engine), with the
// same frozen clocks, and serves each until the end of the test.
func openEngines(t *testing.T, yaml func(engine string) string, o server.Options) map[string]*server.Server {
	t.Helper()
	srvs := make(map[string]*server.Server)
	for _, e := range engines {
		cfg, err := config.Parse(filepath.Join(t.TempDir(), "gateway.yaml"), []byte(yaml(e)))
		if err != nil {
			t.Fatal(err)
		}
		o := o
		o.Config = cfg
		o.Seams = &seams.Seams{Clock: core.NewManualClock(int64(time.Hour)), Now: func() time.Time { return time.Unix(1_700_000_000, 0) }}
		srv, _ := serve(t, o)
		srvs[e] = srv
	}
	return srvs
}

// TestEnginesAnswerAlike sends the same requests, in the same order, to a
// gateway on each engine over real TCP, each in front of a real upstream,
// and requires identical answers: status, header fields but Date, body.
func TestEnginesAnswerAlike(t *testing.T) {
	up := mirror(t)
	deadURL := "http://" + deadAddr(t)
	srvs := openEngines(t, func(e string) string { return engineYAML(up.URL, deadURL, e) },
		server.Options{Logger: slog.New(slog.DiscardHandler)})
	key := func(k string) string { return "X-Api-Key: " + k }
	big := "X-Big: " + strings.Repeat("b", 5000)
	cases := []struct{ name, raw string }{
		{"admitted 1", req("GET", "/up/a/b?x=1&api_key=q", key("k-rate"), "User-Agent: t/1", "X-Forwarded-For: 192.0.2.9")},
		{"admitted 2 with body", req("POST", "/up/a?status=201", key("k-rate"), "Content-Length: 5", "Content-Type: text/plain") + "hello"},
		{"admitted 3, hop-by-hop fields", req("GET", "/up/", key("k-rate"), "Connection: X-Drop", "X-Drop: 1", "Keep-Alive: 5", "Te: trailers", "Proxy-Authorization: x")},
		{"denied by rate", req("GET", "/up/a", key("k-rate"))},
		{"quota 1", req("GET", "/up/q", key("k-quota"))},
		{"quota 2", req("GET", "/up/q", key("k-quota"))},
		{"denied by quota", req("GET", "/up/q", key("k-quota"))},
		{"missing key", req("GET", "/up/a")},
		{"unknown key", req("GET", "/up/a", key("nobody"))},
		{"ambiguous key", req("GET", "/up/a", key("k-quota"), key("k-rate"))},
		{"echo, credentials stripped", req("GET", "/up/echo/x?api_key=k-quota&y=2", "Cookie: a=1", "X-Other: o")},
		{"echo, HEAD", req("HEAD", "/up/echo/x", key("k-quota"))},
		{"keyless", req("GET", "/open/p%20q?r=1", "X-Forwarded-For: 198.51.100.1")},
		// Each alone: one such field makes the fasthttp proxy scrub.
		{"only Forwarded", req("GET", "/open/f", "Forwarded: for=192.0.2.60")},
		{"only X-Forwarded-Host and -Proto", req("GET", "/open/f", "X-Forwarded-Host: evil.test", "X-Forwarded-Proto: https")},
		{"only Upgrade", req("GET", "/open/f", "Upgrade: h2c")},
		{"only Proxy-Connection", req("GET", "/open/f", "Proxy-Connection: keep-alive")},
		{"only Trailer", req("GET", "/open/f", "Trailer: X-Sum")},
		{"Te: trailers with a parameter", req("GET", "/open/f", "TE: trailers;q=0.5")},
		{"Te: trailers among others", req("GET", "/open/f", "Te: deflate, trailers")},
		{"keyless, target with a query", req("GET", "/open/?z=9")},
		{"HEAD to an upstream", req("HEAD", "/open/h")},
		{"large body both ways", req("POST", "/open/big", fmt.Sprintf("Content-Length: %d", 40<<10)) + strings.Repeat("y", 40<<10)},
		{"upstream down", req("GET", "/down/x")},
		{"absolute-form target", req("GET", "http://other.test/open/abs?q=1")},
		{"HTTP/1.0 client", "GET /open/old HTTP/1.0\r\nHost: gw.test\r\n\r\n"},
		{"keyless, escaped slash", req("GET", "/open/a%2Fb")},
		{"no stripping", req("GET", "/raw/a?api_key=k-quota", "Cookie: c=1;d=2")},
		{"endpoint 1", req("POST", "/shop/orders", key("k-rate"), "Content-Length: 0")},
		{"endpoint 2 denied", req("POST", "/shop/orders", key("k-rate"), "Content-Length: 0")},
		{"unclean ..", req("GET", "/open/../up/echo/x?k=v")},
		{"unclean //", req("GET", "//open/a")},
		{"unclean .", req("GET", "/open/./a")},
		{"CONNECT", "CONNECT gw.test:443 HTTP/1.1\r\nHost: gw.test:443\r\nConnection: close\r\n\r\n"},
		{"asterisk", req("GET", "*")},
		{"OPTIONS asterisk", req("OPTIONS", "*")},
		{"unknown route", req("GET", "/nope")},
		{"prefix is no route", req("GET", "/openx")},
		{"bad escape", req("GET", "/open/%zz")},
		{"large header", req("GET", "/open/a", big)},
		{"header over the limit", req("GET", "/open/a", big+big)},
		// Content-Length first: a server that honoured it would read
		// "1\r\nx\r\n" as the body and "0\r\n\r\n" as the next request.
		{"smuggling: Content-Length and Transfer-Encoding", "POST /open/s HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET /open/smuggled HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		// (An empty chunked body goes on as Content-Length: 0 on fasthttp:
		// see README.)
		{"chunked POST", "POST /open/c HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"},
		// A trailer field is no header field: no key from a trailer, and
		// the upstream gets no trailer field as a header field.
		{"key in a trailer", "POST /up/t HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\nX-Api-Key: k-rate\r\n\r\n"},
		{"fields in a trailer", "POST /open/t HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nX-Other: 1\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\nX-Other: 2\r\nX-Forwarded-For: 10.1.1.1\r\nUser-Agent: t\r\n\r\n"},
		{"keep-alive pair", "GET /open/1 HTTP/1.1\r\nHost: gw.test\r\n\r\n" + req("GET", "/open/2")},
		// Framing net/http refuses (found by a new-user trial: fasthttp
		// served them all).
		{"HTTP/1.1 without Host", "GET /open/a HTTP/1.1\r\nConnection: close\r\n\r\n"},
		{"HTTP/1.1 without any field", "GET /open/a HTTP/1.1\r\n\r\n"},
		{"two Host fields", "GET /open/a HTTP/1.1\r\nHost: gw.test\r\nHost: other.test\r\nConnection: close\r\n\r\n"},
		{"two Content-Lengths", "POST /open/a HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 3\r\nContent-Length: 40\r\nConnection: close\r\n\r\nabc" + strings.Repeat("z", 37)},
		{"the same Content-Length twice", "POST /open/a HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 3\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"},
		{"two Transfer-Encodings", "POST /open/a HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"},
		{"HTTP/2.0 request line", "GET /open/a HTTP/2.0\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		// A control byte in a value (a key sent as "demo\x01key": 403
		// unknown API key on fasthttp before), and a name that is no
		// token (found by a new-user trial).
		{"control byte in a value", req("GET", "/up/a", "X-Api-Key: k-\x01rate")},
		{"DEL in a value", req("GET", "/open/a", "X-Other: a\x7fb")},
		{"tab in a value", req("GET", "/open/a", "X-Other: a\tb")},
		{"name that is no token", req("GET", "/open/a", "X(Bad): 1")},
		{"obsolete line folding", req("GET", "/open/a", "X-Other: a", " b")},
		{"control byte in a folded line", req("GET", "/open/a", "X-Other: a", " b\x01")},
		{"empty name", req("GET", "/open/a", ": a")},
		{"high bytes in a value", req("GET", "/open/a", "X-Other: caf\xc3\xa9")},
		// The request line and Host (a second new-user trial).
		{"control byte in the method", "G\x01T /open/m HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"method that is no token", "GE(T /open/m HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"malformed Host", "GET /open/h HTTP/1.1\r\nHost: <script>\r\nConnection: close\r\n\r\n"},
		{"Host with a space", "GET /open/h HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n"},
		{"Host with a port", "GET /open/h HTTP/1.1\r\nHost: gw.test:8080\r\nConnection: close\r\n\r\n"},
		{"IPv6 Host", "GET /open/h HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n"},
		{"HTTP/1.2", "GET /open/v HTTP/1.2\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"lower-case protocol", "GET /open/v http/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"HTTP/1.10", "GET /open/v HTTP/1.10\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"HTTP/01.1", "GET /open/v HTTP/01.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"HTTP/3.0", "GET /open/v HTTP/3.0\r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		{"space after the version", "GET /open/t HTTP/1.1 \r\nHost: gw.test\r\nConnection: close\r\n\r\n"},
		// Expectations (a third trial: fasthttp forwarded "Expect: foo"
		// and spent the key's quota).
		{"Expect other than 100-continue", req("GET", "/up/e", key("k-quota"), "Expect: foo")},
		// (Expect: 100-continue alone gets fasthttp's own 100 Continue:
		// see README.)
		{"Expect 100-continue among others", req("GET", "/open/e", "Expect: foo, 100-Continue")},
		{"empty Expect", req("GET", "/open/e", "Expect: ")},
	}
	for _, c := range cases {
		want := rawExchange(t, srvs[config.EngineNetHTTP].Addr().String(), c.raw)
		got := rawExchange(t, srvs[config.EngineFastHTTP].Addr().String(), c.raw)
		if got != want {
			t.Errorf("%s:\nfasthttp:\n%s\nnet/http:\n%s", c.name, got, want)
		}
	}
}

// TestEnginesRefuseAlikeButTellLess: header lines fasthttp's own parser
// refuses before the gateway sees them get its 400 without net/http's
// detail, and a folded line with a colon in it, which net/http joins to
// the field above, is one of them (README, "The fasthttp engine").
func TestEnginesRefuseAlikeButTellLess(t *testing.T) {
	up := mirror(t)
	srvs := openEngines(t, func(e string) string { return engineYAML(up.URL, "http://"+deadAddr(t), e) },
		server.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, c := range []struct{ name, raw, nethttp string }{
		{"space before the colon", req("GET", "/open/a", "X-Other : a"), "400 Bad Request: invalid header name"},
		{"space in a name", req("GET", "/open/a", "X Other: a"), "400 Bad Request: invalid header name"},
		{"folded line with a colon", req("GET", "/open/a", "X-Other: a", " b: c"), ""},
	} {
		fast := rawExchange(t, srvs[config.EngineFastHTTP].Addr().String(), c.raw)
		slow := rawExchange(t, srvs[config.EngineNetHTTP].Addr().String(), c.raw)
		if !strings.HasPrefix(fast, "400\n") || !strings.Contains(fast, "\n400 Bad Request\n") {
			t.Errorf("%s: fasthttp answered\n%s\nwant its 400", c.name, fast)
		}
		switch {
		case c.nethttp == "" && !strings.HasPrefix(slow, "200\n"):
			t.Errorf("%s: net/http answered\n%s\nwant 200 (the line joined to the field above)", c.name, slow)
		case c.nethttp != "" && (!strings.HasPrefix(slow, "400\n") || !strings.Contains(slow, "\n"+c.nethttp+"\n")):
			t.Errorf("%s: net/http answered\n%s\nwant 400 %q", c.name, slow, c.nethttp)
		}
	}
}

// TestEnginesBeforeFirstApply: a data-plane gateway whose control plane
// has not answered yet answers 503 on both engines alike.
func TestEnginesBeforeFirstApply(t *testing.T) {
	cpAddr := deadAddr(t)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	dir := t.TempDir()
	srvs := openEngines(t, func(e string) string {
		return fmt.Sprintf("listen: 127.0.0.1:0\nserver: {engine: %s}\ncontrol_plane:\n  address: %q\n  token_env: LP_TEST_DP_TOKEN\n  group: dp1\n  state_file: %q\n",
			e, cpAddr, filepath.Join(dir, e+".state.json"))
	}, server.Options{StartTimeout: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	raw := req("GET", "/x", "X-Api-Key: k")
	want := rawExchange(t, srvs[config.EngineNetHTTP].Addr().String(), raw)
	if !strings.HasPrefix(want, "503\n") || !bytes.Contains([]byte(want), []byte("no configuration applied yet")) {
		t.Fatalf("net/http answered\n%s", want)
	}
	if got := rawExchange(t, srvs[config.EngineFastHTTP].Addr().String(), raw); got != want {
		t.Errorf("fasthttp:\n%s\nnet/http:\n%s", got, want)
	}
}

// TestEnginesReadHeaderTimeout: a client that never finishes its request
// header (slowloris) has its connection closed once read_header_timeout
// has passed, on both engines, and nothing reaches the upstream. net/http
// closes without an answer; fasthttp answers 408 first. (The 30 s guard
// only ends a test that would hang; it is not what is checked.)
func TestEnginesReadHeaderTimeout(t *testing.T) {
	up := mirror(t)
	var hits atomic.Int32
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		up.Config.Handler.ServeHTTP(w, r)
	}))
	defer counted.Close()
	srvs := openEngines(t, func(e string) string {
		return fmt.Sprintf("listen: 127.0.0.1:0\nserver: {engine: %s, read_header_timeout: 200ms}\npolicies: [{id: p, rate: {requests: 5, per: 1m}}]\napis: [{id: a, listen_path: /, target: %q, auth: keyless, policies: [p]}]\n", e, counted.URL)
	}, server.Options{})
	want := map[string]string{config.EngineNetHTTP: "", config.EngineFastHTTP: "HTTP/1.1 408 Request Timeout\r\n"}
	for _, e := range engines {
		c, err := net.Dial("tcp", srvs[e].Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(c, "GET /x HTTP/1.1\r\nHost: gw.test\r\nX-Slow: ")
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Errorf("%s: the connection was not closed: %v", e, err)
			continue
		}
		if first, _, _ := strings.Cut(string(got), "\n"); !strings.HasPrefix(string(got), want[e]) || (want[e] == "" && len(got) != 0) {
			t.Errorf("%s: answered %q, want %q", e, first, want[e])
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests, want 0", n)
	}
}

// TestEnginesReadTimeout: a client that sends a request's header but not
// all of its body has its connection closed once read_timeout has passed
// (well before read_header_timeout's 10 s), on both engines, also after a
// request without a body on the same connection, which fasthttp's engine
// reads without moving the deadline. The time is checked only to be
// under read_header_timeout; the 30 s guard ends a test that would hang.
func TestEnginesReadTimeout(t *testing.T) {
	up := mirror(t)
	srvs := openEngines(t, func(e string) string {
		return fmt.Sprintf("listen: 127.0.0.1:0\nserver: {engine: %s, read_header_timeout: 10s, read_timeout: 300ms}\npolicies: [{id: p, rate: {requests: 5, per: 1m}}]\napis: [{id: a, listen_path: /, target: %q, auth: keyless, policies: [p]}]\n", e, up.URL)
	}, server.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, e := range engines {
		c, err := net.Dial("tcp", srvs[e].Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		io.WriteString(c, "GET /x HTTP/1.1\r\nHost: gw.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: first request: %v", e, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: first request answered %d, want 200", e, resp.StatusCode)
		}
		start := time.Now()
		io.WriteString(c, "POST /y HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 10\r\n\r\nabc")
		_, err = io.ReadAll(br)
		c.Close()
		if err != nil {
			t.Errorf("%s: the connection was not closed: %v", e, err)
		} else if d := time.Since(start); d >= 10*time.Second {
			t.Errorf("%s: closed after %v, not by read_timeout", e, d)
		}
	}
}

// TestEnginesIgnoreRequestTrailers: a chunked request's trailer fields
// are no header fields on either engine (fasthttp reads them as such; a
// new-user trial found a client behind a trusted proxy escaping a per-IP
// limit with a trailer X-Forwarded-For): five requests, each with its
// own trailer address behind the same proxy-set one, spend one client's
// limit of 2 (200, 200, 429, 429, 429), on both engines, and the
// upstream sees neither the trailer's X-Forwarded-For nor its other
// fields as header fields.
func TestEnginesIgnoreRequestTrailers(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
	}))
	defer up.Close()
	srvs := openEngines(t, func(e string) string {
		return fmt.Sprintf("listen: 127.0.0.1:0\nserver: {engine: %s}\nclient_ip: {trusted_proxies: [127.0.0.1]}\npolicies: [{id: p, rate: {requests: 2, per: 1m}}]\napis: [{id: a, listen_path: /, target: %q, auth: keyless, policies: [p]}]\n", e, up.URL)
	}, server.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, e := range engines {
		mu.Lock()
		seen = nil
		mu.Unlock()
		var statuses []int
		for i := range 5 {
			raw := "POST /x HTTP/1.1\r\nHost: gw.test\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: 198.51.100.7\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" +
				fmt.Sprintf("5\r\nhello\r\n0\r\nX-Forwarded-For: 10.9.9.%d\r\nX-T: v\r\nContent-Type: text/evil\r\nUser-Agent: trailer\r\n\r\n", i)
			first, _, _ := strings.Cut(rawExchange(t, srvs[e].Addr().String(), raw), "\n")
			st, err := strconv.Atoi(first)
			if err != nil {
				t.Fatalf("%s: request %d: %q", e, i, first)
			}
			statuses = append(statuses, st)
		}
		if fmt.Sprint(statuses) != "[200 200 429 429 429]" {
			t.Errorf("%s: statuses %v, want [200 200 429 429 429]", e, statuses)
		}
		mu.Lock()
		for i, h := range seen {
			if got := strings.Join(h.Values("X-Forwarded-For"), "|"); got != "198.51.100.7, 127.0.0.1" {
				t.Errorf("%s: upstream request %d: X-Forwarded-For %q, want \"198.51.100.7, 127.0.0.1\"", e, i, got)
			}
			if h.Get("X-T") != "" || h.Get("Content-Type") != "text/plain" || h.Get("User-Agent") != "" || len(h.Values("Content-Type")) != 1 {
				t.Errorf("%s: upstream request %d: trailer fields as header fields: %v", e, i, h)
			}
		}
		if len(seen) != 2 {
			t.Errorf("%s: the upstream got %d requests, want 2", e, len(seen))
		}
		mu.Unlock()
	}
}
