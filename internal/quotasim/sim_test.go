package quotasim

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/lease"
)

func seeds(t *testing.T) int {
	if testing.Short() {
		return 20
	}
	return 100
}

func base(name string, mode lease.Mode) Case {
	return Case{
		Name: name, Quota: 10000, Period: 60 * time.Second, Periods: 3,
		Offered: 30000, Split: []int{70, 20, 10}, Mode: mode,
		DelayMin: 5 * time.Millisecond, DelayMax: 80 * time.Millisecond,
	}
}

// summary is min and max over seeds of the admitted per period.
type summary struct{ min, max []int64 }

func (s *summary) add(r Result) {
	for k, p := range r.Periods {
		if len(s.min) <= k {
			s.min, s.max = append(s.min, p.Admitted), append(s.max, p.Admitted)
		}
		s.min[k], s.max[k] = min(s.min[k], p.Admitted), max(s.max[k], p.Admitted)
	}
}

// runCase runs c over the seeds and checks, for every seed: no invariant
// violated, Σ admitted within the bound every period, the ledger's usage
// exact after the drain; then check(seed, result) for the case's own
// numbers.
func runCase(t *testing.T, c Case, check func(t *testing.T, seed uint64, r Result)) summary {
	t.Helper()
	var sum summary
	for seed := range uint64(seeds(t)) {
		r := Run(c, seed)
		sum.add(r)
		for _, v := range r.Violations {
			t.Errorf("%s seed %d: %s", c.Name, seed, v)
		}
		for _, m := range r.Mismatches {
			t.Errorf("%s seed %d: %s", c.Name, seed, m)
		}
		if len(r.Periods) != c.Periods {
			t.Fatalf("%s seed %d: %d periods, want %d", c.Name, seed, len(r.Periods), c.Periods)
		}
		for k, p := range r.Periods {
			limit := c.Quota
			if c.Mode == lease.Optimistic {
				limit = p.SpentFloorBound
				if want := c.Quota + int64(len(c.Split))*c.Floor; p.Bound != want {
					t.Errorf("%s seed %d period %d: reported bound %d, want %d", c.Name, seed, k, p.Bound, want)
				}
			} else if p.Bound != c.Quota {
				t.Errorf("%s seed %d period %d: reported bound %d, want %d", c.Name, seed, k, p.Bound, c.Quota)
			}
			if p.Admitted > limit {
				t.Errorf("%s seed %d period %d: admitted %d > %d", c.Name, seed, k, p.Admitted, limit)
			}
			if p.LedgerSpent != p.Admitted {
				t.Errorf("%s seed %d period %d: ledger spent %d, admitted %d", c.Name, seed, k, p.LedgerSpent, p.Admitted)
			}
		}
		if check != nil {
			check(t, seed, r)
		}
	}
	t.Logf("%s: admitted per period min %v max %v", c.Name, sum.min, sum.max)
	return sum
}

func inRange(t *testing.T, name string, seed uint64, r Result, from int, lo, hi int64) {
	t.Helper()
	for k := from; k < len(r.Periods); k++ {
		if a := r.Periods[k].Admitted; a < lo || a > hi {
			t.Errorf("%s seed %d period %d: admitted %d, want [%d, %d] (per data plane %v)", name, seed, k, a, lo, hi, r.Periods[k].PerDataPlane)
		}
	}
}

func TestHealthy(t *testing.T) {
	t.Parallel()
	for _, m := range []lease.Mode{lease.Strict, lease.Reserved, lease.Optimistic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			c := base("healthy/"+m.String(), m)
			if m != lease.Strict {
				c.Floor = 200
			}
			runCase(t, c, func(t *testing.T, seed uint64, r Result) { inRange(t, c.Name, seed, r, 0, 9900, 10000) })
		})
	}
}

func TestDemandShift(t *testing.T) {
	t.Parallel()
	c := base("shift/strict", lease.Strict)
	c.Rotate = true
	runCase(t, c, func(t *testing.T, seed uint64, r Result) { inRange(t, c.Name, seed, r, 1, 9900, 10000) })
}

// TestTightDemandShift: offered 12,000 per period, just above Q, the split
// rotating: a data plane whose demand fell holds leases sized to its old
// demand, which must come back for the others to reach Q.
func TestTightDemandShift(t *testing.T) {
	t.Parallel()
	c := base("tight shift/strict", lease.Strict)
	c.Offered, c.Rotate = 12000, true
	runCase(t, c, func(t *testing.T, seed uint64, r Result) { inRange(t, c.Name, seed, r, 1, 9900, 10000) })
}

func TestCutOff(t *testing.T) {
	t.Parallel()
	for _, m := range []lease.Mode{lease.Strict, lease.Reserved, lease.Optimistic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			c := base("cut dp2 10-40s/"+m.String(), m)
			if m != lease.Strict {
				c.Floor = 200
			}
			c.Cuts = []Cut{{DataPlane: 1, From: 10 * time.Second, To: 40 * time.Second}, {DataPlane: 2, From: 70 * time.Second, To: 130 * time.Second}}
			floorSpent := 0
			runCase(t, c, func(t *testing.T, seed uint64, r Result) {
				for _, p := range r.Periods {
					if p.SpentFloorBound > c.Quota {
						floorSpent++
					}
				}
			})
			if m == lease.Optimistic && floorSpent == 0 {
				t.Errorf("%s: no seed spent an optimistic floor: the cut did not bite", c.Name)
			}
		})
	}
}

func TestLossyReports(t *testing.T) {
	t.Parallel()
	for _, m := range []lease.Mode{lease.Strict, lease.Reserved, lease.Optimistic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			c := base("loss 20% dup 10%/"+m.String(), m)
			if m != lease.Strict {
				c.Floor = 200
			}
			c.Loss, c.Dup = 0.2, 0.1
			runCase(t, c, nil)
		})
	}
}

func TestControlPlaneCrash(t *testing.T) {
	t.Parallel()
	for _, m := range []lease.Mode{lease.Strict, lease.Reserved, lease.Optimistic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			c := base("cp crash/"+m.String(), m)
			if m != lease.Strict {
				c.Floor = 200
			}
			c.Loss, c.Dup = 0.05, 0.05
			c.Crashes = []Crash{{At: 5 * time.Second, Down: 3 * time.Second}, {At: 25 * time.Second, Down: 8 * time.Second}, {At: 61 * time.Second, Down: 2 * time.Second}, {At: 150 * time.Second, Down: 10 * time.Second}, {At: 185 * time.Second, Down: 2 * time.Second}}
			runCase(t, c, nil)
		})
	}
}

func TestDataPlaneChurn(t *testing.T) {
	t.Parallel()
	c := base("churn/strict", lease.Strict)
	// Long delays, so the old holder's messages arrive after the new one's.
	c.Loss, c.Dup, c.DelayMax = 0.1, 0.2, 1500*time.Millisecond
	c.Churns = []Churn{{DataPlane: 0, At: 3 * time.Second}, {DataPlane: 1, At: 12 * time.Second}, {DataPlane: 0, At: 12*time.Second + 150*time.Millisecond}, {DataPlane: 2, At: 70 * time.Second}, {DataPlane: 0, At: 125 * time.Second}}
	fenced := 0
	runCase(t, c, func(t *testing.T, seed uint64, r Result) { fenced += r.Fenced })
	t.Logf("%s: %d stale-token refusals over the seeds", c.Name, fenced)
	if fenced == 0 {
		t.Errorf("%s: no old holder's message was refused: fencing not exercised", c.Name)
	}
}

// TestNegativeControl: with grants not debited the same checks must see
// Σ admitted > Q.
func TestNegativeControl(t *testing.T) {
	t.Parallel()
	c := base("no debit/strict", lease.Strict)
	c.NoDebit = true
	c.Periods = 2
	caught := 0
	for seed := range uint64(seeds(t)) {
		r := Run(c, seed)
		for _, p := range r.Periods {
			if p.Admitted > c.Quota {
				caught++
				break
			}
		}
	}
	t.Logf("%s: overshoot caught in %d of %d seeds", c.Name, caught, seeds(t))
	if caught == 0 {
		t.Fatalf("%s: Σ admitted never exceeded Q: the simulator does not catch an overshoot", c.Name)
	}
}

// TestDeterministic: one (case, seed) gives one result.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	c := base("det", lease.Optimistic)
	c.Floor, c.Loss, c.Dup = 200, 0.2, 0.1
	c.Cuts = []Cut{{DataPlane: 1, From: 10 * time.Second, To: 40 * time.Second}}
	c.Crashes = []Crash{{At: 20 * time.Second, Down: 5 * time.Second}}
	a, b := Run(c, 7), Run(c, 7)
	for k := range a.Periods {
		if a.Periods[k].Admitted != b.Periods[k].Admitted || a.Grants != b.Grants || a.Reports != b.Reports {
			t.Fatalf("period %d: %+v then %+v", k, a.Periods[k], b.Periods[k])
		}
	}
}
