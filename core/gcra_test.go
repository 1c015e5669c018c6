package core

import (
	"testing"
	"time"
)

func TestGCRAStep(t *testing.T) {
	// 10/s, burst 5: T = 100ms, τ = 500ms. now = 10s.
	p := Limit{Rate: 10, Period: time.Second, Burst: 5}.GCRA()
	const now = int64(10 * time.Second)
	ms := int64(time.Millisecond)
	cases := []struct {
		name   string
		tat, n int64
		want   GCRAResult
	}{
		{"empty, one", 0, 1, GCRAResult{Allowed: true, Store: true, TAT: now + 100*ms, Remaining: 4, ResetAfter: 100 * ms}},
		{"stale tat is now", now - 5*ms*1000, 1, GCRAResult{Allowed: true, Store: true, TAT: now + 100*ms, Remaining: 4, ResetAfter: 100 * ms}},
		{"whole burst", 0, 5, GCRAResult{Allowed: true, Store: true, TAT: now + 500*ms, Remaining: 0, ResetAfter: 500 * ms}},
		{"full bucket denies", now + 500*ms, 1, GCRAResult{TAT: now + 500*ms, Remaining: 0, ResetAfter: 500 * ms, RetryAfter: 100 * ms}},
		{"partial: 2 needs 50ms more", now + 350*ms, 2, GCRAResult{TAT: now + 350*ms, Remaining: 1, ResetAfter: 350 * ms, RetryAfter: 50 * ms}},
		{"exactly fits", now + 300*ms, 2, GCRAResult{Allowed: true, Store: true, TAT: now + 500*ms, Remaining: 0, ResetAfter: 500 * ms}},
		{"cost above burst", 0, 6, GCRAResult{TAT: now, Remaining: 5, RetryAfter: -1}},
		{"peek empty", 0, 0, GCRAResult{Allowed: true, TAT: now, Remaining: 5}},
		{"peek partial", now + 250*ms, 0, GCRAResult{Allowed: true, TAT: now + 250*ms, Remaining: 2, ResetAfter: 250 * ms}},
		{"tat beyond tolerance after a limit change", now + 900*ms, 0, GCRAResult{TAT: now + 900*ms, Remaining: 0, ResetAfter: 900 * ms, RetryAfter: 400 * ms}},
	}
	for _, c := range cases {
		if got := p.Step(c.tat, now, c.n); got != c.want {
			t.Errorf("%s: Step(%d, now, %d) = %+v, want %+v", c.name, c.tat-now, c.n, got, c.want)
		}
	}
}
