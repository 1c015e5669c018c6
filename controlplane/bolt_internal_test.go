package controlplane

import (
	"encoding/json"
	"fmt"
	"sync"
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

// TestParallelCoversEachItemOnce: for any count and number of parts,
// parallel's ranges are non-empty, start at multiples of minPart, number
// at most the parts asked for, and cover [0, n) once; its errors are
// joined.
func TestParallelCoversEachItemOnce(t *testing.T) {
	for _, parts := range []int{0, 1, 2, 3, 4, 7} {
		for _, n := range []int{0, 1, minPart - 1, minPart, minPart + 1, 2*minPart + 1, 3*minPart + 5, 10000, 100003} {
			seen := make([]int32, n)
			var mu sync.Mutex
			calls := 0
			err := parallel(n, parts, func(lo, hi int) error {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if lo%minPart != 0 || lo > hi || lo == hi && n > 0 {
					return fmt.Errorf("range [%d, %d)", lo, hi)
				}
				for i := lo; i < hi; i++ {
					seen[i]++
				}
				return nil
			})
			if err != nil {
				t.Fatalf("n=%d parts=%d: %v", n, parts, err)
			}
			if calls > max(parts, 1) {
				t.Fatalf("n=%d parts=%d: %d calls", n, parts, calls)
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("n=%d parts=%d: item %d seen %d times", n, parts, i, c)
				}
			}
		}
	}
	err := parallel(3*minPart, 3, func(lo, hi int) error { return fmt.Errorf("part %d", lo/minPart) })
	if err == nil || err.Error() != "part 0\npart 1\npart 2" {
		t.Fatalf("errors: %v, want the parts' errors joined in order", err)
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
