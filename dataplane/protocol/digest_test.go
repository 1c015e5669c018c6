package protocol

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/identity"
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

// variedSnapshot is snapshotWithKeys with n keys of every shape: one or
// two policies, an expiry in a zone other than UTC, inactive, per-API
// limits instead of policies, and quota epochs.
func variedSnapshot(n int) *spec.Snapshot {
	s := snapshotWithKeys(9, 0)
	exp := time.Date(2030, 1, 2, 3, 4, 5, 6, time.FixedZone("x", -7200))
	s.Keys = make([]spec.Key, n)
	for i := range n {
		k := spec.Key{KeyHash: identity.HashKey("golden-" + strconv.Itoa(i)).String(), Policies: []string{"free"}, QuotaEpoch: uint64(i % 13)}
		switch i % 5 {
		case 1:
			k.Policies = []string{"gold", "free"}
		case 2:
			k.Expires = &exp
			k.Inactive = true
		case 3:
			k.Policies = nil
			k.APILimits = map[string]spec.Limits{"orders": {Quota: &spec.Quota{Max: int64(i), Renewal: spec.Duration(time.Hour)}, QuotaEpoch: 2}}
		}
		s.Keys[i] = k
	}
	return s
}

// Digest spreads a large snapshot's keys over GOMAXPROCS goroutines: the
// digest is the same whatever GOMAXPROCS, the same as a Digester given
// the keys one by one with AddKey, and the same as this package's digest
// before it hashed in parallel (the values below were computed then).
func TestDigestParallelIsIdentical(t *testing.T) {
	golden := map[int]string{
		0:     "v1:e4f1f833b713b9289c01eb193609f1f48a8a9868ac34a431dbc1eb0c25831200",
		7:     "v1:6cd7a21c70b034d42d6dcb5a0156bae79f1dd1d32bdfba1437d9c1b2bac6c1e5",
		10000: "v1:7f58badca6b45e8778f277ed8602a410fb8f9d5ca75bd2403540c7fdf5ec3659",
		30011: "v1:6d35255ac3fa33d7c810025448bb7a2d2efa7893cbb29566023c98e635b346e1", // 7 parts at GOMAXPROCS 8
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for n, want := range golden {
		s := variedSnapshot(n)
		var one Digester
		for i := range s.Policies {
			one.AddPolicy(&s.Policies[i])
		}
		for i := range s.Keys {
			one.AddKey(&s.Keys[i])
		}
		for i := range s.APIs {
			one.AddAPI(&s.APIs[i])
		}
		if got := one.Digest(); got != want {
			t.Errorf("%d keys one by one: %s, want %s", n, got, want)
		}
		for _, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			if got := Digest(s); got != want {
				t.Errorf("%d keys, GOMAXPROCS %d: %s, want %s", n, procs, got, want)
			}
		}
	}
}
