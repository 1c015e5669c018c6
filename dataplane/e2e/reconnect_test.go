package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// maxReconnect bounds how long after the control plane's return every
// gateway is connected again, whatever the outage's length: one backoff
// (the agent's, capped at 1 s with jitter) plus a dial and a Hello.
const maxReconnect = 2 * time.Second

// TestReconnectAfterOutage kills the control plane (its sync port then
// refuses connections) for a short outage and for a long one (15 s), and
// starts it again: every gateway must be connected again (its /readyz
// state "connected", one reconnect more) within maxReconnect of the
// control plane listening again, and a change made then reaches them.
// Before the fix the agent's backoff (10 s) and gRPC's own connect
// backoff stacked: gateways came back 16 s after a 15 s outage.
func TestReconnectAfterOutage(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "reconnect-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{})
	dp := startDataPlane(t, cp, tk, 2, nil)
	cp.putPolicy(t, quotaPolicy("q5", 5))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "reconnect-key", spec.Key{Policies: []string{"q5"}})
	waitSynced(t, cp, dp.gws...)

	for _, outage := range []time.Duration{time.Second, 15 * time.Second} {
		before := map[string]uint64{}
		for _, g := range dp.gws {
			r := waitReadyz(t, g, "connected", syncTimeout, func(r readiness) bool { return r.ControlPlane.State == "connected" })
			before[g.id] = r.ControlPlane.Reconnects
		}
		cp.kill()
		for _, g := range dp.gws {
			waitReadyz(t, g, "the control plane's loss noticed", syncTimeout, func(r readiness) bool { return r.ControlPlane.State != "connected" })
		}
		time.Sleep(outage) // the outage itself, not a wait for a result
		cp.start(t)
		back := time.Now()
		took := map[string]time.Duration{}
		waitFor(t, "every gateway connected again", syncTimeout, func() (bool, string) {
			for _, g := range dp.gws {
				if _, ok := took[g.id]; ok {
					continue
				}
				r, err := g.readyz()
				if err == nil && r.ControlPlane.State == "connected" && r.ControlPlane.Reconnects > before[g.id] {
					took[g.id] = time.Since(back)
				}
			}
			return len(took) == len(dp.gws), fmt.Sprintf("reconnected: %v", took)
		})
		t.Logf("outage %v: reconnected after the control plane's return in %v", outage, took)
		for id, d := range took {
			if d > maxReconnect {
				t.Errorf("outage %v: gateway %s reconnected %v after the control plane's return, want ≤ %v (all: %v)", outage, id, d, maxReconnect, took)
			}
		}
		waitApplied(t, cp.resetQuota(t, hash, ""), dp.gws...)
	}
}
