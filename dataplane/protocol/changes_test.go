package protocol

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// mustChange returns a function that passes on a change and fails t on an
// error: mustChange(t)(PutKey(&k)).
func mustChange(t testing.TB) func(*syncpb.Change, error) *syncpb.Change {
	return func(c *syncpb.Change, err error) *syncpb.Change {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func TestApplyChanges(t *testing.T) {
	base := snapshotWithKeys(10, 4)
	base.Keys[1].KeyHash = strings.ToUpper(base.Keys[1].KeyHash) // matched in either case
	before := jsonOf(t, base)

	updated := spec.Key{KeyHash: keyHash(1), Policies: []string{"gold"}}
	added := spec.Key{KeyHash: keyHash(9), Policies: []string{"free"}}
	api := spec.API{ID: "billing", ListenPath: "/billing/", Target: spec.BuiltinEcho}
	ch := &syncpb.Changes{FromRevision: 10, Revision: 12, Nonce: "n", Changes: []*syncpb.Change{
		mustChange(t)(PutKey(&added)),
		mustChange(t)(PutKey(&updated)),
		Delete(syncpb.Change_OBJECT_KEY, keyHash(2)),
		Delete(syncpb.Change_OBJECT_POLICY, "free"),
		mustChange(t)(PutAPI(&api)),
		Delete(syncpb.Change_OBJECT_API, "billing"),
		mustChange(t)(PutAPI(&api)),
	}}
	next, err := ApplyChanges(base, ch)
	if err != nil {
		t.Fatal(err)
	}
	want := snapshotWithKeys(12, 4)
	want.Keys = []spec.Key{want.Keys[0], updated, want.Keys[3], added}
	want.Policies = want.Policies[:1]
	want.APIs = append(want.APIs, api)
	if got, w := jsonOf(t, next), jsonOf(t, want); got != w {
		t.Fatalf("next =\n%s\nwant\n%s", got, w)
	}
	if jsonOf(t, base) != before {
		t.Fatal("base was modified")
	}
}

// More changes to one list than smallOps take the map path.
func TestApplyChangesMany(t *testing.T) {
	base := snapshotWithKeys(1, 100)
	base.Keys[50].KeyHash = strings.ToUpper(base.Keys[50].KeyHash)
	ch := &syncpb.Changes{FromRevision: 1, Revision: 2}
	want := snapshotWithKeys(2, 100)
	for i := 0; i < 100; i += 5 {
		k := spec.Key{KeyHash: keyHash(i), Policies: []string{"gold"}, Expires: new(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))}
		ch.Changes = append(ch.Changes, mustChange(t)(PutKey(&k)))
		want.Keys[i] = k
	}
	ch.Changes = append(ch.Changes, Delete(syncpb.Change_OBJECT_KEY, keyHash(50)))
	want.Keys = append(want.Keys[:50], want.Keys[51:]...)
	next, err := ApplyChanges(base, ch)
	if err != nil {
		t.Fatal(err)
	}
	if got, w := jsonOf(t, next), jsonOf(t, want); got != w {
		t.Fatalf("next =\n%s\nwant\n%s", got, w)
	}
	if len(base.Keys) != 100 || base.Keys[0].Policies[0] != "free" {
		t.Fatal("base was modified")
	}
}

func TestApplyChangesRefuses(t *testing.T) {
	base := snapshotWithKeys(10, 3)
	raw := func(kind syncpb.Change_Kind, obj syncpb.Change_Object, id, js string) *syncpb.Change {
		return &syncpb.Change{Kind: kind, Object: obj, Id: id, Json: []byte(js)}
	}
	put, del := syncpb.Change_KIND_PUT, syncpb.Change_KIND_DELETE
	pol, key := syncpb.Change_OBJECT_POLICY, syncpb.Change_OBJECT_KEY
	for _, tc := range []struct {
		name     string
		from, to uint64
		change   *syncpb.Change
		want     string
	}{
		{"from mismatch", 9, 11, raw(del, pol, "free", ""), "protocol: changes do not start at the running revision: changes 9→11, running 10"},
		{"revision not rising", 10, 10, raw(del, pol, "free", ""), "protocol: changes 10→10: the revision must rise"},
		{"unknown kind", 10, 11, raw(7, pol, "free", ""), "protocol: changes 10→11: change 0: unknown kind 7"},
		{"unspecified kind", 10, 11, raw(0, pol, "free", ""), "protocol: changes 10→11: change 0: unknown kind 0"},
		{"unknown object", 10, 11, raw(del, 9, "free", ""), "protocol: changes 10→11: change 0: unknown object 9"},
		{"empty id", 10, 11, raw(del, pol, "", ""), "protocol: changes 10→11: change 0: empty id"},
		{"bad key id", 10, 11, raw(del, key, "sha256:zz", ""), `protocol: changes 10→11: change 0: key id: identity: key hash "sha256:zz": want sha256:<64 hex digits>`},
		{"malformed json", 10, 11, raw(put, pol, "free", `{"id":"free",`), `protocol: changes 10→11: change 0: put policy "free": decode JSON: unexpected EOF`},
		{"unknown field", 10, 11, raw(put, pol, "free", `{"id":"free","rates":{}}`), `protocol: changes 10→11: change 0: put policy "free": decode JSON: json: unknown field "rates"`},
		{"id mismatch", 10, 11, raw(put, pol, "free", `{"id":"gold"}`), `protocol: changes 10→11: change 0: put policy "free": its JSON has id "gold"`},
		{"delete with json", 10, 11, raw(del, pol, "free", `{"id":"free"}`), `protocol: changes 10→11: change 0: delete of policy "free" carries JSON`},
		{"delete absent", 10, 11, raw(del, key, keyHash(7), ""), fmt.Sprintf("protocol: changes 10→11: change 0: delete of %q, which is not there", keyHash(7))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := jsonOf(t, base)
			next, err := ApplyChanges(base, &syncpb.Changes{FromRevision: tc.from, Revision: tc.to, Changes: []*syncpb.Change{tc.change}})
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %s", err, tc.want)
			}
			if next != nil {
				t.Fatal("a snapshot with the error")
			}
			if jsonOf(t, base) != before {
				t.Fatal("base was modified")
			}
		})
	}
	_, err := ApplyChanges(base, &syncpb.Changes{FromRevision: 3, Revision: 4})
	if !errors.Is(err, ErrRevisionMismatch) {
		t.Fatalf("error %v, want ErrRevisionMismatch", err)
	}
}

// BenchmarkApplyChanges changes one key of a snapshot holding n keys.
func BenchmarkApplyChanges(b *testing.B) {
	for _, n := range []int{1000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			base := snapshotWithKeys(1, n)
			k := spec.Key{KeyHash: keyHash(n / 2), Policies: []string{"gold"}}
			ch := &syncpb.Changes{FromRevision: 1, Revision: 2, Changes: []*syncpb.Change{mustChange(b)(PutKey(&k))}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ApplyChanges(base, ch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
