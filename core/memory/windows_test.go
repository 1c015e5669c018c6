package memory_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// windowAlgorithms are the algorithms Options.WindowsAsGCRA enforces as
// GCRA.
var windowAlgorithms = []core.Algorithm{core.FixedWindow, core.SlidingWindow, core.SlidingLog}

// TestPrepareRefusesWindowsByDefault: without Options.WindowsAsGCRA the
// store prepares GCRA only; a window limit is refused with
// core.ErrUnsupportedAlgorithm naming the algorithm, alone or beside a
// quota.
func TestPrepareRefusesWindowsByDefault(t *testing.T) {
	s := memory.New(memory.Options{})
	for _, a := range windowAlgorithms {
		l := core.Limit{Rate: 3, Period: time.Minute, Algorithm: a}
		for _, ls := range []core.LimitSet{{Rate: l}, {Rate: l, Quota: core.Quota{Max: 5, Renewal: time.Hour}, Scope: "api"}} {
			r, err := s.Prepare(ls)
			if want := "algorithm not supported by this store: " + a.String(); r != nil || !errors.Is(err, core.ErrUnsupportedAlgorithm) || err.Error() != want {
				t.Fatalf("Prepare(%+v) = %v, %v; want nil, %q", ls, r, err, want)
			}
		}
	}
	if _, err := s.Prepare(core.LimitSet{Rate: core.PerMinute(3)}); err != nil {
		t.Fatalf("Prepare(GCRA): %v", err)
	}
}

// TestWindowsAsGCRA: with Options.WindowsAsGCRA a window limit of N per
// Period is enforced as GCRA with N per Period and a burst of N (its
// Burst, which windows do not use, is ignored): 3 a minute admits 3 at
// once, then one every 20 s, and reports GCRA's numbers (window τ = 1m).
// The prepared rule still holds the limit as configured.
func TestWindowsAsGCRA(t *testing.T) {
	for _, a := range windowAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			clock := core.NewManualClock(int64(time.Hour))
			s := memory.New(memory.Options{Clock: clock, WindowsAsGCRA: true})
			l := core.Limit{Rate: 3, Period: time.Minute, Burst: 10, Algorithm: a}
			rule := prepare(t, s, core.LimitSet{Rate: l})
			if rule.Rate() != l {
				t.Fatalf("rule.Rate() = %+v, want the limit as given %+v", rule.Rate(), l)
			}
			req := core.Request{Consumer: "c", Rule: rule, Cost: 1}
			take := func(what string, allowed bool, remaining int64, reset, retry time.Duration) {
				t.Helper()
				d, err := s.Take(context.Background(), req)
				want := core.Status{Limit: 3, Remaining: remaining, ResetAfter: reset, Window: time.Minute}
				if err != nil || d.Allowed != allowed || d.DecidedBy != core.KindRate || d.Rate != want || d.RetryAfter != retry {
					t.Fatalf("%s: %+v, %v; want allowed %v, rate %+v, retry after %v", what, d, err, allowed, want, retry)
				}
			}
			take("1st", true, 2, 20*time.Second, 0)
			take("2nd", true, 1, 40*time.Second, 0)
			take("3rd", true, 0, time.Minute, 0)
			take("4th", false, 0, time.Minute, 20*time.Second)
			clock.Advance(20 * time.Second)
			take("20s later", true, 0, time.Minute, 0)
			take("20s later, again", false, 0, time.Minute, 20*time.Second)
		})
	}
}

// TestSeedWindowAsGCRA: a window limit's state seeded from another store's
// decision (the Redis store's, under failure_policy fallback) carries over
// as a GCRA bucket: Remaining r of Rate becomes a bucket with r left, Rate
// − r emission intervals (Period / Rate) from full, whatever the window's
// own ResetAfter. 1 of 3 a minute spent leaves exactly 2, then one every
// 20 s; all 3 spent (or a Remaining below 0) leaves none for 20 s; none
// spent carries nothing and adds no key.
func TestSeedWindowAsGCRA(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := memory.New(memory.Options{Clock: clock, WindowsAsGCRA: true})
	rule := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.SlidingWindow}, Scope: "api"})
	seed := func(consumer string, remaining int64) core.Request {
		req := core.Request{Consumer: consumer, Rule: rule, Cost: 1}
		s.Seed(req, core.Decision{Allowed: true, DecidedBy: core.KindRate, Rate: core.Status{Limit: 3, Remaining: remaining, ResetAfter: 55 * time.Second, Window: time.Minute}})
		return req
	}
	admitted := func(req core.Request, n int) (int, core.Decision) {
		t.Helper()
		allowed := 0
		var d core.Decision
		for range n {
			var err error
			if d, err = s.Take(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
			}
		}
		return allowed, d
	}
	part := seed("part", 2)
	if n, d := admitted(part, 10); n != 2 || d.RetryAfter != 20*time.Second {
		t.Fatalf("1 of 3 spent: %d of 10 admitted, last %+v; want 2, then retry after 20s", n, d)
	}
	for _, rem := range []int64{0, -4} {
		req := seed("spent"+strconv.FormatInt(rem, 10), rem)
		if n, d := admitted(req, 5); n != 0 || d.RetryAfter != 20*time.Second {
			t.Fatalf("Remaining %d: %d admitted, last %+v; want 0, retry after 20s", rem, n, d)
		}
	}
	before := s.Len()
	seed("full", 3)
	if s.Len() != before {
		t.Fatalf("a full window's seed added a key: Len %d, want %d", s.Len(), before)
	}
	clock.Advance(20 * time.Second)
	if n, _ := admitted(part, 10); n != 1 {
		t.Fatalf("20s later: %d admitted, want 1", n)
	}
}

// TestForeignRule: a rule the store did not prepare (none, a bare
// core.NewRule, another memory.Store's: its interval tags are that store's)
// is refused with core.ErrForeignRule by Take, TakeInto (which writes the
// zero Decision), Penalize and Seed (which ignores it), and changes
// nothing.
func TestForeignRule(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := memory.New(memory.Options{Clock: clock})
	other := memory.New(memory.Options{Clock: clock})
	ls := core.LimitSet{Rate: core.PerMinute(3)}
	bare, err := core.NewRule(ls, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, rule := range map[string]*core.Rule{"nil": nil, "bare": bare, "another store's": prepare(t, other, ls)} {
		req := core.Request{Consumer: "c", Rule: rule, Cost: 1}
		if d, err := s.Take(ctx, req); !errors.Is(err, core.ErrForeignRule) || d != (core.Decision{}) {
			t.Errorf("%s rule: Take = %+v, %v; want the zero Decision and ErrForeignRule", name, d, err)
		}
		d := core.Decision{Allowed: true, Remaining: 7}
		if err := s.TakeInto(ctx, &req, &d); !errors.Is(err, core.ErrForeignRule) || d != (core.Decision{}) {
			t.Errorf("%s rule: TakeInto = %+v, %v; want the zero Decision and ErrForeignRule", name, d, err)
		}
		if err := s.Penalize(ctx, req, time.Minute); !errors.Is(err, core.ErrForeignRule) {
			t.Errorf("%s rule: Penalize = %v, want ErrForeignRule", name, err)
		}
		s.Seed(req, core.Decision{Rate: core.Status{Limit: 3, Remaining: 0, ResetAfter: time.Minute}})
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("foreign rules left %d keys, want 0", n)
	}
}
