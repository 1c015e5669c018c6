package memory

import (
	"runtime"
	"time"

	"github.com/limitplane/limitplane/core"
)

// SeedSlack is how far apart two quota period ends may be and still be
// taken for the same period by Seed: the Redis store reports a period's
// end as a duration from its reply, which Seed adds to its own clock, so
// successive replies about one period differ by their latencies. A period
// that ends more than SeedSlack from the one held is a new one (a quota
// reset deleted the counter), and replaces it.
const SeedSlack = time.Second

// maxSeedReset bounds the durations Seed adds to its clock: τ plus the
// longest reservation, far from overflowing a clock reading.
const maxSeedReset = core.MaxTolerance + int64(core.MaxReservation)

// Seed implements core.Seeder: it makes d, another store's decision for
// req (the Redis store's, when this store is its fallback; req.Rule is this
// store's rule for the same limits), the state of req's key, so that
// requests decided here carry on from it:
//
//   - a rate limit gets the TAT now + d.Rate.ResetAfter, unless the key
//     holds a later one; a window limit enforced as GCRA
//     (Options.WindowsAsGCRA) with Remaining r of Rate becomes a GCRA
//     bucket with r left, Rate − r emission intervals (Period / Rate) from
//     full;
//   - an enforced quota that d reports d.Quota.Limit − d.Quota.Remaining
//     > 0 units used of gets a period of req.QuotaEpoch ending
//     d.Quota.ResetAfter from now (the remaining time carries over, not a
//     fresh Renewal), with that many used. A period held of the same epoch
//     whose end is within SeedSlack of that is the same period: its count
//     is raised to the seen one, never lowered (replies may come out of
//     order). A period of a lower epoch, or one that ended or ends
//     elsewhere, is replaced; one of a higher epoch is kept (a count is
//     never revived below a reset).
//
// A request with a higher epoch than the seeded period then starts a fresh
// one here, as it would in the Redis store. A decision with nothing to
// carry (a full bucket, an unspent quota) changes nothing and adds no key;
// at Options.MaxKeys a new key is skipped (not counted in KeysRefused).
// Seeded keys leave by the sweeps like any other once they limit nothing.
// Seeding a held key costs a lookup and one or two CASes; a key's first
// seed takes the shard lock, and a quota period's first seed allocates it.
func (s *Store) Seed(req core.Request, d core.Decision) {
	r := s.ruleOf(&req)
	if r == nil {
		return
	}
	now := s.clock.now()
	var tat int64
	if r.limited {
		reset := int64(d.Rate.ResetAfter)
		if l := &r.window; l.Rate > 0 {
			reset = 0
			if d.Rate.Remaining < l.Rate {
				reset = (l.Rate - max(d.Rate.Remaining, 0)) * r.p.T
			}
		}
		if reset > 0 {
			tat = now + min(reset, maxSeedReset)
		}
	}
	var used, end int64
	if r.quota && d.Quota.Limit == r.qt.Max && d.Quota.ResetAfter > 0 {
		if u := d.Quota.Limit - d.Quota.Remaining; u > 0 {
			used, end = u, now+int64(min(d.Quota.ResetAfter, r.qt.Renewal))
		}
	}
	if tat == 0 && used == 0 {
		return
	}
	sh, f := s.locate(req.Consumer, req.Rule.Scope())
	t := sh.tab.Load()
	var e *entry
	// Lock-free for a key already held, in the units of r's interval when
	// a TAT is seeded (else put converts it).
	if sl := t.findSlot(f); sl != nil && (tat == 0 || sl.tag() == r.tag) {
		e = &sl.entry
	}
	for {
		if e == nil {
			if c := &s.count; c.max > 0 && c.keys.Load() >= c.max {
				return // at MaxKeys: spare the shard lock
			}
			if t, e = sh.put(f, r, now); e == nil {
				return // at MaxKeys
			}
		}
		if used > 0 && !t.periods {
			sh.holdPeriods() // periods live only in Go heap tables
			e = nil
			continue
		}
		ok := e.seedTAT(tat) && (used == 0 || e.seedPeriod(req.QuotaEpoch, used, end, now))
		runtime.KeepAlive(t) // e is in t
		if ok {
			return
		}
		e = nil // swept or moved meanwhile: look up again under the lock
	}
}

// seedTAT raises e's TAT to tat (0: leave it); false if e is frozen.
func (e *entry) seedTAT(tat int64) bool {
	for {
		cur := e.tat.Load()
		if cur < frozen {
			return false
		}
		if tat == 0 || cur >= tat || e.tat.CompareAndSwap(cur, tat) {
			return true
		}
	}
}

// seedPeriod records used units of a quota period of epoch ending at end
// (see Seed); false if e is frozen.
func (e *entry) seedPeriod(epoch uint64, used, end, now int64) bool {
	for {
		q := e.quota.Load()
		switch {
		case q == tombstone:
			return false
		case q != nil && q.epoch > epoch:
			return true
		case q != nil && q.epoch == epoch && q.end > now && q.end-end <= int64(SeedSlack) && end-q.end <= int64(SeedSlack):
			for {
				u := q.used.Load()
				if u >= used || q.used.CompareAndSwap(u, used) {
					return true
				}
			}
		}
		np := &period{end: end, epoch: epoch}
		np.used.Store(used)
		if e.quota.CompareAndSwap(q, np) {
			return true
		}
	}
}

var _ core.Seeder = (*Store)(nil)
