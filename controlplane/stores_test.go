package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// storeCase is one Store implementation the conformance suite runs
// against: every test of this file's suite runs once per case, as a
// subtest named after it.
type storeCase struct {
	name string
	// open returns a new, empty store whose change log keeps logRevs
	// revisions (0: the default), closed at the end of the test, and a
	// function that opens another store on its state (after the first is
	// closed: a restart), closed at the end too.
	open func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store)
}

// storeCases are Bolt, on a file in a temporary directory, and Postgres,
// on a server of its own (pgtest).
var storeCases = []storeCase{
	{"bolt", func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store) {
		path := filepath.Join(t.TempDir(), "cp.db")
		o := controlplane.BoltOptions{ChangeLogRevisions: logRevs}
		open := func() controlplane.Store {
			t.Helper()
			s, err := controlplane.OpenBolt(path, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(), open
	}},
	{"postgres", func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store) {
		srv := pgtest.Start(t, pgtest.Options{})
		o := controlplane.PostgresOptions{ChangeLogRevisions: logRevs}
		open := func() controlplane.Store {
			t.Helper()
			return openPostgres(t, srv.ConnString(), o)
		}
		return open(), open
	}},
}

// openPostgres opens a Postgres store on connString, closed at the end of
// the test.
func openPostgres(t testing.TB, connString string, o controlplane.PostgresOptions) *controlplane.Postgres {
	t.Helper()
	s, err := controlplane.OpenPostgres(context.Background(), connString, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// eachStore runs test once per store case, as subtests.
func eachStore(t *testing.T, test func(t *testing.T, sc storeCase)) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { test(t, sc) })
	}
}

// TestStoreHistory: a new store has a random history id (26 base32
// characters) that a reopen keeps; ForkHistory replaces the id only when
// it is still the one named and leaves the revision alone; History with a
// canceled context fails.
func TestStoreHistory(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		s, reopen := sc.open(t, 0)
		history := func(s controlplane.Store) string {
			t.Helper()
			h, err := s.History(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return h
		}
		h1 := history(s)
		if len(h1) != 26 {
			t.Fatalf("history %q, want 26 base32 characters", h1)
		}
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("p", 1)) })
		s.Close()
		s = reopen()
		if h := history(s); h != h1 {
			t.Fatalf("reopened: history %q, want %q", h, h1)
		}
		if h, err := s.ForkHistory(ctx, "another"); err != nil || h != h1 {
			t.Fatalf("ForkHistory of another history: %q, %v; want %q unchanged", h, err, h1)
		}
		h2, err := s.ForkHistory(ctx, h1)
		if err != nil || h2 == h1 || len(h2) != 26 {
			t.Fatalf("ForkHistory(%q) = %q, %v; want a new id", h1, h2, err)
		}
		if h, err := s.ForkHistory(ctx, h1); err != nil || h != h2 {
			t.Fatalf("ForkHistory of the old id again: %q, %v; want %q", h, err, h2)
		}
		if got := revision(t, s); got != 1 {
			t.Fatalf("revision after forks %d, want 1", got)
		}
		s.Close()
		s = reopen()
		if h := history(s); h != h2 {
			t.Fatalf("reopened after a fork: history %q, want %q", h, h2)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.History(cctx); err == nil {
			t.Fatal("History with a canceled context: no error")
		}
	})
}

// TestStoreClosed: every call after Close fails with ErrClosed.
func TestStoreClosed(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		s, _ := sc.open(t, 0)
		s.Close()
		if _, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("p", 1)) }); !errors.Is(err, controlplane.ErrClosed) {
			t.Fatalf("Update after Close: %v, want ErrClosed", err)
		}
		if err := s.View(ctx, func(controlplane.Reader) error { return nil }); !errors.Is(err, controlplane.ErrClosed) {
			t.Fatalf("View after Close: %v, want ErrClosed", err)
		}
		if _, err := s.ChangesSince(ctx, 0); !errors.Is(err, controlplane.ErrClosed) {
			t.Fatalf("ChangesSince after Close: %v, want ErrClosed", err)
		}
	})
}

// TestConcurrentWritesSomeFail: 16 writers make 20 writes each, sharing
// transactions: a third fail in fn after a put, a third are refused by
// validation (a key of an unknown policy), a third put a key, list keys
// (which writes it to a database store mid-transaction) and put a second
// key. Exactly the last third are kept, each with its own revision, 2 to
// 108 (the policy at 1), and the change log holds exactly their changes
// (two each, Old empty: every key is new).
func TestConcurrentWritesSomeFail(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
		const writers, each = 16, 20
		boom := errors.New("boom")
		var mu sync.Mutex
		var revs []int
		var kept []string
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					k1, k2 := hash(fmt.Sprint(w, "-", i, "-a")), hash(fmt.Sprint(w, "-", i, "-b"))
					var want error
					rev, err := s.Update(ctx, func(tx controlplane.Tx) error {
						switch i % 3 {
						case 0:
							want = boom
							if err := tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}); err != nil {
								return err
							}
							return boom
						case 1:
							return tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"missing"}})
						}
						if err := tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}); err != nil {
							return err
						}
						if ks, err := tx.Keys("", 1); err != nil || len(ks) != 1 {
							return fmt.Errorf("Keys in the write: %v, %v", ks, err)
						}
						return tx.PutKey(spec.Key{KeyHash: k2, Policies: []string{"gold"}})
					})
					var errs spec.Errors
					switch {
					case i%3 == 0 && !errors.Is(err, want):
						t.Errorf("failing write: %v, want boom", err)
					case i%3 == 1 && !errors.As(err, &errs):
						t.Errorf("invalid write: %v, want spec.Errors", err)
					case i%3 == 2 && err != nil:
						t.Errorf("good write: %v", err)
					case i%3 == 2:
						mu.Lock()
						revs, kept = append(revs, int(rev)), append(kept, k1, k2)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		good := writers * (each / 3)
		slices.Sort(revs)
		for i, r := range revs {
			if r != i+2 || len(revs) != good {
				t.Fatalf("revisions %v: want 2..%d, each once", revs, good+1)
			}
		}
		snap, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, k := range snap.Keys {
			got = append(got, k.KeyHash)
		}
		slices.Sort(kept)
		if !slices.Equal(got, kept) || snap.Revision != uint64(good+1) {
			t.Fatalf("%d keys at revision %d, want the %d kept at %d", len(got), snap.Revision, len(kept), good+1)
		}
		cs, err := s.ChangesSince(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 2*good {
			t.Fatalf("%d changes since 1, want %d", len(cs), 2*good)
		}
		for i, c := range cs {
			if c.Revision != uint64(i/2+2) || c.Op != controlplane.OpPut || c.Object != controlplane.ObjectKey || c.Old != nil {
				t.Fatalf("change %d: %+v, want a put of a new key at revision %d", i, c, i/2+2)
			}
		}
	})
}
