package seams

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestOr: a nil *Seams is the system's (Now is time.Now, Clock and
// AfterFunc nil); a set field is kept, and an unset Now still defaults.
func TestOr(t *testing.T) {
	var s *Seams
	v := s.Or()
	if v.Clock != nil || v.AfterFunc != nil || v.Now == nil {
		t.Fatalf("nil.Or() = %+v, want only Now set", v)
	}
	if d := time.Since(v.Now()); d < 0 || d > time.Minute {
		t.Errorf("nil.Or().Now() is %v from time.Now", d)
	}
	epoch := time.Unix(1_700_000_000, 0)
	clock := core.NewManualClock(42)
	v = (&Seams{Clock: clock, Now: func() time.Time { return epoch }}).Or()
	if v.Clock != clock || !v.Now().Equal(epoch) || v.AfterFunc != nil {
		t.Errorf("Or() = %+v, want the clock, epoch and no AfterFunc", v)
	}
	v = (&Seams{Clock: clock}).Or()
	if v.Clock != clock || v.Now == nil {
		t.Errorf("Or() without Now = %+v, want the clock and time.Now", v)
	}
}
