package crosstest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	lpfasthttp "github.com/limitplane/limitplane/adapters/fasthttp"
	lpfiber "github.com/limitplane/limitplane/adapters/fiber"
	lpgin "github.com/limitplane/limitplane/adapters/gin"
	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// epoch is the renderer's wall clock, so X-RateLimit-Reset is exact.
var epoch = time.Unix(1_800_000_000, 0)

// compared are the fields whose values must match byte for byte.
var compared = []string{
	"Ratelimit-Policy", "Ratelimit", "Retry-After",
	"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Content-Type", "X-Content-Type-Options", "Content-Length",
}

// answer is what a client saw: status, the compared fields (every value,
// so a duplicated field shows) and the body.
type answer struct {
	status int
	header map[string]string
	body   string
}

func (a answer) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", a.status)
	for _, k := range compared {
		fmt.Fprintf(&b, "  %s: %s\n", k, a.header[k])
	}
	fmt.Fprintf(&b, "  body %q", a.body)
	return b.String()
}

// limiter builds a fresh engine (frozen clock, empty store), authenticator
// and renderer, identical for every framework.
func limiter(t *testing.T) (*core.Engine, identity.Authenticator, *response.Renderer) {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "rate", Rate: core.Limit{Rate: 2, Period: time.Second, Burst: 2}},
		{ID: "quota", Rate: core.PerSecond(100), Quota: core.Quota{Max: 2, Renewal: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{
		{Hash: identity.HashKey("k-rate"), Policies: []string{"rate"}},
		{Hash: identity.HashKey("k-quota"), Policies: []string{"quota"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rend := response.NewRenderer(response.Options{XRateLimit: true, Now: func() time.Time { return epoch }})
	sources := append(identity.DefaultKeySources(), identity.Source{In: identity.InCookie, Name: "lp_key"})
	return eng, identity.NewAPIKey(keys, identity.APIKeyOptions{Sources: sources}), rend
}

const textPlain = "text/plain; charset=utf-8"

// listen returns a listener on a free loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func serveHTTP(t *testing.T, h http.Handler) string {
	ln := listen(t)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// servers start one server per framework, each behind its limitplane
// middleware and answering GET /x with "ok", and return its base URL.
var servers = []struct {
	name  string
	start func(t *testing.T) string
}{
	{"net/http", func(t *testing.T) string {
		eng, auth, rend := limiter(t)
		h := nethttp.Middleware(eng, auth, nethttp.Options{API: "x", Renderer: rend})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textPlain)
			io.WriteString(w, "ok")
		}))
		return serveHTTP(t, h)
	}},
	{"gin", func(t *testing.T) string {
		eng, auth, rend := limiter(t)
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(lpgin.Middleware(eng, auth, lpgin.Options{API: "x", Renderer: rend}))
		r.GET("/x", func(c *gin.Context) { c.Data(http.StatusOK, textPlain, []byte("ok")) })
		return serveHTTP(t, r)
	}},
	{"fiber", func(t *testing.T) string {
		eng, auth, rend := limiter(t)
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Use(lpfiber.Middleware(eng, auth, lpfiber.Options{API: "x", Renderer: rend}))
		app.Get("/x", func(c *fiber.Ctx) error {
			c.Set("Content-Type", textPlain)
			return c.SendString("ok")
		})
		ln := listen(t)
		go app.Listener(ln)
		t.Cleanup(func() { app.Shutdown() })
		return "http://" + ln.Addr().String()
	}},
	{"fasthttp", func(t *testing.T) string {
		eng, auth, rend := limiter(t)
		return serveFast(t, lpfasthttp.Middleware(eng, auth, lpfasthttp.Options{API: "x", Renderer: rend})(func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType(textPlain)
			ctx.SetBodyString("ok")
		}))
	}},
}

// serveFast serves h with fasthttp's server until the end of the test.
func serveFast(t *testing.T, h fasthttp.RequestHandler) string {
	ln := listen(t)
	s := &fasthttp.Server{Handler: h}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown() })
	return "http://" + ln.Addr().String()
}

var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// get sends GET /x with key in the place via names: "" or "x-api-key",
// "bearer", "query" or "cookie"; with via "raw query", key is the whole
// query string, and with "x-api-key k-rate, raw query" too, beside
// X-API-Key: k-rate.
func get(t *testing.T, base, key, via string) answer {
	t.Helper()
	url := base + "/x"
	switch via {
	case "query":
		url += "?api_key=" + key
	}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if via == "raw query" || via == "x-api-key k-rate, raw query" {
		req.URL.RawQuery = key // as it is, a '#' too: sent in the target
	}
	switch {
	case via == "x-api-key k-rate, raw query":
		req.Header.Set("X-API-Key", "k-rate")
	case key == "" || via == "query" || via == "raw query":
	case via == "bearer":
		req.Header.Set("Authorization", "Bearer "+key)
	case via == "cookie":
		req.AddCookie(&http.Cookie{Name: "lp_key", Value: key})
	default:
		req.Header.Set("X-API-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: map[string]string{}, body: string(body)}
	for _, k := range compared {
		if vs := resp.Header.Values(k); vs != nil {
			a.header[k] = strings.Join(vs, " | ")
		}
	}
	return a
}

// h builds the expected compared fields; absent ones stay empty.
func h(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// ambiguousQuery is the answer to a request that repeats the api_key
// parameter.
var ambiguousQuery = answer{401, h(
	"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "73",
), `{"error":"ambiguous credentials: more than one api_key query parameter"}` + "\n"}

// refused is the answer to a request refused with status and message.
func refused(status int, msg string) answer {
	body := `{"error":"` + msg + `"}` + "\n"
	return answer{status, h("Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", strconv.Itoa(len(body))), body}
}

func TestSameAnswersAcrossFrameworks(t *testing.T) {
	allowedRate := answer{200, h(
		"Ratelimit-Policy", `"rate";q=2;w=1`,
		"Ratelimit", `"rate";r=1;t=1`,
		"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "1", "X-Ratelimit-Reset", "1800000001",
		"Content-Type", textPlain, "Content-Length", "2",
	), "ok"}
	besideSemicolon := refused(401, "ambiguous credentials: the api_key query parameter beside a ';'")
	scenarios := []struct {
		name   string
		key    string
		via    string // where the key is sent (see get); "" is X-API-Key
		before int    // allowed requests sent first with the same key
		want   answer
	}{
		{
			name: "allowed",
			key:  "k-rate",
			want: answer{200, h(
				"Ratelimit-Policy", `"rate";q=2;w=1`,
				"Ratelimit", `"rate";r=1;t=1`,
				"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "1", "X-Ratelimit-Reset", "1800000001",
				"Content-Type", textPlain, "Content-Length", "2",
			), "ok"},
		},
		{
			name: "allowed, key as bearer token",
			key:  "k-rate",
			via:  "bearer",
			want: answer{200, h(
				"Ratelimit-Policy", `"rate";q=2;w=1`,
				"Ratelimit", `"rate";r=1;t=1`,
				"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "1", "X-Ratelimit-Reset", "1800000001",
				"Content-Type", textPlain, "Content-Length", "2",
			), "ok"},
		},
		{
			name: "allowed, key in query",
			key:  "k-quota",
			via:  "query",
			want: answer{200, h(
				"Ratelimit-Policy", `"quota";q=100;w=1, "quota/quota";q=2;w=3600`,
				"Ratelimit", `"quota";r=99;t=1, "quota/quota";r=1;t=3600`,
				"X-Ratelimit-Limit", "100", "X-Ratelimit-Remaining", "99", "X-Ratelimit-Reset", "1800000001",
				"Content-Type", textPlain, "Content-Length", "2",
			), "ok"},
		},
		{
			name:   "rate denied, key in cookie",
			key:    "k-rate",
			via:    "cookie",
			before: 2,
			want: answer{429, h(
				"Ratelimit-Policy", `"rate";q=2;w=1`,
				"Ratelimit", `"rate";r=0;t=1`,
				"Retry-After", "1",
				"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "0", "X-Ratelimit-Reset", "1800000001",
				"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "53",
			), `{"error":"rate limit exceeded","retry_after_ms":500}` + "\n"},
		},
		{
			// burst 2 spent at one instant; T = 500ms, so the third
			// request may pass 500ms later.
			name:   "rate denied",
			key:    "k-rate",
			before: 2,
			want: answer{429, h(
				"Ratelimit-Policy", `"rate";q=2;w=1`,
				"Ratelimit", `"rate";r=0;t=1`,
				"Retry-After", "1",
				"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "0", "X-Ratelimit-Reset", "1800000001",
				"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "53",
			), `{"error":"rate limit exceeded","retry_after_ms":500}` + "\n"},
		},
		{
			// quota of 2 per hour spent; the rate limit (100/s, T = 10ms)
			// has 98 left after the two allowed requests.
			name:   "quota denied",
			key:    "k-quota",
			before: 2,
			want: answer{429, h(
				"Ratelimit-Policy", `"quota";q=100;w=1, "quota/quota";q=2;w=3600`,
				"Ratelimit", `"quota";r=98;t=1, "quota/quota";r=0;t=3600`,
				"Retry-After", "3600",
				"X-Ratelimit-Limit", "2", "X-Ratelimit-Remaining", "0", "X-Ratelimit-Reset", "1800003600",
				"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "52",
			), `{"error":"quota exceeded","retry_after_ms":3600000}` + "\n"},
		},
		// A key parameter given twice is ambiguous, as a repeated header
		// is, whichever value comes first and however the name is
		// escaped: a reader taking the last value would act on a key
		// that was never checked.
		{
			name: "api_key twice",
			key:  "api_key=k-rate&api_key=zzz",
			via:  "raw query",
			want: ambiguousQuery,
		},
		{
			name: "api_key twice, reversed",
			key:  "api_key=zzz&api_key=k-rate",
			via:  "raw query",
			want: ambiguousQuery,
		},
		{
			name: "api_key twice, same key, one name escaped",
			key:  "api_key=k-rate&x=1&api%5Fkey=k-rate",
			via:  "raw query",
			want: ambiguousQuery,
		},
		{
			name: "api_key twice, once without a value",
			key:  "api_key=k-rate&api_key",
			via:  "raw query",
			want: ambiguousQuery,
		},
		// The query is read by identity's own rules (identity.RawQuerier),
		// not by each framework's parser: net/http dropped a pair it
		// could not unescape or that held a ';', fasthttp kept both as
		// text, so the same request passed on one and was refused on the
		// other. A ';' separates parameters to some servers behind a
		// gateway: a key there would be one the gateway never checked.
		{
			name: "api_key that does not unescape",
			key:  "api_key=%zz",
			via:  "raw query",
			want: refused(401, "malformed api_key query parameter"),
		},
		{
			name: "api_key that does not unescape, beside a good header",
			key:  "api_key=k-r%zzate",
			via:  "x-api-key k-rate, raw query",
			want: refused(401, "malformed api_key query parameter"),
		},
		{
			name: "api_key in a pair with a ';' after it",
			key:  "api_key=k-rate;x=1",
			via:  "x-api-key k-rate, raw query",
			want: besideSemicolon,
		},
		{
			name: "api_key after a ';'",
			key:  "x=1;api_key=zzz",
			via:  "x-api-key k-rate, raw query",
			want: besideSemicolon,
		},
		{
			name: "api_key escaped after a ';'",
			key:  "x=1;api%5fkey=zzz",
			via:  "x-api-key k-rate, raw query",
			want: besideSemicolon,
		},
		{
			name: "a ';' in other parameters",
			key:  "x=1;y=2&z=%zz",
			via:  "x-api-key k-rate, raw query",
			want: allowedRate,
		},
		{
			name: "api_key escaped",
			key:  "api%5Fkey=k%2Drate&z=a+b",
			via:  "raw query",
			want: allowedRate,
		},
		// A request target has no fragment: a '#' is part of the query
		// (fasthttp's own query ends there).
		{
			name: "a '#' in the api_key value",
			key:  "api_key=k-rate#x",
			via:  "raw query",
			want: refused(403, "unknown API key"),
		},
		{
			name: "api_key after a '#'",
			key:  "a=1#&api_key=k-rate",
			via:  "raw query",
			want: allowedRate,
		},
		{
			name: "api_key after a '#' and a ';'",
			key:  "a=1#&x=1;api_key=zzz",
			via:  "x-api-key k-rate, raw query",
			want: besideSemicolon,
		},
		{
			name: "missing key",
			want: answer{401, h(
				"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "23",
			), `{"error":"no API key"}` + "\n"},
		},
		{
			name: "unknown key",
			key:  "not-a-key",
			want: answer{403, h(
				"Content-Type", "application/json", "X-Content-Type-Options", "nosniff", "Content-Length", "28",
			), `{"error":"unknown API key"}` + "\n"},
		},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			got := make([]answer, len(servers))
			for i, s := range servers {
				base := s.start(t)
				for j := 0; j < sc.before; j++ {
					if a := get(t, base, sc.key, sc.via); a.status != 200 {
						t.Fatalf("%s: request %d before the scenario: %v", s.name, j+1, a)
					}
				}
				got[i] = get(t, base, sc.key, sc.via)
			}
			for i, s := range servers {
				if got[i].String() != got[0].String() {
					t.Errorf("%s and %s differ:\n%s\n%s", servers[0].name, s.name, got[0], got[i])
				}
			}
			for i, s := range servers {
				if got[i].String() != sc.want.String() {
					t.Errorf("%s:\n got %s\nwant %s", s.name, got[i], sc.want)
				}
			}
		})
	}
}

// TestNilDeciderOrAuthenticator: every adapter refuses a nil decider or
// authenticator where it is built, with a message naming the constructor
// and the argument, instead of answering every request with a panic.
func TestNilDeciderOrAuthenticator(t *testing.T) {
	eng, auth, _ := limiter(t)
	builders := map[string]func(core.Decider, identity.Authenticator){
		"nethttp.Middleware":           func(l core.Decider, a identity.Authenticator) { nethttp.Middleware(l, a, nethttp.Options{}) },
		"gin.Middleware":               func(l core.Decider, a identity.Authenticator) { lpgin.Middleware(l, a, lpgin.Options{}) },
		"fiber.Middleware":             func(l core.Decider, a identity.Authenticator) { lpfiber.Middleware(l, a, lpfiber.Options{}) },
		"fasthttp.Middleware":          func(l core.Decider, a identity.Authenticator) { lpfasthttp.Middleware(l, a, lpfasthttp.Options{}) },
		"grpc.UnaryServerInterceptor":  func(l core.Decider, a identity.Authenticator) { lpgrpc.UnaryServerInterceptor(l, a, lpgrpc.Options{}) },
		"grpc.StreamServerInterceptor": func(l core.Decider, a identity.Authenticator) { lpgrpc.StreamServerInterceptor(l, a, lpgrpc.Options{}) },
	}
	for who, build := range builders {
		for _, c := range []struct {
			l    core.Decider
			a    identity.Authenticator
			want string
		}{
			{nil, auth, who + ": nil core.Decider (a *core.Engine, or a data-plane member's Limiter(api))"},
			{eng, nil, who + ": nil identity.Authenticator (&identity.Keyless{} limits by client address)"},
		} {
			func() {
				defer func() {
					if got := fmt.Sprint(recover()); got != c.want {
						t.Errorf("%s: panic %q, want %q", who, got, c.want)
					}
				}()
				build(c.l, c.a)
			}()
		}
		build(eng, auth) // and both given: no panic
	}
}
