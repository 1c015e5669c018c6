package spec_test

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/spec"
)

// TestGlobalQuotaCore: spec's quota.global becomes core.Quota.Global.
func TestGlobalQuotaCore(t *testing.T) {
	for _, c := range []struct {
		mode string
		want core.GlobalMode
	}{{"strict", core.GlobalStrict}, {"reserved", core.GlobalReserved}, {"optimistic", core.GlobalOptimistic}} {
		q := &spec.Quota{Max: 1000, Renewal: spec.Duration(time.Minute), Global: &spec.GlobalQuota{Mode: c.mode, Floor: 7, LeaseDuration: spec.Duration(5 * time.Second)}}
		got := q.Quota()
		want := core.Quota{Max: 1000, Renewal: time.Minute, Global: core.GlobalQuota{Mode: c.want, Floor: 7, LeaseDuration: 5 * time.Second}}
		if got != want {
			t.Fatalf("%s: %+v, want %+v", c.mode, got, want)
		}
	}
	if g := (&spec.Quota{Max: 10, Renewal: spec.Duration(time.Minute)}).Quota().Global; g != (core.GlobalQuota{}) {
		t.Fatalf("a quota without global: %+v", g)
	}
}
