package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// globalPolicy is a policy with a strict global quota of max per hour,
// its leases lasting leaseFor.
func globalPolicy(id string, max int64, mode string, floor int64, leaseFor time.Duration) spec.Policy {
	return spec.Policy{ID: id, Quota: &spec.Quota{Max: max, Renewal: spec.Duration(time.Hour),
		Global: &spec.GlobalQuota{Mode: mode, Floor: floor, LeaseDuration: spec.Duration(leaseFor)}}}
}

// keyUsage reads the control plane's usage of a key.
func keyUsage(t *testing.T, cp *controlPlane, hash string) controlplane.Usage {
	t.Helper()
	var u controlplane.Usage
	mustDecode(t, cp.mustAdmin(t, http.MethodGet, "/api/usage/keys/"+hash, nil, http.StatusOK), &u)
	return u
}

// spendGlobal sends waves of requests for key over both data planes until
// want are admitted in all or the deadline passes, and fails the test the
// moment the total admitted is above want; each wave sends perWave
// requests to each data plane. It returns the admitted requests per data
// plane. between, when set, runs after each wave.
func spendGlobal(t *testing.T, dp1, dp2 *dataPlane, key string, want, perWave int, deadline time.Duration, between func(wave, admitted int)) (a1, a2 int) {
	t.Helper()
	end := time.Now().Add(deadline)
	for wave := 0; a1+a2 < want && time.Now().Before(end); wave++ {
		c1, c2 := sendBoth(t, dp1.gws, "/echo/g", dp2.gws, "/echo/g", key, perWave, 4)
		a1, a2 = a1+c1.admitted, a2+c2.admitted
		if a1+a2 > want {
			t.Fatalf("wave %d: admitted %d (dp1 %d, dp2 %d): above the global quota of %d", wave, a1+a2, a1, a2, want)
		}
		if between != nil {
			between(wave, a1+a2)
		}
	}
	return a1, a2
}

// waitUsage waits until the control plane's usage of the key names, per
// data plane, exactly the admitted requests counted (reports travel every
// second, asynchronously), and returns it.
func waitUsage(t *testing.T, cp *controlPlane, hash string, want map[string]int64) controlplane.Usage {
	t.Helper()
	deadline := time.Now().Add(syncTimeout)
	for {
		u := keyUsage(t, cp, hash)
		got := map[string]int64{}
		for _, e := range u.Entries {
			for _, d := range e.DataPlanes {
				got[d.DataPlane] += d.Admitted
			}
		}
		same := len(got) == len(want)
		for dp, n := range want {
			same = same && got[dp] == n
		}
		if same {
			return u
		}
		if time.Now().After(deadline) {
			b, _ := json.Marshal(u)
			t.Fatalf("usage never matched: admitted per data plane %v, counted %v\n%s", got, want, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestGlobalQuotaAcrossDataPlanes is issue 22's headline over real
// processes: a control plane and two data planes (each its own
// redis-server and two gateways) share one strict global quota of 600 an
// hour. Under concurrent load on all four gateways, the sum admitted is
// never above 600 and reaches exactly 600 (leases of 2 s cycle: what one
// data plane leaves unspent returns and is leased again); where Tyk's
// MDCB would admit 600 on each data plane, 1,200 in all. The control
// plane's usage for the key then names exactly the 200s counted, per data
// plane, and its ledger committed exactly what was spent.
func TestGlobalQuotaAcrossDataPlanes(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putPolicy(t, globalPolicy("global600", 600, "strict", 0, 2*time.Second))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "global-key", spec.Key{Policies: []string{"global600"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	a1, a2 := spendGlobal(t, dp1, dp2, "global-key", 600, 120, 90*time.Second, nil)
	t.Logf("global 600: dp1 admitted %d, dp2 %d", a1, a2)
	if a1+a2 != 600 || a1 == 0 || a2 == 0 {
		t.Fatalf("admitted dp1 %d + dp2 %d = %d; want exactly 600, some on each", a1, a2, a1+a2)
	}
	// Spent out: every further request is refused on both data planes.
	if c1, c2 := sendBoth(t, dp1.gws, "/echo/g", dp2.gws, "/echo/g", "global-key", 40, 4); c1.admitted+c2.admitted != 0 {
		t.Fatalf("after the quota was spent: admitted %d and %d more; want 0", c1.admitted, c2.admitted)
	}
	u := waitUsage(t, cp, hash, map[string]int64{"dp1": int64(a1), "dp2": int64(a2)})
	if len(u.Entries) != 1 {
		t.Fatalf("usage has %d entries, want 1 (one period, one epoch): %+v", len(u.Entries), u.Entries)
	}
	e := u.Entries[0]
	if e.Policy != "global600" || e.Quota != 600 || e.Totals.Admitted != 600 || e.Totals.Spent != 600 {
		t.Fatalf("entry: policy %q quota %d admitted %d spent %d; want global600, 600, 600, 600", e.Policy, e.Quota, e.Totals.Admitted, e.Totals.Spent)
	}
	if e.Committed < e.Totals.Spent || e.Committed > 600 {
		t.Fatalf("committed %d: want between spent %d and Q 600", e.Committed, e.Totals.Spent)
	}
	if want := identity.HashKey("global-key").String(); u.KeyHash != want {
		t.Fatalf("usage key_hash %q, want %q", u.KeyHash, want)
	}
}

// TestGlobalQuotaControlPlaneKilled kills the control plane with SIGKILL
// in the middle of the period, and restarts it on its store after the
// next wave: requests never wait on it (the wave while it is down is
// answered from the leases the data planes hold), the sum admitted stays
// at most Q and reaches exactly Q, and the ledger after the restart has
// granted nothing twice (its committed units equal what was spent once
// every lease is over).
func TestGlobalQuotaControlPlaneKilled(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putPolicy(t, globalPolicy("global500", 500, "strict", 0, 2*time.Second))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "kill-key", spec.Key{Policies: []string{"global500"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	down := false
	a1, a2 := spendGlobal(t, dp1, dp2, "kill-key", 500, 40, 90*time.Second, func(wave, admitted int) {
		switch {
		case wave == 1:
			if admitted >= 500 {
				t.Fatalf("spent out (%d) before the kill", admitted)
			}
			cp.kill()
			down = true
		case down:
			cp.start(t)
			down = false
		}
	})
	if down {
		cp.start(t)
	}
	t.Logf("global 500 with the control plane killed: dp1 %d, dp2 %d", a1, a2)
	if a1+a2 != 500 {
		t.Fatalf("admitted dp1 %d + dp2 %d = %d; want exactly 500", a1, a2, a1+a2)
	}
	u := waitUsage(t, cp, hash, map[string]int64{"dp1": int64(a1), "dp2": int64(a2)})
	e := u.Entries[0]
	if len(u.Entries) != 1 || e.Totals.Spent != 500 {
		t.Fatalf("usage: %d entries, spent %d; want 1 and 500", len(u.Entries), e.Totals.Spent)
	}
	// Once every lease is over and finally reported, the ledger's
	// committed units are exactly the units spent: nothing was granted
	// twice, and nothing granted is lost.
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	for e.Committed != e.Totals.Spent && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		e = keyUsage(t, cp, hash).Entries[0]
	}
	if e.Committed != 500 || e.Totals.Spent != 500 {
		t.Fatalf("ledger after the restart: committed %d, spent %d; want 500 and 500", e.Committed, e.Totals.Spent)
	}
}

// TestGlobalQuotaReset resets a key's quota while its global quota is
// spent out: the reset raises the key's quota epoch, every data plane
// spends a new ledger entry for the new epoch, and exactly Q more are
// admitted in all; the control plane's usage then has one entry per epoch,
// each with exactly Q spent.
func TestGlobalQuotaReset(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putPolicy(t, globalPolicy("global200", 200, "strict", 0, 2*time.Second))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "reset-key", spec.Key{Policies: []string{"global200"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	a1, a2 := spendGlobal(t, dp1, dp2, "reset-key", 200, 60, 90*time.Second, nil)
	if a1+a2 != 200 {
		t.Fatalf("epoch 0: admitted %d + %d = %d; want exactly 200", a1, a2, a1+a2)
	}
	rev := cp.resetQuota(t, hash, "")
	waitApplied(t, rev, all(dp1, dp2)...)
	b1, b2 := spendGlobal(t, dp1, dp2, "reset-key", 200, 60, 90*time.Second, nil)
	t.Logf("epoch 0: dp1 %d dp2 %d; after the reset: dp1 %d dp2 %d", a1, a2, b1, b2)
	if b1+b2 != 200 {
		t.Fatalf("epoch 1: admitted %d + %d = %d; want exactly 200", b1, b2, b1+b2)
	}
	u := waitUsage(t, cp, hash, map[string]int64{"dp1": int64(a1 + b1), "dp2": int64(a2 + b2)})
	if len(u.Entries) != 2 {
		t.Fatalf("usage has %d entries, want 2 (epochs 0 and 1): %+v", len(u.Entries), u.Entries)
	}
	for _, e := range u.Entries {
		if e.Totals.Spent != 200 || e.Committed > 200 {
			t.Errorf("entry of epoch %d: spent %d, committed %d; want 200 and at most 200", e.Epoch, e.Totals.Spent, e.Committed)
		}
	}
	if u.Entries[0].Epoch == u.Entries[1].Epoch {
		t.Fatalf("both entries are of epoch %d", u.Entries[0].Epoch)
	}
}

// TestGlobalQuotaReplicaKilled runs the global quota on a highly
// available control plane, two replicas on one PostgreSQL, and kills with
// SIGKILL the replica the data planes' lease holders call first, in the
// middle of the period: the holders carry on through the other replica
// from the ledger in the database, the sum admitted stays at most Q and
// reaches exactly Q, and once every lease is over the ledger has committed
// exactly what was spent (nothing granted twice).
func TestGlobalQuotaReplicaKilled(t *testing.T) {
	t.Parallel()
	tk1 := dpToken{group: "dp1", tags: []string{"dp1"}, token: "gq-ha-token-dp1"}
	tk2 := dpToken{group: "dp2", tags: []string{"dp2"}, token: "gq-ha-token-dp2"}
	h := startHA(t, 2, []dpToken{tk1, tk2}, cpOptions{})
	cp, other := h.replicas[0], h.replicas[1]
	dp1 := startHADataPlane(t, h.syncAddrs(), tk1, 2)
	dp2 := startHADataPlane(t, h.syncAddrs(), tk2, 2)
	cp.putPolicy(t, globalPolicy("global400", 400, "strict", 0, 2*time.Second))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "ha-key", spec.Key{Policies: []string{"global400"}})
	waitSynced(t, cp.controlPlane, all(dp1, dp2)...)

	a1, a2 := spendGlobal(t, dp1, dp2, "ha-key", 400, 40, 90*time.Second, func(wave, admitted int) {
		if wave == 1 {
			if admitted >= 400 {
				t.Fatalf("spent out (%d) before the kill", admitted)
			}
			cp.kill()
		}
	})
	t.Logf("global 400, replica killed after wave 1: dp1 %d, dp2 %d", a1, a2)
	if a1+a2 != 400 {
		t.Fatalf("admitted dp1 %d + dp2 %d = %d; want exactly 400", a1, a2, a1+a2)
	}
	u := waitUsage(t, other.controlPlane, hash, map[string]int64{"dp1": int64(a1), "dp2": int64(a2)})
	e := u.Entries[0]
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	for e.Committed != e.Totals.Spent && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		e = keyUsage(t, other.controlPlane, hash).Entries[0]
	}
	if len(u.Entries) != 1 || e.Committed != 400 || e.Totals.Spent != 400 {
		t.Fatalf("ledger: %d entries, committed %d, spent %d; want 1, 400 and 400", len(u.Entries), e.Committed, e.Totals.Spent)
	}
}

// TestGlobalQuotaReservedFloorsClamped gives a reserved quota of 300 a
// floor of 200 on each of two data planes, floors that do not fit twice:
// the ledger gives each data plane an equal part (150, debited when the
// entry opens), no data plane spends a floor before the ledger has
// debited it, and exactly 300 are admitted in all.
func TestGlobalQuotaReservedFloorsClamped(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putPolicy(t, globalPolicy("reserved300", 300, "reserved", 200, 2*time.Second))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "reserved-key", spec.Key{Policies: []string{"reserved300"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	a1, a2 := spendGlobal(t, dp1, dp2, "reserved-key", 300, 60, 60*time.Second, nil)
	t.Logf("reserved 300, floors 200 asked: dp1 %d, dp2 %d", a1, a2)
	if a1+a2 != 300 {
		t.Fatalf("admitted dp1 %d + dp2 %d = %d; want exactly 300", a1, a2, a1+a2)
	}
	if c1, c2 := sendBoth(t, dp1.gws, "/echo/g", dp2.gws, "/echo/g", "reserved-key", 40, 4); c1.admitted+c2.admitted != 0 {
		t.Fatalf("after the quota was spent: admitted %d and %d more; want 0", c1.admitted, c2.admitted)
	}
	u := waitUsage(t, cp, hash, map[string]int64{"dp1": int64(a1), "dp2": int64(a2)})
	if e := u.Entries[0]; e.Committed != 300 || e.Bound != 300 {
		t.Fatalf("entry: committed %d, bound %d; want 300 and 300", e.Committed, e.Bound)
	}
}
