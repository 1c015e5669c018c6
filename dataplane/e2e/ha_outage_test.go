package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// outageWrite is one attempt of TestHADatabaseOutage's writers.
type outageWrite struct {
	key          string // the key it creates
	replica      string
	sent, answer time.Time
	status       int    // 0 for a transport error
	body         string // the answer, or the transport error
	rev          uint64 // of an acknowledged write
}

// TestHADatabaseOutage stops the PostgreSQL of two replicas with
// StopImmediate (pg_ctl stop -m immediate) for 20 s while 4 writers
// create keys through replicas picked at random (one attempt each, no
// retry), and starts it again:
//   - every write sent after the stop returned and answered before the
//     start was called answers 503 with an error message, and both replicas' /readyz
//     answer 503 meanwhile;
//   - the gateways (two, one data plane, each given both replicas) keep
//     enforcing what they had, early and late in the outage: a key with a
//     quota of 10 that spent 4 admits exactly 6 more, another exactly 10
//     of 12, a key never created is refused as before, and their /readyz stays
//     ready and connected;
//   - after the start a write through each replica succeeds within 2 s of
//     the database accepting connections again;
//   - nothing acknowledged is lost: every key whose creation was answered
//     201 is in the database, its creation in the change log at the
//     answered revision, the log has no gap; the gateways reach the
//     database's revision and digest and admit the last key created.
func TestHADatabaseOutage(t *testing.T) {
	t.Parallel()
	const outage, resume, writers = 20 * time.Second, 2 * time.Second, 4
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "ha-outage-token"}
	h := startHA(t, 2, []dpToken{tk}, cpOptions{})
	store := h.openStore(t)
	dp := startHADataPlane(t, h.syncAddrs(), tk, 2)
	cp := h.replicas[0]
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	h.replicas[1].putPolicy(t, quotaPolicy("q10", 10))
	cp.postKey(t, "outage-a", spec.Key{Policies: []string{"q10"}})
	h.replicas[1].postKey(t, "outage-b", spec.Key{Policies: []string{"q10"}})
	waitApplied(t, cp.revision(t), dp.gws...)
	if c := send(t, dp.gws, "/echo/o", "outage-a", 4, 2); c.admitted != 4 {
		t.Fatalf("before the outage: admitted %d of 4", c.admitted)
	}
	unknown := map[string]string{} // gateway → its answer to a key never created, before the outage
	for _, g := range dp.gws {
		status, body := sendOne(t, g, "/echo/o", "outage-never-created")
		if status != http.StatusUnauthorized && status != http.StatusForbidden {
			t.Fatalf("before the outage: gateway %s answered a key never created %d %s", g.id, status, body)
		}
		unknown[g.id] = fmt.Sprintf("%d %s", status, body)
	}

	// The writers, until stop is closed.
	var mu sync.Mutex
	var attempts []outageWrite
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		rng := rand.New(rand.NewPCG(uint64(i), 21))
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := h.replicas[rng.IntN(len(h.replicas))]
				w := outageWrite{key: fmt.Sprintf("outage-w%d-%d", i, n), replica: r.name, sent: time.Now()}
				status, body, err := r.admin(context.Background(), "POST", "/api/keys", map[string]any{"key": w.key, "policies": []string{"q10"}})
				w.answer, w.status, w.body = time.Now(), status, string(body)
				if err != nil {
					w.body = err.Error()
				}
				if status == http.StatusCreated {
					var wr written
					if json.Unmarshal(body, &wr) == nil {
						w.rev = wr.Revision
					}
				}
				mu.Lock()
				attempts = append(attempts, w)
				mu.Unlock()
				if status != http.StatusCreated {
					time.Sleep(10 * time.Millisecond) // a client's pause between refused writes
				}
			}
		})
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriters()
	acked := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, w := range attempts {
			if w.status == http.StatusCreated {
				n++
			}
		}
		return n
	}
	waitFor(t, "50 keys created before the outage", syncTimeout, func() (bool, string) { return acked() >= 50, fmt.Sprint(acked()) })

	h.pg.StopImmediate()
	stopped := time.Now()
	t.Logf("PostgreSQL stopped (immediate) after %d keys created", acked())

	// The replicas say why they take no writes.
	for _, r := range h.replicas {
		waitFor(t, "replica "+r.name+"'s /readyz answering 503", syncTimeout, func() (bool, string) {
			resp, err := quick.Get("http://" + r.adminAddr + "/readyz")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == http.StatusServiceUnavailable {
				t.Logf("replica %s /readyz during the outage: 503 %s", r.name, b)
				return true, ""
			}
			return false, fmt.Sprintf("%d %s", resp.StatusCode, b)
		})
	}
	enforcing := func(when, key string, n, want int) {
		t.Helper()
		if c := send(t, dp.gws, "/echo/o", key, n, 2); c.admitted != want {
			t.Fatalf("%s in the outage: key %s admitted %d of %d, want exactly %d", when, key, c.admitted, n, want)
		}
		for _, g := range dp.gws {
			if status, body := sendOne(t, g, "/echo/o", "outage-never-created"); fmt.Sprintf("%d %s", status, body) != unknown[g.id] {
				t.Fatalf("%s in the outage: gateway %s answered a key never created %d %s, before the outage %s", when, g.id, status, body, unknown[g.id])
			}
			r, err := g.readyz()
			if err != nil {
				t.Fatal(err)
			}
			if !r.Ready || r.ControlPlane.State != "connected" {
				t.Errorf("%s in the outage: gateway %s /readyz ready %v state %q (%s), want ready and its stream open", when, g.id, r.Ready, r.ControlPlane.State, r.ControlPlane.LastError)
			}
		}
	}
	enforcing("early", "outage-a", 10, 6)
	time.Sleep(time.Until(stopped.Add(outage))) // the outage lasts this long, whatever happens
	enforcing("late", "outage-b", 12, 10)

	restarting := time.Now() // PostgreSQL accepts connections from some moment before Start returns
	h.pg.Start()
	back := time.Now()
	t.Logf("PostgreSQL started again after %v", back.Sub(stopped).Round(time.Millisecond))
	// A write through each replica, as soon as it succeeds.
	for _, r := range h.replicas {
		for n := 0; ; n++ {
			status, body, err := r.admin(context.Background(), "PUT", "/api/policies/probe-"+r.name, quotaPolicy("probe-"+r.name, int64(n+1)))
			if err == nil && status == http.StatusOK {
				took := time.Since(back)
				t.Logf("replica %s took a write %v after PostgreSQL accepted connections again", r.name, took.Round(time.Millisecond))
				if took > resume {
					t.Errorf("replica %s took its first write %v after PostgreSQL was back, want ≤ %v", r.name, took, resume)
				}
				break
			}
			if time.Since(back) > syncTimeout {
				t.Fatalf("replica %s takes no write %v after PostgreSQL is back: %d %s %v", r.name, syncTimeout, status, body, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The writers create a few more, then stop.
	before := acked()
	waitFor(t, "writers creating keys again", syncTimeout, func() (bool, string) { return acked() >= before+20, fmt.Sprint(acked() - before) })
	stopWriters()

	// What each attempt was answered.
	var during, refused, ackedN, lostN int
	var firstAfter time.Duration = -1
	var keys []outageWrite
	for _, w := range attempts {
		if w.status == http.StatusCreated {
			ackedN++
			keys = append(keys, w)
			if w.sent.After(back) && (firstAfter < 0 || w.answer.Sub(back) < firstAfter) {
				firstAfter = w.answer.Sub(back)
			}
		}
		if w.sent.After(stopped) && w.answer.Before(restarting) {
			during++
			if w.status != http.StatusServiceUnavailable {
				t.Errorf("write %s through %s during the outage answered %d %s, want 503", w.key, w.replica, w.status, w.body)
				continue
			}
			var e struct {
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(w.body), &e) != nil || e.Error == "" {
				t.Errorf("write %s through %s during the outage: 503 without an error message: %s", w.key, w.replica, w.body)
			}
			if refused == 0 {
				t.Logf("a write during the outage: 503 %s", w.body)
			}
			refused++
		} else if w.status != http.StatusCreated {
			lostN++ // around the stop or the start: not acknowledged, may or may not be made
		}
	}
	t.Logf("%d writes: %d acknowledged, %d sent during the outage (all answered 503: %v), %d unacknowledged around the stop or start; the writers' first acknowledged write after the start %v after it",
		len(attempts), ackedN, during, refused == during, lostN, firstAfter.Round(time.Millisecond))
	if during == 0 {
		t.Fatal("no write was sent during the outage")
	}

	// Nothing acknowledged lost.
	rev, _ := dbView(t, store, nil)
	by := checkGapless(t, store, rev)
	err := store.View(context.Background(), func(r controlplane.Reader) error {
		for _, w := range keys {
			hash := identity.HashKey(w.key).String()
			k, err := r.Key(hash)
			if err != nil {
				return err
			}
			if k == nil {
				t.Errorf("key %s, created through %s (201 at revision %d), is not in the database", w.key, w.replica, w.rev)
			}
			if !slices.ContainsFunc(by[w.rev], func(c controlplane.Change) bool { return c.Object == controlplane.ObjectKey && c.ID == hash }) {
				t.Errorf("key %s's creation is not in the change log at its revision %d", w.key, w.rev)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitApplied(t, rev, dp.gws...)
	checkGatewaysAt(t, store, rev, dp)
	last := keys[len(keys)-1].key
	for _, g := range dp.gws {
		if status, body := sendOne(t, g, "/echo/o", last); status != http.StatusOK {
			t.Errorf("gateway %s: key %s created after the outage answered %d %s", g.id, last, status, body)
		}
	}
	t.Logf("the database at revision %d holds all %d acknowledged keys, the change log has no gap; the gateways run it", rev, len(keys))
}
