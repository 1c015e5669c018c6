package gateway_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// TestReplicatedRedisFailover demonstrates the "replicated Redis" pattern
// for a limit shared by two data planes (README, Many data planes): the
// gateways of both use one Redis primary through Sentinel, replicated to
// a replica. While the primary answers, the quota is exact across both;
// when the primary is lost, Sentinel promotes the replica and the gateways
// follow it with every count the replica received, so the quota stays
// exact: of 1,000, 600 spent before the failover leave exactly 400 after.
// (What the replica had not received when the primary died could be
// admitted again: the test waits until the replica has applied every write
// of the primary first, so that window is empty here.)
func TestReplicatedRedisFailover(t *testing.T) {
	// No diskless-sync delay: the replica's first sync starts at once, not
	// after Redis 7's default 5 s.
	primary := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	sentinel := redistest.StartSentinel(t, "dp", primary, 500*time.Millisecond)
	ctx := context.Background()
	pc, rc := primary.Client(t, nil), replica.Client(t, nil)
	// caughtUp waits until the replica has applied the primary's whole
	// replication stream so far. (WAIT would not do: it counts the acks of
	// what the calling connection wrote, and this one writes nothing, so it
	// is satisfied even by a replica still loading its first sync.)
	caughtUp := func() {
		t.Helper()
		want := replInfo(t, pc, "master_repl_offset")
		waitFor(t, 10*time.Second, "the replica to apply offset "+strconv.FormatInt(want, 10), func() bool {
			return replInfo(t, rc, "master_link_status") == 1 && replInfo(t, rc, "master_sync_in_progress") == 0 &&
				replInfo(t, rc, "slave_repl_offset") >= want
		})
	}
	caughtUp()

	snap := &spec.Snapshot{
		Revision: 1,
		Policies: []spec.Policy{{ID: "daily", Quota: &spec.Quota{Max: 1000, Renewal: spec.Duration(24 * time.Hour)}}},
		Keys:     []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"daily"}}},
		APIs:     []spec.API{{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho}},
	}
	url := "redis+sentinel://dp@" + sentinel.Addr
	var gws []*gateway.TestServer
	for range 2 { // one gateway in each of two data planes
		store, closeStore, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: url, FailurePolicy: core.FailClosed,
			// The test is about exactness across a failover, not latency: a
			// loaded machine can take longer than the default 250 ms to look
			// the master up through Sentinel, and one batch that times out
			// answers all its requests 503.
			Redis: redisstore.Options{Timeout: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeStore() })
		gw, err := gateway.New(gateway.Options{Store: store, FailurePolicy: core.FailClosed, StoreTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { gw.Close() })
		if err := gw.Apply(ctx, snap); err != nil {
			t.Fatal(err)
		}
		srv := gateway.ServeTest(t, gw)
		t.Cleanup(srv.Close)
		gws = append(gws, srv)
	}
	// send makes n requests spread over both gateways from 8 goroutines
	// and counts the answers by status.
	send := func(n int) map[int]int {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		next := make(chan int)
		for range 8 {
			wg.Go(func() {
				for i := range next {
					req, _ := http.NewRequest(http.MethodGet, gws[i%2].URL+"/a/x", nil)
					req.Header.Set("X-API-Key", "k1")
					status := -1
					if resp, err := http.DefaultClient.Do(req); err == nil {
						status = resp.StatusCode
						resp.Body.Close()
					}
					mu.Lock()
					got[status]++
					mu.Unlock()
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		return got
	}

	if got := send(600); got[200] != 600 || len(got) != 1 {
		t.Fatalf("before the failover: %v, want 600 × 200", got)
	}
	caughtUp()
	primary.Kill()
	sc := sentinel.Client(t, nil)
	waitFor(t, 30*time.Second, "Sentinel to promote the replica", func() bool {
		addr, err := sc.Do(ctx, "SENTINEL", "get-master-addr-by-name", "dp").StringSlice()
		return err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(replica.Port)
	})
	// Until the gateways' clients follow the switch, requests fail closed
	// (503, nothing admitted). Send until 600 requests were answered by
	// the store (admitted or refused by the quota).
	admitted, refused := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for admitted+refused < 600 && time.Now().Before(deadline) {
		got := send(50)
		admitted += got[200]
		refused += got[429]
	}
	if admitted != 400 || refused < 200 {
		t.Fatalf("after the failover: %d admitted, %d refused by the quota; want exactly 400 admitted (1,000 − 600 before), the rest refused", admitted, refused)
	}
}

// replInfo returns one field of c's INFO replication as a number: "up"
// counts as 1, any other word as 0; a missing field fails the test.
func replInfo(t *testing.T, c *redis.Client, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatalf("INFO replication: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != field {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		if v == "up" {
			return 1
		}
		return 0
	}
	t.Fatalf("INFO replication has no %s:\n%s", field, info)
	return 0
}

// waitFor polls cond every 50 ms until it holds, or fails the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
