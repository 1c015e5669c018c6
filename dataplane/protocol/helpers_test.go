package protocol

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// snapshotWithKeys returns a valid snapshot at revision rev with two
// policies, one API and n keys, key i being the hash of "key-i".
func snapshotWithKeys(rev uint64, n int) *spec.Snapshot {
	s := &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{
			{ID: "gold", Rate: &spec.Rate{Requests: 100, Per: spec.Duration(time.Second)}, Quota: &spec.Quota{Max: 1000, Renewal: spec.Duration(24 * time.Hour)}},
			{ID: "free", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute), Burst: 5}},
		},
		APIs: []spec.API{{ID: "orders", ListenPath: "/orders/", Target: spec.BuiltinEcho, Tags: []string{"eu"}}},
		Keys: make([]spec.Key, n),
	}
	for i := range n {
		s.Keys[i] = spec.Key{KeyHash: keyHash(i), Policies: []string{"free"}}
	}
	return s
}

func keyHash(i int) string { return identity.HashKey(fmt.Sprintf("key-%d", i)).String() }

// jsonOf is v's JSON, for comparing snapshots exactly.
func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
