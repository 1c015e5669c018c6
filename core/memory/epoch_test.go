package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// TestQuotaEpochLowerSpendsNewerPeriod documents the in-process store's
// answer to a lower quota epoch than the period it holds (a request
// decided with a key's configuration from before a raise): it spends the
// newer period. It neither revives the old count nor resets the newer
// period again when the raised epoch comes back.
func TestQuotaEpochLowerSpendsNewerPeriod(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := memory.New(memory.Options{Clock: clock})
	q := core.Quota{Max: 3, Renewal: time.Hour}
	old := request(t, s, core.Call{Consumer: "c", Quota: q, Cost: 1, QuotaEpoch: 1})
	raised := old
	raised.QuotaEpoch = 2
	want := func(r core.Request, allowed bool, remaining int64) {
		t.Helper()
		d, err := s.Take(context.Background(), r)
		if err != nil || d.Allowed != allowed || d.Remaining != remaining {
			t.Fatalf("epoch %d: %+v, %v; want allowed %v, remaining %d", r.QuotaEpoch, d, err, allowed, remaining)
		}
	}
	want(old, true, 2)
	want(old, true, 1)
	want(raised, true, 2) // fresh period at epoch 2
	want(old, true, 1)    // spends epoch 2's period, not epoch 1's count
	want(raised, true, 0) // not reset again
	want(old, false, 0)
	want(raised, false, 0)

	// A period that ended keeps its epoch: a stale request starts the next
	// one at epoch 2, which the current requests then share.
	clock.Advance(time.Hour)
	want(old, true, 2)
	want(raised, true, 1)
}

// TestResetQuotaKeepsEpoch: after ResetQuota a stale request (lower epoch)
// starts the new period at the epoch the store had, so the next current
// request spends that period instead of resetting it a second time.
func TestResetQuotaKeepsEpoch(t *testing.T) {
	s := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	ctx := context.Background()
	q := core.Quota{Max: 3, Renewal: time.Hour}
	cur := request(t, s, core.Call{Consumer: "c", Scope: "api", Quota: q, Cost: 1, QuotaEpoch: 5})
	stale := cur
	stale.QuotaEpoch = 4
	for range 3 {
		if _, err := s.Take(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ResetQuota(ctx, "c", "api", 5); err != nil {
		t.Fatal(err)
	}
	for i, r := range []core.Request{stale, cur, cur, stale} {
		d, err := s.Take(ctx, r)
		wantAllowed, wantRemaining := i < 3, max(int64(2-i), 0)
		if err != nil || d.Allowed != wantAllowed || d.Remaining != wantRemaining {
			t.Fatalf("request %d after reset (epoch %d): %+v, %v; want allowed %v, remaining %d",
				i+1, r.QuotaEpoch, d, err, wantAllowed, wantRemaining)
		}
	}
}
