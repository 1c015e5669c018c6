package controlplane

import (
	"fmt"
	"testing"
	"time"
)

// TestDataPlanesPrunedWithoutList: ended entries expire even when nobody
// lists the registry (no /metrics scrape, no GET /api/dataplanes), while
// gateways come and go with new IDs (the default gateway_id is
// hostname-pid: every restart is a new one). 10,000 gateways, one a
// minute, each connecting and ending; Expiry 1 h, so Connect and
// Disconnect prune every 3m45s, that is at the Connect of every 4th
// gateway (minute 0, 4, …, 9996). The last prune, at minute 9996, keeps
// the 59 entries that ended in minutes 9937–9995; gateways 9996–9999
// came after it: 63 entries at minute 10000, the oldest 63 minutes old
// (within Expiry + Expiry/16 = 63m45s).
func TestDataPlanesPrunedWithoutList(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := &DataPlanes{Expiry: time.Hour, Now: func() time.Time { return now }}
	for i := range 10000 {
		id := fmt.Sprintf("host-%d", i)
		d.Connect(DataPlane{GatewayID: id, Stream: uint64(i + 1)})
		d.Disconnect(id, uint64(i+1))
		now = now.Add(time.Minute)
	}
	if n := len(d.m); n != 63 {
		t.Errorf("%d gateways' entries held, want 63", n)
	}
	if _, ok := d.m["host-9937"]; !ok {
		t.Error("host-9937 (ended 63 minutes ago, after the last prune's cutoff) is gone")
	}
	if _, ok := d.m["host-9936"]; ok {
		t.Error("host-9936 (expired at the last prune) is held")
	}
	if n := len(d.List()); n != 59 {
		t.Errorf("List: %d entries, want the 59 that ended less than an hour ago (minutes 9941–9999)", n)
	}
}
