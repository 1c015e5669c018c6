package metrics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/metrics"
)

// A Collector is registered with Prometheus and handed to the engine as its
// Observer; serve the registry with promhttp as usual.
func ExampleNew() {
	store := memory.New(memory.Options{Clock: core.NewManualClock(1)})
	col := metrics.New(metrics.Options{Keys: store})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	engine, _ := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "default", Rate: core.Limit{Rate: 1, Period: time.Minute}},
	}}, core.Options{Observer: col})
	c := &core.Consumer{ID: "alice", Policies: []string{"default"}}
	engine.Decide(context.Background(), c, "orders", 1)
	engine.Decide(context.Background(), c, "orders", 1)
	n, _ := testutil.GatherAndCount(reg, "limitplane_decisions_total")
	fmt.Println("decision series:", n)
	// Output: decision series: 2
}
