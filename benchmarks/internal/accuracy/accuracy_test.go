package accuracy

import "testing"

// TestOursNeverOvershoot runs the default workload on every limiter, logs
// the table, and asserts only limitplane's: none may admit more than
// burst + rate × elapsed in its own clock, and a limiter on the precise
// clock (the same monotonic clock Run measures with) not in real time
// either. Peers' overshoot is reported, not judged.
func TestOursNeverOvershoot(t *testing.T) {
	var rs []Result
	for _, l := range Limiters {
		r := Run(l, Default)
		rs = append(rs, r)
		if !l.Ours {
			continue
		}
		if r.Admitted > r.OwnBound {
			t.Errorf("%s admitted %d > %d, the bound in its own clock", l.Name, r.Admitted, r.OwnBound)
		}
		if !l.Coarse && r.Overshoot != 0 {
			t.Errorf("%s overshot by %d (admitted %d, bound %d)", l.Name, r.Overshoot, r.Admitted, r.Bound)
		}
		if r.Admitted < Default.Burst {
			t.Errorf("%s admitted %d < burst %d", l.Name, r.Admitted, Default.Burst)
		}
	}
	t.Log("\n" + Table(Default, rs))
}
