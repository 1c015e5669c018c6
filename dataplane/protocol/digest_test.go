package protocol

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

func TestDigestOfEmptySnapshot(t *testing.T) {
	// SHA-256 of the domain string, a zero sum and a zero count.
	const want = "v1:109db3aa75fa43f3c7e9e454a27c6d7e0b70f801461bdf85dc7df55013e46907"
	if got := Digest(&spec.Snapshot{}); got != want {
		t.Fatalf("Digest(empty) = %s, want %s", got, want)
	}
	if got := Digest(nil); got != want {
		t.Fatalf("Digest(nil) = %s, want %s", got, want)
	}
	var d Digester
	if got := d.Digest(); got != want {
		t.Fatalf("zero Digester = %s, want %s", got, want)
	}
}

// Same content, different revision, list order, map order, key hash case
// and time zone: one digest.
func TestDigestIgnoresRevisionOrderCaseAndZone(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	a := snapshotWithKeys(7, 3)
	a.Keys[0].Expires = &exp
	a.Keys[1].APILimits = map[string]spec.Limits{
		"orders":  {Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(time.Hour)}},
		"billing": {Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}},
	}
	b := snapshotWithKeys(99, 3)
	b.Policies[0], b.Policies[1] = b.Policies[1], b.Policies[0]
	b.Keys[0], b.Keys[2] = b.Keys[2], b.Keys[0]
	expTokyo := exp.In(time.FixedZone("JST", 9*3600))
	b.Keys[2].Expires = &expTokyo
	b.Keys[2].KeyHash = strings.ToUpper(b.Keys[2].KeyHash[:7]) + strings.ToUpper(b.Keys[2].KeyHash[7:])
	b.Keys[1].APILimits = map[string]spec.Limits{
		"billing": {Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}},
		"orders":  {Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(time.Hour)}},
	}
	if da, db := Digest(a), Digest(b); da != db {
		t.Fatalf("same content, digests %s and %s", da, db)
	}
}

func TestDigestChangesWithContent(t *testing.T) {
	base := Digest(snapshotWithKeys(1, 3))
	for name, edit := range map[string]func(*spec.Snapshot){
		"policy rate":     func(s *spec.Snapshot) { s.Policies[0].Rate.Requests = 101 },
		"key inactive":    func(s *spec.Snapshot) { s.Keys[1].Inactive = true },
		"key dropped":     func(s *spec.Snapshot) { s.Keys = s.Keys[:2] },
		"key duplicated":  func(s *spec.Snapshot) { s.Keys = append(s.Keys, s.Keys[0]) },
		"api tags":        func(s *spec.Snapshot) { s.APIs[0].Tags = []string{"us"} },
		"policy as api":   func(s *spec.Snapshot) { s.APIs = nil; s.Policies = append(s.Policies, spec.Policy{ID: "orders"}) },
		"key policy list": func(s *spec.Snapshot) { s.Keys[0].Policies = []string{"free", "gold"} },
	} {
		s := snapshotWithKeys(1, 3)
		edit(s)
		if got := Digest(s); got == base {
			t.Errorf("%s: digest unchanged (%s)", name, got)
		}
	}
}

// A Digester kept up to date change by change equals the digest of the
// resulting snapshot.
func TestDigesterFollowsChanges(t *testing.T) {
	s := snapshotWithKeys(1, 5)
	var d Digester
	for i := range s.Policies {
		d.AddPolicy(&s.Policies[i])
	}
	for i := range s.Keys {
		d.AddKey(&s.Keys[i])
	}
	for i := range s.APIs {
		d.AddAPI(&s.APIs[i])
	}
	if got, want := d.Digest(), Digest(s); got != want {
		t.Fatalf("Digester = %s, Digest = %s", got, want)
	}
	updated := s.Keys[2]
	updated.Inactive = true
	d.RemoveKey(&s.Keys[2])
	d.AddKey(&updated)
	d.RemovePolicy(&s.Policies[1])
	d.RemoveAPI(&s.APIs[0])
	api := spec.API{ID: "billing", ListenPath: "/billing/", Target: spec.BuiltinEcho}
	d.AddAPI(&api)

	next := snapshotWithKeys(2, 5)
	next.Keys[2].Inactive = true
	next.Policies = next.Policies[:1]
	next.APIs = []spec.API{api}
	if got, want := d.Digest(), Digest(next); got != want {
		t.Fatalf("Digester after changes = %s, Digest = %s", got, want)
	}
}

// TestParallelSplits: for any count and number of parts, parallel's
// ranges are non-empty, start at multiples of minPart, number at most
// the parts asked for, and cover [0, n) once.
func TestParallelSplits(t *testing.T) {
	for _, parts := range []int{0, 1, 2, 3, 4, 7} {
		for _, n := range []int{0, 1, minPart - 1, minPart, minPart + 1, 2*minPart + 1, 3*minPart + 5, 100003} {
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
			if err != nil || calls > max(parts, 1) {
				t.Fatalf("n=%d parts=%d: %v, %d calls", n, parts, err, calls)
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("n=%d parts=%d: item %d seen %d times", n, parts, i, c)
				}
			}
		}
	}
}
