package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// requestRecorder is a Store that remembers the last Request it was given
// and answers from an in-process store.
type requestRecorder struct {
	mu   sync.Mutex
	last core.Request
	s    core.Store
}

func (r *requestRecorder) Take(ctx context.Context, req core.Request) (core.Decision, error) {
	r.mu.Lock()
	r.last = req
	r.mu.Unlock()
	return r.s.Take(ctx, req)
}

func (r *requestRecorder) ResetQuota(ctx context.Context, consumer, scope string) error {
	return r.s.ResetQuota(ctx, consumer, scope)
}

// TestEngineDistributedFollowsRatePolicy: Request.Distributed is the
// Distributed of the policy whose rate limit the request carries; a
// distributed policy that only sets the quota, or that loses the rate to a
// more generous policy, does not make the request distributed, and a
// consumer's own APILimits are never distributed.
func TestEngineDistributedFollowsRatePolicy(t *testing.T) {
	rec := &requestRecorder{s: memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})}
	e, err := core.NewEngine(rec, core.Config{Policies: []core.Policy{
		{ID: "shared", Rate: core.PerSecond(1000), Distributed: true},
		{ID: "small", Rate: core.PerSecond(10)},
		{ID: "bigger", Rate: core.PerSecond(5000)},
		{ID: "quota-drl", Quota: core.Quota{Max: 100, Renewal: time.Hour}, Distributed: true},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    core.Consumer
		want bool
	}{
		{"distributed rate policy", core.Consumer{ID: "a", Policies: []string{"shared"}}, true},
		{"distributed policy wins the rate", core.Consumer{ID: "b", Policies: []string{"small", "shared"}}, true},
		{"plain policy wins the rate", core.Consumer{ID: "c", Policies: []string{"shared", "bigger"}}, false},
		{"plain policy only", core.Consumer{ID: "d", Policies: []string{"small"}}, false},
		{"distributed policy sets only the quota", core.Consumer{ID: "e", Policies: []string{"small", "quota-drl"}}, false},
		{"own APILimits", core.Consumer{ID: "f", Policies: []string{"shared"}, APILimits: map[string]core.Limits{"api": {Rate: core.PerSecond(1000)}}}, false},
	}
	for _, tc := range cases {
		d, err := e.Decide(context.Background(), &tc.c, "api", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", tc.name, d, err)
		}
		rec.mu.Lock()
		got := rec.last.Distributed
		rec.mu.Unlock()
		if got != tc.want {
			t.Errorf("%s: Request.Distributed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMemoryStoreIgnoresDistributed: a store that does not split limits
// decides a distributed request exactly as the same request without the
// flag: the same admitted count and the same Decision.
func TestMemoryStoreIgnoresDistributed(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := memory.New(memory.Options{Clock: clock})
	ctx := context.Background()
	plain := core.Request{Consumer: "x", Rate: core.Limit{Rate: 10, Period: time.Second, Burst: 5}, Cost: 1}
	drl := plain
	drl.Consumer, drl.Distributed = "y", true
	admitted := 0
	for i := 0; i < 8; i++ {
		dp, err1 := s.Take(ctx, plain)
		dd, err2 := s.Take(ctx, drl)
		if err1 != nil || err2 != nil || dp != dd {
			t.Fatalf("take %d: plain %+v, %v; distributed %+v, %v", i, dp, err1, dd, err2)
		}
		if dd.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of 8 at once, want the burst 5", admitted)
	}
}
