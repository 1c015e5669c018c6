package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/metrics"
)

// TestDRLExportsTheState: every scrape reads the DRL state afresh, under
// the names the README documents.
func TestDRLExportsTheState(t *testing.T) {
	st := drl.Stats{LimiterStats: drl.LimiterStats{Epoch: 17, HotKeys: 3, ShareRate: 612.5, Fallbacks: 2, Tables: 16, Runs: 3, KeysRefused: 5}, Allocator: true}
	d := metrics.NewDRL(metrics.Options{}, func() drl.Stats { return st })
	reg := prometheus.NewRegistry()
	reg.MustRegister(d)
	want := `# HELP limitplane_drl_allocator 1 while this gateway holds the allocator's lease, else 0.
# TYPE limitplane_drl_allocator gauge
limitplane_drl_allocator 1
# HELP limitplane_drl_epoch Epoch of the Distributed Rate Limiter's allocation table in force (0: none yet).
# TYPE limitplane_drl_epoch gauge
limitplane_drl_epoch 17
# HELP limitplane_drl_fallbacks_total Times a key fell back to its floor (stale table: Redis down or the allocator gone).
# TYPE limitplane_drl_fallbacks_total counter
limitplane_drl_fallbacks_total 2
# HELP limitplane_drl_hot_keys Keys this gateway decides in memory against its share.
# TYPE limitplane_drl_hot_keys gauge
limitplane_drl_hot_keys 3
# HELP limitplane_drl_runs_total Runs this gateway started: its first, then one each time it was cut off from Redis long enough for its report to expire.
# TYPE limitplane_drl_runs_total counter
limitplane_drl_runs_total 3
# HELP limitplane_drl_share_rate Sum over the hot keys of this gateway's rate share, requests per second.
# TYPE limitplane_drl_share_rate gauge
limitplane_drl_share_rate 612.5
# HELP limitplane_drl_tables_total Allocation tables this gateway applied.
# TYPE limitplane_drl_tables_total counter
limitplane_drl_tables_total 16
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	st = drl.Stats{LimiterStats: drl.LimiterStats{Epoch: 18}}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP limitplane_drl_allocator 1 while this gateway holds the allocator's lease, else 0.
# TYPE limitplane_drl_allocator gauge
limitplane_drl_allocator 0
# HELP limitplane_drl_epoch Epoch of the Distributed Rate Limiter's allocation table in force (0: none yet).
# TYPE limitplane_drl_epoch gauge
limitplane_drl_epoch 18
`), "limitplane_drl_allocator", "limitplane_drl_epoch"); err != nil {
		t.Fatal(err)
	}
}
