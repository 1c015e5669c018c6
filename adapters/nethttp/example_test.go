package nethttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// Example puts the middleware in front of a handler of a plain net/http
// server: API keys are checked, each key gets 2 requests an hour, and
// every response carries the RateLimit fields. The README shows this code.
func Example() {
	// The counters: an in-process store (one process; use the Redis store
	// to share limits between instances).
	store := memory.New(memory.Options{})
	defer store.Close()

	// The policies, and the keys that have them (held as SHA-256 hashes).
	engine, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "default", Rate: core.Limit{Rate: 2, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		log.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{
		{Hash: identity.HashKey("secret-key"), Policies: []string{"default"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	limit := nethttp.Middleware(engine, identity.NewAPIKey(keys, identity.APIKeyOptions{}),
		nethttp.Options{API: "hello"})

	mux := http.NewServeMux()
	mux.Handle("/hello", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))

	// In a program: http.ListenAndServe("127.0.0.1:8080", mux).
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, key := range []string{"secret-key", "secret-key", "secret-key", ""} {
		req, _ := http.NewRequest("GET", srv.URL+"/hello", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 OK "default";q=2;w=3600
	// 200 OK "default";q=2;w=3600
	// 429 Too Many Requests "default";q=2;w=3600
	// 401 Unauthorized
}

// Example_jwt authenticates consumers by JSON Web Token instead: tokens
// signed with HS256 and a shared secret of at least 32 bytes, the consumer
// named by the "sub" claim (ConsumerClaim's default), each consumer with
// the "default" policy (DefaultPolicies; without it, or a policy claim,
// a consumer has no policy and is refused 403), and "exp" required (set
// AllowNoExpiry to accept tokens without it). The README shows this code.
func Example_jwt() {
	store := memory.New(memory.Options{})
	defer store.Close()
	engine, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "default", Rate: core.Limit{Rate: 2, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		log.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef") // 32 bytes; in a program, from a secret store
	auth, err := identity.NewJWT(identity.JWTOptions{
		Algorithms:      []string{"HS256"},
		Keys:            []identity.JWTKey{identity.SecretKey("", secret)}, // "": tokens need no kid
		DefaultPolicies: []string{"default"},
	})
	if err != nil {
		log.Fatal(err)
	}
	limit := nethttp.Middleware(engine, auth, nethttp.Options{API: "hello"})
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	defer srv.Close()

	// Tokens as an issuer would sign them (github.com/golang-jwt/jwt/v5).
	token := func(sub string) string {
		t, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
		}).SignedString(secret)
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	for _, sub := range []string{"alice", "alice", "alice", "bob", ""} {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		if sub != "" {
			req.Header.Set("Authorization", "Bearer "+token(sub))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			body = []byte("Retry-After is set: " + fmt.Sprint(resp.Header.Get("Retry-After") != "") + "\n")
		}
		fmt.Printf("%-5s %s %s", sub, resp.Status, body)
	}
	// Output:
	// alice 200 OK hello
	// alice 200 OK hello
	// alice 429 Too Many Requests Retry-After is set: true
	// bob   200 OK hello
	//       401 Unauthorized {"error":"no token"}
}

// TestREADMEShowsExample keeps the README's "embed the middleware" code
// identical to Example's and Example_jwt's bodies, and their output, so the
// README shows code that compiles and whose output is checked.
func TestREADMEShowsExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Example", "Example_jwt"} {
		m := regexp.MustCompile(`(?s)\nfunc ` + name + `\(\) \{\n(.*?)\n\t// Output:\n(.*?)\n\}`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s's body not found", name)
		}
		var body, out strings.Builder
		for _, l := range strings.Split(string(m[1]), "\n") {
			body.WriteString(strings.TrimPrefix(l, "\t"))
			body.WriteString("\n")
		}
		for _, l := range strings.Split(string(m[2]), "\n") {
			out.WriteString(strings.TrimPrefix(strings.TrimPrefix(l, "\t//"), " "))
			out.WriteString("\n")
		}
		if !strings.Contains(string(readme), body.String()) {
			t.Errorf("README.md does not contain %s's body (unindented by one tab):\n%s", name, body.String())
		}
		if !strings.Contains(string(readme), "```\n"+out.String()+"```\n") {
			t.Errorf("README.md does not show %s's output:\n%s", name, out.String())
		}
	}
}
