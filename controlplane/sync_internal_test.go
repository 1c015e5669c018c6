package controlplane

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// randomWriter makes random writes over a small universe of policies,
// keys and APIs, so that objects are created, replaced and deleted often
// and APIs gain and lose tags. Some writes are refused by validation (a
// delete of an API still referred to); they change nothing.
type randomWriter struct {
	rng *rand.Rand
}

var randomTags = []string{"eu", "us", "asia"}

func (w *randomWriter) subset(ids []string, p float64) []string {
	var out []string
	for _, id := range ids {
		if w.rng.Float64() < p {
			out = append(out, id)
		}
	}
	return out
}

func ids[T any](objs []T, id func(T) string) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = id(o)
	}
	return out
}

// write runs one Update of one to three random objects. It reports
// whether the write was accepted.
func (w *randomWriter) write(ctx context.Context, s Store) (bool, error) {
	n := 1 + w.rng.IntN(3)
	if w.rng.IntN(4) == 0 {
		n = 1
	}
	// Decided outside the transaction: fn may run more than once and must
	// draw the same choices.
	seed := w.rng.Uint64()
	_, err := s.Update(ctx, func(tx Tx) error {
		rng := rand.New(rand.NewPCG(seed, 7))
		ww := &randomWriter{rng: rng}
		for range n {
			if err := ww.one(tx); err != nil {
				return err
			}
		}
		return nil
	})
	var errs spec.Errors
	if errors.As(err, &errs) {
		return false, nil
	}
	return err == nil, err
}

func (w *randomWriter) one(tx Tx) error {
	pols, err := tx.Policies()
	if err != nil {
		return err
	}
	apis, err := tx.APIs()
	if err != nil {
		return err
	}
	polIDs := ids(pols, func(p spec.Policy) string { return p.ID })
	apiIDs := ids(apis, func(a spec.API) string { return a.ID })
	switch r := w.rng.IntN(20); {
	case r < 2: // an API
		id := fmt.Sprintf("a%d", w.rng.IntN(5))
		if w.rng.IntN(4) == 0 {
			_, err := tx.DeleteAPI(id)
			return err
		}
		return tx.PutAPI(spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Tags: w.subset(randomTags, 0.3)})
	case r < 4: // a policy
		id := fmt.Sprintf("p%d", w.rng.IntN(4))
		if w.rng.IntN(5) == 0 {
			_, err := tx.DeletePolicy(id)
			return err
		}
		p := spec.Policy{ID: id, Rate: &spec.Rate{Requests: 1 + w.rng.Int64N(100), Per: spec.Duration(time.Minute)}}
		if w.rng.IntN(2) == 0 {
			p.APIs = w.subset(apiIDs, 0.4)
		}
		return tx.PutPolicy(p)
	default: // a key
		h := identity.HashKey(fmt.Sprintf("k%d", w.rng.IntN(25))).String()
		if w.rng.IntN(4) == 0 {
			_, err := tx.DeleteKey(h)
			return err
		}
		k := spec.Key{KeyHash: h, Policies: w.subset(polIDs, 0.3), QuotaEpoch: w.rng.Uint64N(3)}
		for _, a := range w.subset(apiIDs, 0.3) {
			if k.APILimits == nil {
				k.APILimits = map[string]spec.Limits{}
			}
			k.APILimits[a] = spec.Limits{Rate: &spec.Rate{Requests: 1 + w.rng.Int64N(9), Per: spec.Duration(time.Second)}}
		}
		if len(k.Policies) == 0 && len(k.APILimits) == 0 && len(polIDs) > 0 {
			k.Policies = polIDs[:1]
		}
		return tx.PutKey(k)
	}
}

// canonical is a snapshot's JSON with its lists in ID order: what a
// gateway enforces does not depend on their order (and the digest does
// not either), and ApplyChanges appends what is new.
func canonical(t *testing.T, s *spec.Snapshot) string {
	t.Helper()
	c := *s
	c.Policies = slices.SortedFunc(slices.Values(s.Policies), func(a, b spec.Policy) int { return cmp.Compare(a.ID, b.ID) })
	c.Keys = slices.SortedFunc(slices.Values(s.Keys), func(a, b spec.Key) int { return cmp.Compare(a.KeyHash, b.KeyHash) })
	c.APIs = slices.SortedFunc(slices.Values(s.APIs), func(a, b spec.API) int { return cmp.Compare(a.ID, b.ID) })
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var randomTagSets = [][]string{nil, {"eu"}, {"us"}, {"eu", "us"}, {"asia", "eu", "us"}}

// follower is a data plane with some tags as planChanges sees it: the
// view the control plane believes it has, and what it would run.
type follower struct {
	tags []string
	base view
	runs *spec.Snapshot
}

// tally counts what the planner did, so the test can tell that every
// path was taken.
type tally struct {
	changes, snapshots, upToDate int
	structural, filtered, empty  int
	puts, deletes, identities    int
}

// step brings f to the store's revision as a stream would and checks the
// result against Select of the state; exact says no write may run
// meanwhile, so the result must equal the store's snapshot now.
func step(t *testing.T, ctx context.Context, srv *SyncServer, store Store, f *follower, tl *tally, forget bool, exact bool) {
	t.Helper()
	if forget {
		f.base.filter = nil // as after a snapshot read while the state moved
	}
	ch, next, why, err := srv.planChanges(ctx, f.tags, f.base)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case why != "":
		snap, v, err := srv.snapshotView(ctx, f.tags)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := v.digest.Digest(), protocol.Digest(snap); got != want {
			t.Fatalf("snapshot view digest %s, want %s", got, want)
		}
		f.base, f.runs = v, snap
		tl.snapshots++
	case ch == nil:
		if next.revision != f.base.revision || next.digest != f.base.digest || next.filter == nil {
			t.Fatalf("up to date at %d: the view changed to %d", f.base.revision, next.revision)
		}
		f.base = next
		tl.upToDate++
	default:
		applied, err := protocol.ApplyChanges(f.runs, ch)
		if err != nil {
			t.Fatalf("tags %q: ApplyChanges %d→%d: %v", f.tags, ch.FromRevision, ch.Revision, err)
		}
		if got := protocol.Digest(applied); got != ch.Digest || got != next.digest.Digest() || next.revision != ch.Revision {
			t.Fatalf("tags %q: changes %d→%d: digest of the result %s, Changes.digest %s, view %s at %d",
				f.tags, ch.FromRevision, ch.Revision, got, ch.Digest, next.digest.Digest(), next.revision)
		}
		tl.changes++
		if next.filter.identity {
			tl.identities++
		} else {
			tl.filtered++
		}
		if len(ch.Changes) == 0 {
			tl.empty++
		}
		for _, c := range ch.Changes {
			if c.Object != syncpb.Change_OBJECT_KEY {
				tl.structural++
			} else if c.Kind == syncpb.Change_KIND_PUT {
				tl.puts++
			} else {
				tl.deletes++
			}
		}
		f.base, f.runs = next, applied
	}
	if !exact {
		return
	}
	want, err := store.Snapshot(ctx, f.tags)
	if err != nil {
		t.Fatal(err)
	}
	if f.runs.Revision != want.Revision {
		t.Fatalf("tags %q: at revision %d, the store is at %d", f.tags, f.runs.Revision, want.Revision)
	}
	if got, w := canonical(t, f.runs), canonical(t, want); got != w {
		t.Fatalf("tags %q at revision %d:\n got %s\nwant %s", f.tags, want.Revision, got, w)
	}
	if got, w := protocol.Digest(f.runs), protocol.Digest(want); got != w {
		t.Fatalf("tags %q: digest %s, want %s", f.tags, got, w)
	}
}

func newTestSyncServer(t *testing.T, o SyncOptions) (*SyncServer, *Bolt) {
	t.Helper()
	store, err := OpenBolt(filepath.Join(t.TempDir(), "cp.db"), BoltOptions{BatchDelay: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	o.Store = store
	o.Tokens = []DataPlaneToken{{Hash: HashToken("t"), Group: "g"}}
	srv, err := NewSyncServer(o)
	if err != nil {
		t.Fatal(err)
	}
	return srv, store
}

// TestPlanChangesMatchesSelect: over random sequences of writes (seeded),
// for several tag sets, the Changes the sync server plans, applied with
// protocol.ApplyChanges to what each data plane runs, give exactly Select
// of the new state (lists compared in ID order), with equal digests, and
// Changes.digest is that digest. Data planes catch up after one to four
// writes, so Changes span several revisions; sometimes a data plane's
// rule is forgotten, as after a snapshot read while the state moved.
func TestPlanChangesMatchesSelect(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var total tally
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		t.Logf("%+v", total)
		// Every path was taken, many times. Empty Changes are those whose
		// key changes all map to nothing in a filtered view.
		for name, n := range map[string]int{
			"changes": total.changes, "snapshots": total.snapshots, "up to date": total.upToDate,
			"policy or API changes": total.structural, "changes in a filtered view": total.filtered,
			"changes in the identity": total.identities, "empty changes": total.empty,
			"key puts": total.puts, "key deletes": total.deletes,
		} {
			if n < 20 {
				t.Errorf("%s: %d times, want at least 20", name, n)
			}
		}
	})
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			var tl tally
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				total.changes += tl.changes
				total.snapshots += tl.snapshots
				total.upToDate += tl.upToDate
				total.structural += tl.structural
				total.filtered += tl.filtered
				total.empty += tl.empty
				total.puts += tl.puts
				total.deletes += tl.deletes
				total.identities += tl.identities
			}()
			planRandomly(t, ctx, seed, &tl)
		})
	}
}

func planRandomly(t *testing.T, ctx context.Context, seed uint64, total *tally) {
	{
		srv, store := newTestSyncServer(t, SyncOptions{MaxChanges: 25})
		w := &randomWriter{rng: rand.New(rand.NewPCG(seed, 1))}
		var fs []*follower
		for _, tags := range randomTagSets {
			snap, v, err := srv.snapshotView(ctx, tags)
			if err != nil {
				t.Fatal(err)
			}
			fs = append(fs, &follower{tags: tags, base: v, runs: snap})
		}
		accepted := 0
		for range 150 {
			ok, err := w.write(ctx, store)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				accepted++
			}
			for _, f := range fs {
				if w.rng.IntN(3) == 0 {
					step(t, ctx, srv, store, f, total, w.rng.IntN(8) == 0, true)
				}
			}
		}
		for _, f := range fs {
			step(t, ctx, srv, store, f, total, false, true)
		}
		if accepted < 75 {
			t.Fatalf("seed %d: %d of 150 writes accepted; the generator makes too many invalid ones", seed, accepted)
		}
	}
}

// TestPlanChangesWhileWriting: with writes running all along, every
// Changes planned applies to what the data plane runs and carries the
// digest of the result (the change log and the state are read at one
// revision), and once the writes stop, one more round brings every data
// plane exactly to Select of the final state.
func TestPlanChangesWhileWriting(t *testing.T) {
	ctx := context.Background()
	srv, store := newTestSyncServer(t, SyncOptions{})
	var fs []*follower
	for _, tags := range randomTagSets {
		snap, v, err := srv.snapshotView(ctx, tags)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, &follower{tags: tags, base: v, runs: snap})
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			w := &randomWriter{rng: rand.New(rand.NewPCG(uint64(g), 2))}
			for range 300 {
				if _, err := w.write(ctx, store); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	var tl tally
	rng := rand.New(rand.NewPCG(9, 9))
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		for _, f := range fs {
			step(t, ctx, srv, store, f, &tl, rng.IntN(8) == 0, false)
		}
	}
	for _, f := range fs {
		step(t, ctx, srv, store, f, &tl, false, true)
	}
	if tl.changes < 50 {
		t.Fatalf("%d Changes planned while writing, want many: %+v", tl.changes, tl)
	}
	t.Logf("%+v", tl)
}
