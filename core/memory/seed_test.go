package memory_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// seedPair is a primary store whose every decision seeds a fallback, both
// on one manual clock (the fallback's clock runs 5 h ahead: Seed works in
// durations, not clock readings).
type seedPair struct {
	t                 *testing.T
	clock, fbClock    *core.ManualClock
	primary, fallback *memory.Store
}

func newSeedPair(t *testing.T) *seedPair {
	p := &seedPair{t: t, clock: core.NewManualClock(int64(time.Hour)), fbClock: core.NewManualClock(int64(6 * time.Hour))}
	p.primary = memory.New(memory.Options{Clock: p.clock})
	p.fallback = memory.New(memory.Options{Clock: p.fbClock, MaxKeys: 2})
	return p
}

func (p *seedPair) advance(d time.Duration) { p.clock.Advance(d); p.fbClock.Advance(d) }

// take decides c in the primary and seeds the fallback with it (c's
// limits prepared on each store).
func (p *seedPair) take(c core.Call) core.Decision {
	p.t.Helper()
	d, err := p.primary.Take(context.Background(), request(p.t, p.primary, c))
	if err != nil {
		p.t.Fatal(err)
	}
	p.fallback.Seed(request(p.t, p.fallback, c), d)
	return d
}

// count sends n requests c to s and returns how many were allowed.
func count(t *testing.T, s *memory.Store, c core.Call, n int) int {
	t.Helper()
	req := request(t, s, c)
	allowed := 0
	for range n {
		d, err := s.Take(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// TestSeedQuotaCarriesOn: a fallback seeded with the primary's decisions
// continues the quota from the last count it saw, in the same period: a
// key that spent 300 of 300 gets nothing more, one that spent 100 gets
// exactly 200 more, and the period ends when the primary's would (the
// remaining 40 minutes, not a fresh hour). A raised quota epoch starts a
// fresh period in the fallback too.
func TestSeedQuotaCarriesOn(t *testing.T) {
	p := newSeedPair(t)
	q := core.Quota{Max: 300, Renewal: time.Hour}
	spent := core.Call{Consumer: "spent", Quota: q, Cost: 1, QuotaEpoch: 3}
	part := core.Call{Consumer: "part", Quota: q, Cost: 1, QuotaEpoch: 3}
	for range 300 {
		p.take(spent)
	}
	p.advance(20 * time.Minute)
	for range 100 {
		p.take(part)
	}
	if d := p.take(spent); d.Allowed {
		t.Fatalf("the primary allowed a 301st request: %+v", d)
	}

	if n := count(t, p.fallback, spent, 50); n != 0 {
		t.Errorf("fallback allowed %d more of a spent quota, want 0", n)
	}
	d, _ := p.fallback.Take(context.Background(), request(t, p.fallback, spent))
	if d.DecidedBy != core.KindQuota || d.RetryAfter != 40*time.Minute || d.Quota.Remaining != 0 {
		t.Errorf("spent key in the fallback: %+v; want denied by the quota, retry after 40m", d)
	}
	if n := count(t, p.fallback, part, 300); n != 200 {
		t.Errorf("fallback allowed %d more of a quota 100 of 300 spent, want 200", n)
	}

	// The period carried over ends 40 minutes on, as the primary's does.
	p.advance(40*time.Minute - 1)
	if n := count(t, p.fallback, spent, 1); n != 0 {
		t.Errorf("allowed before the period ended")
	}
	p.advance(1)
	if n := count(t, p.fallback, spent, 300); n != 300 {
		t.Errorf("next period: %d of 300 allowed", n)
	}

	// A raised epoch during the outage starts a fresh period.
	p2 := newSeedPair(t)
	for range 300 {
		p2.take(spent)
	}
	raised := spent
	raised.QuotaEpoch = 4
	if n := count(t, p2.fallback, spent, 5); n != 0 {
		t.Errorf("same epoch: %d allowed, want 0", n)
	}
	if n := count(t, p2.fallback, raised, 301); n != 300 {
		t.Errorf("raised epoch: %d allowed, want a fresh 300", n)
	}
	// A later seed of the old epoch does not revive its count.
	p2.fallback.Seed(request(t, p2.fallback, spent), core.Decision{Quota: core.Status{Limit: 300, Remaining: 0, ResetAfter: time.Hour}})
	if n := count(t, p2.fallback, raised, 1); n != 0 {
		t.Errorf("raised epoch after an old-epoch seed: %d allowed, want 0 (its 300 are spent)", n)
	}
}

// TestSeedNeverLowers: replies that come out of order do not move the
// state back; a period that ends elsewhere (the primary's counter was
// reset) replaces the one held.
func TestSeedNeverLowers(t *testing.T) {
	p := newSeedPair(t)
	q := core.Quota{Max: 10, Renewal: time.Hour}
	req := core.Call{Consumer: "c", Quota: q, Rate: core.Limit{Rate: 10, Period: time.Second}, Cost: 1}
	var ds []core.Decision
	for range 6 {
		d, err := p.primary.Take(context.Background(), request(t, p.primary, req))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	p.fallback.Seed(request(t, p.fallback, req), ds[5])
	p.fallback.Seed(request(t, p.fallback, req), ds[2]) // an older reply, later
	if n := count(t, p.fallback, req, 10); n != 4 {
		t.Errorf("after an out-of-order seed: %d allowed, want 4 (of 10, 6 seen spent)", n)
	}
	// A counter reset in the primary: its next period ends elsewhere.
	p.advance(30 * time.Minute)
	if err := p.primary.ResetQuota(context.Background(), "c", "", 0); err != nil {
		t.Fatal(err)
	}
	p.take(req)
	if n := count(t, p.fallback, req, 10); n != 9 {
		t.Errorf("after the primary's reset: %d allowed, want 9", n)
	}
}

// TestSeedGCRAContinuesFromTAT: a rate limit mid-burst carries on from the
// primary's TAT: 6 of a burst of 10 spent leaves exactly 4, and one more
// every emission interval (100 ms).
func TestSeedGCRAContinuesFromTAT(t *testing.T) {
	p := newSeedPair(t)
	req := core.Call{Consumer: "c", Scope: "api", Rate: core.Limit{Rate: 10, Period: time.Second}, Cost: 1}
	for range 6 {
		p.take(req)
	}
	if n := count(t, p.fallback, req, 10); n != 4 {
		t.Errorf("mid-burst: %d allowed, want 4", n)
	}
	p.advance(100 * time.Millisecond)
	if n := count(t, p.fallback, req, 10); n != 1 {
		t.Errorf("one interval later: %d allowed, want 1", n)
	}
	// A full bucket carries nothing and adds no key; nor does an unspent
	// quota.
	p.fallback.Seed(request(t, p.fallback, core.Call{Consumer: "idle", Rate: req.Rate, Cost: 1}), core.Decision{Rate: core.Status{Limit: 10, Remaining: 10}})
	p.fallback.Seed(request(t, p.fallback, core.Call{Consumer: "idle", Quota: core.Quota{Max: 5, Renewal: time.Hour}, Cost: 0}),
		core.Decision{Quota: core.Status{Limit: 5, Remaining: 5, ResetAfter: time.Hour}})
	if n := p.fallback.Len(); n != 1 {
		t.Errorf("fallback holds %d keys, want 1", n)
	}
	// At MaxKeys (2) a new key is skipped, not counted as refused.
	for _, c := range []string{"x", "y"} {
		p.fallback.Seed(request(t, p.fallback, core.Call{Consumer: c, Rate: req.Rate, Cost: 1}), core.Decision{Rate: core.Status{Limit: 10, Remaining: 9, ResetAfter: 100 * time.Millisecond}})
	}
	if n, r := p.fallback.Len(), p.fallback.KeysRefused(); n != 2 || r != 0 {
		t.Errorf("at the cap: %d keys, %d refused; want 2, 0", n, r)
	}
}

// BenchmarkSeed is what Options.Seed adds to each Redis decision: seeding
// a held key with a rate limit, and with a rate limit and a quota (1000
// keys).
func BenchmarkSeed(b *testing.B) {
	var ids [1000]string
	for i := range ids {
		ids[i] = "consumer-" + strconv.Itoa(i)
	}
	for _, m := range []struct {
		name  string
		quota bool
	}{{"Rate", false}, {"RateQuota", true}} {
		b.Run(m.name, func(b *testing.B) {
			s := memory.New(memory.Options{})
			ls := core.LimitSet{Rate: core.Limit{Rate: 1000, Period: time.Second}}
			d := core.Decision{Rate: core.Status{Limit: 1000, Remaining: 990, ResetAfter: 10 * time.Millisecond}}
			if m.quota {
				ls.Quota = core.Quota{Max: 1 << 40, Renewal: time.Hour}
				d.Quota = core.Status{Limit: 1 << 40, Remaining: 1<<40 - 5, ResetAfter: time.Hour}
			}
			req := core.Request{Rule: prepare(b, s, ls), Cost: 1}
			for _, id := range ids {
				req.Consumer = id
				s.Seed(req, d)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				req.Consumer = ids[i%len(ids)]
				s.Seed(req, d)
			}
		})
	}
}
