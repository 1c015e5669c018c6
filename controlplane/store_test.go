package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// open opens a Bolt store in a fresh file, closed at the end of the test.
func open(t testing.TB, o controlplane.BoltOptions) (*controlplane.Bolt, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cp.db")
	s, err := controlplane.OpenBolt(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func hash(key string) string { return identity.HashKey(key).String() }

func policy(id string, requests int64) spec.Policy {
	return spec.Policy{ID: id, Rate: &spec.Rate{Requests: requests, Per: spec.Duration(time.Minute)}}
}

func update(t *testing.T, s controlplane.Store, fn func(tx controlplane.Tx) error) uint64 {
	t.Helper()
	rev, err := s.Update(context.Background(), fn)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func revision(t *testing.T, s controlplane.Store) uint64 {
	t.Helper()
	var rev uint64
	if err := s.View(context.Background(), func(r controlplane.Reader) error { rev = r.Revision(); return nil }); err != nil {
		t.Fatal(err)
	}
	return rev
}

// summary is a change without its value, for comparisons.
func summary(cs []controlplane.Change) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprintf("%d %s %s %s", c.Revision, c.Op, c.Object, c.ID)
	}
	return out
}

// TestRevisionsAndChangeLog writes a sequence and checks the revision of
// each write, that a write of nothing and a failed write raise nothing,
// and the change log, values included.
func TestRevisionsAndChangeLog(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		if got := revision(t, s); got != 0 {
			t.Fatalf("new store at revision %d, want 0", got)
		}
		k1 := hash("k1")
		steps := []struct {
			fn   func(tx controlplane.Tx) error
			want uint64
		}{
			{func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) }, 1},
			{func(tx controlplane.Tx) error { return tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}) }, 2},
			{func(tx controlplane.Tx) error {
				return tx.PutAPI(spec.API{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho})
			}, 3},
			{func(tx controlplane.Tx) error { return nil }, 3}, // wrote nothing
			{func(tx controlplane.Tx) error { // two objects, one revision
				if err := tx.PutPolicy(policy("silver", 5)); err != nil {
					return err
				}
				return tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"silver"}})
			}, 4},
			{func(tx controlplane.Tx) error { _, err := tx.DeleteKey(k1); return err }, 5},
		}
		for i, st := range steps {
			if got := update(t, s, st.fn); got != st.want {
				t.Fatalf("step %d: revision %d, want %d", i, got, st.want)
			}
		}
		boom := errors.New("boom")
		_, err := s.Update(ctx, func(tx controlplane.Tx) error {
			if err := tx.PutPolicy(policy("bronze", 1)); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("failed write: %v, want boom", err)
		}
		if got := revision(t, s); got != 5 {
			t.Fatalf("revision %d after a failed write, want 5", got)
		}
		cs, err := s.ChangesSince(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"1 put policy gold",
			"2 put key " + k1,
			"3 put api echo",
			"4 put policy silver",
			"4 put key " + k1,
			"5 delete key " + k1,
		}
		if got := summary(cs); !reflect.DeepEqual(got, want) {
			t.Fatalf("changes:\n%q\nwant\n%q", got, want)
		}
		if got, want := string(cs[4].Value), `{"key_hash":"`+k1+`","policies":["silver"]}`; got != want {
			t.Fatalf("change value %s, want %s", got, want)
		}
		if cs[5].Value != nil {
			t.Fatalf("delete carries a value: %s", cs[5].Value)
		}
		// Old is the object before each change: none for a creation, the
		// previous value for a replacement and for a delete.
		for i, want := range []string{"", "", "", "", `{"key_hash":"` + k1 + `","policies":["gold"]}`, string(cs[4].Value)} {
			if got := string(cs[i].Old); got != want {
				t.Fatalf("change %d (%s): old %q, want %q", i, summary(cs[i : i+1])[0], got, want)
			}
		}
		cs, err = s.ChangesSince(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		if got := summary(cs); !reflect.DeepEqual(got, want[3:]) {
			t.Fatalf("changes since 3: %q, want %q", got, want[3:])
		}
	})
}

// TestChangeLogBound keeps 3 revisions: changes since an older revision
// are refused with ErrTooFarBehind, since a future one with
// ErrRevisionAhead, and the bound holds after reopening the file.
func TestChangeLogBound(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, reopen := sc.open(t, 3)
		ctx := context.Background()
		for i := range 6 {
			update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("p", int64(i+1))) })
		}
		check := func(s controlplane.Store) {
			t.Helper()
			for rev, want := range map[uint64][]string{
				3: {"4 put policy p", "5 put policy p", "6 put policy p"},
				5: {"6 put policy p"},
				6: {},
			} {
				cs, err := s.ChangesSince(ctx, rev)
				if err != nil {
					t.Fatalf("since %d: %v", rev, err)
				}
				if got := summary(cs); !reflect.DeepEqual(got, want) {
					t.Fatalf("since %d: %q, want %q", rev, got, want)
				}
			}
			for _, rev := range []uint64{0, 1, 2} {
				if _, err := s.ChangesSince(ctx, rev); !errors.Is(err, controlplane.ErrTooFarBehind) {
					t.Fatalf("since %d: %v, want ErrTooFarBehind", rev, err)
				}
			}
			if _, err := s.ChangesSince(ctx, 7); !errors.Is(err, controlplane.ErrRevisionAhead) {
				t.Fatalf("since 7: %v, want ErrRevisionAhead", err)
			}
		}
		check(s)
		s.Close()
		s2 := reopen()
		check(s2)
		if got := revision(t, s2); got != 6 {
			t.Fatalf("reopened at revision %d, want 6", got)
		}
	})
}

// TestInvalidWritesRefused: writes that would leave an invalid state are
// refused with spec.Errors whose paths name the object by ID, and change
// nothing.
func TestInvalidWritesRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		k1 := hash("k1")
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
		update(t, s, func(tx controlplane.Tx) error { return tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}) })
		before, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			fn   func(tx controlplane.Tx) error
			want []string
		}{
			{"key with an unknown policy", func(tx controlplane.Tx) error {
				return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"gold", "nope"}})
			}, []string{`spec: keys["` + hash("k2") + `"].policies[1]: unknown policy "nope"`}},
			{"delete a policy a key uses", func(tx controlplane.Tx) error {
				_, err := tx.DeletePolicy("gold")
				return err
			}, []string{`spec: keys["` + k1 + `"].policies[0]: unknown policy "gold"`}},
			{"bad rate", func(tx controlplane.Tx) error {
				return tx.PutPolicy(spec.Policy{ID: "bad", Rate: &spec.Rate{Requests: 0, Per: spec.Duration(time.Second)}})
			}, []string{`spec: policies["bad"].rate.requests: 0 must be > 0 (or -1 for unlimited)`}},
			{"bad key hash", func(tx controlplane.Tx) error {
				return tx.PutKey(spec.Key{KeyHash: "md5:x", Policies: []string{"gold"}})
			}, []string{`spec: keys["md5:x"].key_hash: "md5:x" is not sha256:<64 hex digits>`}},
			{"API with a policy on an api_key API", func(tx controlplane.Tx) error {
				return tx.PutAPI(spec.API{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho, Policies: []string{"gold"}})
			}, []string{`spec: apis["a"].policies: only keyless APIs take policies; an api_key API applies each key's own policies`}},
		}
		for _, c := range cases {
			_, err := s.Update(ctx, c.fn)
			var errs spec.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("%s: %v, want spec.Errors", c.name, err)
			}
			got := make([]string, len(errs))
			for i, e := range errs {
				got[i] = e.Error()
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("%s:\n%q\nwant\n%q", c.name, got, c.want)
			}
		}
		after, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(after, before) {
			t.Fatalf("state changed:\n%+v\nwas\n%+v", after, before)
		}
		if after.Revision != 2 {
			t.Fatalf("revision %d, want 2", after.Revision)
		}
	})
}

// TestConcurrentWritesGetDistinctRevisions: 16 writers of 25 keys each
// share transactions, and every write gets its own revision, 1 to 400.
func TestConcurrentWritesGetDistinctRevisions(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
		const writers, each = 16, 25
		putKeysConcurrently(t, writers, each, s)
		snap, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Keys) != writers*each || snap.Revision != writers*each+1 {
			t.Fatalf("%d keys at revision %d, want %d at %d", len(snap.Keys), snap.Revision, writers*each, writers*each+1)
		}
	})
}

func TestSelects(t *testing.T) {
	for _, c := range []struct {
		api, dp []string
		want    bool
	}{
		{nil, nil, true},
		{nil, []string{"eu"}, true},
		{[]string{"eu"}, nil, false},
		{[]string{"eu"}, []string{"eu"}, true},
		{[]string{"eu"}, []string{"us"}, false},
		{[]string{"eu", "us"}, []string{"us"}, true},
		{[]string{"eu"}, []string{"us", "eu"}, true},
		{[]string{"eu", "us"}, []string{"asia", "africa"}, false},
	} {
		if got := controlplane.Selects(c.api, c.dp); got != c.want {
			t.Errorf("Selects(%q, %q) = %v, want %v", c.api, c.dp, got, c.want)
		}
	}
}

// TestSnapshotSelectsByTag stores tagged APIs with policies and keys that
// refer to them, and checks what each data plane receives: exactly the
// APIs its tags select, the references to others removed, and a snapshot
// that passes Validate.
func TestSnapshotSelectsByTag(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		api := func(id string, tags ...string) spec.API {
			return spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Tags: tags}
		}
		quota := func(max int64) spec.Limits {
			return spec.Limits{Quota: &spec.Quota{Max: max, Renewal: spec.Duration(24 * time.Hour)}}
		}
		update(t, s, func(tx controlplane.Tx) error {
			for _, a := range []spec.API{api("all"), api("eu", "eu"), api("us", "us"), api("both", "eu", "us")} {
				if err := tx.PutAPI(a); err != nil {
					return err
				}
			}
			for _, p := range []spec.Policy{
				policy("global", 100),
				{ID: "p-eu", Rate: policy("", 6).Rate, APIs: []string{"eu"}},
				{ID: "p-eu-all", Rate: policy("", 7).Rate, APIs: []string{"eu", "all"}},
			} {
				if err := tx.PutPolicy(p); err != nil {
					return err
				}
			}
			for _, k := range []spec.Key{
				{KeyHash: hash("a"), Policies: []string{"global"}},
				{KeyHash: hash("b"), Policies: []string{"p-eu"}},
				{KeyHash: hash("c"), APILimits: map[string]spec.Limits{"us": quota(400), "eu": quota(600)}},
				{KeyHash: hash("d"), Policies: []string{"p-eu", "p-eu-all"}},
			} {
				if err := tx.PutKey(k); err != nil {
					return err
				}
			}
			return nil
		})
		type view struct {
			APIs     []string
			Policies map[string][]string // ID → apis
			Keys     map[string]string   // plaintext → policies and api_limits
		}
		name := map[string]string{hash("a"): "a", hash("b"): "b", hash("c"): "c", hash("d"): "d"}
		for _, c := range []struct {
			tags []string
			want view
		}{
			{nil, view{
				APIs:     []string{"all"},
				Policies: map[string][]string{"global": nil, "p-eu-all": {"all"}},
				Keys:     map[string]string{"a": "[global] []", "d": "[p-eu-all] []"},
			}},
			{[]string{"eu"}, view{
				APIs:     []string{"all", "both", "eu"},
				Policies: map[string][]string{"global": nil, "p-eu": {"eu"}, "p-eu-all": {"eu", "all"}},
				Keys:     map[string]string{"a": "[global] []", "b": "[p-eu] []", "c": "[] [eu]", "d": "[p-eu p-eu-all] []"},
			}},
			{[]string{"us"}, view{
				APIs:     []string{"all", "both", "us"},
				Policies: map[string][]string{"global": nil, "p-eu-all": {"all"}},
				Keys:     map[string]string{"a": "[global] []", "c": "[] [us]", "d": "[p-eu-all] []"},
			}},
			{[]string{"asia"}, view{
				APIs:     []string{"all"},
				Policies: map[string][]string{"global": nil, "p-eu-all": {"all"}},
				Keys:     map[string]string{"a": "[global] []", "d": "[p-eu-all] []"},
			}},
		} {
			snap, err := s.Snapshot(ctx, c.tags)
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Validate(); err != nil {
				t.Fatalf("tags %q: snapshot invalid: %v", c.tags, err)
			}
			got := view{Policies: map[string][]string{}, Keys: map[string]string{}}
			for _, a := range snap.APIs {
				got.APIs = append(got.APIs, a.ID)
			}
			for _, p := range snap.Policies {
				got.Policies[p.ID] = p.APIs
			}
			for _, k := range snap.Keys {
				var limits []string
				for id := range k.APILimits {
					limits = append(limits, id)
				}
				sort.Strings(limits)
				got.Keys[name[k.KeyHash]] = fmt.Sprintf("%v %v", k.Policies, limits)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("tags %q:\n%+v\nwant\n%+v", c.tags, got, c.want)
			}
			if snap.Revision != 1 {
				t.Errorf("tags %q: revision %d, want 1", c.tags, snap.Revision)
			}
		}
		// The stored state itself is untouched by selection.
		full, err := s.Snapshot(ctx, []string{"eu", "us"})
		if err != nil {
			t.Fatal(err)
		}
		if len(full.APIs) != 4 || len(full.Policies) != 3 || len(full.Keys) != 4 {
			t.Fatalf("full snapshot: %d APIs, %d policies, %d keys; want 4, 3, 4", len(full.APIs), len(full.Policies), len(full.Keys))
		}
		for _, k := range full.Keys {
			if k.KeyHash != hash("c") {
				continue
			}
			b, err := json.Marshal(k.APILimits)
			if err != nil {
				t.Fatal(err)
			}
			if want := `{"eu":{"quota":{"max":600,"renewal":"24h0m0s"}},"us":{"quota":{"max":400,"renewal":"24h0m0s"}}}`; string(b) != want {
				t.Fatalf("key c's api_limits %s, want %s", b, want)
			}
		}
	})
}

// Reader.Policies and Reader.APIs list every object in ID order, in a
// View and in a write transaction (where they include its own writes).
func TestReaderListsInIDOrder(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ids := func(ps []spec.Policy, as []spec.API) string {
			var out []string
			for _, p := range ps {
				out = append(out, "p:"+p.ID)
			}
			for _, a := range as {
				out = append(out, "a:"+a.ID)
			}
			return fmt.Sprint(out)
		}
		list := func(r controlplane.Reader) string {
			t.Helper()
			ps, err := r.Policies()
			if err != nil {
				t.Fatal(err)
			}
			as, err := r.APIs()
			if err != nil {
				t.Fatal(err)
			}
			return ids(ps, as)
		}
		update(t, s, func(tx controlplane.Tx) error {
			for _, id := range []string{"zeta", "alpha", "Mid"} {
				if err := tx.PutPolicy(policy(id, 1)); err != nil {
					return err
				}
			}
			for _, id := range []string{"orders", "beta"} {
				if err := tx.PutAPI(spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho}); err != nil {
					return err
				}
			}
			if got, want := list(tx), "[p:Mid p:alpha p:zeta a:beta a:orders]"; got != want {
				t.Errorf("in the write: %s, want %s", got, want)
			}
			return nil
		})
		update(t, s, func(tx controlplane.Tx) error { _, err := tx.DeletePolicy("alpha"); return err })
		var got string
		if err := s.View(context.Background(), func(r controlplane.Reader) error { got = list(r); return nil }); err != nil {
			t.Fatal(err)
		}
		if want := "[p:Mid p:zeta a:beta a:orders]"; got != want {
			t.Fatalf("View: %s, want %s", got, want)
		}
	})
}

// TestTxReadsItsOwnWrites: inside one Update, reads see the write's own
// puts and deletes (single objects and lists, also after a list read
// has flushed the earlier writes), the change log's Old is the value
// before each change, and the state committed is the last value of
// each object.
func TestTxReadsItsOwnWrites(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		k1, k2 := hash("k1"), hash("k2")
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
		update(t, s, func(tx controlplane.Tx) error {
			check := func(what string, got, want any) {
				t.Helper()
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: %v, want %v", what, got, want)
				}
			}
			key := func(h string) any {
				t.Helper()
				k, err := tx.Key(h)
				if err != nil {
					t.Fatal(err)
				}
				if k == nil {
					return nil
				}
				return k.Policies
			}
			if err := tx.PutPolicy(policy("silver", 5)); err != nil {
				return err
			}
			if err := tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}); err != nil {
				return err
			}
			check("k1 after put", key(k1), []string{"gold"})
			if err := tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"silver"}}); err != nil {
				return err
			}
			check("k1 after second put", key(k1), []string{"silver"})
			p, err := tx.Policy("silver")
			if err != nil {
				return err
			}
			check("policy silver", p.Rate.Requests, int64(5))
			ps, err := tx.Policies() // flushes
			if err != nil {
				return err
			}
			check("policies", len(ps), 2)
			if ok, err := tx.DeletePolicy("gold"); !ok || err != nil {
				t.Fatalf("DeletePolicy(gold) = %v, %v", ok, err)
			}
			if p, _ := tx.Policy("gold"); p != nil {
				t.Fatalf("policy gold after delete: %+v", p)
			}
			if ok, _ := tx.DeletePolicy("gold"); ok {
				t.Fatal("deleted gold twice")
			}
			ps, err = tx.Policies()
			if err != nil {
				return err
			}
			check("policies after delete", ps[0].ID+" "+fmt.Sprint(len(ps)), "silver 1")
			if err := tx.PutKey(spec.Key{KeyHash: k2, Policies: []string{"silver"}}); err != nil {
				return err
			}
			if ok, err := tx.DeleteKey(k2); !ok || err != nil {
				t.Fatalf("DeleteKey(k2) = %v, %v", ok, err)
			}
			check("k2 after delete", key(k2), nil)
			if ok, _ := tx.DeleteKey(k2); ok {
				t.Fatal("deleted k2 twice")
			}
			return nil
		})
		snap, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := &spec.Snapshot{Revision: 2, Policies: []spec.Policy{policy("silver", 5)}, Keys: []spec.Key{{KeyHash: k1, Policies: []string{"silver"}}}}
		if !reflect.DeepEqual(snap, want) {
			t.Fatalf("snapshot %+v, want %+v", snap, want)
		}
		changes, err := s.ChangesSince(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		name := map[string]string{k1: "k1", k2: "k2", "gold": "gold", "silver": "silver"}
		var got []string
		for _, c := range changes {
			got = append(got, fmt.Sprintf("%d %s %s %s old=%s", c.Revision, c.Op, c.Object, name[c.ID], c.Old))
		}
		wantChanges := []string{
			`2 put policy silver old=`,
			`2 put key k1 old=`,
			`2 put key k1 old={"key_hash":"` + k1 + `","policies":["gold"]}`,
			`2 delete policy gold old={"id":"gold","rate":{"requests":10,"per":"1m0s"}}`,
			`2 put key k2 old=`,
			`2 delete key k2 old={"key_hash":"` + k2 + `","policies":["silver"]}`,
		}
		if !reflect.DeepEqual(got, wantChanges) {
			t.Fatalf("changes:\n%q\nwant\n%q", got, wantChanges)
		}
	})
}

// TestBulkWriteValidation: one write of 10,000 keys of which three are
// invalid is refused with exactly their problems, keys in hash order,
// each path naming its key; nothing is written. The same keys, fixed,
// are written (the snapshot, decoded on several goroutines, holds them
// all in hash order), and an API change that breaks one of them (api_limits of
// an API turned keyless) is refused naming that key, after the API's own
// problem.
func TestBulkWriteValidation(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		ctx := context.Background()
		api := spec.API{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho}
		update(t, s, func(tx controlplane.Tx) error {
			if err := tx.PutAPI(api); err != nil {
				return err
			}
			return tx.PutPolicy(policy("gold", 10))
		})
		keys := make([]spec.Key, 10000)
		for i := range keys {
			keys[i] = spec.Key{KeyHash: hash(fmt.Sprint("bulk-", i)), Policies: []string{"gold"}}
		}
		bad := map[int]spec.Key{
			17:   {Policies: []string{"nope"}},
			5000: {},
			9999: {Policies: []string{"gold"}, APILimits: map[string]spec.Limits{"orders": {}}},
		}
		putAll := func(tx controlplane.Tx, ks []spec.Key) error {
			for _, k := range ks {
				if err := tx.PutKey(k); err != nil {
					return err
				}
			}
			return nil
		}
		broken := slices.Clone(keys)
		var want []string
		for i, k := range bad {
			k.KeyHash = keys[i].KeyHash
			broken[i] = k
		}
		for _, i := range slices.SortedFunc(maps.Keys(bad), func(a, b int) int { return strings.Compare(keys[a].KeyHash, keys[b].KeyHash) }) {
			at := `spec: keys["` + keys[i].KeyHash + `"]`
			switch i {
			case 17:
				want = append(want, at+`.policies[0]: unknown policy "nope"`)
			case 5000:
				want = append(want, at+`.policies: a key needs at least one policy (or api_limits)`)
			case 9999:
				want = append(want, at+`.api_limits.orders: needs rate or quota`)
			}
		}
		_, err := s.Update(ctx, func(tx controlplane.Tx) error { return putAll(tx, broken) })
		var errs spec.Errors
		if !errors.As(err, &errs) {
			t.Fatalf("bulk write: %v, want spec.Errors", err)
		}
		var got []string
		for _, e := range errs {
			got = append(got, e.Error())
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("bulk write:\n%q\nwant\n%q", got, want)
		}
		if rev := revision(t, s); rev != 1 {
			t.Fatalf("revision %d after a refused write, want 1", rev)
		}
		keys[9999].APILimits = map[string]spec.Limits{"orders": {Rate: &spec.Rate{Requests: 5, Per: spec.Duration(time.Second)}}}
		update(t, s, func(tx controlplane.Tx) error { return putAll(tx, keys) })
		snap, err := s.Snapshot(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.SortedFunc(slices.Values(keys), func(a, b spec.Key) int { return strings.Compare(a.KeyHash, b.KeyHash) })
		if !reflect.DeepEqual(snap.Keys, sorted) {
			t.Fatalf("snapshot holds %d keys, not the %d written in hash order", len(snap.Keys), len(keys))
		}
		keyless := api
		keyless.Auth = spec.AuthKeyless
		_, err = s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutAPI(keyless) })
		if want := `spec: apis["orders"].policies: a keyless API needs at least one policy (applied per client IP)` + "\n" +
			`spec: keys["` + keys[9999].KeyHash + `"].api_limits.orders: API "orders" is keyless; api_limits only apply to api_key APIs`; err == nil || err.Error() != want {
			t.Fatalf("API change: %v, want %s", err, want)
		}
	})
}

// TestOneAPIPerDataPlane: the same listen path may carry one API per data
// plane (disjoint tags), each data plane's snapshot holding its own copy;
// a copy whose tags meet another's is refused.
func TestOneAPIPerDataPlane(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		copyFor := func(id string, tags ...string) spec.API {
			return spec.API{ID: id, ListenPath: "/orders/", Target: spec.BuiltinEcho, Tags: tags}
		}
		update(t, s, func(tx controlplane.Tx) error {
			for _, a := range []spec.API{copyFor("orders-dp1", "dp1"), copyFor("orders-dp2", "dp2")} {
				if err := tx.PutAPI(a); err != nil {
					return err
				}
			}
			return nil
		})
		for _, c := range []struct{ tag, want string }{{"dp1", "orders-dp1"}, {"dp2", "orders-dp2"}} {
			snap, err := s.Snapshot(context.Background(), []string{c.tag})
			if err != nil {
				t.Fatal(err)
			}
			if len(snap.APIs) != 1 || snap.APIs[0].ID != c.want {
				t.Errorf("data plane %s: APIs %+v, want only %s", c.tag, snap.APIs, c.want)
			}
			if err := snap.Validate(); err != nil {
				t.Errorf("data plane %s: its snapshot is invalid: %v", c.tag, err)
			}
		}
		_, err := s.Update(context.Background(), func(tx controlplane.Tx) error {
			return tx.PutAPI(copyFor("orders-eu", "dp2", "eu"))
		})
		want := `spec: apis["orders-eu"].listen_path: "/orders/" is the same path as apis["orders-dp2"].listen_path`
		if err == nil || err.Error() != want {
			t.Fatalf("a copy sharing tag dp2: got %v, want %s", err, want)
		}
	})
}

// TestKeysPages: Reader.Keys returns at most limit keys after a hash, in
// hash order, in a View and in a Tx, which sees its own unwritten puts and
// deletes.
func TestKeysPages(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		hs := []string{hash("a"), hash("b"), hash("c"), hash("d")}
		slices.Sort(hs)
		hashes := func(ks []spec.Key) []string {
			out := []string{}
			for _, k := range ks {
				out = append(out, k.KeyHash)
			}
			return out
		}
		update(t, s, func(tx controlplane.Tx) error {
			if err := tx.PutPolicy(policy("gold", 10)); err != nil {
				return err
			}
			for _, h := range hs[:3] {
				if err := tx.PutKey(spec.Key{KeyHash: h, Policies: []string{"gold"}}); err != nil {
					return err
				}
			}
			return nil
		})
		err := s.View(context.Background(), func(r controlplane.Reader) error {
			for _, c := range []struct {
				after string
				limit int
				want  []string
			}{
				{"", 10, hs[:3]},
				{"", 2, hs[:2]},
				{hs[0], 1, hs[1:2]},
				{hs[2], 5, []string{}},
				{"sha256:" + strings.Repeat("0", 64), 1, hs[:1]},
			} {
				ks, err := r.Keys(c.after, c.limit)
				if err != nil {
					return err
				}
				if got := hashes(ks); !reflect.DeepEqual(got, c.want) {
					t.Fatalf("Keys(%q, %d) = %q, want %q", c.after, c.limit, got, c.want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		update(t, s, func(tx controlplane.Tx) error {
			if err := tx.PutKey(spec.Key{KeyHash: hs[3], Policies: []string{"gold"}}); err != nil {
				return err
			}
			if ok, err := tx.DeleteKey(hs[1]); !ok || err != nil {
				t.Fatalf("DeleteKey = %v, %v", ok, err)
			}
			ks, err := tx.Keys("", 10)
			if err != nil {
				return err
			}
			if got, want := hashes(ks), []string{hs[0], hs[2], hs[3]}; !reflect.DeepEqual(got, want) {
				t.Fatalf("in the Tx: Keys = %q, want %q", got, want)
			}
			return nil
		})
	})
}

// putKeysConcurrently has writers goroutines put each keys apiece (policy
// gold), writer w through stores[w%len(stores)], and fails t unless the
// writes got the revisions 2 to writers×each+1, each once (the store held
// only gold, at revision 1).
func putKeysConcurrently(t *testing.T, writers, each int, stores ...controlplane.Store) {
	t.Helper()
	ctx := context.Background()
	revs := make(chan uint64, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		s := stores[w%len(stores)]
		wg.Go(func() {
			for i := range each {
				k := spec.Key{KeyHash: hash(fmt.Sprint(w, "-", i)), Policies: []string{"gold"}}
				rev, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutKey(k) })
				if err != nil {
					t.Error(err)
					return
				}
				revs <- rev
			}
		})
	}
	wg.Wait()
	close(revs)
	var got []int
	for r := range revs {
		got = append(got, int(r))
	}
	sort.Ints(got)
	for i, r := range got {
		if r != i+2 || len(got) != writers*each {
			t.Fatalf("revisions %v: want 2..%d, each once", got, writers*each+1)
		}
	}
}

// incrementKeysConcurrently has writers Update keys hot-0..hot-<keys-1>
// each times, each Update reading its key and putting it back with
// QuotaEpoch one higher (a read-modify-write; the key is created at 1
// when absent); every third writer lists keys first, which writes a
// shared transaction's earlier writes to the database in the middle of
// it. Writer w writes through stores[w%len(stores)]. It then checks that
// no increment was lost: each key's QuotaEpoch is the number of Updates
// of it, and each change of it in the log has an Old one lower than its
// Value.
func incrementKeysConcurrently(t *testing.T, writers, each, keys int, stores ...controlplane.Store) {
	t.Helper()
	ctx := context.Background()
	var counts = make([]atomic.Int64, keys)
	var wg sync.WaitGroup
	for w := range writers {
		s := stores[w%len(stores)]
		wg.Go(func() {
			for i := range each {
				n := (w + i) % keys
				h := hash(fmt.Sprint("hot-", n))
				_, err := s.Update(ctx, func(tx controlplane.Tx) error {
					if w%3 == 0 {
						if _, err := tx.Keys("", 1); err != nil {
							return err
						}
					}
					k, err := tx.Key(h)
					if err != nil {
						return err
					}
					if k == nil {
						k = &spec.Key{KeyHash: h, Policies: []string{"gold"}}
					}
					k.QuotaEpoch++
					return tx.PutKey(*k)
				})
				if err != nil {
					t.Error(err)
					return
				}
				counts[n].Add(1)
			}
		})
	}
	wg.Wait()
	for _, s := range stores {
		for n := range keys {
			h := hash(fmt.Sprint("hot-", n))
			var got uint64
			if err := s.View(ctx, func(r controlplane.Reader) error {
				k, err := r.Key(h)
				if err != nil || k == nil {
					return fmt.Errorf("key hot-%d: %v, %v", n, k, err)
				}
				got = k.QuotaEpoch
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if want := uint64(counts[n].Load()); got != want {
				t.Errorf("key hot-%d at QuotaEpoch %d after %d increments", n, got, want)
			}
		}
	}
	cs, err := stores[0].ChangesSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	puts := 0
	for _, c := range cs {
		if c.Object != controlplane.ObjectKey {
			continue
		}
		puts++
		var v, old spec.Key
		if err := json.Unmarshal(c.Value, &v); err != nil {
			t.Fatal(err)
		}
		if c.Old != nil {
			if err := json.Unmarshal(c.Old, &old); err != nil {
				t.Fatal(err)
			}
		}
		if v.QuotaEpoch != old.QuotaEpoch+1 {
			t.Fatalf("revision %d: key %s Old at QuotaEpoch %d, Value at %d", c.Revision, c.ID, old.QuotaEpoch, v.QuotaEpoch)
		}
	}
	if puts != writers*each {
		t.Fatalf("%d key changes logged, want %d", puts, writers*each)
	}
}

// TestConcurrentIncrementsLoseNothing: 16 writers make 25
// read-modify-writes each on 4 shared keys, in shared transactions, some
// listing keys first; no increment is lost and every logged Old is the
// value the write replaced.
func TestConcurrentIncrementsLoseNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		s, _ := sc.open(t, 0)
		update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
		incrementKeysConcurrently(t, 16, 25, 4, s)
	})
}
