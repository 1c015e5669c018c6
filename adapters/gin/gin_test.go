package gin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	lpgin "github.com/limitplane/limitplane/adapters/gin"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// TestCostAndAbort checks that Cost is spent, that a denial aborts the
// chain (later handlers do not run) and that OnDecision sees each decision.
func TestCostAndAbort(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 5, Period: time.Second}}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var seen []bool
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(lpgin.Middleware(eng, &identity.Keyless{Policies: []string{"p"}}, lpgin.Options{
		Cost:       func(*gin.Context) int64 { return 2 },
		OnDecision: func(_ *gin.Context, d core.Decision, err error) { seen = append(seen, d.Allowed) },
	}))
	ran := 0
	r.GET("/", func(c *gin.Context) { ran++; c.String(http.StatusOK, "ok") })

	var codes []int
	var last *httptest.ResponseRecorder
	for range 3 {
		req := httptest.NewRequestWithContext(context.Background(), "GET", "/", nil)
		req.RemoteAddr = "192.0.2.7:1234"
		last = httptest.NewRecorder()
		r.ServeHTTP(last, req)
		codes = append(codes, last.Code)
	}
	// Burst 5 at cost 2: two requests pass (4 units), the third needs one
	// more unit, T = 200ms later.
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 || ran != 2 {
		t.Fatalf("codes %v, handler ran %d times", codes, ran)
	}
	if len(seen) != 3 || !seen[0] || !seen[1] || seen[2] {
		t.Fatalf("OnDecision saw %v", seen)
	}
	if got := last.Body.String(); got != `{"error":"rate limit exceeded","retry_after_ms":200}`+"\n" {
		t.Fatalf("body %q", got)
	}
	if got := last.Header().Get("Ratelimit"); got != `"p";r=1;t=1` {
		t.Fatalf("Ratelimit %q", got)
	}
}
