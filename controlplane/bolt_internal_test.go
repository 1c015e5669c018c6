package controlplane

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/limitplane/limitplane/spec"
)

// TestEncodeChangeIsJSONMarshal: the change log's encoding is byte for
// byte json.Marshal's, for IDs that need escaping too, with and without
// Value and Old.
func TestEncodeChangeIsJSONMarshal(t *testing.T) {
	for _, c := range []Change{
		{Revision: 1, Op: OpPut, Object: ObjectKey, ID: "sha256:00ff", Value: json.RawMessage(`{"key_hash":"sha256:00ff","policies":["gold"]}`)},
		{Revision: 18446744073709551615, Op: OpDelete, Object: ObjectPolicy, ID: "gold", Old: json.RawMessage(`{"id":"gold"}`)},
		{Revision: 7, Op: OpPut, Object: ObjectAPI, ID: "a<b>&\"c\\d\n\u2028é", Value: json.RawMessage(`{"id":"a\u003cb"}`), Old: json.RawMessage(`{"id":"x"}`)},
		{Revision: 0, Op: OpPut, Object: ObjectAPI, ID: ""},
	} {
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeChange(c)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("encodeChange:\n%s\nwant\n%s", got, want)
		}
	}
}

// TestChangeListKeepsOrder: a changeList yields every change added, in
// order, with its position, across blocks; and stops when asked.
func TestChangeListKeepsOrder(t *testing.T) {
	var l changeList
	const n = 20000 // past the largest block
	for i := range n {
		l.add(Change{Revision: uint64(i)})
	}
	if l.n != n {
		t.Fatalf("n = %d, want %d", l.n, n)
	}
	next := 0
	for i, c := range l.all() {
		if i != next || c.Revision != uint64(i) {
			t.Fatalf("position %d holds revision %d, want %d", i, c.Revision, next)
		}
		next++
	}
	if next != n {
		t.Fatalf("yielded %d, want %d", next, n)
	}
	for i := range l.all() {
		if i == 9 {
			break
		}
	}
}

// TestHistory: a new store has a random history id that a reopen keeps;
// a store made before histories (no id in its meta bucket) gets one on
// its first open and keeps it; ForkHistory replaces the id only when it
// is still the one named, durably, and leaves the revision alone.
func TestHistory(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cp.db")
	open := func() *Bolt {
		t.Helper()
		b, err := OpenBolt(path, BoltOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	history := func(b *Bolt) string {
		t.Helper()
		h, err := b.History(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	b := open()
	h1 := history(b)
	if len(h1) != 26 {
		t.Fatalf("history %q, want 26 base32 characters", h1)
	}
	if _, err := b.Update(ctx, func(tx Tx) error { return tx.PutPolicy(spec.Policy{ID: "p"}) }); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b = open()
	if h := history(b); h != h1 {
		t.Fatalf("reopened: history %q, want %q", h, h1)
	}
	if h, err := b.ForkHistory(ctx, "another"); err != nil || h != h1 {
		t.Fatalf("ForkHistory of another history: %q, %v; want %q unchanged", h, err, h1)
	}
	h2, err := b.ForkHistory(ctx, h1)
	if err != nil || h2 == h1 || len(h2) != 26 {
		t.Fatalf("ForkHistory(%q) = %q, %v; want a new id", h1, h2, err)
	}
	if h, err := b.ForkHistory(ctx, h1); err != nil || h != h2 {
		t.Fatalf("ForkHistory of the old id again: %q, %v; want %q", h, err, h2)
	}
	var rev uint64
	if err := b.View(ctx, func(r Reader) error { rev = r.Revision(); return nil }); err != nil || rev != 1 {
		t.Fatalf("revision after forks %d, %v; want 1", rev, err)
	}
	b.Close()

	// A store from before histories: its meta bucket has no id.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaHistory) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	b = open()
	h3 := history(b)
	if len(h3) != 26 || h3 == h2 {
		t.Fatalf("first open of a store without a history: %q (before: %q)", h3, h2)
	}
	b.Close()
	b = open()
	defer b.Close()
	if h := history(b); h != h3 {
		t.Fatalf("reopened: history %q, want %q", h, h3)
	}
	if _, err := b.History(canceled()); err == nil {
		t.Fatal("History with a canceled context: no error")
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
