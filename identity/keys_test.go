package identity_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/limitplane/limitplane/identity"
)

// order returns the raw keys of ks's records, in Records' order, for
// records made by rec.
func order(ks *identity.Keys) []string {
	var out []string
	for _, r := range ks.Records() {
		out = append(out, r.Policies[0])
	}
	return out
}

// rec is a record for raw key raw whose one policy is named raw too, so
// order can tell records apart.
func rec(raw string) identity.KeyRecord {
	return identity.KeyRecord{Hash: identity.HashKey(raw), Policies: []string{raw}}
}

// TestKeysUpdate puts, replaces and deletes keys: Lookup, Len and
// Records' order (a replaced key keeps its place, new keys go last) follow,
// and the record handed out before the change is left as it was.
func TestKeysUpdate(t *testing.T) {
	ks, err := identity.NewKeys([]identity.KeyRecord{rec("a"), rec("b"), rec("c")})
	if err != nil {
		t.Fatal(err)
	}
	before := ks.Lookup(identity.HashKey("b"))
	b2 := rec("b")
	b2.Inactive = true
	if err := ks.Update([]identity.KeyRecord{rec("d"), b2}, []identity.KeyHash{identity.HashKey("a")}); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(order(ks)), "[b c d]"; got != want {
		t.Errorf("Records order %s, want %s", got, want)
	}
	if ks.Len() != 3 || ks.Lookup(identity.HashKey("a")) != nil || ks.Lookup(identity.HashKey("d")) == nil {
		t.Errorf("Len %d, a %v, d %v", ks.Len(), ks.Lookup(identity.HashKey("a")), ks.Lookup(identity.HashKey("d")))
	}
	if r := ks.Lookup(identity.HashKey("b")); !r.Inactive || before.Inactive {
		t.Errorf("b now inactive %v, the record looked up before %v; want true, false", r.Inactive, before.Inactive)
	}
	if got := ks.Lookup(identity.HashKey("d")).Consumer().ID; got != identity.HashKey("d").ConsumerID() {
		t.Errorf("consumer ID of d %q", got)
	}
	// Deleted and added again: last.
	if err := ks.Update(nil, []identity.KeyHash{identity.HashKey("b")}); err != nil {
		t.Fatal(err)
	}
	if err := ks.Update([]identity.KeyRecord{rec("b")}, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(order(ks)), "[c d b]"; got != want {
		t.Errorf("Records order %s, want %s", got, want)
	}
}

// TestKeysUpdateRefused: each refused update leaves the registry as it
// was.
func TestKeysUpdateRefused(t *testing.T) {
	ks, err := identity.NewKeys([]identity.KeyRecord{rec("a"), rec("b")})
	if err != nil {
		t.Fatal(err)
	}
	a, b := identity.HashKey("a"), identity.HashKey("b")
	for _, c := range []struct {
		name string
		put  []identity.KeyRecord
		del  []identity.KeyHash
		want string
	}{
		{"put twice", []identity.KeyRecord{rec("x"), rec("x")}, []identity.KeyHash{a}, "identity: update: key " + identity.HashKey("x").String() + " is put twice"},
		{"put and deleted", []identity.KeyRecord{rec("x"), rec("b")}, []identity.KeyHash{b}, "identity: update: key " + b.String() + " is both put and deleted"},
		{"unknown delete", []identity.KeyRecord{rec("x")}, []identity.KeyHash{a, identity.HashKey("zz")}, "identity: no such key: delete of " + identity.HashKey("zz").String()},
		{"deleted twice", nil, []identity.KeyHash{a, a}, "identity: no such key: delete of " + a.String()},
	} {
		err := ks.Update(c.put, c.del)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
		if got := fmt.Sprint(order(ks)); got != "[a b]" || ks.Len() != 2 || ks.Lookup(identity.HashKey("x")) != nil {
			t.Errorf("%s: registry now %s (Len %d)", c.name, got, ks.Len())
		}
	}
	if err := ks.Update(nil, []identity.KeyHash{identity.HashKey("zz")}); !errors.Is(err, identity.ErrUnknownKey) {
		t.Errorf("unknown delete: %v, want ErrUnknownKey", err)
	}
}

// TestKeysUpdateGrows adds 20,000 keys one Update at a time to an empty
// registry, past several doublings of the shard count, then deletes every
// other one: every key is found or not as it should be, and Records keeps
// the order of addition.
func TestKeysUpdateGrows(t *testing.T) {
	ks, err := identity.NewKeys(nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	for i := range n {
		if err := ks.Update([]identity.KeyRecord{rec(strconv.Itoa(i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var del []identity.KeyHash
	for i := 0; i < n; i += 2 {
		del = append(del, identity.HashKey(strconv.Itoa(i)))
	}
	if err := ks.Update(nil, del); err != nil {
		t.Fatal(err)
	}
	if ks.Len() != n/2 {
		t.Fatalf("Len %d, want %d", ks.Len(), n/2)
	}
	for i := range n {
		if got := ks.Lookup(identity.HashKey(strconv.Itoa(i))) != nil; got != (i%2 == 1) {
			t.Fatalf("key %d found %v", i, got)
		}
	}
	recs := ks.Records()
	for j, r := range recs {
		if want := strconv.Itoa(2*j + 1); r.Policies[0] != want {
			t.Fatalf("Records[%d] is %s, want %s", j, r.Policies[0], want)
		}
	}
	seen := 0
	ks.Range(func(*identity.KeyRecord) bool { seen++; return true })
	if seen != n/2 {
		t.Errorf("Range saw %d records, want %d", seen, n/2)
	}
}

// TestKeysLookupDuringUpdates looks a key that never changes up from 4
// goroutines while 2,000 updates add and remove others (run with -race):
// it is found every time, and each update is seen whole (Range over one
// version holds both keys an update adds or neither).
func TestKeysLookupDuringUpdates(t *testing.T) {
	recs := benchRecords(5_000)
	ks, err := identity.NewKeys(recs)
	if err != nil {
		t.Fatal(err)
	}
	stable := recs[42].Hash
	done := make(chan struct{})
	var wg sync.WaitGroup
	var missed, torn [4]int
	for g := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if ks.Lookup(stable) == nil {
					missed[g]++
				}
				var xs, ys int
				ks.Range(func(r *identity.KeyRecord) bool {
					switch r.Policies[0][0] {
					case 'x':
						xs++
					case 'y':
						ys++
					}
					return true
				})
				if xs != ys {
					torn[g]++
				}
			}
		})
	}
	for i := range 1_000 {
		x, y := rec("x"+strconv.Itoa(i)), rec("y"+strconv.Itoa(i))
		if err := ks.Update([]identity.KeyRecord{x, y}, nil); err != nil {
			t.Fatal(err)
		}
		if err := ks.Update(nil, []identity.KeyHash{x.Hash, y.Hash}); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	for g := range 4 {
		if missed[g] != 0 || torn[g] != 0 {
			t.Errorf("reader %d: stable key missed %d times, torn updates %d", g, missed[g], torn[g])
		}
	}
	if ks.Len() != 5_000 {
		t.Errorf("Len %d, want 5000", ks.Len())
	}
}
