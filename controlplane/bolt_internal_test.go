package controlplane

import (
	"encoding/json"
	"testing"
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
