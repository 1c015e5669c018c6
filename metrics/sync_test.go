package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/limitplane/limitplane/metrics"
)

// TestSyncExportsTheState: every scrape reads the state afresh.
func TestSyncExportsTheState(t *testing.T) {
	st := metrics.SyncState{Connected: true, AppliedRevision: 42, SnapshotsApplied: 2, SnapshotsRejected: 1, ChangesApplied: 7, Reconnects: 3}
	s := metrics.NewSync(metrics.Options{}, func() metrics.SyncState { return st })
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	want := `# HELP limitplane_sync_applied_revision Revision of the configuration the gateway runs.
# TYPE limitplane_sync_applied_revision gauge
limitplane_sync_applied_revision 42
# HELP limitplane_sync_connected 1 while the gateway is connected to its control plane, else 0.
# TYPE limitplane_sync_connected gauge
limitplane_sync_connected 1
# HELP limitplane_sync_deliveries_total Deliveries from the control plane, by kind (snapshot, changes) and result (applied, rejected).
# TYPE limitplane_sync_deliveries_total counter
limitplane_sync_deliveries_total{kind="changes",result="applied"} 7
limitplane_sync_deliveries_total{kind="changes",result="rejected"} 0
limitplane_sync_deliveries_total{kind="snapshot",result="applied"} 2
limitplane_sync_deliveries_total{kind="snapshot",result="rejected"} 1
# HELP limitplane_sync_reconnects_total Sync streams opened after the first.
# TYPE limitplane_sync_reconnects_total counter
limitplane_sync_reconnects_total 3
# HELP limitplane_sync_staleness_seconds Time the gateway has been without its control plane (0 while connected).
# TYPE limitplane_sync_staleness_seconds gauge
limitplane_sync_staleness_seconds 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	st = metrics.SyncState{AppliedRevision: 42, Staleness: 1500 * time.Millisecond}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP limitplane_sync_connected 1 while the gateway is connected to its control plane, else 0.
# TYPE limitplane_sync_connected gauge
limitplane_sync_connected 0
# HELP limitplane_sync_staleness_seconds Time the gateway has been without its control plane (0 while connected).
# TYPE limitplane_sync_staleness_seconds gauge
limitplane_sync_staleness_seconds 1.5
`), "limitplane_sync_connected", "limitplane_sync_staleness_seconds"); err != nil {
		t.Fatal(err)
	}
}
