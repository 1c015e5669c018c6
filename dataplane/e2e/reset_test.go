package e2e

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// spendEach sends n requests of key through each data plane's gateways
// (the two data planes at once) and fails the test unless each admits
// exactly want.
func spendEach(t *testing.T, what string, dp1, dp2 *dataPlane, key string, n, want int) {
	t.Helper()
	c1, c2 := sendBoth(t, dp1.gws, "/echo/r", dp2.gws, "/echo/r", key, n, 4)
	if c1.admitted != want || c2.admitted != want {
		t.Fatalf("%s: dp1 admitted %d, dp2 %d of %d each; want exactly %d on each", what, c1.admitted, c2.admitted, n, want)
	}
}

// checkRemaining fails the test unless every gateway reads key hash's
// quota on api as limit max with remaining left: each gateway's own
// reading of its running configuration's quota epoch.
func checkRemaining(t *testing.T, what string, gws []*gateway, hash, api string, max, left int64) {
	t.Helper()
	for _, g := range gws {
		if q := quotaRemaining(t, g, hash, api); q.Limit != max || q.Remaining != left {
			t.Fatalf("%s: gateway %s reads quota %+v, want limit %d remaining %d", what, g.id, q, max, left)
		}
	}
}

// TestResets shows quota resets as data, on two data planes of two
// gateways each, with a key whose quota is 5 a day:
//   - POST reset-quota reaches every gateway: after the quota was spent
//     (exactly 5 of 8 on each data plane), every gateway reads 5 left and
//     each data plane admits exactly 5 of 8 again;
//   - a key update without suppress_reset resets (5 again), one with
//     ?suppress_reset=1 does not (0);
//   - a data plane cut off (its gateways SIGSTOPped until the control
//     plane's keepalive drops their streams) during a reset gets it when
//     they come back: 5 again there, while the connected data plane got it
//     at once;
//   - the same reset delivered twice resets once: a gateway restarted
//     receives the configuration again, and the spent quota stays spent (0).
func TestResets(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{keepalive: "1s"})
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("five", 5))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "reset-key", spec.Key{Policies: []string{"five"}})
	waitSynced(t, cp, gws...)
	spendEach(t, "first period", dp1, dp2, "reset-key", 8, 5)
	checkRemaining(t, "spent", gws, hash, "echo", 5, 0)

	// A reset from the control plane reaches all four gateways.
	epoch := cp.getKey(t, hash).QuotaEpoch
	rev := cp.resetQuota(t, hash, "")
	if k := cp.getKey(t, hash); k.QuotaEpoch <= epoch {
		t.Fatalf("reset left quota_epoch at %d (was %d)", k.QuotaEpoch, epoch)
	}
	start := time.Now()
	waitApplied(t, rev, gws...)
	t.Logf("reset applied by all 4 gateways %v after the answer", time.Since(start))
	checkRemaining(t, "after the reset", gws, hash, "echo", 5, 5)
	spendEach(t, "after the reset", dp1, dp2, "reset-key", 8, 5)

	// A key update resets its quota unless it says suppress_reset.
	waitApplied(t, cp.putKey(t, hash, spec.Key{Policies: []string{"five"}}, false), gws...)
	checkRemaining(t, "after an update", gws, hash, "echo", 5, 5)
	spendEach(t, "after an update", dp1, dp2, "reset-key", 8, 5)
	epoch = cp.getKey(t, hash).QuotaEpoch
	waitApplied(t, cp.putKey(t, hash, spec.Key{Policies: []string{"five"}}, true), gws...)
	if k := cp.getKey(t, hash); k.QuotaEpoch != epoch {
		t.Fatalf("an update with suppress_reset moved quota_epoch from %d to %d", epoch, k.QuotaEpoch)
	}
	checkRemaining(t, "after an update with suppress_reset", gws, hash, "echo", 5, 0)
	spendEach(t, "after an update with suppress_reset", dp1, dp2, "reset-key", 8, 0)

	// dp2 cut off during a reset: its gateways frozen until the control
	// plane drops their streams.
	for _, g := range dp2.gws {
		g.proc.signal(syscall.SIGSTOP)
	}
	frozen := true
	defer func() {
		if frozen {
			for _, g := range dp2.gws {
				g.proc.signal(syscall.SIGCONT)
			}
		}
	}()
	waitFor(t, "dp2's gateways disconnected in /api/dataplanes", syncTimeout, func() (bool, string) {
		list := cp.dataPlanes(t)
		for _, d := range list {
			if d.Group == "dp2" && d.Connected {
				return false, fmt.Sprintf("%+v", list)
			}
		}
		return len(list) == 4, fmt.Sprintf("%+v", list)
	})
	rev = cp.resetQuota(t, hash, "")
	waitApplied(t, rev, dp1.gws...)
	c1 := send(t, dp1.gws, "/echo/r", "reset-key", 8, 4)
	if c1.admitted != 5 {
		t.Fatalf("dp1 after the reset made while dp2 was cut off: admitted %d of 8, want 5", c1.admitted)
	}
	for _, g := range dp2.gws {
		g.proc.signal(syscall.SIGCONT)
	}
	frozen = false
	start = time.Now()
	waitApplied(t, rev, dp2.gws...)
	t.Logf("dp2 applied the reset %v after SIGCONT", time.Since(start))
	waitConnected(t, cp, rev, gws...)
	checkRemaining(t, "dp2 after reconnecting", dp2.gws, hash, "echo", 5, 5)
	if c2 := send(t, dp2.gws, "/echo/r", "reset-key", 8, 4); c2.admitted != 5 {
		t.Fatalf("dp2 after reconnecting: admitted %d of 8, want 5", c2.admitted)
	}

	// The same reset delivered twice resets once: restart one gateway of
	// each data plane; each receives the configuration (the same epoch)
	// again.
	for _, dp := range []*dataPlane{dp1, dp2} {
		g := dp.gws[0]
		if err := g.proc.stop(); err != nil {
			t.Fatalf("gateway %s exited with %v", g.id, err)
		}
		g.start(t)
	}
	waitApplied(t, rev, gws...)
	waitReadyz(t, dp1.gws[0], "source control_plane", syncTimeout, func(r readiness) bool { return r.ControlPlane.Source == "control_plane" })
	waitReadyz(t, dp2.gws[0], "source control_plane", syncTimeout, func(r readiness) bool { return r.ControlPlane.Source == "control_plane" })
	checkRemaining(t, "after the same reset again", gws, hash, "echo", 5, 0)
	spendEach(t, "after the same reset again", dp1, dp2, "reset-key", 8, 0)
	list := cp.dataPlanes(t)
	if i := slices.IndexFunc(list, func(d controlplane.DataPlane) bool { return d.LastRejection != nil }); i >= 0 {
		t.Errorf("a gateway rejected a revision: %+v", list[i])
	}
}

// TestResetOneAPI resets a key's quota for one API (?api=): the key's
// api_limits quota there starts again (exactly 3 of 5 on each data
// plane) while its key-wide quota on another API stays spent (0).
func TestResetOneAPI(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("three", 3))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.putAPI(t, echoAPI("other", "/other/"))
	hash, _ := cp.postKey(t, "api-key", spec.Key{
		Policies:  []string{"three"},
		APILimits: map[string]spec.Limits{"echo": {Quota: &spec.Quota{Max: 3, Renewal: spec.Duration(24 * time.Hour)}}},
	})
	waitSynced(t, cp, gws...)
	spendEach(t, "echo", dp1, dp2, "api-key", 5, 3)
	o1, o2 := sendBoth(t, dp1.gws, "/other/x", dp2.gws, "/other/x", "api-key", 5, 2)
	if o1.admitted != 3 || o2.admitted != 3 {
		t.Fatalf("other: admitted %d and %d of 5, want 3 and 3", o1.admitted, o2.admitted)
	}
	waitApplied(t, cp.resetQuota(t, hash, "echo"), gws...)
	spendEach(t, "echo after its reset", dp1, dp2, "api-key", 5, 3)
	o1, o2 = sendBoth(t, dp1.gws, "/other/x", dp2.gws, "/other/x", "api-key", 5, 2)
	if o1.admitted != 0 || o2.admitted != 0 {
		t.Fatalf("other after echo's reset: admitted %d and %d, want 0 and 0", o1.admitted, o2.admitted)
	}
}
