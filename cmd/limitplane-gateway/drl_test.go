package main

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// drlConfig: two gateways' file, the Distributed Rate Limiter on with
// H = 200 ms, a distributed policy (1,000/s, burst 100: floor 31.25/s, 3
// with 32 gateways) for key k-hot, a plain one for k-plain.
const drlConfig = `
admin: {listen: "127.0.0.1:0"}
drl: {group: t1, interval: 200ms}
policies:
  - {id: shared, rate: {requests: 1000, per: 1s, burst: 100}, distributed: true}
  - {id: plain, rate: {requests: 1000, per: 1s, burst: 100}}
keys:
  - {key: k-hot, policies: [shared]}
  - {key: k-plain, policies: [plain]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`

var drlGatewayRE = regexp.MustCompile(`msg="distributed rate limiter on".* gateway=(\S+)`)

// metric returns the value of an unlabelled metric on an admin endpoint.
func metric(t *testing.T, admin, name string) float64 {
	t.Helper()
	r := get(t, http.DefaultClient, admin+"/metrics")
	for _, line := range strings.Split(r.body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, r.body)
	return 0
}

// scriptCalls returns Redis's EVALSHA and EVAL count.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" || !ok {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, _ := strconv.ParseInt(calls, 10, 64)
		n += v
	}
	return n
}

// TestGatewayDRL: two gateway processes' worth of run (real clocks) with
// a drl section: the banner says so, /metrics exports the DRL (a table in
// force on both, exactly one allocator), a distributed key is decided in
// memory (its 200 requests cost no script call per request, while the
// plain key's cost one each) with the global burst in its header fields,
// and a gateway that stops leaves at once: its report (and the lease, if
// it held it) is gone when run returns.
func TestGatewayDRL(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	cfg := writeConfig(t, "store: redis://"+srv.Addr+"/0\n"+drlConfig)
	gws := []*running{start(t, env{}, "-config", cfg), start(t, env{}, "-config", cfg)}
	var admins, ids []string
	for _, g := range gws {
		if !strings.Contains(g.stdout.String(), "distributed rate limiter: group t1, interval 200ms, max_gateways 32") {
			t.Errorf("banner without the DRL line:\n%s", g.stdout)
		}
		admins = append(admins, adminURL(t, g))
		m := drlGatewayRE.FindStringSubmatch(g.stderr.String())
		if m == nil {
			t.Fatalf("no DRL start line in the log:\n%s", g.stderr)
		}
		ids = append(ids, m[1])
	}
	deadline := time.Now().Add(5 * time.Second)
	for metric(t, admins[0], "limitplane_drl_epoch") == 0 || metric(t, admins[1], "limitplane_drl_epoch") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no table in force on both gateways within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	allocator := -1
	for i, a := range admins {
		if metric(t, a, "limitplane_drl_allocator") == 1 {
			if allocator >= 0 {
				t.Fatal("two allocators")
			}
			allocator = i
		}
	}
	if allocator < 0 {
		t.Fatal("no allocator")
	}

	send := func(key string, n int) (ok int, policy string) {
		for i := range n {
			r := get(t, http.DefaultClient, gws[i%2].base+"/echo/x", "X-API-Key", key)
			if r.status == http.StatusOK {
				ok++
			}
			policy = r.header.Get("RateLimit-Policy")
		}
		return ok, policy
	}
	// A new key runs at its floor until the allocator has its demand:
	// wait until both gateways' shares are above their floors (a key's
	// share changes at its next request).
	deadline = time.Now().Add(5 * time.Second)
	for send("k-hot", 2); metric(t, admins[0], "limitplane_drl_share_rate") <= 31.25 || metric(t, admins[1], "limitplane_drl_share_rate") <= 31.25; send("k-hot", 2) {
		if time.Now().After(deadline) {
			t.Fatal("no share above the floor on both gateways within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := scriptCalls(t, rc)
	began := time.Now()
	ok, policy := send("k-hot", 200)
	hotCalls, took := scriptCalls(t, rc)-before, time.Since(began)
	// The loops of two gateways make about a dozen script calls per H
	// (200 ms): the reports, the other's elections every H/4, the
	// allocator's renewals, tables and acks. None is per request.
	if budget := 20 * (int64(took/(200*time.Millisecond)) + 1); hotCalls > budget {
		t.Errorf("200 distributed requests in %v made %d script calls, want at most the loops' %d", took, hotCalls, budget)
	}
	// At their floors (31.25/s, burst 3) the two gateways would pass at
	// most 2×(3 + 31.25×took).
	if floors := 2 * (3 + 31.25*took.Seconds()); float64(ok) <= floors {
		t.Errorf("distributed key: %d of 200 passed in %v, no more than the floors' %.0f", ok, took, floors)
	}
	_, plainPolicy := send("k-plain", 1)
	if want := strings.Replace(plainPolicy, `"plain"`, `"shared"`, 1); policy != want || !strings.Contains(policy, "q=100;") {
		t.Errorf("distributed key's RateLimit-Policy %q, want the global limit's %q", policy, want)
	}
	if n := metric(t, admins[0], "limitplane_drl_hot_keys") + metric(t, admins[1], "limitplane_drl_hot_keys"); n != 2 {
		t.Errorf("hot keys on the two gateways: %v, want 1 each", n)
	}
	before = scriptCalls(t, rc)
	send("k-plain", 200)
	plainCalls := scriptCalls(t, rc) - before
	if plainCalls < 200 {
		t.Errorf("200 plain requests made %d script calls, want at least one each (the Redis store)", plainCalls)
	}
	t.Logf("script calls: distributed %d, plain %d (200 requests each)", hotCalls, plainCalls)

	ctx := context.Background()
	report := func(i int) string { return "limitplane:drl:{t1}:report:" + ids[i] }
	if n, _ := rc.Exists(ctx, report(0), report(1)).Result(); n != 2 {
		t.Fatalf("%d reports in Redis, want 2", n)
	}
	// The allocator and its lease, read twice alike (a slow machine may
	// have moved the lease meanwhile).
	var lease string
	for {
		allocator = -1
		for i, a := range admins {
			if metric(t, a, "limitplane_drl_allocator") == 1 {
				allocator = i
			}
		}
		l1, _ := rc.Get(ctx, "limitplane:drl:{t1}:lease").Result()
		again := metric(t, admins[max(allocator, 0)], "limitplane_drl_allocator") == 1
		l2, _ := rc.Get(ctx, "limitplane:drl:{t1}:lease").Result()
		if allocator >= 0 && again && l1 != "" && l1 == l2 {
			lease = l1
			break
		}
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("no stable allocator")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := gws[allocator].stop(); err != nil {
		t.Fatal(err)
	}
	if n, _ := rc.Exists(ctx, report(allocator)).Result(); n != 0 {
		t.Fatal("after the allocator stopped, its report is left")
	}
	// The lease is gone, or already the other gateway's.
	if now, err := rc.Get(ctx, "limitplane:drl:{t1}:lease").Result(); err != redis.Nil && now == lease {
		t.Fatalf("after the allocator stopped, its lease %q is left", lease)
	}
	other := 1 - allocator
	deadline = time.Now().Add(time.Second)
	for metric(t, admins[other], "limitplane_drl_allocator") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the other gateway did not become the allocator within 1s (5H)")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDistributedWithoutDRLWarns: a file with a distributed policy and
// no drl section starts, enforces the policy exactly, and logs one
// warning saying so.
func TestDistributedWithoutDRLWarns(t *testing.T) {
	cfg := writeConfig(t, `
policies:
  - {id: shared, rate: {requests: 2, per: 1m}, distributed: true}
  - {id: other, rate: {requests: 2, per: 1m}, distributed: true}
keys:
  - {key: k, policies: [shared]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`)
	g := start(t, frozen(), "-config", cfg)
	var got []int
	for range 3 {
		got = append(got, get(t, http.DefaultClient, g.base+"/echo/x", "X-API-Key", "k").status)
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("statuses %v, want the exact 200 200 429", got)
	}
	if n := strings.Count(g.stderr.String(), "policies marked distributed are enforced exactly by the store"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, g.stderr)
	}
}
