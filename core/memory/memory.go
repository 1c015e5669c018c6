// Package memory is limitplane's in-process Store: sharded, lock-free per
// key, with no goroutine per key.
//
// Each key holds one atomic theoretical arrival time (GCRA's TAT), updated
// with a compare-and-swap loop, and, when a quota applies, a pointer to its
// current quota period whose used count is likewise a CAS-updated atomic.
// Keys are spread over shards by a seeded hash; a shard's read-write mutex
// guards only its map (lookups take the read side), never a key's state.
//
// An entry whose TAT has passed and whose quota period has ended is the same
// state as no entry (DESIGN.md), so sweeps drop such entries without loss.
// Sweeps are amortised: a shard sweeps itself when an insert finds it has
// doubled since its last sweep, which keeps memory proportional to the keys
// that are still limited. Sweep and Options.SweepInterval add explicit and
// periodic sweeps. An exhausted key is never dropped while still limited.
package memory

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitplane/limitplane/core"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Clock is the time source; default core.NewSystemClock(). A
	// *core.CoarseClock is fastest; a *core.ManualClock makes tests exact.
	Clock core.Clock
	// Shards is the number of shards, rounded up to a power of two;
	// default 256.
	Shards int
	// SweepInterval, when > 0, starts one goroutine that sweeps every
	// shard at that interval until Close. Amortised sweeps on insert run
	// either way.
	SweepInterval time.Duration
}

// minSweepAt is the smallest shard size at which an insert sweeps.
const minSweepAt = 64

// dead marks an entry's TAT while a sweep removes it. Any goroutine that sees
// it looks the key up again (blocking on the shard lock the sweep holds).
const dead = math.MinInt64

type key struct{ consumer, scope string }

type entry struct {
	tat   atomic.Int64           // GCRA theoretical arrival time; 0 = none; dead while being removed
	quota atomic.Pointer[period] // current quota period; nil = none; tombstone while being removed
}

type period struct {
	end  int64 // ns on the store's clock when the period renews
	used atomic.Int64
}

// tombstone is the quota pointer of an entry being removed. It is never
// written to.
var tombstone = &period{}

type shard struct {
	mu        sync.RWMutex
	m         map[key]*entry
	nextSweep int
	_         [64]byte // keep shards on separate cache lines
}

// Store is the in-process Store. Create it with New; it is safe for
// concurrent use.
type Store struct {
	clock  core.Clock
	seed   maphash.Seed
	mask   uint64
	shards []shard
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
}

// New returns a Store configured by opts.
func New(opts Options) *Store {
	n := 256
	if opts.Shards > 0 {
		n = 1
		for n < opts.Shards {
			n <<= 1
		}
	}
	s := &Store{clock: opts.Clock, seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n)}
	if s.clock == nil {
		s.clock = core.NewSystemClock()
	}
	for i := range s.shards {
		s.shards[i].m = make(map[key]*entry)
		s.shards[i].nextSweep = minSweepAt
	}
	if opts.SweepInterval > 0 {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.janitor(opts.SweepInterval)
	}
	return s
}

// Close stops the periodic sweeper, if any. The Store stays usable.
func (s *Store) Close() error {
	s.closed.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
	return nil
}

func (s *Store) janitor(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.Sweep()
		case <-s.stop:
			return
		}
	}
}

func (s *Store) shardOf(consumer string) *shard {
	return &s.shards[maphash.String(s.seed, consumer)&s.mask]
}

// lookup returns the entry for k, or nil.
func (sh *shard) lookup(k key) *entry {
	sh.mu.RLock()
	e := sh.m[k]
	sh.mu.RUnlock()
	return e
}

// create returns the entry for k, inserting one if needed.
func (sh *shard) create(k key, now int64) *entry {
	sh.mu.Lock()
	e := sh.m[k]
	if e == nil {
		if len(sh.m) >= sh.nextSweep {
			sh.sweepLocked(now)
		}
		e = new(entry)
		sh.m[k] = e
	}
	sh.mu.Unlock()
	return e
}

// Sweep drops every entry that no longer limits anything: TAT passed and
// quota period ended (or absent).
func (s *Store) Sweep() {
	now := s.clock.Nanotime()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepLocked(now)
		sh.mu.Unlock()
	}
}

// sweepLocked removes idle entries. Holding the write lock means no one can
// look an entry up meanwhile; a goroutine that already holds a pointer sees
// the dead/tombstone marks, fails its CAS, and looks up again after us.
func (sh *shard) sweepLocked(now int64) {
	for k, e := range sh.m {
		t := e.tat.Load()
		if t > now || !e.tat.CompareAndSwap(t, dead) {
			continue
		}
		q := e.quota.Load()
		if (q != nil && q.end > now) || !e.quota.CompareAndSwap(q, tombstone) {
			e.tat.Store(t) // still limited by its quota: revive
			continue
		}
		delete(sh.m, k)
	}
	sh.nextSweep = max(2*len(sh.m), minSweepAt)
}

// Len returns the number of keys held (for tests and metrics).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// errRetry tells Take that an entry was removed under it.
var errRetry = errors.New("entry removed; retry")

// Take implements core.Store. Only GCRA is supported; other algorithms
// return core.ErrUnsupportedAlgorithm.
func (s *Store) Take(_ context.Context, req core.Request) (core.Decision, error) {
	if req.Cost < 0 {
		return core.Decision{}, core.ErrInvalidCost
	}
	var p core.GCRAParams
	limited := !req.Rate.IsUnlimited()
	if limited {
		var err error
		if p, err = req.Rate.CheckedGCRA(); err != nil {
			return core.Decision{}, err
		}
		if req.Rate.Algorithm != core.GCRA {
			return core.Decision{}, core.ErrUnsupportedAlgorithm
		}
	}
	quota := !req.Quota.IsUnlimited()
	if quota {
		if err := req.Quota.Validate(); err != nil {
			return core.Decision{}, err
		}
	}
	k := key{req.Consumer, req.Scope}
	sh := s.shardOf(req.Consumer)
	now := s.clock.Nanotime()
	e := sh.lookup(k)
	if e == nil {
		if req.Cost == 0 || (limited && req.Cost > p.Burst) || (quota && req.Cost > req.Quota.Max) {
			// Cannot change state: answer from the empty state, create nothing.
			return decide(nil, p, limited, req, now)
		}
		e = sh.create(k, now)
	}
	for {
		d, err := decide(e, p, limited, req, now)
		if err != errRetry {
			return d, err
		}
		e = sh.create(k, now)
	}
}

// decide applies req to e (nil means the empty state, read-only).
func decide(e *entry, p core.GCRAParams, limited bool, req core.Request, now int64) (core.Decision, error) {
	var d core.Decision
	n := req.Cost
	quota := !req.Quota.IsUnlimited()

	// 1. Quota peek: an exhausted quota denies without touching the rate.
	var q *period
	if quota {
		if e != nil {
			if q = e.quota.Load(); q == tombstone {
				return d, errRetry
			}
		}
		if q != nil && q.end <= now {
			q = nil // ended: the next spend starts a new period
		}
		used := int64(0)
		if q != nil {
			used = q.used.Load()
		}
		if used+n > req.Quota.Max {
			setQuota(&d, req.Quota, q, used, now)
			d.DecidedBy, d.RetryAfter = core.KindQuota, d.Quota.ResetAfter
			if n > req.Quota.Max {
				d.RetryAfter = -1
			}
			if limited {
				tat := int64(0)
				if e != nil {
					tat = e.tat.Load()
				}
				setRate(&d, p, p.Step(tat, now, 0))
			}
			d.Limit, d.Remaining, d.ResetAfter = d.Quota.Limit, d.Quota.Remaining, d.Quota.ResetAfter
			return d, nil
		}
	}

	// 2. Rate: CAS the TAT forward.
	var r core.GCRAResult
	var oldTAT int64
	if limited {
		for {
			tat := int64(0)
			if e != nil {
				if tat = e.tat.Load(); tat == dead {
					return d, errRetry
				}
			}
			r = p.Step(tat, now, n)
			if !r.Store || e.tat.CompareAndSwap(tat, r.TAT) {
				oldTAT = tat
				break
			}
		}
		setRate(&d, p, r)
		if !r.Allowed {
			d.DecidedBy, d.RetryAfter = core.KindRate, time.Duration(r.RetryAfter)
			if quota {
				used := int64(0)
				if q != nil {
					used = q.used.Load()
				}
				setQuota(&d, req.Quota, q, used, now)
			}
			d.Limit, d.Remaining, d.ResetAfter = d.Rate.Limit, d.Rate.Remaining, d.Rate.ResetAfter
			return d, nil
		}
	}

	// 3. Quota spend.
	if quota {
		for n > 0 {
			q = e.quota.Load()
			if q == tombstone {
				refund(e, p, limited && r.Store, n)
				return core.Decision{}, errRetry
			}
			if q == nil || q.end <= now {
				np := &period{end: now + int64(req.Quota.Renewal)}
				np.used.Store(n)
				if e.quota.CompareAndSwap(q, np) {
					q = np
					break
				}
				continue
			}
			used := q.used.Load()
			if used+n > req.Quota.Max {
				// Lost a race for the last units: undo the rate step.
				refund(e, p, limited && r.Store, n)
				d = core.Decision{}
				if limited {
					setRate(&d, p, p.Step(oldTAT, now, 0))
				}
				setQuota(&d, req.Quota, q, used, now)
				d.DecidedBy, d.RetryAfter = core.KindQuota, d.Quota.ResetAfter
				d.Limit, d.Remaining, d.ResetAfter = d.Quota.Limit, d.Quota.Remaining, d.Quota.ResetAfter
				return d, nil
			}
			if q.used.CompareAndSwap(used, used+n) {
				break
			}
		}
		used := int64(0)
		if q != nil && q.end > now {
			used = q.used.Load()
		} else {
			q = nil
		}
		setQuota(&d, req.Quota, q, used, now)
	}

	d.Allowed = true
	if limited {
		d.DecidedBy = core.KindRate
		d.Limit, d.Remaining, d.ResetAfter = d.Rate.Limit, d.Rate.Remaining, d.Rate.ResetAfter
	} else if quota {
		d.DecidedBy = core.KindQuota
		d.Limit, d.Remaining, d.ResetAfter = d.Quota.Limit, d.Quota.Remaining, d.Quota.ResetAfter
	}
	return d, nil
}

// refund gives back n×T of TAT after the quota denied a request whose rate
// step was already stored. The CAS loop makes it exact under concurrency:
// the result equals the state in which this request never happened.
func refund(e *entry, p core.GCRAParams, stored bool, n int64) {
	if !stored {
		return
	}
	for {
		t := e.tat.Load()
		if t == dead || e.tat.CompareAndSwap(t, t-n*p.T) {
			return
		}
	}
}

func setRate(d *core.Decision, p core.GCRAParams, r core.GCRAResult) {
	d.Rate = core.Status{Limit: p.Burst, Remaining: r.Remaining, ResetAfter: time.Duration(r.ResetAfter), Window: time.Duration(p.Tau)}
}

// setQuota fills the quota status from period q (nil: not started, the
// renewal would start now) with used units.
func setQuota(d *core.Decision, qt core.Quota, q *period, used, now int64) {
	reset := int64(qt.Renewal)
	if q != nil {
		reset = q.end - now
	} else {
		used = 0
	}
	d.Quota = core.Status{Limit: qt.Max, Remaining: max(qt.Max-used, 0), ResetAfter: time.Duration(reset), Window: qt.Renewal}
}

// ResetQuota deletes the quota period of (consumer, scope).
func (s *Store) ResetQuota(_ context.Context, consumer, scope string) error {
	sh := s.shardOf(consumer)
	k := key{consumer, scope}
	for {
		e := sh.lookup(k)
		if e == nil {
			return nil
		}
		q := e.quota.Load()
		if q == tombstone {
			continue // being removed; look again
		}
		if q == nil || e.quota.CompareAndSwap(q, nil) {
			return nil
		}
	}
}

var _ core.Store = (*Store)(nil)
