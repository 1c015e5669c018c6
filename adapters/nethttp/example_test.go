package nethttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

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

// TestREADMEShowsExample keeps the README's "embed the middleware" code
// identical to Example's body, so the README shows code that compiles and
// whose output is checked.
func TestREADMEShowsExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\nfunc Example\(\) \{\n(.*?)\n\t// Output:`).FindSubmatch(src)
	if m == nil {
		t.Fatal("Example body not found")
	}
	var body strings.Builder
	for _, l := range strings.Split(string(m[1]), "\n") {
		body.WriteString(strings.TrimPrefix(l, "\t"))
		body.WriteString("\n")
	}
	if !strings.Contains(string(readme), body.String()) {
		t.Errorf("README.md does not contain Example's body (unindented by one tab):\n%s", body.String())
	}
}
