package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/spec"
)

// maxRepersist bounds how long after its Redis restarted empty a data
// plane's configuration is persisted there again: the agents' save delay
// (1 s, the default), their check's period, plus the save itself.
const maxRepersist = 2 * time.Second

// TestRedisRestartedEmpty restarts a data plane's redis-server empty
// under its running gateways: within the save delay the gateways persist
// their configuration there again (the revision they run, the whole
// snapshot), so a gateway restarted during a later control-plane outage
// starts from it (source "persisted", the last revision) and serves it,
// instead of answering 503 for ever.
func TestRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "redis-empty-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{})
	dp := startDataPlane(t, cp, tk, 2, nil)
	cp.putPolicy(t, quotaPolicy("q10", 10))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "redis-empty-key", spec.Key{Policies: []string{"q10"}})
	rev := waitSynced(t, cp, dp.gws...)
	rdb := dp.redis.Client(t, nil)
	persister := dataplane.NewRedisPersister(rdb, "dp1")
	persisted := func() (bool, string) {
		snap, err := persister.Load(context.Background())
		if err != nil || snap == nil {
			return false, fmt.Sprintf("%v %v", snap, err)
		}
		return snap.Revision == rev && len(snap.Keys) == 1 && len(snap.APIs) == 1 && len(snap.Policies) == 1,
			fmt.Sprintf("revision %d, %d keys, %d APIs, %d policies", snap.Revision, len(snap.Keys), len(snap.APIs), len(snap.Policies))
	}
	waitFor(t, "revision "+strconv.FormatUint(rev, 10)+" persisted", syncTimeout, persisted)
	for _, g := range dp.gws { // no save of theirs is still under way
		waitReadyz(t, g, "revision "+strconv.FormatUint(rev, 10)+" persisted", syncTimeout, func(r readiness) bool {
			return r.ControlPlane.PersistedRevision == rev
		})
	}

	// A key only the test writes shows Redis came back empty: the
	// gateways may persist again before any count of keys could be
	// taken (they check every save delay), so their keys cannot.
	const marker = "e2e:before-restart"
	if err := rdb.Set(context.Background(), marker, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	dp.redis.Restart(t) // persistence off: it comes back empty
	restarted := time.Now()
	if n, err := rdb.Exists(context.Background(), marker).Result(); err != nil || n != 0 {
		t.Fatalf("redis-server after its restart holds the key set before it (%d, %v), want it gone", n, err)
	}
	waitFor(t, "the configuration persisted again", syncTimeout, persisted)
	took := time.Since(restarted)
	t.Logf("the configuration was persisted again %v after Redis restarted empty", took)
	if took > maxRepersist {
		t.Fatalf("the configuration was persisted again %v after Redis restarted empty, want ≤ %v", took, maxRepersist)
	}

	cp.kill()
	g := restartFromPersisted(t, dp.gws[0], rev)
	if c := send(t, []*gateway{g}, "/echo/x", "redis-empty-key", 12, 2); c.admitted != 10 || c.denied != 2 {
		t.Fatalf("the restarted gateway admitted %d and denied %d of 12, want 10 and 2 (a quota of 10, counters lost with Redis)", c.admitted, c.denied)
	}
}
