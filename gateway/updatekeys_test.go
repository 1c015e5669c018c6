package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// perHour is a quota of n requests an hour.
func perHour(n int64) *spec.Quota { return &spec.Quota{Max: n, Renewal: spec.Duration(time.Hour)} }

// keyStatuses sends n requests with key to /api/x and returns their statuses.
func keyStatuses(t *testing.T, g *testGateway, key string, n int) []int {
	t.Helper()
	var s []int
	for range n {
		s = append(s, g.mustGet(t, "/api/x", key).status)
	}
	return s
}

// updateKeys calls UpdateKeys or fails the test.
func (g *testGateway) updateKeys(t *testing.T, rev uint64, put []spec.Key, del []string) {
	t.Helper()
	if err := g.gw.UpdateKeys(context.Background(), rev, put, del); err != nil {
		t.Fatalf("UpdateKeys(%d): %v", rev, err)
	}
}

// TestUpdateKeysPutAndDelete: a key put by UpdateKeys is admitted on the
// next request; a deleted key is refused exactly as a key never known
// (403, same body); the revision is raised.
func TestUpdateKeysPutAndDelete(t *testing.T) {
	g := newTestGateway(t)
	g.apply(t, basic(1, spec.BuiltinEcho, nil, perHour(100)))
	unknown := g.mustGet(t, "/api/x", "never-known")
	if unknown.status != 403 {
		t.Fatalf("unknown key: %d", unknown.status)
	}
	checkStatuses(t, "k2 before", keyStatuses(t, g, "k2", 1), []int{403})

	g.updateKeys(t, 2, []spec.Key{{KeyHash: keyHash("k2"), Policies: []string{"p"}}}, nil)
	checkStatuses(t, "k2 put", keyStatuses(t, g, "k2", 2), []int{200, 200})
	checkStatuses(t, "k1 kept", keyStatuses(t, g, "k1", 1), []int{200})

	g.updateKeys(t, 3, nil, []string{keyHash("k1")})
	a := g.mustGet(t, "/api/x", "k1")
	if a.status != unknown.status || a.body != unknown.body {
		t.Errorf("deleted k1: %d %q, want as an unknown key: %d %q", a.status, a.body, unknown.status, unknown.body)
	}
	checkStatuses(t, "k2 after the delete", keyStatuses(t, g, "k2", 1), []int{200})
	if g.gw.Revision() != 3 || g.gw.Snapshot().Revision != 3 {
		t.Errorf("Revision %d, Snapshot().Revision %d; want 3", g.gw.Revision(), g.gw.Snapshot().Revision)
	}
}

// TestUpdateKeysChangesPolicyKeepsCounters moves a key from a policy with
// a quota of 3 an hour to one of 5 an hour after it spent 2: its next
// request meets the new quota with the 2 kept (3 more pass), and its
// RateLimit-Policy field names the new policy.
func TestUpdateKeysChangesPolicyKeepsCounters(t *testing.T) {
	g := newTestGateway(t)
	snap := basic(1, spec.BuiltinEcho, nil, perHour(3))
	snap.Policies = append(snap.Policies, spec.Policy{ID: "gold", Quota: perHour(5)})
	g.apply(t, snap)
	checkStatuses(t, "under p", keyStatuses(t, g, "k1", 2), []int{200, 200})

	g.updateKeys(t, 2, []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"gold"}}}, nil)
	a := g.mustGet(t, "/api/x", "k1")
	if got, want := a.header.Get("RateLimit-Policy"), `"gold/quota";q=5;w=3600`; a.status != 200 || got != want {
		t.Errorf("first under gold: %d, RateLimit-Policy %q; want 200, %q", a.status, got, want)
	}
	checkStatuses(t, "under gold", keyStatuses(t, g, "k1", 3), []int{200, 200, 429})
}

// TestUpdateKeysRefusesInvalidWhole: one invalid put (an unknown policy)
// and one malformed delete refuse the whole call, with every problem at
// its path; neither the valid put nor the delete took effect, and the
// revision stays.
func TestUpdateKeysRefusesInvalidWhole(t *testing.T) {
	g := newTestGateway(t)
	g.apply(t, basic(1, spec.BuiltinEcho, nil, perHour(100)))
	err := g.gw.UpdateKeys(context.Background(), 2, []spec.Key{
		{KeyHash: keyHash("k2"), Policies: []string{"p"}},
		{KeyHash: keyHash("k3"), Policies: []string{"gold"}},
	}, []string{keyHash("k1"), "sha256:xyz"})
	var errs spec.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("UpdateKeys = %v, want spec.Errors", err)
	}
	want := "spec: put[1].policies[0]: unknown policy \"gold\"\nspec: delete[1]: \"sha256:xyz\" is not sha256:<64 hex digits>"
	if err.Error() != want {
		t.Errorf("UpdateKeys =\n%v\nwant\n%s", err, want)
	}
	checkStatuses(t, "k2 not put", keyStatuses(t, g, "k2", 1), []int{403})
	checkStatuses(t, "k1 not deleted", keyStatuses(t, g, "k1", 1), []int{200})
	if g.gw.Revision() != 1 || g.gw.Snapshot().Revision != 1 {
		t.Errorf("revision %d, want 1", g.gw.Revision())
	}
	// Drift: the delete of a key not held refuses the call too.
	err = g.gw.UpdateKeys(context.Background(), 2, []spec.Key{{KeyHash: keyHash("k2"), Policies: []string{"p"}}}, []string{keyHash("k9")})
	if !errors.Is(err, identity.ErrUnknownKey) {
		t.Errorf("delete of an unknown key: %v, want identity.ErrUnknownKey", err)
	}
	checkStatuses(t, "k2 still not put", keyStatuses(t, g, "k2", 1), []int{403})
}

// TestUpdateKeysRefusesStaleRevision: a revision equal to or below the
// running one is refused with ErrStaleRevision and changes nothing; after
// an UpdateKeys to 6, an Apply of revision 5 is stale too.
func TestUpdateKeysRefusesStaleRevision(t *testing.T) {
	g := newTestGateway(t)
	if err := g.gw.UpdateKeys(context.Background(), 1, nil, nil); !errors.Is(err, gateway.ErrNotApplied) {
		t.Errorf("UpdateKeys before Apply: %v, want ErrNotApplied", err)
	}
	g.apply(t, basic(5, spec.BuiltinEcho, nil, perHour(100)))
	put := []spec.Key{{KeyHash: keyHash("k2"), Policies: []string{"p"}}}
	for _, rev := range []uint64{5, 4, 0} {
		err := g.gw.UpdateKeys(context.Background(), rev, put, nil)
		if want := fmt.Sprintf("live: snapshot revision is older than the running one (%d <= 5)", rev); !errors.Is(err, gateway.ErrStaleRevision) || err.Error() != want {
			t.Errorf("UpdateKeys(%d) = %v, want %s", rev, err, want)
		}
	}
	checkStatuses(t, "k2 not put", keyStatuses(t, g, "k2", 1), []int{403})
	g.updateKeys(t, 6, put, nil)
	if err := g.gw.Apply(context.Background(), basic(5, spec.BuiltinEcho, nil, perHour(100))); !errors.Is(err, gateway.ErrStaleRevision) {
		t.Errorf("Apply(5) after UpdateKeys(6) = %v, want ErrStaleRevision", err)
	}
	checkStatuses(t, "k2 put", keyStatuses(t, g, "k2", 1), []int{200})
}

// TestUpdateKeysDuringRequests sends 400 requests with a key that never
// changes, from 8 goroutines, while 1,000 UpdateKeys calls add, change and
// delete other keys (run with -race): its quota of 300 admits exactly 300,
// and every other request is a 429 (never a 403 from a torn registry).
func TestUpdateKeysDuringRequests(t *testing.T) {
	g := newTestGateway(t)
	snap := basic(1, spec.BuiltinEcho, nil, perHour(300))
	snap.Policies = append(snap.Policies, spec.Policy{ID: "gold", Quota: perHour(1000)})
	g.apply(t, snap)

	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]int{}
	for range 8 {
		wg.Go(func() {
			for range 50 {
				a, err := g.get("/api/x", "k1")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[a.status]++
				mu.Unlock()
			}
		})
	}
	for i := range 1_000 {
		rev := uint64(i + 2)
		var put []spec.Key
		var del []string
		switch k := "churn" + strconv.Itoa(i/3); i % 3 {
		case 0:
			put = []spec.Key{{KeyHash: keyHash(k), Policies: []string{"p"}}}
		case 1:
			put = []spec.Key{{KeyHash: keyHash(k), Policies: []string{"gold"}}}
		case 2:
			del = []string{keyHash(k)}
		}
		g.updateKeys(t, rev, put, del)
	}
	wg.Wait()
	if want := map[int]int{200: 300, 429: 100}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if n := len(g.gw.Snapshot().Keys); n != 2 { // k1 and churn333, put last
		t.Errorf("%d keys held, want 2", n)
	}
}

// TestUpdateKeysSnapshot: after UpdateKeys, Snapshot is the snapshot
// protocol.ApplyChanges makes of the applied one with the same changes
// (same keys in the same order, revision raised, policies and APIs as
// applied), made once per change; applying that snapshot in full then
// gives the same behaviour.
func TestUpdateKeysSnapshot(t *testing.T) {
	g := newTestGateway(t)
	base := basic(1, spec.BuiltinEcho, nil, perHour(2))
	base.Policies = append(base.Policies, spec.Policy{ID: "gold", Quota: perHour(4)})
	base.Keys = []spec.Key{
		{KeyHash: keyHash("a"), Policies: []string{"p"}},
		{KeyHash: keyHash("b"), Policies: []string{"p"}},
		{KeyHash: keyHash("c"), Policies: []string{"p"}},
	}
	g.apply(t, base)
	if g.gw.Snapshot() != base {
		t.Fatal("Snapshot is not the applied snapshot")
	}
	// The changes as a control plane sends them, and as the data-plane
	// agent decodes them for UpdateKeys.
	expires := epoch.Add(time.Hour)
	ch := &syncpb.Changes{FromRevision: 1, Revision: 2}
	for _, k := range []spec.Key{
		{KeyHash: keyHash("d"), Policies: []string{"gold"}, Expires: &expires},
		{KeyHash: keyHash("b"), Policies: []string{"gold"}},
	} {
		c, err := protocol.PutKey(&k)
		if err != nil {
			t.Fatal(err)
		}
		ch.Changes = append(ch.Changes, c)
	}
	ch.Changes = append(ch.Changes, protocol.Delete(syncpb.Change_OBJECT_KEY, keyHash("a")))
	decoded, err := protocol.DecodeChanges(ch)
	if err != nil {
		t.Fatal(err)
	}
	var put []spec.Key
	var del []string
	for _, c := range decoded {
		if c.Kind == syncpb.Change_KIND_PUT {
			put = append(put, *c.Key)
		} else {
			del = append(del, c.ID)
		}
	}
	g.updateKeys(t, 2, put, del)
	want, err := protocol.ApplyChanges(base, ch)
	if err != nil {
		t.Fatal(err)
	}
	got := g.gw.Snapshot()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Snapshot after UpdateKeys:\n%+v\nwant\n%+v", got, want)
	}
	if g.gw.Snapshot() != got {
		t.Error("a second Snapshot made the snapshot again")
	}
	if protocol.Digest(got) != protocol.Digest(want) {
		t.Error("digests differ")
	}

	behaviour := func(what string) {
		t.Helper()
		checkStatuses(t, what+": a", keyStatuses(t, g, "a", 1), []int{403})
		checkStatuses(t, what+": b", keyStatuses(t, g, "b", 1), []int{200})
		checkStatuses(t, what+": c", keyStatuses(t, g, "c", 1), []int{200})
		checkStatuses(t, what+": d", keyStatuses(t, g, "d", 1), []int{200})
	}
	behaviour("after UpdateKeys")
	g.apply(t, want)
	if g.gw.Snapshot() != want {
		t.Error("Snapshot after the full Apply is not the applied snapshot")
	}
	behaviour("after the full Apply")
	// b (gold, 4 an hour) and c (p, 2 an hour) kept their counts.
	checkStatuses(t, "b", keyStatuses(t, g, "b", 3), []int{200, 200, 429})
	checkStatuses(t, "c", keyStatuses(t, g, "c", 1), []int{429})
}
