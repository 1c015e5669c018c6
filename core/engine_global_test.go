package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// limitSetRecorder records the LimitSets its inner store prepares.
type limitSetRecorder struct {
	core.Store
	mu   sync.Mutex
	sets []core.LimitSet
}

func (s *limitSetRecorder) Prepare(ls core.LimitSet) (*core.Rule, error) {
	s.mu.Lock()
	s.sets = append(s.sets, ls)
	s.mu.Unlock()
	return s.Store.Prepare(ls)
}

func (s *limitSetRecorder) globalPolicies() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]bool{}
	for _, ls := range s.sets {
		if ls.Quota.Global.Mode != core.NotGlobal {
			m[ls.Quota.Global.Policy+"@"+ls.Scope] = true
		}
	}
	return m
}

// TestEngineGlobalQuotaPolicy: the engine names the policy a global quota
// came from in the LimitSet it prepares (alone, and paired with another
// policy's rate), and no policy for a consumer's own per-API limit; on the
// in-process store a global quota counts as a plain quota.
func TestEngineGlobalQuotaPolicy(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	st := &limitSetRecorder{Store: mem}
	g := core.Quota{Max: 2, Renewal: time.Hour, Global: core.GlobalQuota{Mode: core.GlobalStrict, Policy: "ignored"}}
	e, err := core.NewEngine(st, core.Config{Policies: []core.Policy{
		{ID: "gold", Quota: g},
		{ID: "fast", Rate: core.PerSecond(100)},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []*core.Consumer{
		{ID: "a", Policies: []string{"gold"}},
		{ID: "b", Policies: []string{"gold", "fast"}},
		{ID: "c", APILimits: map[string]core.Limits{"orders": {Quota: g}}},
	} {
		for i := range 3 {
			d, err := e.Decide(ctx, c, "orders", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i < 2) {
				t.Fatalf("%s: request %d allowed %v under a plain quota of 2", c.ID, i, d.Allowed)
			}
		}
	}
	got := st.globalPolicies()
	want := map[string]bool{"gold@": true, "@orders": true}
	if len(got) != len(want) || !got["gold@"] || !got["@orders"] {
		t.Fatalf("global LimitSets prepared: %v, want %v", got, want)
	}
}
