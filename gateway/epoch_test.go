package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
	"github.com/redis/go-redis/v9"
)

// epochSnapshot: key k1 has policy q (a quota of 3 a day) on every API at
// key-wide quota epoch wide; key k2 has policy q too, and its own quota of
// 2 a day on API "api" at epoch apiEpoch; APIs "api" and "other".
func epochSnapshot(rev, wide, k2Wide, apiEpoch uint64) *spec.Snapshot {
	day := spec.Duration(24 * time.Hour)
	return &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{{ID: "q", Quota: &spec.Quota{Max: 3, Renewal: day}}},
		Keys: []spec.Key{
			{KeyHash: keyHash("k1"), Policies: []string{"q"}, QuotaEpoch: wide},
			{KeyHash: keyHash("k2"), Policies: []string{"q"}, QuotaEpoch: k2Wide,
				APILimits: map[string]spec.Limits{"api": {Quota: &spec.Quota{Max: 2, Renewal: day}, QuotaEpoch: apiEpoch}}},
		},
		APIs: []spec.API{
			{ID: "api", ListenPath: "/api/", Target: spec.BuiltinEcho},
			{ID: "other", ListenPath: "/other/", Target: spec.BuiltinEcho},
		},
	}
}

// sends sends n requests to path with key and returns their statuses.
func sends(t *testing.T, g *testGateway, n int, path, key string) []int {
	t.Helper()
	var s []int
	for range n {
		s = append(s, g.mustGet(t, path, key).status)
	}
	return s
}

// TestApplyRaisedQuotaEpochResetsQuota: a quota of 3 spent, a snapshot
// that raises the key's quota_epoch gives exactly 3 more on the next
// requests; applying the same snapshot again, or a later revision with the
// same epoch, gives nothing more. A key's per-API epoch resets that API's
// quota only, and its key-wide epoch leaves the per-API quota alone.
func TestApplyRaisedQuotaEpochResetsQuota(t *testing.T) {
	g := newTestGateway(t)
	g.apply(t, epochSnapshot(1, 0, 0, 0))
	checkStatuses(t, "epoch 0", sends(t, g, 4, "/api/x", "k1"), []int{200, 200, 200, 429})

	raised := epochSnapshot(2, 1, 0, 0)
	g.apply(t, raised)
	checkStatuses(t, "epoch 1", sends(t, g, 4, "/api/x", "k1"), []int{200, 200, 200, 429})
	g.apply(t, raised)
	checkStatuses(t, "epoch 1 applied again", sends(t, g, 1, "/api/x", "k1"), []int{429})
	g.apply(t, epochSnapshot(3, 1, 0, 0))
	checkStatuses(t, "a later revision, same epoch", sends(t, g, 1, "/other/x", "k1"), []int{429})

	// k2: 2 on "api" (its own counter), 3 on "other" (key-wide).
	checkStatuses(t, "k2 api", sends(t, g, 3, "/api/x", "k2"), []int{200, 200, 429})
	checkStatuses(t, "k2 other", sends(t, g, 4, "/other/x", "k2"), []int{200, 200, 200, 429})
	g.apply(t, epochSnapshot(4, 1, 0, 1))
	checkStatuses(t, "k2 api after its epoch", sends(t, g, 3, "/api/x", "k2"), []int{200, 200, 429})
	checkStatuses(t, "k2 other after the api epoch", sends(t, g, 1, "/other/x", "k2"), []int{429})
	g.apply(t, epochSnapshot(5, 1, 1, 1))
	checkStatuses(t, "k2 other after the key-wide epoch", sends(t, g, 4, "/other/x", "k2"), []int{200, 200, 200, 429})
	checkStatuses(t, "k2 api after the key-wide epoch", sends(t, g, 1, "/api/x", "k2"), []int{429})
	checkStatuses(t, "k1 untouched by k2's epochs", sends(t, g, 1, "/api/x", "k1"), []int{429})
}

// redisGateway is a gateway over its own redisstore.Store on the shared
// client, served over real HTTP.
func redisGateway(t *testing.T, c redis.UniversalClient) *testGateway {
	t.Helper()
	store, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{Store: store, FailurePolicy: core.FailClosed, Seams: &seams.Seams{Now: func() time.Time { return epoch }}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := gateway.ServeTest(t, gw)
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &testGateway{gw: gw, srv: srv, c: &http.Client{Transport: tr}}
}

// TestQuotaEpochTwoGatewaysOneRedis: two gateways of one data plane share
// a Redis. A raised epoch is a reset for each gateway from the moment it
// applies it: a gateway that has not yet applied it goes on spending the
// old period; once both have, they share the new one, exactly 3, under
// concurrent load too. Applying the same snapshot again resets nothing,
// and the old epoch's counter is left to expire with its period (its TTL).
func TestQuotaEpochTwoGatewaysOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, &redis.Options{PoolSize: 32})
	a, b := redisGateway(t, c), redisGateway(t, c)
	for _, g := range []*testGateway{a, b} {
		g.apply(t, epochSnapshot(1, 0, 0, 0))
	}
	checkStatuses(t, "A at epoch 0", sends(t, a, 2, "/api/x", "k1"), []int{200, 200})
	checkStatuses(t, "B at epoch 0", sends(t, b, 2, "/api/x", "k1"), []int{200, 429})

	raised := epochSnapshot(2, 1, 0, 0)
	a.apply(t, raised)
	checkStatuses(t, "A at epoch 1", sends(t, a, 1, "/api/x", "k1"), []int{200})
	checkStatuses(t, "B still at epoch 0", sends(t, b, 1, "/api/x", "k1"), []int{429})
	b.apply(t, raised)
	checkStatuses(t, "B at epoch 1", sends(t, b, 3, "/api/x", "k1"), []int{200, 200, 429})
	checkStatuses(t, "A after B", sends(t, a, 1, "/api/x", "k1"), []int{429})
	for _, g := range []*testGateway{a, b} {
		g.apply(t, raised) // a replay
	}
	checkStatuses(t, "A after the replay", sends(t, a, 1, "/api/x", "k1"), []int{429})
	checkStatuses(t, "B after the replay", sends(t, b, 1, "/api/x", "k1"), []int{429})

	// Both at epoch 2, 40 concurrent requests over the two gateways.
	for _, g := range []*testGateway{a, b} {
		g.apply(t, epochSnapshot(3, 2, 0, 0))
	}
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		g := []*testGateway{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ans, err := g.get("/other/x", "k1")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				got[-1]++
				return
			}
			got[ans.status]++
		}()
	}
	wg.Wait()
	if fmt.Sprint(got) != "map[200:3 429:37]" {
		t.Errorf("40 concurrent requests at epoch 2: %v, want 3 admitted", got)
	}

	// One quota key per epoch, each expiring with its period (24 h).
	ctx := context.Background()
	keys, err := c.Keys(ctx, "limitplane:*:quota*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, k := range keys {
		kinds = append(kinds, strings.Split(k, ":")[2])
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl <= 23*time.Hour || ttl > 24*time.Hour {
			t.Errorf("PTTL %s = %v, %v; want the renewal, 24h", k, ttl, err)
		}
	}
	slices.Sort(kinds)
	if want := []string{"quota", "quota.1", "quota.2"}; !slices.Equal(kinds, want) {
		t.Errorf("quota keys of kinds %q, want %q", kinds, want)
	}
}

// TestAdminResetQuotaAtEpoch: on Redis, the operations endpoint's
// reset-quota deletes the counter of the key's current epoch (key-wide, or
// the API's own), so it works for a key whose quota_epoch was raised.
func TestAdminResetQuotaAtEpoch(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.New(srv.Client(t, nil), redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rig := newRig(t, rigOptions{store: store, policy: core.FailClosed, apply: epochSnapshot(1, 4, 0, 6), admin: gateway.AdminOptions{Token: adminToken}})
	for _, c := range []struct {
		key, path, query string
		want             []int
	}{
		{"k1", "/other/x", "", []int{200, 200, 200, 429}},
		{"k2", "/api/x", "?api=api", []int{200, 200, 429}},
	} {
		url := rig.base + c.path
		if got := statuses(t, len(c.want), url, "X-API-Key", c.key); !slices.Equal(got, c.want) {
			t.Fatalf("%s before the reset: %v, want %v", c.key, got, c.want)
		}
		reset := call(t, http.MethodPost, rig.admin+"/consumers/"+identity.HashKey(c.key).String()+"/reset-quota"+c.query, bearer...)
		if reset.status != 200 || !strings.Contains(reset.body, `"quota_reset":true`) {
			t.Fatalf("%s reset: %d %s", c.key, reset.status, reset.body)
		}
		if got := statuses(t, len(c.want), url, "X-API-Key", c.key); !slices.Equal(got, c.want) {
			t.Errorf("%s after the reset: %v, want %v", c.key, got, c.want)
		}
	}
}
