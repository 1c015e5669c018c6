package identity_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
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

// TestKeysInternPolicies: keys with the same policy list share one slice
// in the registry, and that sharing never carries a change from one key to
// another: a key updated with other policies has them alone, the keys that
// shared its old list keep it, and the caller's slices, changed after
// Replace or Update, change nothing. Lists whose IDs join to the same text
// are told apart, and an empty list is nil.
func TestKeysInternPolicies(t *testing.T) {
	pq := []string{"p", "q"}
	ks, err := identity.NewKeys([]identity.KeyRecord{
		{Hash: identity.HashKey("a"), Policies: pq},
		{Hash: identity.HashKey("b"), Policies: []string{"p", "q"}},
		{Hash: identity.HashKey("c"), Policies: []string{"pq"}},
		{Hash: identity.HashKey("d"), Policies: []string{"p", "q", ""}},
		{Hash: identity.HashKey("e"), Policies: []string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	pq[0] = "x" // the caller's slice: not the registry's
	policies := func(raw string) string { return fmt.Sprintf("%q", ks.Lookup(identity.HashKey(raw)).Policies) }
	want := func(what string, wants map[string]string) {
		t.Helper()
		for raw, w := range wants {
			if got := policies(raw); got != w {
				t.Errorf("%s: %s has %s, want %s", what, raw, got, w)
			}
		}
	}
	want("after NewKeys", map[string]string{"a": `["p" "q"]`, "b": `["p" "q"]`, "c": `["pq"]`, "d": `["p" "q" ""]`, "e": `[]`})
	a, b := ks.Lookup(identity.HashKey("a")), ks.Lookup(identity.HashKey("b"))
	if &a.Policies[0] != &b.Policies[0] {
		t.Error("a and b, with the same policies, hold two slices")
	}
	if ks.Lookup(identity.HashKey("e")).Policies != nil {
		t.Error("e's empty list is not nil")
	}

	// a changes: b keeps the list a had; the record of a looked up before
	// is unchanged too.
	if err := ks.Update([]identity.KeyRecord{{Hash: identity.HashKey("a"), Policies: []string{"gold"}}}, nil); err != nil {
		t.Fatal(err)
	}
	want("after a's update", map[string]string{"a": `["gold"]`, "b": `["p" "q"]`, "c": `["pq"]`, "d": `["p" "q" ""]`})
	if got := fmt.Sprintf("%q", a.Policies); got != `["p" "q"]` {
		t.Errorf("a's old record has %s, want [p q]", got)
	}

	// f gets the list b has, from a slice the caller then changes; then b
	// changes: f keeps it.
	fl := []string{"p", "q"}
	if err := ks.Update([]identity.KeyRecord{{Hash: identity.HashKey("f"), Policies: fl}}, nil); err != nil {
		t.Fatal(err)
	}
	fl[1] = "z"
	if f := ks.Lookup(identity.HashKey("f")); &f.Policies[0] != &ks.Lookup(identity.HashKey("b")).Policies[0] {
		t.Error("f, put with b's policies, holds a slice of its own")
	}
	if err := ks.Update([]identity.KeyRecord{{Hash: identity.HashKey("b"), Policies: []string{"p"}}}, nil); err != nil {
		t.Fatal(err)
	}
	want("after b's update", map[string]string{"a": `["gold"]`, "b": `["p"]`, "f": `["p" "q"]`, "d": `["p" "q" ""]`})
	for _, raw := range []string{"a", "b", "f"} {
		if c := ks.Lookup(identity.HashKey(raw)).Consumer(); fmt.Sprintf("%q", c.Policies) != policies(raw) {
			t.Errorf("consumer of %s has %q, its record %s", raw, c.Policies, policies(raw))
		}
	}
}

// TestKeyRecordConsumer: a held record's consumer is made once, with the
// key's consumer ID, policies, per-API limits and quota epoch, and is the
// same pointer for every caller, even callers racing on its first use
// while others copy the record (run with -race); Authenticate returns it.
// A record outside a registry makes a fresh one each call.
func TestKeyRecordConsumer(t *testing.T) {
	h := identity.HashKey("k")
	limits := map[string]core.Limits{"api": {Quota: core.Quota{Max: 5, Renewal: time.Hour}, QuotaEpoch: 2}}
	in := identity.KeyRecord{Hash: h, Policies: []string{"p"}, APILimits: limits, QuotaEpoch: 7}
	ks, err := identity.NewKeys([]identity.KeyRecord{in})
	if err != nil {
		t.Fatal(err)
	}
	r := ks.Lookup(h)
	const n = 8
	got := make([]*core.Consumer, n)
	copies := make([]identity.KeyRecord, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() { defer wg.Done(); got[i] = r.Consumer() }()
		go func() { defer wg.Done(); copies[i] = *r }()
	}
	wg.Wait()
	c := got[0]
	for i := range n {
		if got[i] != c {
			t.Fatalf("Consumer call %d returned another consumer", i)
		}
		if copies[i].Hash != h || copies[i].QuotaEpoch != 7 {
			t.Errorf("copy %d of the record: %+v", i, copies[i])
		}
	}
	want := core.Consumer{ID: h.ConsumerID(), Policies: []string{"p"}, APILimits: limits, QuotaEpoch: 7}
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("consumer %+v, want %+v", *c, want)
	}
	a := identity.NewAPIKey(ks, identity.APIKeyOptions{})
	if ac, err := a.Authenticate(context.Background(), &benchReq{key: []string{"k"}}); err != nil || ac != c {
		t.Errorf("Authenticate = %p, %v; want the record's consumer %p", ac, err, c)
	}
	if r.Consumer() != c || ks.Lookup(h).Consumer() != c {
		t.Error("a later Consumer call returned another consumer")
	}
	// Another key's update copies c's shard, not c's record: c stays.
	if err := ks.Update([]identity.KeyRecord{{Hash: identity.HashKey("other"), Policies: []string{"p"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if ks.Lookup(h).Consumer() != c {
		t.Error("an update of another key made k a new consumer")
	}
	// A record of its own: a new consumer, equal, each call.
	own := in
	c1, c2 := own.Consumer(), own.Consumer()
	if c1 == c2 || !reflect.DeepEqual(*c1, want) || !reflect.DeepEqual(*c2, want) {
		t.Errorf("a record outside a registry: consumers %p %+v and %p %+v", c1, *c1, c2, *c2)
	}
}

// TestKeysRecordsOrderAfterChurn: Records keeps the order of addition as
// keys are deleted and added again, and replaced, many times over: first
// while few more keys were ever added than are held (each record placed by
// its number), then long after (numbers sorted). A simulation of the
// order is the reference.
func TestKeysRecordsOrderAfterChurn(t *testing.T) {
	var want []string
	var recs []identity.KeyRecord
	for i := range 10 {
		raw := "k" + strconv.Itoa(i)
		want = append(want, raw)
		recs = append(recs, rec(raw))
	}
	ks, err := identity.NewKeys(recs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 400 {
		raw := "k" + strconv.Itoa(i*7%10)
		if i%3 == 0 { // replaced: keeps its place
			r := rec(raw)
			r.Inactive = true
			if err := ks.Update([]identity.KeyRecord{r}, nil); err != nil {
				t.Fatal(err)
			}
		} else { // deleted, added again: last
			if err := ks.Update(nil, []identity.KeyHash{identity.HashKey(raw)}); err != nil {
				t.Fatal(err)
			}
			if err := ks.Update([]identity.KeyRecord{rec(raw)}, nil); err != nil {
				t.Fatal(err)
			}
			j := slices.Index(want, raw)
			want = append(slices.Delete(want, j, j+1), raw)
		}
		if got := fmt.Sprint(order(ks)); got != fmt.Sprint(want) {
			t.Fatalf("after change %d: Records order %s, want %v", i, got, want)
		}
	}
}

// TestKeysReplaceRefusesDuplicates: two records with one hash, among many
// (so in a table of many shards) or among few, are refused naming the
// hash, and a registry that Replace refuses keeps its keys.
func TestKeysReplaceRefusesDuplicates(t *testing.T) {
	for _, n := range []int{3, 5_000} {
		recs := benchRecords(n)
		dup := recs[n/2]
		dup.Inactive = true
		recs = append(recs, dup)
		if _, err := identity.NewKeys(recs); err == nil || err.Error() != "identity: duplicate key "+dup.Hash.String() {
			t.Errorf("%d keys and a duplicate: NewKeys error %v", n, err)
		}
	}
	ks, err := identity.NewKeys([]identity.KeyRecord{rec("a")})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Replace([]identity.KeyRecord{rec("b"), rec("c"), rec("b")}); err == nil {
		t.Fatal("Replace with a duplicate: no error")
	}
	if got := fmt.Sprint(order(ks)); got != "[a]" {
		t.Errorf("after a refused Replace: %s, want [a]", got)
	}
}

// TestCheckKey: the one rule for plaintext keys that the gateway's file
// and the control plane apply: what a gateway could be presented with.
func TestCheckKey(t *testing.T) {
	ok512 := strings.Repeat("k", identity.DefaultMaxKeyLength)
	for _, c := range []struct{ key, want string }{
		{"demo-key-1", ""},
		{ok512, ""},
		{"a b", ""},
		{"ключ", ""},
		{"", "identity: empty key"},
		{ok512 + "k", "identity: longer than 512 bytes; the gateway refuses such keys"},
		{"a\rb", `identity: holds the control character '\r' at byte 1; no request header can carry it`},
		{"ab\nc", `identity: holds the control character '\n' at byte 2; no request header can carry it`},
		{"a\x00", `identity: holds the control character '\x00' at byte 1; no request header can carry it`},
		{"a\tb", `identity: holds a tab at byte 1; keys hold no control characters, not even the tab a request header may carry`},
		{"a\x7f", `identity: holds the control character '\x7f' at byte 1; no request header can carry it`},
		{" k", "identity: starts or ends with white space, which the gateway trims from a presented key"},
		{"k\n", "identity: starts or ends with white space, which the gateway trims from a presented key"},
		{"y\xff\xfe", "identity: not valid UTF-8"},
		{"y\uFFFD\uFFFD", "identity: holds U+FFFD, which a JSON or YAML decoder puts for bytes that are not UTF-8 or a lone surrogate: the key meant is another"},
	} {
		got := ""
		if err := identity.CheckKey(c.key); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("CheckKey(%q): %q, want %q", c.key, got, c.want)
		}
	}
}
