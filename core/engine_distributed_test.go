package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// TestMemoryStoreIgnoresDistributed: a store that does not split limits
// decides a distributed request exactly as the same request without the
// flag: the same admitted count and the same Decision.
func TestMemoryStoreIgnoresDistributed(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := memory.New(memory.Options{Clock: clock})
	ctx := context.Background()
	l := core.Limit{Rate: 10, Period: time.Second, Burst: 5}
	plainRule, err := s.Prepare(core.LimitSet{Rate: l})
	if err != nil {
		t.Fatal(err)
	}
	drlRule, err := s.Prepare(core.LimitSet{Rate: l, Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	plain := core.Request{Consumer: "x", Rule: plainRule, Cost: 1}
	drl := core.Request{Consumer: "y", Rule: drlRule, Cost: 1}
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
