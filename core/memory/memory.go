// Package memory is limitplane's in-process Store: sharded, lock-free per
// key, with no goroutine per key.
//
// Each key holds one atomic theoretical arrival time (GCRA's TAT), updated
// with a compare-and-swap loop, and, when a quota applies, a pointer to its
// current quota period whose used count is likewise a CAS-updated atomic.
// A key is hashed once, with a per-process random seed: the consumer's hash
// picks the shard (so all of a consumer's keys share one), and the hash of
// consumer and scope indexes the shard's open-addressing table. Lookups read
// the table without a lock (atomic loads only); inserts, sweeps and resizes
// take the shard's mutex, never a key's state. A table is never changed in
// a way that hides a live key from a reader: removal leaves a deleted mark,
// and a resize publishes a new table while the old one stays intact, so a
// reader at worst finds an entry just swept (its TAT reads dead; it then
// looks again under the lock) or misses a key inserted while it looked (the
// lookup then takes effect before that insert; a request that changes
// state inserts under the lock, where it finds the key).
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
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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

// minSlots is the size of a shard's first table.
const minSlots = 8

// dead marks an entry's TAT while a sweep removes it. Any goroutine that sees
// it looks the key up again (blocking on the shard lock the sweep holds).
const dead = math.MinInt64

// entry is one key's state: 48 bytes plus the key (see newEntry), which
// with its 16-byte table slot (tables are filled between 3/8 and 3/4 as
// they grow) keeps a key under 100 bytes of heap besides the key itself.
type entry struct {
	tat      atomic.Int64           // GCRA theoretical arrival time; 0 = none; dead while being removed
	quota    atomic.Pointer[period] // current quota period; nil = none; tombstone while being removed
	consumer string
	scope    string
}

func (e *entry) is(consumer, scope string) bool {
	return e.consumer == consumer && e.scope == scope
}

// Entries with room for their key: a lookup that finds an entry compares
// the key it holds, and with the key in the same allocation that costs no
// second cache miss (or TLB miss) on a large store. The store also never
// keeps a caller's string alive, which might pin a larger buffer.
type (
	entry16 struct {
		entry
		key [16]byte
	}
	entry32 struct {
		entry
		key [32]byte
	}
	entry48 struct {
		entry
		key [48]byte
	}
	entry80 struct {
		entry
		key [80]byte
	}
)

// newEntry returns an empty entry for (consumer, scope) holding its own
// copy of both, inline when they total at most 80 bytes.
func newEntry(consumer, scope string) *entry {
	var e *entry
	var buf []byte
	switch n := len(consumer) + len(scope); {
	case n <= 16:
		x := new(entry16)
		e, buf = &x.entry, x.key[:n]
	case n <= 32:
		x := new(entry32)
		e, buf = &x.entry, x.key[:n]
	case n <= 48:
		x := new(entry48)
		e, buf = &x.entry, x.key[:n]
	case n <= 80:
		x := new(entry80)
		e, buf = &x.entry, x.key[:n]
	default:
		return &entry{consumer: strings.Clone(consumer), scope: strings.Clone(scope)}
	}
	copy(buf[copy(buf, consumer):], scope)
	// The strings point into the entry's own array, which is never
	// written again; they keep the whole allocation alive.
	if consumer != "" {
		e.consumer = unsafe.String(&buf[0], len(consumer))
	}
	if scope != "" {
		e.scope = unsafe.String(&buf[len(consumer)], len(scope))
	}
	return e
}

type period struct {
	end  int64 // ns on the store's clock when the period renews
	used atomic.Int64
}

// tombstone is the quota pointer of an entry being removed. It is never
// written to.
var tombstone = &period{}

// deleted marks a table slot whose entry was swept. Probes pass over it.
var deleted = &entry{}

// slot is one cell of a table: a key hash and its entry. An empty slot
// (nil entry) ends a probe; a slot, once filled, only ever changes to
// deleted.
type slot struct {
	hash atomic.Uint64
	e    atomic.Pointer[entry]
}

// table is an open-addressing hash table with linear probing. Its size is a
// power of two and at least a quarter of it stays empty, so probes end.
type table struct {
	slots []slot
	mask  uint64
}

func newTable(size int) *table {
	return &table{slots: make([]slot, size), mask: uint64(size - 1)}
}

type shard struct {
	tab atomic.Pointer[table]
	mu  sync.Mutex // serialises writers: inserts, sweeps, resizes
	// Guarded by mu:
	live      int      // entries in tab
	used      int      // live plus deleted slots in tab
	nextSweep int      // live count at which an insert sweeps first
	_         [64]byte // keep shards on separate cache lines
}

// Store is the in-process Store. Create it with New; it is safe for
// concurrent use.
type Store struct {
	clock  clock
	shift  uint // a consumer hash's top bits pick its shard: h >> shift
	shards []shard
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
}

// New returns a Store configured by opts.
func New(opts Options) *Store {
	n, shift := 256, uint(56)
	if opts.Shards > 0 {
		n, shift = 1, 64
		for n < opts.Shards {
			n, shift = n<<1, shift-1
		}
	}
	s := &Store{clock: newClock(opts.Clock), shift: shift, shards: make([]shard, n)}
	for i := range s.shards {
		s.shards[i].tab.Store(newTable(minSlots))
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

// Seeds of the key hash, random per process.
var consumerSeed, scopeSeed = maphash.MakeSeed(), maphash.MakeSeed()

// keyHash returns the map hash of (consumer, scope) given the consumer's
// hash hc. Scopes are hashed with their own seed, so swapping consumer and
// scope gives an unrelated hash.
func keyHash(hc uint64, scope string) uint64 {
	if scope != "" {
		hc ^= maphash.String(scopeSeed, scope)
	}
	return hc
}

// locate returns the shard of (consumer, scope) and the key's hash.
func (s *Store) locate(consumer, scope string) (*shard, uint64) {
	hc := maphash.String(consumerSeed, consumer)
	return &s.shards[hc>>s.shift], keyHash(hc, scope)
}

// get returns the entry for (consumer, scope) with hash h, or nil. It takes
// no lock; nil may mean the key was inserted while get looked (see the
// package comment), so a caller that must be sure asks put.
func (sh *shard) get(h uint64, consumer, scope string) *entry {
	t := sh.tab.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		e := sl.e.Load()
		if e == nil {
			return nil
		}
		if sl.hash.Load() == h && e != deleted && e.is(consumer, scope) {
			return e
		}
	}
}

// put returns the entry for (consumer, scope) with hash h, inserting one if
// needed.
func (sh *shard) put(h uint64, consumer, scope string, now int64) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.get(h, consumer, scope); e != nil {
		return e
	}
	if sh.live >= sh.nextSweep {
		sh.sweepLocked(now)
	}
	t := sh.tab.Load()
	if 4*(sh.used+1) > 3*len(t.slots) {
		t = sh.resize(sh.live + 1)
	}
	e := newEntry(consumer, scope)
	t.insert(h, e)
	sh.live++
	sh.used++
	return e
}

// insert puts e in the first empty slot of h's probe sequence. The hash is
// stored before the entry, so a reader that sees the entry sees its hash.
func (t *table) insert(h uint64, e *entry) {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		if sl := &t.slots[i]; sl.e.Load() == nil {
			sl.hash.Store(h)
			sl.e.Store(e)
			return
		}
	}
}

// resize publishes a new table for the live entries, the smallest that n
// entries fill at most half of, and returns it. Growth (at 3/4) therefore
// doubles the table. The old table is left as it is for readers still
// probing it.
func (sh *shard) resize(n int) *table {
	size := minSlots
	for 2*n > size {
		size <<= 1
	}
	old := sh.tab.Load()
	t := newTable(size)
	for i := range old.slots {
		sl := &old.slots[i]
		if e := sl.e.Load(); e != nil && e != deleted {
			t.insert(sl.hash.Load(), e)
		}
	}
	sh.tab.Store(t)
	sh.used = sh.live
	return t
}

// Sweep drops every entry that no longer limits anything: TAT passed and
// quota period ended (or absent).
func (s *Store) Sweep() {
	now := s.clock.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepLocked(now)
		sh.mu.Unlock()
	}
}

// sweepLocked removes idle entries and, when that leaves the table mostly
// empty, moves the rest to a smaller one, so memory follows the live keys.
// A goroutine that already holds a removed entry sees its dead/tombstone
// marks, fails its CAS, and looks up again under the lock.
func (sh *shard) sweepLocked(now int64) {
	t := sh.tab.Load()
	for i := range t.slots {
		sl := &t.slots[i]
		if e := sl.e.Load(); e != nil && e != deleted && e.kill(now) {
			sl.e.Store(deleted)
			sh.live--
		}
	}
	if len(t.slots) > minSlots && 8*sh.live < len(t.slots) {
		sh.resize(sh.live)
	}
	sh.nextSweep = max(2*sh.live, minSweepAt)
}

// kill marks e dead and reports true if it no longer limits anything at now;
// the caller, holding the write lock, then removes it from its map.
func (e *entry) kill(now int64) bool {
	t := e.tat.Load()
	if t > now || !e.tat.CompareAndSwap(t, dead) {
		return false
	}
	q := e.quota.Load()
	if (q != nil && q.end > now) || !e.quota.CompareAndSwap(q, tombstone) {
		e.tat.Store(t) // still limited by its quota: revive
		return false
	}
	return true
}

// Len returns the number of keys held (for tests and metrics).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.live
		sh.mu.Unlock()
	}
	return n
}

// errRetry tells Take that an entry was removed under it.
var errRetry = errors.New("entry removed; retry")

// Take implements core.Store (through TakeInto). Only GCRA is supported;
// other algorithms return core.ErrUnsupportedAlgorithm.
func (s *Store) Take(ctx context.Context, req core.Request) (d core.Decision, err error) {
	err = s.TakeInto(ctx, &req, &d)
	return d, err
}

// TakeInto is Take writing the decision into *d (overwriting all of it)
// instead of returning it (core.DecisionWriter): called on a *Store, it
// saves copying the Decision on every call.
func (s *Store) TakeInto(_ context.Context, req *core.Request, d *core.Decision) error {
	// The common case, a valid GCRA rate limit alone on a key already held,
	// decided in registers with a small frame; everything else, errors
	// included, in take. The general path copies result structs and costs
	// about twice as much.
	if req.Cost >= 0 && req.Rate.Algorithm == core.GCRA && !req.Rate.IsUnlimited() && req.Quota.IsUnlimited() {
		p, perr := req.Rate.CheckedGCRA()
		sh, h := s.locate(req.Consumer, req.Scope)
		var now int64 // s.clock.now(), inlined by hand
		switch c := &s.clock; {
		case c.coarse != nil:
			now = c.coarse.Nanotime()
		case c.isSystem:
			now = c.system.Nanotime()
		default:
			now = c.any.Nanotime()
		}
		if e := sh.get(h, req.Consumer, req.Scope); e != nil && perr == nil {
			n, md := req.Cost, req.Reservation()
			for {
				tat := e.tat.Load()
				if tat == dead {
					break // being swept: take looks up again
				}
				next, ok := p.ConformWithin(tat, now, n, md)
				after := next // the TAT after the call
				if !ok {
					after = max(tat, now)
				}
				// Divide before the CAS, so the division's latency overlaps
				// the CAS's instead of following it.
				rem := p.Remaining(after, now)
				if ok && n > 0 && !e.tat.CompareAndSwap(tat, next) {
					continue
				}
				*d = core.Decision{}
				d.Allowed, d.DecidedBy = ok, core.KindRate
				retry := int64(0)
				if !ok {
					retry = p.RetryAfter(tat, now, n)
				} else if wait := next - p.Tau - now; wait > 0 {
					d.Delay = time.Duration(wait) // admitted by reservation
				}
				reset := time.Duration(after - now)
				d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter = p.Burst, rem, reset, time.Duration(retry)
				d.Rate = core.Status{Limit: p.Burst, Remaining: rem, ResetAfter: reset, Window: time.Duration(p.Tau)}
				return nil
			}
		}
	}
	var err error
	*d, err = s.take(*req)
	return err
}

// take is Take's general path: validation, new keys, quotas, and entries
// being swept.
func (s *Store) take(req core.Request) (core.Decision, error) {
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
	sh, h := s.locate(req.Consumer, req.Scope)
	now := s.clock.now()
	e := sh.get(h, req.Consumer, req.Scope)
	if e == nil {
		if req.Cost == 0 || (limited && req.Cost > p.Burst) || (quota && req.Cost > req.Quota.Max) {
			// Cannot change state: answer from the empty state, create nothing.
			return decide(nil, p, limited, req, now)
		}
		e = sh.put(h, req.Consumer, req.Scope, now)
	}
	for {
		d, err := decide(e, p, limited, req, now)
		if err != errRetry {
			return d, err
		}
		e = sh.put(h, req.Consumer, req.Scope, now)
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
			r = p.Reserve(tat, now, n, req.Reservation())
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
		d.DecidedBy, d.Delay = core.KindRate, time.Duration(r.Delay)
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
	sh, h := s.locate(consumer, scope)
	for {
		e := sh.get(h, consumer, scope)
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

// SupportsAlgorithm implements core.AlgorithmSupporter: the in-process
// store enforces GCRA only.
func (s *Store) SupportsAlgorithm(a core.Algorithm) bool { return a == core.GCRA }

var (
	_ core.AlgorithmSupporter = (*Store)(nil)
	_ core.DecisionWriter     = (*Store)(nil)
)
