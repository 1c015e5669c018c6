package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// unavailableMsg starts the error message of the admin API's 503 while
// the store's database is unavailable.
const unavailableMsg = "the control plane's database is unavailable; "

// The two endings of unavailableMsg: a write refused before its commit,
// and one whose connection was lost in the commit round trip
// (controlplane.ErrCommitUnknown), which may be on the database.
const (
	unchangedMsg = unavailableMsg + "nothing was changed"
	mayBeMadeMsg = unavailableMsg + "the change may have been made"
)

// keyWriters are writers creating keys through replicas picked at random
// (POST /api/keys, one attempt per key, no retry) until stop, each
// attempt recorded as an outageWrite (status 0 and the error in body for
// a transport error).
type keyWriters struct {
	h      *haCluster
	prefix string
	policy string

	mu       sync.Mutex
	attempts []outageWrite

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// startKeyWriters starts n writers of keys prefix-w<i>-<n> with policy;
// their stop is registered with t.Cleanup too.
func startKeyWriters(t testing.TB, h *haCluster, n int, prefix, policy string) *keyWriters {
	kw := &keyWriters{h: h, prefix: prefix, policy: policy, stop: make(chan struct{})}
	for i := range n {
		rng := rand.New(rand.NewPCG(uint64(i), 29))
		kw.wg.Go(func() { kw.run(i, rng) })
	}
	t.Cleanup(kw.halt)
	return kw
}

func (kw *keyWriters) run(i int, rng *rand.Rand) {
	for n := 0; ; n++ {
		select {
		case <-kw.stop:
			return
		default:
		}
		r := kw.h.replicas[rng.IntN(len(kw.h.replicas))]
		w := outageWrite{key: fmt.Sprintf("%s-w%d-%d", kw.prefix, i, n), replica: r.name, sent: time.Now()}
		status, body, err := r.admin(context.Background(), "POST", "/api/keys", map[string]any{"key": w.key, "policies": []string{kw.policy}})
		w.answer, w.status, w.body = time.Now(), status, string(body)
		if err != nil {
			w.status, w.body = 0, err.Error()
		}
		if w.status == http.StatusCreated {
			var wr written
			if json.Unmarshal(body, &wr) == nil {
				w.rev = wr.Revision
			}
		}
		kw.mu.Lock()
		kw.attempts = append(kw.attempts, w)
		kw.mu.Unlock()
		if w.status != http.StatusCreated {
			time.Sleep(10 * time.Millisecond) // a client's pause between refused writes
		}
	}
}

// halt stops the writers and waits for them; later calls do nothing.
func (kw *keyWriters) halt() { kw.once.Do(func() { close(kw.stop); kw.wg.Wait() }) }

// count returns how many attempts so far match.
func (kw *keyWriters) count(match func(outageWrite) bool) int {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	n := 0
	for _, w := range kw.attempts {
		if match(w) {
			n++
		}
	}
	return n
}

// refusedUnavailable reports whether w was answered the admin API's 503
// for an unavailable database, with its error message.
func refusedUnavailable(w outageWrite) bool {
	var e struct {
		Error string `json:"error"`
	}
	return w.status == http.StatusServiceUnavailable && json.Unmarshal([]byte(w.body), &e) == nil &&
		(strings.HasPrefix(e.Error, unchangedMsg) || strings.HasPrefix(e.Error, mayBeMadeMsg))
}

// mayBeMade reports whether w was answered the 503 of a write whose
// commit's answer was lost.
func mayBeMade(w outageWrite) bool {
	var e struct {
		Error string `json:"error"`
	}
	return w.status == http.StatusServiceUnavailable && json.Unmarshal([]byte(w.body), &e) == nil && strings.HasPrefix(e.Error, mayBeMadeMsg)
}

// replicaReadyz returns a replica's GET /readyz status and body.
func replicaReadyz(r *replica) (int, string) {
	resp, err := quick.Get("http://" + r.adminAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// listenConns counts the control plane's LISTEN connections on the
// server at connString (listening, not connecting).
func listenConns(t testing.TB, connString string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("connect to %s: %v", connString, err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'limitplane-controlplane-listen' AND query = 'LISTEN limitplane_revision'").Scan(&n); err != nil {
		t.Fatalf("count LISTEN connections: %v", err)
	}
	return n
}

// TestHAPromotedStandby runs three replicas (the built binary) on a
// PostgreSQL primary with a synchronous streaming standby, their -store
// URL listing both with target_session_attrs=read-write, and one data
// plane of one gateway given all three. 4 writers create keys through
// replicas picked at random (one attempt each) while the primary is
// stopped at once (pg_ctl stop -m immediate) and, once writes have been
// refused for a while, the standby promoted; no replica is restarted.
//   - every write sent after the stop returned and answered before the
//     promotion began is answered 503 with the unavailable-database
//     message, and its key is not on the new primary; every write not
//     acknowledged, at any time, was answered that 503 (no transport
//     error, no other status); every replica's /readyz answers 503 in the
//     gap, and the gateway keeps enforcing (a key with a quota of 10
//     admits exactly 10 of 12);
//   - each replica takes a write (a probe) within promoteResume of the
//     promoted standby accepting writes, its LISTEN connection is on the
//     new primary, its /readyz answers 200, and the writers' writes
//     succeed again;
//   - on the new primary: every key acknowledged (201) is there, its
//     creation in the change log at the answered revision; the log runs
//     1…R without a gap; R is the setup's revision plus one per key there
//     plus one per probe, and the keys there are the setup's plus those
//     created by the writers (acknowledged, or unacknowledged around the
//     stop, committed with the answer lost); the gateway runs R with the new
//     primary's digest; and a key created after the promotion with a
//     quota of 5 admits exactly 5 of 8 there.
func TestHAPromotedStandby(t *testing.T) {
	t.Parallel()
	const replicas, writers, promoteResume = 3, 4, 10 * time.Second
	tk := dpToken{group: "dp1", tags: []string{"dp1"}, token: "ha-promote-token"}
	primary := pgtest.Start(t, pgtest.Options{})
	standby := primary.StartStandby(t, pgtest.StandbyOptions{Synchronous: true})
	h := startHAOn(t, primary, pgtest.MultiHostConnString(primary, standby), replicas, []dpToken{tk}, cpOptions{})
	dp := startHADataPlane(t, h.syncAddrs(), tk, 1)
	gw := dp.gws[0]
	cp := h.replicas[0]
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	h.replicas[1].putPolicy(t, quotaPolicy("q10", 10))
	h.replicas[2].putPolicy(t, quotaPolicy("q5", 5))
	_, setup := cp.postKey(t, "promote-gap", spec.Key{Policies: []string{"q10"}})
	const setupKeys = 1
	waitApplied(t, setup, gw)

	kw := startKeyWriters(t, h, writers, "promote", "q10")
	acked := func(w outageWrite) bool { return w.status == http.StatusCreated }
	waitFor(t, "50 keys created before the stop", syncTimeout, func() (bool, string) { n := kw.count(acked); return n >= 50, fmt.Sprint(n) })

	stopping := time.Now()
	primary.StopImmediate()
	stopped := time.Now()
	t.Logf("primary stopped (immediate) in %v after %d keys created", stopped.Sub(stopping).Round(time.Millisecond), kw.count(acked))
	for _, r := range h.replicas {
		waitFor(t, "replica "+r.name+"'s /readyz answering 503", syncTimeout, func() (bool, string) {
			status, body := replicaReadyz(r)
			return status == http.StatusServiceUnavailable, fmt.Sprintf("%d %s", status, body)
		})
	}
	if c := send(t, dp.gws, "/echo/p", "promote-gap", 12, 2); c.admitted != 10 || c.denied != 2 {
		t.Fatalf("in the gap: key promote-gap admitted %d and denied %d of 12, want exactly 10 and 2", c.admitted, c.denied)
	}
	inGap := func(w outageWrite) bool { return w.sent.After(stopped) }
	waitFor(t, "20 writes refused with the primary down", syncTimeout, func() (bool, string) {
		n := kw.count(func(w outageWrite) bool { return inGap(w) && refusedUnavailable(w) })
		return n >= 20, fmt.Sprint(n)
	})

	promoting := time.Now()
	standby.Promote()
	promoted := time.Now()
	t.Logf("standby promoted: pg_ctl promote took %v, %v after the stop", promoted.Sub(promoting).Round(time.Millisecond), promoted.Sub(stopped).Round(time.Millisecond))

	// A write through each replica, as soon as it succeeds, all at once.
	took := make([]time.Duration, len(h.replicas))
	probeErrs := make([]error, len(h.replicas))
	var wg sync.WaitGroup
	for i, r := range h.replicas {
		wg.Go(func() {
			for n := 0; ; n++ {
				status, body, err := r.admin(context.Background(), "PUT", "/api/policies/probe-"+r.name, quotaPolicy("probe-"+r.name, int64(n+1)))
				if err == nil && status == http.StatusOK {
					took[i] = time.Since(promoted)
					return
				}
				if w := (outageWrite{status: status, body: string(body)}); err != nil || !refusedUnavailable(w) {
					probeErrs[i] = fmt.Errorf("replica %s: probe write after the promotion answered %d %s (%v), want 200 or the unavailable 503", r.name, status, body, err)
					return
				}
				if time.Since(promoted) > syncTimeout {
					probeErrs[i] = fmt.Errorf("replica %s takes no write %v after the promotion: %d %s", r.name, syncTimeout, status, body)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for i, err := range probeErrs {
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("replica %s took a write %v after the promoted standby accepted writes (%v after pg_ctl promote began)", h.replicas[i].name, took[i].Round(time.Millisecond), (took[i] + promoted.Sub(promoting)).Round(time.Millisecond))
		if took[i] > promoteResume {
			t.Errorf("replica %s took its first write %v after the promotion, want ≤ %v", h.replicas[i].name, took[i], promoteResume)
		}
	}
	afterPromotion := func(w outageWrite) bool { return acked(w) && w.sent.After(promoted) }
	waitFor(t, "50 keys created after the promotion", syncTimeout, func() (bool, string) {
		n := kw.count(afterPromotion)
		return n >= 50, fmt.Sprint(n)
	})
	kw.halt()
	// /readyz reuses its answer for a second (controlplane.HealthOptions.CacheFor).
	for _, r := range h.replicas {
		waitFor(t, "replica "+r.name+"'s /readyz answering 200 after the promotion", syncTimeout, func() (bool, string) {
			status, body := replicaReadyz(r)
			return status == http.StatusOK, fmt.Sprintf("%d %s", status, body)
		})
	}
	waitFor(t, "every replica's LISTEN connection on the new primary", syncTimeout, func() (bool, string) {
		n := listenConns(t, standby.ConnString())
		return n == replicas, fmt.Sprint(n)
	})

	// What each attempt was answered.
	var nAcked, gap, around, aroundPromotion, transport int
	firstAfter := time.Duration(-1)
	for _, w := range kw.attempts {
		switch {
		case acked(w):
			nAcked++
			if w.sent.After(stopped) && w.answer.Before(promoting) {
				t.Errorf("key %s created through %s (201 at revision %d) while the primary was down and the standby not promoted", w.key, w.replica, w.rev)
			}
			if w.sent.After(promoted) && (firstAfter < 0 || w.answer.Sub(promoted) < firstAfter) {
				firstAfter = w.answer.Sub(promoted)
			}
			continue
		case w.status == 0:
			transport++
			t.Errorf("write %s through %s: transport error %s (no replica was stopped)", w.key, w.replica, w.body)
			continue
		case !refusedUnavailable(w):
			t.Errorf("write %s through %s answered %d %s, want 201 or 503 %q", w.key, w.replica, w.status, w.body, unavailableMsg)
			continue
		}
		switch {
		case w.answer.Before(stopping):
			t.Errorf("write %s through %s answered %d %s before the primary was stopped", w.key, w.replica, w.status, w.body)
		case w.sent.After(stopped) && w.answer.Before(promoting):
			gap++
		case w.answer.After(promoting):
			aroundPromotion++
		default:
			around++
		}
	}
	t.Logf("%d writes: %d acknowledged (201); answered 503: %d in the gap (sent after the stop, answered before the promotion), %d around the stop, %d around the promotion; %d transport errors; the writers' first acknowledged write sent after the promotion answered %v after it",
		len(kw.attempts), nAcked, gap, around, aroundPromotion, transport, firstAfter.Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}

	// The new primary holds every acknowledged write, no write refused
	// in the gap, and a change log without gap.
	store := openStoreAt(t, standby.ConnString())
	rev, _ := dbView(t, store, nil)
	by := checkGapless(t, store, rev)
	var present, unackedPresent int
	err := store.View(context.Background(), func(r controlplane.Reader) error {
		for _, w := range kw.attempts {
			hash := identity.HashKey(w.key).String()
			k, err := r.Key(hash)
			if err != nil {
				return err
			}
			if k != nil {
				present++
			}
			switch {
			case acked(w):
				if k == nil {
					t.Errorf("key %s, created through %s (201 at revision %d), is not on the new primary", w.key, w.replica, w.rev)
				}
				if !slices.ContainsFunc(by[w.rev], func(c controlplane.Change) bool {
					return c.Object == controlplane.ObjectKey && c.ID == hash && c.Op == controlplane.OpPut
				}) {
					t.Errorf("key %s's creation is not in the change log at its revision %d: %+v", w.key, w.rev, by[w.rev])
				}
			case k != nil && w.sent.After(stopped) && w.answer.Before(promoting):
				t.Errorf("key %s, refused through %s in the gap (%d %s), is on the new primary", w.key, w.replica, w.status, w.body)
			case k != nil && !(w.sent.Before(stopped) && w.answer.After(stopping)):
				t.Errorf("key %s, answered %d through %s (sent %v after the stop began, answered %v after it), is on the new primary: only a write in flight at the stop may be there unacknowledged",
					w.key, w.status, w.replica, w.sent.Sub(stopping), w.answer.Sub(stopping))
			case k != nil && !mayBeMade(w):
				t.Errorf("key %s, answered %d %s through %s, is on the new primary: a write that may have been made must say so (%q)", w.key, w.status, w.body, w.replica, mayBeMadeMsg)
			case k != nil:
				unackedPresent++ // committed, its answer lost with the primary
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := store.Snapshot(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := setup + uint64(present) + replicas; rev != want {
		t.Errorf("the new primary is at revision %d, want %d (setup %d + %d keys there + %d probes)", rev, want, setup, present, replicas)
	}
	if len(snap.Keys) != setupKeys+present {
		t.Errorf("%d keys on the new primary, want %d (%d of the setup + %d of the writers there)", len(snap.Keys), setupKeys+present, setupKeys, present)
	}
	t.Logf("the new primary at revision %d holds all %d acknowledged keys and %d unacknowledged (in flight at the stop, answered 503), none refused in the gap; the change log runs 1…%d without a gap",
		rev, nAcked, unackedPresent, rev)

	// The gateway runs the new primary's configuration and enforces a key
	// created after the promotion.
	waitApplied(t, rev, gw)
	checkGatewaysAt(t, store, rev, dp)
	_, keyRev := h.replicas[1].postKey(t, "promote-after", spec.Key{Policies: []string{"q5"}})
	if keyRev != rev+1 {
		t.Fatalf("key promote-after created at revision %d, want %d", keyRev, rev+1)
	}
	waitApplied(t, keyRev, gw)
	checkGatewaysAt(t, store, keyRev, dp)
	if c := send(t, dp.gws, "/echo/p", "promote-after", 8, 2); c.admitted != 5 || c.denied != 3 {
		t.Fatalf("key promote-after, created after the promotion: admitted %d and denied %d of 8, want exactly 5 and 3", c.admitted, c.denied)
	}
	r, err := gw.readyz()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gateway %s at revision %d on %s, %d reconnects, deliveries %+v", gw.id, keyRev, replicaOf(gw), r.ControlPlane.Reconnects, r.ControlPlane.Deliveries)
}
