package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/gateway"
)

const concurrentConfig = `
listen: 127.0.0.1:8080   # the tests override it with -listen 127.0.0.1:0
response:
  x_ratelimit: true
policies:
  - id: e2e
    rate: {requests: 100, per: 10s, burst: 100}
keys:
  - key: k-e2e
    policies: [e2e]
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
`

// hammer sends n GETs from g goroutines through one client and returns
// every reply.
func hammer(t *testing.T, url string, g, n int, hdr ...string) []reply {
	t.Helper()
	return hammerAll(t, []string{url}, g, n, hdr...)
}

// hammerAll is hammer spread over several URLs (gateways): goroutine w
// sends to urls[w % len(urls)].
func hammerAll(t *testing.T, urls []string, g, n int, hdr ...string) []reply {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: g}}
	defer c.CloseIdleConnections()
	out := make([]reply, n)
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += g {
				r, err := fetch(c, urls[w%len(urls)], hdr...)
				if err != nil {
					t.Error(err)
					return
				}
				out[i] = r
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// TestConcurrentClientsExact: 50 goroutines send 500 requests through a
// real gateway at 100 per 10s, burst 100, with the limiter's clock frozen:
// exactly 100 pass, each seeing a different remaining count, and 400 get
// the same exact 429.
func TestConcurrentClientsExact(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, concurrentConfig))
	checkExact(t, hammer(t, gw.base+"/echo/hello", 50, 500, "X-API-Key", "k-e2e"))
}

// checkExact checks the replies to 500 requests of k-e2e under
// concurrentConfig at one frozen instant: exactly 100 pass, each with a
// different remaining count and exact header fields, and 400 get the same
// exact 429.
func checkExact(t *testing.T, replies []reply) {
	t.Helper()
	seen := map[int]bool{}
	denied := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusOK:
			rem, err := strconv.Atoi(r.header.Get("X-Ratelimit-Remaining"))
			if err != nil || rem < 0 || rem > 99 || seen[rem] {
				t.Fatalf("200 with X-RateLimit-Remaining %q (seen before: %v)", r.header.Get("X-Ratelimit-Remaining"), seen[rem])
			}
			seen[rem] = true
			// Admitted n = 100-rem so far: the bucket is full again n×100ms later.
			tsec := (100 - rem + 9) / 10
			checkHeaders(t, "200", r.header, map[string]string{
				"RateLimit-Policy":       `"e2e";q=100;w=10`,
				"RateLimit":              fmt.Sprintf(`"e2e";r=%d;t=%d`, rem, tsec),
				"X-RateLimit-Limit":      "100",
				"X-RateLimit-Reset":      strconv.Itoa(epoch + tsec),
				"Retry-After":            "",
				"Content-Type":           "application/json",
				"X-Content-Type-Options": "",
			})
			var e gateway.EchoReply
			err = json.Unmarshal([]byte(r.body), &e)
			if _, sent := e.Headers["X-Api-Key"]; err != nil || e.API != "echo" || e.Path != "/hello" || sent {
				t.Fatalf("echo body %q (%v)", r.body, err)
			}
		case http.StatusTooManyRequests:
			denied++
			// The 101st request at the frozen instant would pass 100ms
			// later (one emission interval): Retry-After rounds it up to 1.
			checkHeaders(t, "429", r.header, map[string]string{
				"RateLimit-Policy":       `"e2e";q=100;w=10`,
				"RateLimit":              `"e2e";r=0;t=1`,
				"Retry-After":            "1",
				"X-RateLimit-Limit":      "100",
				"X-RateLimit-Remaining":  "0",
				"X-RateLimit-Reset":      strconv.Itoa(epoch + 10),
				"Content-Type":           "application/json",
				"X-Content-Type-Options": "nosniff",
			})
			if want := `{"error":"rate limit exceeded","retry_after_ms":100}` + "\n"; r.body != want {
				t.Fatalf("429 body %q, want %q", r.body, want)
			}
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	if len(seen) != 100 || denied != 400 {
		t.Errorf("%d allowed and %d denied, want exactly 100 and 400", len(seen), denied)
	}
}

// TestConcurrentClientsRealClock is the same load on the real clock: the
// limiter may refill one request per 100ms while the test runs, and never
// more, so burst ≤ allowed ≤ burst + elapsed/T.
func TestConcurrentClientsRealClock(t *testing.T) {
	gw := start(t, env{}, "-config", writeConfig(t, concurrentConfig))
	begin := time.Now()
	replies := hammer(t, gw.base+"/echo/hello", 50, 500, "X-API-Key", "k-e2e")
	elapsed := time.Since(begin)
	checkRealClockReplies(t, replies, elapsed)
}

// checkRealClockReplies checks the replies to concurrentConfig's key (100
// per 10 s, burst 100) sent over elapsed real time: every one 200 or 429,
// each 429 passing again within one emission interval, and between 100
// and 100 + elapsed/100ms allowed.
func checkRealClockReplies(t *testing.T, replies []reply, elapsed time.Duration) {
	t.Helper()
	allowed := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
			// A denied request would pass within one emission interval.
			checkHeaders(t, "429", r.header, map[string]string{"Retry-After": "1", "RateLimit": `"e2e";r=0;t=1`})
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	if bound := 100 + int(elapsed/(100*time.Millisecond)); allowed < 100 || allowed > bound {
		t.Errorf("allowed %d in %v, want between 100 and %d", allowed, elapsed, bound)
	}
}

// TestAuthFailures: a missing key is 401 and an unknown, expired or
// inactive key 403, an ambiguous request (a key header or parameter given
// twice) 401, each with a JSON body and no rate-limit fields; keys are
// read from X-API-Key, Authorization (with or without Bearer) and the
// api_key query parameter.
func TestAuthFailures(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
policies:
  - {id: p, rate: {requests: 10, per: 1m}}
  - {id: only-b, rate: {requests: 10, per: 1m}, apis: [b]}
keys:
  - {key: good, policies: [p]}
  - {key: old, policies: [p], expires: "2023-11-14T22:13:19Z"}   # one second before the frozen clock
  - {key: off, policies: [p], inactive: true}
  - {key: b-only, policies: [only-b]}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo"}
  - {id: b, listen_path: /b/, target: "builtin:echo"}
`))
	for _, tc := range []struct {
		name   string
		url    string
		hdr    []string
		status int
		body   string // the error, or for 200 the RateLimit field
	}{
		{"no key", "/a/x", nil, 401, `{"error":"no API key"}`},
		{"empty key", "/a/x", []string{"X-API-Key", "  "}, 401, `{"error":"no API key"}`},
		{"unknown key", "/a/x", []string{"X-API-Key", "nope"}, 403, `{"error":"unknown API key"}`},
		{"expired key", "/a/x", []string{"X-API-Key", "old"}, 403, `{"error":"API key expired"}`},
		{"inactive key", "/a/x", []string{"X-API-Key", "off"}, 403, `{"error":"unknown API key"}`},
		{"key without a policy for this API", "/a/x", []string{"X-API-Key", "b-only"}, 403, `{"error":"access to this API is not allowed"}`},
		// A key parameter given twice is ambiguous, as a header given
		// twice is, whichever comes first.
		{"api_key twice", "/a/x?api_key=good&api_key=zzz", nil, 401, `{"error":"ambiguous credentials: more than one api_key query parameter"}`},
		{"api_key twice, reversed", "/a/x?api_key=zzz&api_key=good", nil, 401, `{"error":"ambiguous credentials: more than one api_key query parameter"}`},
		{"api_key twice, same key, escaped name", "/a/x?api_key=good&api%5Fkey=good", []string{"X-API-Key", "good"}, 401, `{"error":"ambiguous credentials: more than one api_key query parameter"}`},
		{"X-API-Key twice", "/a/x", []string{"X-API-Key", "good", "X-API-Key", "zzz"}, 401, `{"error":"ambiguous credentials: more than one X-API-Key header"}`},
		// The query is read by identity's rules on both engines (whose
		// own parsers differ): a key parameter that does not unescape, or
		// in a pair with a ';' (a separator to some upstreams), is refused.
		{"api_key that does not unescape", "/a/x?api_key=%zz", nil, 401, `{"error":"malformed api_key query parameter"}`},
		{"api_key that does not unescape, beside the header", "/a/x?api_key=go%zzod", []string{"X-API-Key", "good"}, 401, `{"error":"malformed api_key query parameter"}`},
		{"api_key after a ';'", "/a/x?x=1;api_key=zzz", []string{"X-API-Key", "good"}, 401, `{"error":"ambiguous credentials: the api_key query parameter beside a ';'"}`},
		{"api_key before a ';'", "/a/x?api_key=good;x=1", []string{"X-API-Key", "good"}, 401, `{"error":"ambiguous credentials: the api_key query parameter beside a ';'"}`},
		// One key read from three places spends one bucket.
		{"bearer", "/a/x", []string{"Authorization", "Bearer good"}, 200, `"p";r=9;t=6`},
		{"bare authorization", "/a/x", []string{"Authorization", "good"}, 200, `"p";r=8;t=12`},
		{"query parameter", "/a/x?api_key=good", nil, 200, `"p";r=7;t=18`},
		{"policy scoped to this API", "/b/x", []string{"X-API-Key", "b-only"}, 200, `"only-b";r=9;t=6`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, nil, gw.base+tc.url, tc.hdr...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tc.status, r.body)
			}
			if tc.status == 200 {
				checkHeaders(t, tc.name, r.header, map[string]string{"RateLimit": tc.body})
				return
			}
			if r.body != tc.body+"\n" {
				t.Errorf("body %q, want %q", r.body, tc.body+"\n")
			}
			checkHeaders(t, tc.name, r.header, map[string]string{
				"Content-Type": "application/json", "RateLimit": "", "RateLimit-Policy": "", "Retry-After": "",
			})
		})
	}
}

// TestKeylessPerClientIP: a keyless API limits each client address on its
// own, and separately from another keyless API with the same policy.
func TestKeylessPerClientIP(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
policies:
  - {id: anon, rate: {requests: 2, per: 1m}}
apis:
  - {id: open, listen_path: /open/, target: "builtin:echo", auth: keyless, policies: [anon]}
  - {id: open2, listen_path: /open2/, target: "builtin:echo", auth: keyless, policies: [anon]}
`))
	one, two := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i, want := range []string{`"anon";r=1;t=30`, `"anon";r=0;t=60`} {
		r := get(t, one, gw.base+"/open/x")
		if r.status != 200 {
			t.Fatalf("request %d: status %d", i+1, r.status)
		}
		checkHeaders(t, "200", r.header, map[string]string{"RateLimit": want, "RateLimit-Policy": `"anon";q=2;w=60`})
	}
	r := get(t, one, gw.base+"/open/x")
	if r.status != 429 {
		t.Fatalf("third request from 127.0.0.1: status %d, want 429", r.status)
	}
	checkHeaders(t, "429", r.header, map[string]string{"Retry-After": "30", "RateLimit": `"anon";r=0;t=30`, "RateLimit-Policy": `"anon";q=2;w=60`})
	if want := `{"error":"rate limit exceeded","retry_after_ms":30000}` + "\n"; r.body != want {
		t.Errorf("body %q, want %q", r.body, want)
	}

	r = get(t, two, gw.base+"/open/x")
	if r.status != 200 {
		t.Fatalf("127.0.0.2: status %d, want 200", r.status)
	}
	checkHeaders(t, "127.0.0.2", r.header, map[string]string{"RateLimit": `"anon";r=1;t=30`})
	var e gateway.EchoReply
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || !strings.HasPrefix(e.RemoteAddr, "127.0.0.2:") {
		t.Errorf("echo saw remote_addr %q (%v), want 127.0.0.2:port", e.RemoteAddr, err)
	}

	r = get(t, one, gw.base+"/open2/x")
	if r.status != 200 {
		t.Fatalf("other keyless API: status %d, want 200", r.status)
	}
	checkHeaders(t, "open2", r.header, map[string]string{"RateLimit": `"anon";r=1;t=30`})
}

// TestQuotaExhaustion: three requests spend a quota of three; the fourth
// is refused until the period renews an hour after the first, with 429 or,
// when configured, 403.
func TestQuotaExhaustion(t *testing.T) {
	for _, status := range []int{429, 403} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			gw := start(t, frozen(), "-config", writeConfig(t, fmt.Sprintf(`
response: {x_ratelimit: true, x_ratelimit_reset: seconds, quota_status: %d}
policies:
  - id: q
    rate: {requests: 10, per: 1s}
    quota: {max: 3, renewal: 1h}
keys:
  - {key: k, policies: [q]}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo"}
`, status)))
			policy := `"q";q=10;w=1, "q/quota";q=3;w=3600`
			for i := 1; i <= 3; i++ {
				r := get(t, nil, gw.base+"/a/", "X-API-Key", "k")
				if r.status != 200 {
					t.Fatalf("request %d: status %d %s", i, r.status, r.body)
				}
				checkHeaders(t, "200", r.header, map[string]string{
					"RateLimit-Policy":      policy,
					"RateLimit":             fmt.Sprintf(`"q";r=%d;t=1, "q/quota";r=%d;t=3600`, 10-i, 3-i),
					"X-RateLimit-Limit":     "10",
					"X-RateLimit-Remaining": strconv.Itoa(10 - i),
					"X-RateLimit-Reset":     "1",
				})
			}
			r := get(t, nil, gw.base+"/a/", "X-API-Key", "k")
			if r.status != status {
				t.Fatalf("fourth request: status %d, want %d", r.status, status)
			}
			checkHeaders(t, "denied", r.header, map[string]string{
				"RateLimit-Policy":      policy,
				"RateLimit":             `"q";r=7;t=1, "q/quota";r=0;t=3600`,
				"Retry-After":           "3600",
				"X-RateLimit-Limit":     "3",
				"X-RateLimit-Remaining": "0",
				"X-RateLimit-Reset":     "3600",
			})
			if want := `{"error":"quota exceeded","retry_after_ms":3600000}` + "\n"; r.body != want {
				t.Errorf("body %q, want %q", r.body, want)
			}
		})
	}
}

// TestPartitionedPolicies: a key whose rate comes from one policy and whose
// quota comes from another gets both: exactly 5 requests pass, then 429 by
// the rate policy, and the header fields name each limit's policy.
func TestPartitionedPolicies(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
response: {x_ratelimit: true, x_ratelimit_reset: seconds}
policies:
  - {id: rate, rate: {requests: 5, per: 1m}}
  - {id: yearly, quota: {max: 100000, renewal: 8760h}}
keys:
  - {key: k, policies: [yearly, rate]}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo"}
`))
	policy := `"rate";q=5;w=60, "yearly/quota";q=100000;w=31536000`
	for i := 1; i <= 5; i++ {
		r := get(t, nil, gw.base+"/a/", "X-API-Key", "k")
		if r.status != 200 {
			t.Fatalf("request %d: status %d %s", i, r.status, r.body)
		}
		checkHeaders(t, fmt.Sprintf("request %d", i), r.header, map[string]string{
			"RateLimit-Policy":      policy,
			"RateLimit":             fmt.Sprintf(`"rate";r=%d;t=%d, "yearly/quota";r=%d;t=31536000`, 5-i, 12*i, 100000-i),
			"X-RateLimit-Limit":     "5",
			"X-RateLimit-Remaining": strconv.Itoa(5 - i),
		})
	}
	r := get(t, nil, gw.base+"/a/", "X-API-Key", "k")
	if r.status != 429 {
		t.Fatalf("request 6: status %d, want 429", r.status)
	}
	checkHeaders(t, "request 6", r.header, map[string]string{
		"RateLimit-Policy": policy,
		"RateLimit":        `"rate";r=0;t=12, "yearly/quota";r=99995;t=31536000`,
		"Retry-After":      "12",
	})
}

// TestPerAPIKeyLimits: a key's api_limits replace its policies on that API
// with counters of their own.
func TestPerAPIKeyLimits(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
policies:
  - {id: p, rate: {requests: 5, per: 1s}}
keys:
  - key: k
    policies: [p]
    api_limits:
      b: {rate: {requests: 1, per: 1m}}
apis:
  - {id: a, listen_path: /a/, target: "builtin:echo"}
  - {id: b, listen_path: /b/, target: "builtin:echo"}
`))
	r := get(t, nil, gw.base+"/b/", "X-API-Key", "k")
	checkHeaders(t, "b 1st", r.header, map[string]string{"RateLimit": `"limit";r=0;t=60`, "RateLimit-Policy": `"limit";q=1;w=60`})
	if r = get(t, nil, gw.base+"/b/", "X-API-Key", "k"); r.status != 429 {
		t.Fatalf("second request to b: status %d, want 429", r.status)
	}
	checkHeaders(t, "b 2nd", r.header, map[string]string{"Retry-After": "60"})
	r = get(t, nil, gw.base+"/a/", "X-API-Key", "k")
	if r.status != 200 {
		t.Fatalf("a: status %d, want 200", r.status)
	}
	checkHeaders(t, "a", r.header, map[string]string{"RateLimit": `"p";r=4;t=1`})
}

// TestReverseProxy: a real upstream behind an http:// target receives the
// path without the listen path, joined to the target's own path, the query,
// the body, its own Host and fresh X-Forwarded-* fields; its status,
// headers and body come back with the rate-limit fields added.
func TestReverseProxy(t *testing.T) {
	type seen struct {
		path, rawPath, query, host, xff, xfh, xfp, body string
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, r.Host,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-Proto"), string(b)}
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "from upstream")
	}))
	defer up.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // nothing listens there any more

	gw := start(t, frozen(), "-config", writeConfig(t, fmt.Sprintf(`
policies:
  - {id: p, rate: {requests: 100, per: 1m}}
apis:
  - {id: svc, listen_path: /svc/, target: "%[1]s/base", auth: keyless, policies: [p]}
  - {id: raw, listen_path: /raw/, target: "%[1]s", auth: keyless, policies: [p], strip_listen_path: false}
  - {id: gone, listen_path: /gone/, target: "%[2]s", auth: keyless, policies: [p]}
`, up.URL, down.URL)))
	host := strings.TrimPrefix(gw.base, "http://")
	upHost := strings.TrimPrefix(up.URL, "http://")

	for _, tc := range []struct {
		method, path, body string
		want               seen
	}{
		{"GET", "/svc/items/7?x=1&y=2", "", seen{path: "/base/items/7", rawPath: "/base/items/7", query: "x=1&y=2"}},
		{"GET", "/svc", "", seen{path: "/base/", rawPath: "/base/"}},
		{"GET", "/svc/a%2Fb", "", seen{path: "/base/a/b", rawPath: "/base/a%2Fb"}},
		{"POST", "/svc/orders", "hello", seen{path: "/base/orders", rawPath: "/base/orders", body: "hello"}},
		{"GET", "/raw/a", "", seen{path: "/raw/a", rawPath: "/raw/a"}},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, gw.base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Forwarded-For", "6.6.6.6") // must not reach the upstream
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || string(b) != "from upstream" {
				t.Fatalf("got %d %q, want the upstream's 201", resp.StatusCode, b)
			}
			checkHeaders(t, "response", resp.Header, map[string]string{"X-Upstream": "yes", "RateLimit-Policy": `"p";q=100;w=60`})
			s := <-got
			want := tc.want
			want.host, want.xff, want.xfh, want.xfp = upHost, "127.0.0.1", host, "http"
			if s != want {
				t.Errorf("upstream saw %+v\n                 want %+v", s, want)
			}
		})
	}

	r := get(t, nil, gw.base+"/gone/x")
	if r.status != http.StatusBadGateway || r.body != `{"error":"upstream unavailable"}`+"\n" {
		t.Errorf("dead upstream: %d %q, want 502 upstream unavailable", r.status, r.body)
	}
	checkHeaders(t, "502", r.header, map[string]string{"Content-Type": "application/json", "RateLimit-Policy": `"p";q=100;w=60`})
}

// TestRouting: the longest listen path wins, a listen path matches with
// and without its final slash but not as a word prefix, unmatched paths get
// a JSON 404, and unclean paths are redirected to their clean form.
func TestRouting(t *testing.T) {
	routes := `
policies:
  - {id: p, rate: {requests: 100, per: 1m}}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo", auth: keyless, policies: [p]}
  - {id: v2, listen_path: /echo/v2/, target: "builtin:echo", auth: keyless, policies: [p]}
`
	gw := start(t, frozen(), "-config", writeConfig(t, routes))
	withRoot := start(t, frozen(), "-config", writeConfig(t, routes+
		`  - {id: root, listen_path: /, target: "builtin:echo", auth: keyless, policies: [p]}`+"\n"))
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, tc := range []struct {
		gw        *running
		path      string
		api, sees string
	}{
		{gw, "/echo/v2/x", "v2", "/x"},
		{gw, "/echo/v2", "v2", "/"},
		{gw, "/echo/v3", "echo", "/v3"},
		{gw, "/echo/", "echo", "/"},
		{gw, "/echo", "echo", "/"},
		{withRoot, "/echoes", "root", "/echoes"},
		{withRoot, "/", "root", "/"},
		{withRoot, "/echo/v2/y", "v2", "/y"},
	} {
		r := get(t, nil, tc.gw.base+tc.path)
		var e gateway.EchoReply
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != 200 || e.API != tc.api || e.Path != tc.sees {
			t.Errorf("%s: %d api %q path %q, want api %q path %q (%v)", tc.path, r.status, e.API, e.Path, tc.api, tc.sees, err)
		}
	}
	for _, p := range []string{"/echoes", "/", "/nope/echo/"} {
		r := get(t, nil, gw.base+p)
		if r.status != 404 || r.body != `{"error":"no API is served at this path"}`+"\n" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %q, want the JSON 404", p, r.status, r.body)
		}
	}
	for _, tc := range []struct{ path, location string }{
		{"/nope/../echo/v2/x?a=1", "/echo/v2/x?a=1"},
		{"/echo//v2/", "/echo/v2/"},
		{"/echo/%2e%2e/admin", "/admin"},
	} {
		r := get(t, noRedirect, gw.base+tc.path)
		if r.status != http.StatusPermanentRedirect || r.header.Get("Location") != tc.location {
			t.Errorf("%s: %d Location %q, want 308 to %q", tc.path, r.status, r.header.Get("Location"), tc.location)
		}
	}
}

// TestShutdownFinishesRequests: on cancellation the gateway stops
// accepting connections, lets the request in flight finish, and run
// returns nil.
func TestShutdownFinishesRequests(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, "finished")
	}))
	defer up.Close()
	gw := start(t, env{}, "-config", writeConfig(t, fmt.Sprintf(`
policies: [{id: p, rate: {requests: 10, per: 1s}}]
apis: [{id: slow, listen_path: /, target: %q, auth: keyless, policies: [p]}]
`, up.URL)))

	result := make(chan reply, 1)
	go func() {
		r, err := fetch(nil, gw.base+"/work")
		if err != nil {
			r.body = err.Error()
		}
		result <- r
	}()
	<-arrived
	stopped := make(chan error, 1)
	go func() { stopped <- gw.stop() }()
	// Wait until the listener is closed: shutdown has begun.
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(gw.base, "http://"))
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("run returned %v while a request was in flight", err)
	default:
	}
	close(release)
	if r := <-result; r.status != 200 || r.body != "finished" {
		t.Errorf("in-flight request got %d %q", r.status, r.body)
	}
	if err := <-stopped; err != nil {
		t.Errorf("run: %v", err)
	}
	if out := gw.stdout.String(); !strings.HasSuffix(out, "shutting down\n") {
		t.Errorf("stdout does not end with the shutdown notice:\n%s", out)
	}
}

// TestTrustedProxy: behind a trusted proxy a keyless API limits the
// address the proxy reports, and the upstream gets the proxy's
// X-Forwarded-For chain with the proxy appended; from any other peer the
// header is ignored, for limiting and upstream alike.
func TestTrustedProxy(t *testing.T) {
	xff := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		xff <- strings.Join(r.Header.Values("X-Forwarded-For"), "|")
	}))
	defer up.Close()
	gw := start(t, frozen(), "-config", writeConfig(t, fmt.Sprintf(`
client_ip: {trusted_proxies: [127.0.0.1]}
policies: [{id: anon, rate: {requests: 1, per: 1m}}]
apis: [{id: open, listen_path: /, target: %q, auth: keyless, policies: [anon]}]
`, up.URL)))
	proxy, other := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for _, tc := range []struct {
		c        *http.Client
		from     string
		claimed  string
		status   int
		upstream string // the X-Forwarded-For the upstream sees
	}{
		{proxy, "127.0.0.1", "203.0.113.5", 200, "203.0.113.5, 127.0.0.1"},
		{proxy, "127.0.0.1", "203.0.113.5", 429, ""},
		{proxy, "127.0.0.1", "198.51.100.1, 203.0.113.6", 200, "198.51.100.1, 203.0.113.6, 127.0.0.1"},
		{other, "127.0.0.2", "203.0.113.7", 200, "127.0.0.2"},
		{other, "127.0.0.2", "203.0.113.8", 429, ""},
	} {
		r := get(t, tc.c, gw.base+"/x", "X-Forwarded-For", tc.claimed)
		if r.status != tc.status {
			t.Fatalf("from %s claiming %s: status %d, want %d", tc.from, tc.claimed, r.status, tc.status)
		}
		if tc.status == 200 {
			if got := <-xff; got != tc.upstream {
				t.Errorf("from %s claiming %s: upstream saw X-Forwarded-For %q, want %q", tc.from, tc.claimed, got, tc.upstream)
			}
		}
	}
}

// raw sends one request written out in full (request line, header,
// blank line) on a new connection to gw and returns the answer.
func raw(t *testing.T, gw *running, request string) reply {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// TestOwnAnswers: requests that no route can take get the gateway's JSON
// answers (400 for the asterisk form, 405 for CONNECT, 404); what net/http
// refuses before the gateway sees the request stays text/plain, as the
// README says (a bad escape in the path, a header over max_header_bytes).
func TestOwnAnswers(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
server: {max_header_bytes: 1024}
policies: [{id: p, rate: {requests: 100, per: 1m}}]
apis: [{id: open, listen_path: /open/, target: "builtin:echo", auth: keyless, policies: [p]}]
`))
	const host = "Host: gw\r\n"
	for _, tc := range []struct {
		name, request string
		status        int
		contentType   string
		body          string
		allow         string
	}{
		{"asterisk form", "GET * HTTP/1.1\r\n" + host + "\r\n", 400, "application/json",
			`{"error":"request target must be a path starting with /"}` + "\n", ""},
		{"CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405, "application/json",
			`{"error":"method CONNECT is not allowed"}` + "\n", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		{"no route", "GET /closed/x HTTP/1.1\r\n" + host + "\r\n", 404, "application/json",
			`{"error":"no API is served at this path"}` + "\n", ""},
		{"bad escape (net/http)", "GET /open/%zz HTTP/1.1\r\n" + host + "\r\n", 400, "text/plain; charset=utf-8", "400 Bad Request", ""},
		{"header too large (net/http)", "GET /open/x HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("x", 8<<10) + "\r\n\r\n", 431,
			"text/plain; charset=utf-8", "431 Request Header Fields Too Large", ""},
	} {
		r := raw(t, gw, tc.request)
		if r.status != tc.status || r.body != tc.body {
			t.Errorf("%s: %d %q, want %d %q", tc.name, r.status, r.body, tc.status, tc.body)
		}
		checkHeaders(t, tc.name, r.header, map[string]string{"Content-Type": tc.contentType, "Allow": tc.allow})
	}
}

// TestEchoShowsWhatUpstreamsGet: builtin:echo leaves out hop-by-hop header
// fields (the fixed ones and those Connection names) and shows credential
// headers and query parameters as [redacted], the rest of the query as
// sent.
func TestEchoShowsWhatUpstreamsGet(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
policies: [{id: p, rate: {requests: 100, per: 1m}}]
apis: [{id: open, listen_path: /open/, target: "builtin:echo", auth: keyless, policies: [p]}]
`))
	r := raw(t, gw, "GET /open/x?api_key=k1&x=%41&access_token=t&api%5Fkey=k2&y HTTP/1.1\r\nHost: gw\r\n"+
		"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eDp5\r\nTe: trailers\r\nUpgrade: h2c\r\n"+
		"Authorization: Bearer k1\r\nX-Api-Key: k1\r\nCookie: s=1\r\nX-Kept: yes\r\n\r\n")
	var e gateway.EchoReply
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != 200 {
		t.Fatalf("%d %q (%v)", r.status, r.body, err)
	}
	if want := "api_key=[redacted]&x=%41&access_token=[redacted]&api%5Fkey=[redacted]&y"; e.Query != want {
		t.Errorf("query %q, want %q", e.Query, want)
	}
	want := map[string]string{"Authorization": "[redacted]", "X-Api-Key": "[redacted]", "Cookie": "[redacted]", "X-Kept": "yes"}
	if fmt.Sprint(e.Headers) != fmt.Sprint(want) {
		t.Errorf("headers %v, want %v", e.Headers, want)
	}
}

// TestMemoryMaxKeys: with memory.max_keys 2 and failure_policy closed, a
// third client address is refused with the store-failure status while the
// two held ones keep their exact limits.
func TestMemoryMaxKeys(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, `
failure_policy: closed
memory: {max_keys: 2}
policies:
  - {id: anon, rate: {requests: 2, per: 1m}}
apis:
  - {id: open, listen_path: /open/, target: "builtin:echo", auth: keyless, policies: [anon]}
`))
	one, two, three := clientFrom("127.0.0.1"), clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	for _, c := range []*http.Client{one, two} {
		if r := get(t, c, gw.base+"/open/x"); r.status != 200 {
			t.Fatalf("held client: status %d, want 200", r.status)
		}
	}
	r := get(t, three, gw.base+"/open/x")
	if want := `{"error":"rate limit store unavailable"}` + "\n"; r.status != 503 || r.body != want {
		t.Fatalf("third address at the cap: status %d body %q, want 503 %q", r.status, r.body, want)
	}
	if r := get(t, one, gw.base+"/open/x"); r.status != 200 || r.header.Get("RateLimit") != `"anon";r=0;t=60` {
		t.Fatalf("held client's second request: status %d RateLimit %q", r.status, r.header.Get("RateLimit"))
	}
	if r := get(t, one, gw.base+"/open/x"); r.status != 429 {
		t.Fatalf("held client's third request: status %d, want 429", r.status)
	}
	if !strings.Contains(gw.stderr.String(), "memory: too many keys") && !strings.Contains(gw.stdout.String(), "memory: too many keys") {
		t.Errorf("the refusal was not logged:\n%s%s", gw.stdout, gw.stderr)
	}
}
