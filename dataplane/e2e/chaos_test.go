package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// chaosSeed is the seed of TestChaosKill's writers and kills; LP_E2E_SEED
// overrides it, to replay another run.
func chaosSeed(t *testing.T) uint64 {
	seed := uint64(20261201)
	if s := os.Getenv("LP_E2E_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LP_E2E_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (set LP_E2E_SEED to replay another)", seed)
	return seed
}

// write is one admin API call of the chaos writers.
type write struct {
	method, path string
	body         any
	// create: a 409 after a lost answer means the lost attempt made it;
	// remove: a 404 after a lost answer means the lost attempt made it.
	create, remove bool
}

// retry sends w until the control plane answers it, through kills and
// restarts: a transport error or a 5xx is an answer lost (the write may or
// may not have been made) and the write is sent again. It returns the
// number of lost answers, or an error for an answer that is wrong.
func (c *controlPlane) retry(ctx context.Context, w write) (lost int, err error) {
	deadline := time.Now().Add(time.Minute)
	for {
		status, body, err := c.admin(ctx, w.method, w.path, w.body)
		switch {
		case err == nil && status >= 200 && status < 300:
			return lost, nil
		case err == nil && lost > 0 && (w.create && status == http.StatusConflict || w.remove && status == http.StatusNotFound):
			return lost, nil // the lost attempt was made
		case err == nil && status < 500:
			return lost, fmt.Errorf("%s %s (after %d lost answers): %d %s", w.method, w.path, lost, status, body)
		}
		lost++
		if time.Now().After(deadline) {
			return lost, fmt.Errorf("%s %s: no answer within a minute: %d %s %v", w.method, w.path, status, body, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// modelKey is what the acknowledged writes say a key is.
type modelKey struct {
	plain    string
	exists   bool
	ever     bool // created at least once
	policies []string
	limited  bool // has an api_limits quota on dp1-api
}

func (m *modelKey) hash() string { return identity.HashKey(m.plain).String() }

func (m *modelKey) spec() spec.Key {
	k := spec.Key{Policies: slices.Clone(m.policies)}
	if m.limited {
		k.APILimits = map[string]spec.Limits{"dp1-api": {Quota: &spec.Quota{Max: 50, Renewal: spec.Duration(time.Hour)}}}
	}
	return k
}

// chaosWriter makes its share of the changes on keys and a policy only it
// touches, so the acknowledged writes say exactly what the state must be.
type chaosWriter struct {
	id      int
	rng     *rand.Rand
	keys    []*modelKey
	policy  string
	max     int64 // the policy's quota
	lost    int
	resets  map[int]string // op index → a reset key to reset then
	cp      *controlPlane
	applied *atomic.Int64
}

func (w *chaosWriter) randomPolicies() []string {
	n := 1 + w.rng.IntN(2)
	var out []string
	for len(out) < n {
		p := fmt.Sprintf("p%d", w.rng.IntN(8))
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// change is the writer's next change to key k, chosen by r (0..99): the
// write, the object it writes (its kind, id and op, for the change log),
// and what to record in the model once it is acknowledged (nil: nothing).
// The HA chaos test's writers make the same mix.
func (w *chaosWriter) change(k *modelKey, r int) (wr write, obj controlplane.Object, id string, op controlplane.Op, after func()) {
	obj, id, op = controlplane.ObjectKey, k.hash(), controlplane.OpPut
	switch {
	case !k.exists:
		pol, limited := w.randomPolicies(), w.rng.IntN(3) == 0
		body := map[string]any{"key": k.plain, "policies": pol}
		if limited {
			body["api_limits"] = map[string]any{"dp1-api": map[string]any{"quota": map[string]any{"max": 50, "renewal": "1h"}}}
		}
		wr = write{method: "POST", path: "/api/keys", body: body, create: true}
		after = func() { k.exists, k.ever, k.policies, k.limited = true, true, pol, limited }
	case r < 35:
		pol, limited := w.randomPolicies(), w.rng.IntN(3) == 0
		nk := modelKey{policies: pol, limited: limited}
		path := "/api/keys/" + k.hash()
		if w.rng.IntN(2) == 0 {
			path += "?suppress_reset=1"
		}
		wr = write{method: "PUT", path: path, body: nk.spec()}
		after = func() { k.policies, k.limited = pol, limited }
	case r < 50:
		wr = write{method: "DELETE", path: "/api/keys/" + k.hash(), remove: true}
		op = controlplane.OpDelete
		after = func() { k.exists = false }
	case r < 75:
		path := "/api/keys/" + k.hash() + "/reset-quota"
		if k.limited && w.rng.IntN(2) == 0 {
			path += "?api=dp1-api"
		}
		wr = write{method: "POST", path: path}
	default:
		max := 1000 + w.rng.Int64N(1000)
		wr = write{method: "PUT", path: "/api/policies/" + w.policy, body: quotaPolicy(w.policy, max)}
		obj, id = controlplane.ObjectPolicy, w.policy
		after = func() { w.max = max }
	}
	return wr, obj, id, op, after
}

// run makes n changes.
func (w *chaosWriter) run(ctx context.Context, n int) error {
	for i := range n {
		var wr write
		var after func()
		k := w.keys[w.rng.IntN(len(w.keys))]
		r := w.rng.IntN(100)
		if w.resets[i] != "" {
			wr = write{method: "POST", path: "/api/keys/" + identity.HashKey(w.resets[i]).String() + "/reset-quota"}
		} else {
			wr, _, _, _, after = w.change(k, r)
		}
		lost, err := w.cp.retry(ctx, wr)
		w.lost += lost
		if err != nil {
			return fmt.Errorf("writer %d, change %d: %w", w.id, i, err)
		}
		if after != nil {
			after()
		}
		w.applied.Add(1)
	}
	return nil
}

// TestChaosKill kills the control plane with SIGKILL 10 times at random
// (seeded) moments while 8 writers make 5,000 changes through the admin
// API (keys created, updated with and without suppress_reset, deleted,
// reset, per API too; policies changed), restarting it each time on the
// same data file; a writer sends a write whose answer was lost again and
// records each acknowledged write. Then:
//   - every gateway of both data planes applied the control plane's
//     revision, and its digest is the digest of its data plane's view of
//     the control plane's state; /api/dataplanes lists all four
//     connected at that revision;
//   - every acknowledged write is in the control plane's state (each key
//     and policy as its last acknowledged write left it, deleted keys
//     gone), and the gateways enforce it (live keys pass, deleted ones are
//     refused);
//   - no reset is lost or applied twice: three keys with a quota of 3 were
//     spent on both data planes before; the two reset during the chaos
//     admit exactly 3 again on each data plane, the one not reset 0; after
//     one more kill and restart of the control plane and a restart of one
//     gateway per data plane, all three admit 0.
func TestChaosKill(t *testing.T) {
	t.Parallel()
	const changes, kills, writers, keysPerWriter = 5000, 10, 8, 24
	seed := chaosSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	gws := all(dp1, dp2)

	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.putAPI(t, echoAPI("dp1-api", "/dp1/", "dp1"))
	cp.putAPI(t, echoAPI("dp2-api", "/dp2/", "dp2"))
	cp.putPolicy(t, quotaPolicy("q3", 3))
	for i := range 8 {
		cp.putPolicy(t, quotaPolicy(fmt.Sprintf("p%d", i), 1000))
	}
	resetKeys := []string{"reset-a", "reset-b", "reset-c"}
	for _, k := range resetKeys {
		cp.postKey(t, k, spec.Key{Policies: []string{"q3"}})
	}
	waitSynced(t, cp, gws...)
	for _, k := range resetKeys {
		spendEach(t, "before the chaos: "+k, dp1, dp2, k, 5, 3)
	}

	var applied atomic.Int64
	ws := make([]*chaosWriter, writers)
	for i := range ws {
		w := &chaosWriter{id: i, rng: rand.New(rand.NewPCG(seed, uint64(i+1))), policy: fmt.Sprintf("p%d", i), max: 1000,
			resets: map[int]string{}, cp: cp, applied: &applied}
		for j := range keysPerWriter {
			w.keys = append(w.keys, &modelKey{plain: fmt.Sprintf("chaos-%d-%d", i, j)})
		}
		ws[i] = w
	}
	ws[0].resets[200] = "reset-a"
	ws[1].resets[450] = "reset-b"

	var at []int64
	for range kills {
		at = append(at, changes/20+rng.Int64N(changes*9/10))
	}
	slices.Sort(at)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, writers)
	start := time.Now()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { errs <- w.run(ctx, changes/writers) })
	}
	killed := 0
	var downtime time.Duration
	for _, n := range at {
		for applied.Load() < n && len(errs) == 0 {
			time.Sleep(2 * time.Millisecond)
		}
		if len(errs) != 0 {
			break
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		cp.kill()
		killed++
		down := time.Now()
		cp.start(t)
		downtime += time.Since(down)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	lost := 0
	for _, w := range ws {
		lost += w.lost
	}
	t.Logf("%d changes by %d writers in %v with %d kills (restarts took %v in all); %d answers lost and the writes sent again",
		applied.Load(), writers, time.Since(start), killed, downtime, lost)
	if killed != kills || applied.Load() != changes {
		t.Fatalf("%d kills and %d changes, want %d and %d", killed, applied.Load(), kills, changes)
	}

	// Every gateway at the control plane's revision.
	start = time.Now()
	rev := waitSynced(t, cp, gws...)
	waitConnected(t, cp, rev, gws...)
	t.Logf("all gateways at revision %d %v after the last change", rev, time.Since(start))

	// The control plane's state is what the acknowledged writes say.
	state := &spec.Snapshot{Revision: rev}
	for _, id := range []string{"dp1-api", "dp2-api", "echo"} {
		var a spec.API
		mustDecode(t, cp.mustAdmin(t, "GET", "/api/apis/"+id, nil, 200), &a)
		state.APIs = append(state.APIs, a)
	}
	getPolicy := func(id string, max int64) {
		var p spec.Policy
		mustDecode(t, cp.mustAdmin(t, "GET", "/api/policies/"+id, nil, 200), &p)
		if p.Quota == nil || p.Quota.Max != max {
			t.Errorf("policy %s is %+v, the last acknowledged write made its quota %d", id, p, max)
		}
		state.Policies = append(state.Policies, p)
	}
	getPolicy("q3", 3)
	for _, w := range ws {
		getPolicy(w.policy, w.max)
	}
	var live, gone []*modelKey
	for _, k := range resetKeys {
		state.Keys = append(state.Keys, cp.getKey(t, identity.HashKey(k).String()))
	}
	for _, w := range ws {
		for _, m := range w.keys {
			if !m.exists {
				if m.ever {
					cp.mustAdmin(t, "GET", "/api/keys/"+m.hash(), nil, 404)
					gone = append(gone, m)
				}
				continue
			}
			k := cp.getKey(t, m.hash())
			want := m.spec()
			if !slices.Equal(k.Policies, want.Policies) || len(k.APILimits) != len(want.APILimits) {
				t.Errorf("key %s is %+v, the last acknowledged write made it %+v", m.plain, k, want)
			}
			state.Keys = append(state.Keys, k)
			live = append(live, m)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if err := state.Validate(); err != nil {
		t.Fatalf("the control plane's state is invalid: %v", err)
	}
	t.Logf("state: %d policies, %d keys (%d deleted), %d APIs", len(state.Policies), len(state.Keys), len(gone), len(state.APIs))
	for _, dp := range []*dataPlane{dp1, dp2} {
		want := protocol.Digest(controlplane.Select(state, dp.tags))
		for _, g := range dp.gws {
			r, err := g.readyz()
			if err != nil {
				t.Fatal(err)
			}
			if r.ControlPlane.AppliedRevision != rev || r.ControlPlane.Digest != want {
				t.Errorf("gateway %s runs revision %d digest %q; the control plane's view for %v is revision %d digest %s", g.id, r.ControlPlane.AppliedRevision, r.ControlPlane.Digest, dp.tags, rev, want)
			}
			t.Logf("gateway %s: %d reconnects, deliveries %+v", g.id, r.ControlPlane.Reconnects, r.ControlPlane.Deliveries)
		}
	}

	// The gateways enforce it: a few live keys pass, deleted ones are refused.
	for _, g := range gws {
		for i, m := range live {
			if i%(len(live)/4+1) != 0 {
				continue
			}
			if status, body := sendOne(t, g, "/echo/x", m.plain); status != 200 {
				t.Errorf("gateway %s: live key %s answered %d %s", g.id, m.plain, status, body)
			}
		}
		for i, m := range gone {
			if i%(len(gone)/4+1) != 0 {
				continue
			}
			if status, body := sendOne(t, g, "/echo/x", m.plain); status != 401 && status != 403 {
				t.Errorf("gateway %s: deleted key %s answered %d %s", g.id, m.plain, status, body)
			}
		}
	}

	// No reset lost, none applied twice.
	spendEach(t, "reset-a, reset during the chaos", dp1, dp2, "reset-a", 5, 3)
	spendEach(t, "reset-b, reset during the chaos", dp1, dp2, "reset-b", 5, 3)
	spendEach(t, "reset-c, never reset", dp1, dp2, "reset-c", 5, 0)
	cp.kill()
	cp.start(t)
	for _, dp := range []*dataPlane{dp1, dp2} {
		if err := dp.gws[0].proc.stop(); err != nil {
			t.Fatalf("gateway %s exited with %v", dp.gws[0].id, err)
		}
		dp.gws[0].start(t)
	}
	waitConnected(t, cp, waitSynced(t, cp, gws...), gws...)
	for _, k := range resetKeys {
		spendEach(t, k+" after the configuration was delivered again", dp1, dp2, k, 5, 0)
	}
}

func mustDecode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// TestFreezeControlPlane freezes the control plane with SIGSTOP for 30 s
// (its keepalive at 1 s): the gateways notice (their /readyz leaves
// "connected") and keep enforcing their configuration (exactly 20 of 25
// for a key with a quota of 20, early and late in the freeze); after
// SIGCONT every gateway is connected again on a new stream (its /readyz,
// and /api/dataplanes, which has heard from it since) and a reset made
// then reaches them (exactly 20 again).
func TestFreezeControlPlane(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "freeze-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{keepalive: "1s"})
	dp := startDataPlane(t, cp, tk, 2, nil)
	cp.putPolicy(t, quotaPolicy("q20", 20))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "freeze-a", spec.Key{Policies: []string{"q20"}})
	hashB, _ := cp.postKey(t, "freeze-b", spec.Key{Policies: []string{"q20"}})
	rev := waitSynced(t, cp, dp.gws...)
	waitConnected(t, cp, rev, dp.gws...)

	const freeze = 30 * time.Second
	cp.proc.signal(syscall.SIGSTOP)
	frozen := time.Now()
	defer cp.proc.signal(syscall.SIGCONT)
	if c := send(t, dp.gws, "/echo/f", "freeze-a", 25, 4); c.admitted != 20 {
		t.Fatalf("early in the freeze: admitted %d of 25, want 20", c.admitted)
	}
	noticed := map[string]time.Duration{}
	for time.Since(frozen) < freeze {
		for _, g := range dp.gws {
			if _, ok := noticed[g.id]; ok {
				continue
			}
			if r, err := g.readyz(); err == nil && r.ControlPlane.State != "connected" {
				noticed[g.id] = time.Since(frozen)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := send(t, dp.gws, "/echo/f", "freeze-b", 25, 4); c.admitted != 20 {
		t.Fatalf("late in the freeze: admitted %d of 25, want 20", c.admitted)
	}
	// thawed is taken before SIGCONT: a frozen control plane updates no
	// LastSeen, and the gateways, whose dials wait in its listen backlog,
	// can be connected again (and seen) before this goroutine runs after
	// the signal; taken after it, it was later than their LastSeen.
	thawed := time.Now()
	cp.proc.signal(syscall.SIGCONT)
	t.Logf("gateways noticed the frozen control plane after %v", noticed)
	if len(noticed) != len(dp.gws) {
		t.Errorf("after %v of freeze only %v noticed (their /readyz left \"connected\")", freeze, noticed)
	}
	for _, g := range dp.gws {
		waitReadyz(t, g, "connected again on a new stream", syncTimeout, func(r readiness) bool {
			return r.ControlPlane.State == "connected" && r.ControlPlane.Reconnects >= 1
		})
	}
	waitConnectedSince(t, cp, rev, thawed, dp.gws...)
	t.Logf("all gateways connected again %v after SIGCONT", time.Since(thawed))
	waitApplied(t, cp.resetQuota(t, hashB, ""), dp.gws...)
	if c := send(t, dp.gws, "/echo/f", "freeze-b", 25, 4); c.admitted != 20 {
		t.Fatalf("after a reset made after the freeze: admitted %d of 25, want 20", c.admitted)
	}
}

// TestGatewayRestartWithoutControlPlane restarts a gateway while the
// control plane is down: it starts from its data plane's last
// configuration, persisted in the data plane's Redis (source
// "persisted", the last revision, not zero APIs), and enforces it with
// the counters it shares there: a key with a quota of 10 that spent 4
// before admits exactly 6 more. When the control plane is back, the
// gateway's configuration is the control plane's again (source
// control_plane), also when the control plane confirms the revision it
// runs rather than sending it again.
func TestGatewayRestartWithoutControlPlane(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "restart-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{})
	dp := startDataPlane(t, cp, tk, 2, nil)
	cp.putPolicy(t, quotaPolicy("q10", 10))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "restart-key", spec.Key{Policies: []string{"q10"}})
	rev := waitSynced(t, cp, dp.gws...)
	if c := send(t, dp.gws, "/echo/x", "restart-key", 4, 2); c.admitted != 4 {
		t.Fatalf("admitted %d of 4", c.admitted)
	}
	// The data plane's configuration is persisted in its Redis.
	rdb := dp.redis.Client(t, nil)
	persisted := "limitplane:dataplane:{dp1}:config"
	waitFor(t, "revision "+strconv.FormatUint(rev, 10)+" persisted in "+persisted, syncTimeout, func() (bool, string) {
		v, err := rdb.HGet(context.Background(), persisted, "revision").Result()
		return err == nil && v == strconv.FormatUint(rev, 10), fmt.Sprintf("%q %v", v, err)
	})

	cp.kill()
	g := restartFromPersisted(t, dp.gws[0], rev)
	if c := send(t, []*gateway{g}, "/echo/x", "restart-key", 10, 2); c.admitted != 6 {
		t.Fatalf("the restarted gateway admitted %d of 10, want exactly 6 (4 of 10 spent before)", c.admitted)
	}

	// The control plane comes back. The other gateway reconnects first
	// (the restarted one is held with SIGSTOP meanwhile), so the control
	// plane knows the digest of revision rev when the restarted gateway
	// names it: it confirms what the gateway runs instead of sending a
	// snapshot, and that must make the gateway's source control_plane.
	g.proc.signal(syscall.SIGSTOP)
	cp.start(t)
	waitConnected(t, cp, rev, dp.gws[1])
	g.proc.signal(syscall.SIGCONT)
	waitReadyz(t, g, "source control_plane again", syncTimeout, func(r readiness) bool {
		return r.ControlPlane.Source == "control_plane" && r.ControlPlane.State == "connected"
	})
	waitConnected(t, cp, rev, dp.gws...)
}

// TestReconnectWithNothingNew cuts a gateway off while nothing changes:
// SIGSTOP until the control plane's keepalive (1 s) drops its stream,
// then SIGCONT. The gateway reconnects naming the revision and digest it
// runs, which are the control plane's latest, so there is nothing to
// send; it must still count as connected again (its /readyz state, and
// /api/dataplanes having heard from it since), and a change made then
// reaches it.
func TestReconnectWithNothingNew(t *testing.T) {
	t.Parallel()
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "nothing-new-token"}
	cp := startControlPlane(t, []dpToken{tk}, cpOptions{keepalive: "1s"})
	dp := startDataPlane(t, cp, tk, 1, nil)
	g := dp.gws[0]
	cp.putPolicy(t, quotaPolicy("q5", 5))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "nothing-new-key", spec.Key{Policies: []string{"q5"}})
	rev := waitSynced(t, cp, g)
	waitConnected(t, cp, rev, g)

	g.proc.signal(syscall.SIGSTOP)
	waitFor(t, "the gateway dropped by the control plane's keepalive", syncTimeout, func() (bool, string) {
		list := cp.dataPlanes(t)
		return len(list) == 1 && !list[0].Connected, fmt.Sprintf("%+v", list)
	})
	g.proc.signal(syscall.SIGCONT)
	thawed := time.Now()
	waitReadyz(t, g, "connected again", syncTimeout, func(r readiness) bool {
		return r.ControlPlane.State == "connected" && r.ControlPlane.Reconnects >= 1 && r.ControlPlane.AppliedRevision == rev
	})
	waitConnectedSince(t, cp, rev, thawed, g)
	t.Logf("connected again %v after SIGCONT", time.Since(thawed))
	waitApplied(t, cp.resetQuota(t, hash, ""), g)
}

// restartFromPersisted restarts gateway g (the control plane being down)
// and waits until it serves the persisted configuration, which must be
// revision rev; it returns g.
func restartFromPersisted(t *testing.T, g *gateway, rev uint64) *gateway {
	t.Helper()
	if err := g.proc.stop(); err != nil {
		t.Fatalf("gateway %s exited with %v", g.id, err)
	}
	g.start(t)
	r := waitReadyz(t, g, "the persisted configuration", syncTimeout, func(r readiness) bool {
		return r.ControlPlane.Source == "persisted" && r.Ready
	})
	if r.ControlPlane.AppliedRevision != rev || r.Revision != rev {
		t.Fatalf("restarted without the control plane, the gateway runs revision %d (%d), want %d", r.ControlPlane.AppliedRevision, r.Revision, rev)
	}
	return g
}
