package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/metrics"
)

// TestStoreErrorsCounted: with ObserveStoreError as the engine's
// OnStoreError, every failed store call is counted, also under the open
// and fallback failure policies, whose decisions carry no error (3 fail
// open and 2 fall back: 5 store errors, 5 decisions without error).
func TestStoreErrorsCounted(t *testing.T) {
	col := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	cfg := core.Config{Policies: []core.Policy{{ID: "gold", Rate: core.Limit{Rate: 3, Period: time.Minute}}}}
	fb := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer fb.Close()
	open, _ := core.NewEngine(downStore{}, cfg, core.Options{Observer: col, OnStoreError: col.ObserveStoreError})
	fallback, _ := core.NewEngine(downStore{}, cfg, core.Options{Observer: col, OnStoreError: col.ObserveStoreError,
		FailurePolicy: core.FailFallback, Fallback: fb})
	ctx := context.Background()
	c := &core.Consumer{ID: "a", Policies: []string{"gold"}}
	for range 3 {
		open.Decide(ctx, c, "orders", 1)
	}
	for range 2 {
		fallback.Decide(ctx, c, "orders", 1)
	}
	want := `
# HELP limitplane_decisions_total Rate-limit and quota decisions by API, policy, deciding limit and result (allowed, denied, shadow_denied, error, canceled).
# TYPE limitplane_decisions_total counter
limitplane_decisions_total{api="orders",limit="none",policy="",result="allowed"} 3
limitplane_decisions_total{api="orders",limit="rate",policy="gold",result="allowed"} 2
# HELP limitplane_store_errors_total Store calls that failed (unreachable, timed out, circuit breaker open), whatever the failure policy then decided.
# TYPE limitplane_store_errors_total counter
limitplane_store_errors_total 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "limitplane_decisions_total", "limitplane_store_errors_total"); err != nil {
		t.Error(err)
	}
}
