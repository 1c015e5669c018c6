package core

import "testing"

// TestNilRuleAccessors: every accessor of a nil *Rule answers the zero
// value (a rule that limits nothing), so a wrapper store may read them
// before the store it wraps refuses the request with ErrForeignRule.
func TestNilRuleAccessors(t *testing.T) {
	var r *Rule
	if r.Limits() != (LimitSet{}) || r.Rate() != (Limit{}) || r.Quota() != (Quota{}) || r.Scope() != "" ||
		r.Distributed() || r.RateEnforced() || r.QuotaEnforced() || r.Enforced() || r.GCRA() != (GCRAParams{}) || r.Data() != nil {
		t.Errorf("a nil rule's accessors: %+v %+v %+v %q %v %v %v %v %+v %v", r.Limits(), r.Rate(), r.Quota(), r.Scope(),
			r.Distributed(), r.RateEnforced(), r.QuotaEnforced(), r.Enforced(), r.GCRA(), r.Data())
	}
}
