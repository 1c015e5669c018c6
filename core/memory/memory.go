// Package memory is limitplane's in-process Store: sharded, lock-free per
// key, with no goroutine per key.
//
// Each key holds one atomic theoretical arrival time (GCRA's TAT), updated
// with a compare-and-swap loop, and, when a quota applies, a pointer to its
// current quota period whose used count is likewise a CAS-updated atomic.
// A key's state lives in its slot of an open-addressing table (32 bytes:
// fingerprint with the tag of its TAT's emission interval, TAT, quota
// pointer; two to a cache line, and a key's probe starts at its line's
// first slot), so deciding for a key that is not in
// the CPU's caches costs one cache miss, not one for the table and another
// for a separately allocated entry. That is what keeps a store of millions
// of keys fast, since each such miss costs 100–170 ns.
//
// Large tables are mapped outside the Go heap (on Unix) until a key of
// their shard gets a quota period, the one Go pointer a slot can hold: the
// garbage collector then neither scans them nor counts them in the heap
// whose size its pacing doubles (GOGC), so a process holding a million
// rate-limited keys is about 64 MB larger, not 130. A replaced table is
// unmapped once no goroutine holds it (runtime.AddCleanup).
//
// A key is identified by a 96-bit fingerprint of (consumer, scope): two
// hash/maphash values under independent seeds, random per process, one of
// 64 bits and one cut to 32 (the other half of its word holds the interval
// tag, see below). The store keeps no copy of the key itself (so it holds
// no credential and pins no caller memory). Two distinct keys share state
// only if both hashes collide, which for n keys has probability below
// n²/2⁹⁷ (about 6×10⁻¹⁸ for a million keys); keys cannot be chosen to
// collide without the seeds. (Tyk's hash_keys identifies keys by a 128-bit
// hash.)
//
// The consumer's hash picks the shard (so all of a consumer's keys share
// one), and the key's first hash indexes the shard's table. Lookups read the
// table without a lock (atomic loads only); inserts, sweeps and resizes take
// the shard's mutex, never a key's state. A table is never changed in a way
// that hides a live key from a reader: removal leaves a deleted mark, and a
// resize freezes each key's state in the old table (so a reader still
// holding it fails its CAS), copies it to the new table and publishes the
// new table only when complete. A reader that meets frozen state looks the
// key up again under the lock; a reader that misses a key inserted while it
// looked takes effect before that insert (a request that changes state
// inserts under the lock, where it finds the key).
//
// An entry whose TAT has passed and whose quota period has ended is the same
// state as no entry (DESIGN.md), so sweeps drop such entries without loss.
// Sweeps are amortised: a shard sweeps itself when an insert finds it has
// doubled since its last sweep, which keeps memory proportional to the keys
// that are still limited. Sweep and Options.SweepInterval add explicit and
// periodic sweeps. An exhausted key is never dropped while still limited.
//
// # Limit changes
//
// A key keeps the units it spent when its limit changes, not the time
// (DESIGN.md, GCRA): a TAT is a debt in emission intervals of the limit it
// was stored under, and a request under a limit of another interval
// converts it first, TAT' = now + ⌈(TAT − now) × T_new / T_old⌉ (128-bit
// integer arithmetic; a TAT that has passed is kept). So a slot records
// the interval its TAT is in: Prepare numbers each distinct interval with
// a 32-bit tag (store-wide, up to 65,536 of them; a rule prepared after
// that gets tag 0, unknown, and carries nothing over), and the tag is the
// high half of the slot's check word. The fast path compares the whole
// word, so a key under its rule's tag costs nothing more, and a key held
// under another tag goes to the general path. There the key moves, under
// its shard's lock, to a new slot with the rule's tag and the rescaled TAT
// (the quota period moves with it), and the old slot is frozen for good
// and deleted, as a resize freezes the slots it copies. A slot's check
// word is written once, before the slot is published, and never changes,
// so a request that matched the old tag and read the old TAT either
// stepped it before the freeze (its step is rescaled with the rest) or
// fails its CAS and looks the key up again: it can never step the
// converted TAT in the old units, even when that TAT later comes back to
// the value it read. A key whose requests keep alternating between
// intervals (two policies of different rates on one key-wide counter)
// moves at each alternation: exact, but each such request takes the shard
// lock and a slot (reclaimed by the next resize), some 10× the cost of a
// request under one rule (BenchmarkStoreAlternatingRules). Quota counts need no
// conversion: a changed Max applies to the units already used.
//
// # Quota epochs
//
// A quota period records the core.Request.QuotaEpoch of the request that
// started it. A request with a higher epoch finds the period reset and
// starts a fresh one (a reset carried as data: raising the epoch once
// resets once, the same epoch again changes nothing); a request with a
// lower epoch, which can only be one decided with a key's configuration
// from before the raise, spends the stored, newer period, so it neither
// revives the old count nor resets the new one. The GCRA state is not
// touched by an epoch. The epoch is kept with the period (ResetQuota leaves
// an ended period holding it), not the key: once a key is swept, the store
// forgets it, as a swept key is the same state as no key.
//
// # Bounding the number of keys
//
// With Options.MaxKeys set, the store holds at most that many keys: at the
// cap, a request that would create a key (a new consumer, or a new scope of
// one) is refused with an error wrapping ErrTooManyKeys, while every key
// already held keeps its exact counters. Nothing is evicted: dropping a key
// that is still limited would hand its consumer a fresh allowance. Keys
// leave only when they no longer limit anything (their TAT has passed and
// their quota period ended), by the sweeps above; at the cap an insert also
// sweeps the whole store first, at most once a second, so idle keys make
// room even without Options.SweepInterval. core.Engine treats the
// refusal as a store failure, so its FailurePolicy decides the request:
// FailClosed refuses new consumers during a flood of them (a gateway
// answers 503), FailOpen lets them through unlimited. KeysRefused counts
// the refusals; Len counts the keys.
//
// # Seeding
//
// As the fallback of the Redis store, the store records the state of each
// Redis decision (Seed, core.Seeder): the GCRA TAT, the quota's count and
// period end. Requests it decides when Redis fails carry on from there.
// Seeding never moves a key's state back and adds no key that limits
// nothing; seeded keys are bounded by MaxKeys and leave by the sweeps.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"runtime"
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
	// MaxKeys, when > 0, is the most keys (consumer and scope pairs) the
	// store holds; at the cap a request that would add a key fails with an
	// error wrapping ErrTooManyKeys and changes nothing (see the package
	// comment). Requests that create no key (peeks, costs that can never
	// pass) are answered as usual. Default 0: unbounded.
	MaxKeys int
	// WindowsAsGCRA makes Prepare accept the window algorithms
	// (core.FixedWindow, core.SlidingWindow, core.SlidingLog) and enforce a
	// window limit of Rate per Period as GCRA with the same Rate per
	// Period and a burst of Rate: the same long-run rate, without a fixed
	// window's 2× burst at a boundary. It is for a fallback store standing
	// in for one that has window algorithms (the Redis store under
	// failure_policy fallback). Default false: Prepare refuses them with
	// core.ErrUnsupportedAlgorithm.
	WindowsAsGCRA bool
}

// ErrTooManyKeys is wrapped by the error of a request that would add a key
// to a Store already holding Options.MaxKeys keys. No counter changed.
var ErrTooManyKeys = errors.New("memory: too many keys")

// capSweepGap is how often, at most, an insert that finds the store at
// Options.MaxKeys sweeps the whole store to make room: once per second of
// the store's clock, so a flood of new keys at the cap costs one sweep a
// second, not one per request. The whole store, not the insert's shard:
// with a small cap the idle keys are seldom in that shard.
const capSweepGap = int64(time.Second)

// keyCount counts the keys of all shards and the inserts refused at the
// cap. It sits on cache lines of its own: inserts write it, while every
// request reads the Store's other fields.
type keyCount struct {
	_       [64]byte
	keys    atomic.Int64  // entries in all shards
	refused atomic.Uint64 // inserts refused at max
	swept   atomic.Int64  // 1 + the clock reading of the last sweep at max; 0: none
	max     int64         // Options.MaxKeys; 0 = unbounded
	_       [64]byte
}

// reserve counts one more key, or reports false (counting nothing) when
// the store is at max. Concurrent reservations never take the count above
// max: each adds first and gives back if it went over.
func (c *keyCount) reserve() bool {
	if n := c.keys.Add(1); c.max > 0 && n > c.max {
		c.keys.Add(-1)
		return false
	}
	return true
}

// minSweepAt is the smallest shard size at which an insert sweeps.
const minSweepAt = 64

// minSlots is the size of a shard's first table.
const minSlots = 8

// Frozen TATs. A live TAT is a time on the store's clock, or a little
// below 0 after a refund (never below −2^61, the largest n×T): everything
// below frozen is one of these marks, and any goroutine that reads one
// looks the key up again under the shard lock.
const (
	// dead marks the TAT of a swept entry.
	dead = math.MinInt64
	// movedTo+i marks the TAT of an entry a resize moved to slot i of the
	// old table's next table.
	movedTo = math.MinInt64 + 1
	// retagTo+i marks the TAT of an entry moved to slot i of the same
	// table, to hold its TAT in another emission interval's units: a
	// request of a changed limit found it (see shard.put).
	retagTo = math.MinInt64 + 1<<61
	// frozen is the bound below which a TAT is a mark.
	frozen = -1 << 62
)

// Marks in a slot's hash; a key's first hash is never one of them.
const (
	emptyHash   = 0 // an empty slot: ends a probe
	deletedHash = 1 // a slot whose entry was swept: probes pass over it
	firstHash   = 2 // the smallest hash a key can have
)

// entry is one key's state.
type entry struct {
	tat   atomic.Int64           // GCRA theoretical arrival time; 0 = none; frozen: see dead, movedTo
	quota atomic.Pointer[period] // current quota period; nil = none; tombstone once frozen
}

// period is one quota period. end and epoch never change once the period
// is published; a new period replaces the pointer.
type period struct {
	end   int64  // ns on the store's clock when the period renews
	epoch uint64 // core.Request.QuotaEpoch of the request that started it
	used  atomic.Int64
}

// current reports whether q still counts for a request of quota epoch
// epoch at now: it has not ended and the request's epoch is not newer
// (a raised epoch starts a fresh period). A lower epoch than q's spends q:
// a stale request never revives an older count or resets a newer one.
func (q *period) current(now int64, epoch uint64) bool {
	return q.end > now && q.epoch >= epoch
}

// tombstone is the quota pointer of a frozen entry. It is never written to.
var tombstone = &period{}

// fingerprint identifies a key: two hashes under independent seeds, the
// second cut to 32 bits. h, at least firstHash, also indexes the table.
type fingerprint struct {
	h     uint64
	check uint32
}

// word returns f's check word with tag: the check in the low half, the tag
// of the emission interval the slot's TAT is stored in in the high half.
func (f fingerprint) word(tag uint32) uint64 { return uint64(tag)<<32 | uint64(f.check) }

// slot is one cell of a table: a key's fingerprint and its state, 32 bytes
// (two to a cache line, never straddling one, as large slices are
// page-aligned). An empty slot is filled once (check word first, then
// hash, which publishes it) and can then only change to deleted; deleted
// slots are reused only by a resize, which builds a new table. So a slot's
// check word, and with it the units of its TAT, never change while it is
// live: a key whose TAT must change units moves to another slot (put).
type slot struct {
	hash  atomic.Uint64 // fingerprint.h, emptyHash or deletedHash
	check atomic.Uint64 // fingerprint.word: check, and the TAT's interval tag
	entry
}

// tag returns the tag of the emission interval sl's TAT is stored in.
func (sl *slot) tag() uint32 { return uint32(sl.check.Load() >> 32) }

// table is an open-addressing hash table with linear probing. Its size is a
// power of two and at least a quarter of it stays empty, so probes end. A
// key's probe starts at the first slot of its cache line, so the key is
// found in that one line unless both of the line's slots were taken when
// it was inserted (about one key in nine at half full, against one in six
// when probes start at any slot).
//
// A large table's slots live outside the Go heap (see newSlots) unless the
// table may hold quota periods (periods): the GC then neither scans them
// nor counts them in the heap its pacing doubles, so a store of a million
// rate-limited keys costs their slots in RSS, not twice that. Such slots
// hold no Go pointer but the tombstone (a global, never freed). They are
// unmapped by a cleanup once no goroutine holds the table, so code that
// uses an entry must keep the entry's table reachable
// (runtime.KeepAlive) until it is done.
type table struct {
	slots []slot
	mask  uint64
	// next is the table that replaced this one (set before any entry is
	// moved), for following a movedTo mark.
	next atomic.Pointer[table]
	// periods reports whether entries may hold quota periods: the slots
	// are on the Go heap. Set for every table of a shard once one of its
	// keys had a quota (shard.periods).
	periods bool
	// mapped reports whether the slots are mapped outside the Go heap.
	mapped bool
}

func newTable(size int, periods bool) *table {
	t := &table{mask: uint64(size - 1), periods: periods}
	if periods {
		t.slots = make([]slot, size)
		return t
	}
	var free func()
	t.slots, free = newSlots(size)
	if free != nil {
		t.mapped = true
		runtime.AddCleanup(t, func(free func()) { free() }, free)
	}
	return t
}

type shard struct {
	tab *atomic.Pointer[table] // the shard's entry of Store.tabs
	mu  sync.Mutex             // serialises writers: inserts, sweeps, resizes
	// Guarded by mu:
	live      int        // entries in tab
	used      int        // live plus deleted slots in tab
	nextSweep int        // live count at which an insert sweeps first
	count     *keyCount  // the store's, shared by all shards
	tags      *intervals // the store's, for converting TATs (retag)
	// periods is set, for good, when one of the shard's keys first gets a
	// quota period: its tables are from then on on the Go heap.
	periods bool
	_       [64]byte // keep shards on separate cache lines
}

// Store is the in-process Store. Create it with New; it is safe for
// concurrent use.
type Store struct {
	clock clock
	shift uint // a consumer hash's top bits pick its shard: h >> shift
	// tabs holds each shard's table, apart from the shards: a lookup
	// reads only this, and 8 shards' tables share a cache line, so with
	// 256 shards the lines it needs stay in the CPU's nearest cache.
	tabs   []atomic.Pointer[table]
	shards []shard
	count  keyCount
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
	// windows is Options.WindowsAsGCRA.
	windows bool
	// tags numbers the emission intervals of the rules prepared.
	tags intervals
	// flights counts the requests in flight under in-flight limits.
	flights flights
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
	s := &Store{clock: newClock(opts.Clock), shift: shift, tabs: make([]atomic.Pointer[table], n), shards: make([]shard, n), windows: opts.WindowsAsGCRA, flights: newFlights(n)}
	s.count.max = int64(max(opts.MaxKeys, 0))
	for i := range s.shards {
		sh := &s.shards[i]
		sh.tab = &s.tabs[i]
		sh.tab.Store(newTable(minSlots, false))
		sh.nextSweep = minSweepAt
		sh.count = &s.count
		sh.tags = &s.tags
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

// Seeds of the key hashes, random per process: the consumer's and the
// scope's of each of the fingerprint's two hashes.
var (
	consumerSeed, scopeSeed           = maphash.MakeSeed(), maphash.MakeSeed()
	consumerCheckSeed, scopeCheckSeed = maphash.MakeSeed(), maphash.MakeSeed()
)

// locate returns the shard and the fingerprint of (consumer, scope). Scopes
// are hashed with seeds of their own, so swapping consumer and scope gives
// an unrelated fingerprint. TakeInto's fast path computes the same
// fingerprint in line, with the same calls (the scope's hashes prepared
// in its rule: rule.scopeH): keep the two alike.
func (s *Store) locate(consumer, scope string) (*shard, fingerprint) {
	hc := maphash.Comparable(consumerSeed, consumer)
	h, check := hc, maphash.Comparable(consumerCheckSeed, consumer)
	if scope != "" {
		h ^= maphash.Comparable(scopeSeed, scope)
		check ^= maphash.Comparable(scopeCheckSeed, scope)
	}
	f := fingerprint{h: h, check: uint32(check)}
	if f.h < firstHash {
		f.h += firstHash
	}
	return &s.shards[hc>>s.shift], f
}

// get returns the entry for f, or nil, for tests: a caller must keep the
// table reachable while it uses the entry (see table). It takes no lock; nil may mean the
// key was inserted while get looked (see the package comment), so a caller
// that must be sure asks put.
func (sh *shard) get(f fingerprint) *entry {
	return sh.tab.Load().find(f)
}

// find returns the entry for f in t, or nil.
func (t *table) find(f fingerprint) *entry {
	if sl := t.findSlot(f); sl != nil {
		return &sl.entry
	}
	return nil
}

// findSlot returns the slot of f's key in t, whatever the interval its TAT
// is in, or nil.
func (t *table) findSlot(f fingerprint) *slot {
	for i := f.h & t.mask &^ 1; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		switch h := sl.hash.Load(); {
		case h == emptyHash:
			return nil
		case h == f.h && uint32(sl.check.Load()) == f.check:
			return sl
		}
	}
}

// findWord returns the entry of the key of hash h whose slot has check
// word word (its check, and the tag of the interval its TAT is in) in t,
// or nil, also when the key is held under another tag.
func (t *table) findWord(h, word uint64) *entry {
	for i := h & t.mask &^ 1; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		switch sh := sl.hash.Load(); {
		case sh == emptyHash:
			return nil
		case sh == h && sl.check.Load() == word:
			return &sl.entry
		}
	}
}

// put returns the entry for f and its table, inserting one if needed. When
// r has a rate limit, the entry's TAT is in the units of r's emission
// interval: a key held in another's is moved to a slot of r's (retag). r
// nil takes the key in whatever units it is (tests). At the store's
// MaxKeys it inserts nothing and returns nil, nil (see Store.insert).
func (sh *shard) put(f fingerprint, r *rule, now int64) (*table, *entry) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var tag uint32
	retag := r != nil && r.limited
	if retag {
		tag = r.tag
	}
	t := sh.tab.Load()
	if sl := t.findSlot(f); sl != nil {
		if !retag || sl.tag() == tag {
			return t, &sl.entry
		}
		return sh.retag(t, sl, f, tag, now)
	}
	if sh.live >= sh.nextSweep {
		sh.sweepLocked(now)
	}
	if !sh.count.reserve() {
		return nil, nil // at the cap: Store.insert sweeps and tries again
	}
	t = sh.tab.Load() // the sweep may have shrunk it
	if 4*(sh.used+1) > 3*len(t.slots) {
		t = sh.resize(sh.live + 1)
	}
	_, sl := t.claim(f)
	t.publish(sl, f.h, f.word(tag))
	sh.live++
	sh.used++
	return t, &sl.entry
}

// retag moves the key of sl, a live slot of t holding f, to a new slot
// whose TAT is in the units of tag's emission interval, rescaled (see
// rescale), and returns the new entry and its table. The old slot is
// frozen for good (its TAT a retagTo mark, its quota the tombstone) and
// then deleted: an update made through it before the freeze is in the
// rescaled TAT, one after fails its CAS, and its maker looks the key up
// again under the lock. A slot's check word never changes, so a request
// that matched the old tag can never step the new TAT in the old units,
// even when that TAT later comes back to a value it read. The caller holds
// sh.mu.
func (sh *shard) retag(t *table, sl *slot, f fingerprint, tag uint32, now int64) (*table, *entry) {
	if 4*(sh.used+1) > 3*len(t.slots) {
		t = sh.resize(sh.live)
		sl = t.findSlot(f)
	}
	i, to := t.claim(f)
	from := sh.tags.interval(sl.tag())
	tat := sl.tat.Swap(retagTo + int64(i))
	to.tat.Store(rescale(tat, now, from, sh.tags.interval(tag)))
	to.quota.Store(sl.quota.Swap(tombstone))
	t.publish(to, f.h, f.word(tag))
	sl.hash.Store(deletedHash) // after the new slot: a reader finds one of them
	sh.used++
	return t, &to.entry
}

// claim returns the first empty slot of f's probe sequence and its index.
// Only the shard's lock holder may claim, and it must publish the slot
// before releasing the lock.
func (t *table) claim(f fingerprint) (uint64, *slot) {
	for i := f.h & t.mask &^ 1; ; i = (i + 1) & t.mask {
		if sl := &t.slots[i]; sl.hash.Load() == emptyHash {
			return i, sl
		}
	}
}

// publish makes the claimed slot sl visible as the key of hash h and check
// word word. The check word is stored before the hash, so a reader that
// sees the hash sees the check word.
func (t *table) publish(sl *slot, h, word uint64) {
	sl.check.Store(word)
	sl.hash.Store(h)
}

// resize publishes a new table for the live entries, the smallest that n
// entries fill at most half of, and returns it. Growth (at 3/4) therefore
// doubles the table. Each entry is frozen in the old table (its TAT becomes
// movedTo+i, its quota tombstone) as it is copied, so no update made
// through the old table is lost: one made before the freeze is copied, one
// after fails its CAS, and its maker looks the key up again under the lock,
// which resize holds until the new table is published.
func (sh *shard) resize(n int) *table {
	size := minSlots
	for 2*n > size {
		size <<= 1
	}
	old := sh.tab.Load()
	t := newTable(size, sh.periods)
	old.next.Store(t)
	for i := range old.slots {
		sl := &old.slots[i]
		h := sl.hash.Load()
		if h < firstHash {
			continue
		}
		w := sl.check.Load()
		j, to := t.claim(fingerprint{h: h, check: uint32(w)})
		to.tat.Store(sl.tat.Swap(movedTo + int64(j)))
		to.quota.Store(sl.quota.Swap(tombstone))
		t.publish(to, h, w)
	}
	sh.tab.Store(t)
	sh.used = sh.live
	return t
}

// holdPeriods makes the shard's tables, for good, ones that may hold quota
// periods (on the Go heap), moving its keys to such a table unless the
// current one is already.
func (sh *shard) holdPeriods() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.periods = true
	if !sh.tab.Load().periods {
		sh.resize(sh.live)
	}
}

// Sweep drops every entry that no longer limits anything: TAT passed and
// quota period ended (or absent).
func (s *Store) Sweep() { s.sweepAt(s.clock.now()) }

// sweepAt sweeps every shard at now.
func (s *Store) sweepAt(now int64) {
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
		if sl.hash.Load() >= firstHash && sl.kill(now) {
			sl.hash.Store(deletedHash)
			sh.live--
			sh.count.keys.Add(-1)
		}
	}
	if len(t.slots) > minSlots && 8*sh.live < len(t.slots) {
		sh.resize(sh.live)
	}
	sh.nextSweep = max(2*sh.live, minSweepAt)
}

// kill marks e dead and reports true if it no longer limits anything at now;
// the caller, holding the shard lock, then marks its slot deleted.
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

// KeysRefused returns how many requests were refused with ErrTooManyKeys
// since New: inserts at Options.MaxKeys (for metrics).
func (s *Store) KeysRefused() uint64 { return s.count.refused.Load() }

// MaxKeys returns Options.MaxKeys, 0 when unbounded.
func (s *Store) MaxKeys() int { return int(s.count.max) }

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

// errRetry tells take that an entry was swept or moved under it.
var errRetry = errors.New("entry removed; retry")

// rule is the store's compiled form of a core.LimitSet (core.Rule.Data).
type rule struct {
	// The fields TakeInto reads come first, on one cache line.
	//
	// p are the GCRA constants the rate limit is enforced with (a window
	// limit's under Options.WindowsAsGCRA).
	p core.GCRAParams
	// tagWord is tag shifted into a check word's high half: a slot holds
	// a TAT this rule may step iff its check word's high half is tagWord.
	tagWord uint64
	// scopeH and scopeCheck are the hashes of the rule's scope
	// (core.LimitSet.Scope) that locate XORs into a key's fingerprint,
	// computed once here; 0 and 0 for no scope, which changes nothing.
	scopeH, scopeCheck uint64
	// owner is the store that prepared the rule: tags are its own.
	owner *Store
	// limited and quota: the rate limit and the quota are enforced.
	limited, quota bool
	// fast: a GCRA rate limit alone, which TakeInto decides in line.
	fast bool
	// tag is the tag of p.T in the store's intervals (0 without a rate
	// limit, or unknown).
	tag uint32
	// window is the window limit enforced as GCRA, for Seed; zero for a
	// GCRA limit.
	window core.Limit
	qt     core.Quota
	// inFlight is the in-flight cap (core.LimitSet.InFlight); 0: none.
	inFlight int64
	// settle: the quota's charge is settled after the response
	// (core.LimitSet.Settle).
	settle bool
	// limits is, with an in-flight cap and a rate limit or quota, the
	// rule of the same limits without the cap: takeInFlight takes it
	// through TakeInto's fast path.
	limits *core.Rule
}

// Prepare implements core.Store: it validates ls and compiles it. A rate
// limit of a window algorithm is refused with core.ErrUnsupportedAlgorithm
// unless Options.WindowsAsGCRA is set. The rule is this store's alone:
// another store, another memory.Store included, refuses it with
// core.ErrForeignRule.
//
// A key keeps what it spent when its limit changes: a request under a rule
// whose emission interval T differs from the one the key's TAT was stored
// under carries the debt TAT − now over in emission intervals, to
// ⌈(TAT − now) × T_new / T_old⌉. A key that spent 3 of 3 per minute and
// is raised to 6 per minute has exactly 3 more at once; one that spent 3
// of 6 and is lowered to 3 has none, and its next after one new emission
// interval (20 s). A change of burst alone keeps T and the TAT, which
// likewise keeps the units spent; quota counts are kept as they are. The
// store tags up to 65,536 distinct emission intervals; a rule prepared
// after that many carries nothing over, and its keys keep their TAT as it
// is (the behaviour of stores that keep time, not units). A key whose
// requests alternate between rules of different intervals (two policies
// of different rates sharing a key-wide counter) is converted at each
// alternation, under its shard's lock: exact, but slower than a request
// under one rule.
func (s *Store) Prepare(ls core.LimitSet) (*core.Rule, error) {
	if err := ls.Validate(); err != nil {
		return nil, err
	}
	r := &rule{limited: ls.Rate.Enforced(), quota: ls.Quota.Enforced(), qt: ls.Quota, owner: s}
	if ls.Scope != "" {
		r.scopeH, r.scopeCheck = maphash.Comparable(scopeSeed, ls.Scope), maphash.Comparable(scopeCheckSeed, ls.Scope)
	}
	if r.limited {
		l := ls.Rate
		if l.Algorithm != core.GCRA {
			if !s.windows {
				return nil, fmt.Errorf("%w: %v", core.ErrUnsupportedAlgorithm, l.Algorithm)
			}
			r.window = l
			l.Algorithm, l.Burst = core.GCRA, 0
		}
		r.p = l.GCRA()
		r.tag = s.tags.tagOf(r.p.T)
		r.tagWord = uint64(r.tag) << 32
	}
	r.inFlight, r.settle = ls.InFlight, ls.Settle && r.quota
	r.fast = r.limited && !r.quota && r.inFlight == 0
	if r.inFlight > 0 && (r.limited || r.quota) {
		inner := ls
		inner.InFlight = 0
		var err error
		if r.limits, err = s.Prepare(inner); err != nil {
			return nil, err
		}
	}
	return core.NewRule(ls, r)
}

// ruleOf returns req's compiled rule, or nil when req.Rule is not one s
// prepared.
func (s *Store) ruleOf(req *core.Request) *rule {
	// Data is nil for a nil Rule.
	if r, _ := req.Rule.Data().(*rule); r != nil && r.owner == s {
		return r
	}
	return nil
}

// Take implements core.Store: it spends req.Cost units of the rate limit
// and the quota of req.Rule for the key (req.Consumer, req.Rule.Scope())
// and reports whether the request may go ahead. A cost of 0 only asks
// (nothing is spent or stored), so a request that should count sets Cost,
// usually to 1. A cost outside [0, core.MaxCost] returns
// core.ErrInvalidCost, a rule this store did not prepare
// core.ErrForeignRule. A request that would add a key to a store at
// Options.MaxKeys returns an error wrapping ErrTooManyKeys and changes
// nothing.
//
// Take is TakeInto on a copy of req and on its own result; it inlines.
func (s *Store) Take(ctx context.Context, req core.Request) (d core.Decision, err error) {
	err = s.TakeInto(ctx, &req, &d)
	return
}

// TakeInto is Take writing the decision into *d instead of returning it:
// every field of *d is overwritten, on errors too (with the zero
// Decision), so d can be reused from call to call. req is only read. Call
// it on the concrete store (for example a *memory.Store guarding a hot
// key): on a hot in-process key the Decision copy it avoids is about a
// third of the cost; on a store of a million keys it costs about half what
// Take does in a tight loop (benchmarks/README.md).
func (s *Store) TakeInto(ctx context.Context, req *core.Request, d *core.Decision) error {
	// The common case is decided here: a GCRA rate limit alone, on a key
	// already held whose state is not being moved. Everything else
	// (errors included) goes to take.
	//
	// A key not in the CPU's caches costs a cache miss of 100–170 ns, the
	// bulk of a request on a large store. A core overlaps that miss with
	// the next requests' only as far as its out-of-order window reaches, a
	// few hundred instructions and a few dozen stores, so this path is
	// written for few of both: no calls but the clock and the two hashes,
	// which come first while little is live (nothing to spill around
	// them); the limit's constants prepared once (Prepare); *d written
	// once, field by field, not zeroed and then filled.
	r, n := s.ruleOf(req), req.Cost
	if r == nil || !r.fast || uint64(n) > core.MaxCost {
		return s.slow(ctx, req, d)
	}
	var now int64 // s.clock.now(), inlined by hand
	switch c := &s.clock; {
	case c.coarse != nil:
		now = c.coarse.Nanotime()
	case c.isSystem:
		now = c.system.Nanotime()
	default:
		now = c.any.Nanotime()
	}
	h := maphash.Comparable(consumerSeed, req.Consumer)
	check := maphash.Comparable(consumerCheckSeed, req.Consumer)
	sh := h >> s.shift
	h ^= r.scopeH // the scope's hashes, as locate XORs them in (0 for none)
	check ^= r.scopeCheck
	if h < firstHash {
		h += firstHash
	}
	t := s.tabs[sh].Load()
	home := &t.slots[h&t.mask&^1]
	atHome := home.hash.Load() // the miss starts here
	p := r.p
	// The check word holds the key's check and the tag of the interval
	// its TAT is in: one comparison matches both. A key held under
	// another interval (its limit changed) goes to take, which converts it.
	word := uint64(uint32(check)) | r.tagWord
	var e *entry
	if atHome == h && home.check.Load() == word {
		e = &home.entry
	} else if e = t.findWord(h, word); e == nil {
		return s.slow(ctx, req, d)
	}
	md := req.Reservation()
	tat := e.tat.Load()
	for {
		if tat < frozen {
			runtime.KeepAlive(t)       // e is in t
			return s.slow(ctx, req, d) // swept or moved: take looks up again
		}
		next, ok := p.ConformWithin(tat, now, n, md)
		if !ok {
			after := max(tat, now)
			reset, rem := time.Duration(after-now), p.Remaining(after, now)
			d.Allowed, d.DecidedBy, d.Policy, d.Shadowed = false, core.KindRate, "", false
			d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.Delay = p.Burst, rem, reset, time.Duration(p.RetryAfter(tat, now, n)), 0
			d.Rate.Limit, d.Rate.Remaining, d.Rate.ResetAfter, d.Rate.Window, d.Rate.Policy = p.Burst, rem, reset, time.Duration(p.Tau), ""
			d.Quota, d.Hold = core.Status{}, core.Hold{}
			runtime.KeepAlive(t) // e is in t
			return nil
		}
		// Divide before the CAS, so the division's latency overlaps
		// the CAS's instead of following it.
		rem := p.Remaining(next, now)
		if n > 0 && !e.tat.CompareAndSwap(tat, next) {
			tat = e.tat.Load()
			continue
		}
		reset := time.Duration(next - now)
		d.Allowed, d.DecidedBy, d.Policy, d.Shadowed = true, core.KindRate, "", false
		// A positive delay: admitted by reservation.
		d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter, d.Delay = p.Burst, rem, reset, 0, time.Duration(max(next-p.Tau-now, 0))
		d.Rate.Limit, d.Rate.Remaining, d.Rate.ResetAfter, d.Rate.Window, d.Rate.Policy = p.Burst, rem, reset, time.Duration(p.Tau), ""
		d.Quota, d.Hold = core.Status{}, core.Hold{}
		runtime.KeepAlive(t) // e is in t
		return nil
	}
}

// slow is TakeInto's general path, take writing into *d.
func (s *Store) slow(ctx context.Context, req *core.Request, d *core.Decision) (err error) {
	*d, err = s.take(ctx, *req)
	return err
}

// take is Take's general path: errors, new keys, quotas, and entries
// being swept.
func (s *Store) take(ctx context.Context, req core.Request) (core.Decision, error) {
	if req.Cost < 0 || req.Cost > core.MaxCost {
		return core.Decision{}, core.ErrInvalidCost
	}
	r := s.ruleOf(&req)
	if r == nil {
		return core.Decision{}, core.ErrForeignRule
	}
	if r.inFlight > 0 && !core.InFlightSkipped(ctx) {
		return s.takeInFlight(ctx, req, r)
	}
	return s.takeLimits(req, r)
}

// takeLimits is take for r's rate limit and quota.
func (s *Store) takeLimits(req core.Request, r *rule) (core.Decision, error) {
	if !r.limited && !r.quota {
		return core.Decision{Allowed: true}, nil
	}
	sh, f := s.locate(req.Consumer, req.Rule.Scope())
	return s.takeAt(sh, f, req, r)
}

// takeAt is takeLimits for the key located at (sh, f).
func (s *Store) takeAt(sh *shard, f fingerprint, req core.Request, r *rule) (core.Decision, error) {
	now := s.clock.now()
	t := sh.tab.Load()
	var e *entry
	sl := t.findSlot(f)
	switch {
	case sl != nil && (!r.limited || sl.tag() == r.tag):
		e = &sl.entry
	case sl == nil && (req.Cost == 0 || (r.limited && req.Cost > r.p.Burst) || (r.quota && req.Cost > r.qt.Max)):
		// Cannot change state: answer from the empty state, create nothing.
		return sh.decide(nil, nil, r, req, now, nil)
	default:
		// A new key, or one whose TAT is in another interval's units:
		// put inserts or converts it.
		if t, e = s.insert(sh, f, r, now); e == nil {
			return core.Decision{}, s.tooMany()
		}
	}
	for {
		var spent *period
		d, err := sh.decide(t, e, r, req, now, &spent)
		runtime.KeepAlive(t) // e is in t
		if err != errRetry {
			if r.settle && spent != nil && d.Allowed && err == nil {
				d.Hold = core.NewHold(&settlement{q: spent, charged: req.Cost})
			}
			return d, err
		}
		if t, e = s.insert(sh, f, r, now); e == nil {
			return core.Decision{}, s.tooMany()
		}
	}
}

// insert is sh.put that, at Options.MaxKeys, sweeps the whole store for
// room (at most once a capSweepGap) and tries once more; it counts a
// refusal when that finds none.
func (s *Store) insert(sh *shard, f fingerprint, r *rule, now int64) (*table, *entry) {
	if t, e := sh.put(f, r, now); e != nil {
		return t, e
	}
	if last := s.count.swept.Load(); (last == 0 || now-(last-1) >= capSweepGap) && s.count.swept.CompareAndSwap(last, now+1) {
		s.sweepAt(now)
		if t, e := sh.put(f, r, now); e != nil {
			return t, e
		}
	}
	s.count.refused.Add(1)
	return nil, nil
}

// tooMany is the error of a request refused at Options.MaxKeys.
func (s *Store) tooMany() error {
	return fmt.Errorf("%w: the store holds its MaxKeys %d; a new key was refused", ErrTooManyKeys, s.count.max)
}

// decide applies req to e, an entry of table t (nil means the empty state,
// read-only). When spent is not nil and req's cost went to a quota period,
// *spent is set to that period.
func (sh *shard) decide(t *table, e *entry, cr *rule, req core.Request, now int64, spent **period) (core.Decision, error) {
	var d core.Decision
	n := req.Cost
	p, limited, quota, qt := cr.p, cr.limited, cr.quota, cr.qt

	// 1. Quota peek: an exhausted quota denies without touching the rate.
	var q *period
	if quota {
		if e != nil {
			if q = e.quota.Load(); q == tombstone {
				return d, errRetry
			}
		}
		if q != nil && !q.current(now, req.QuotaEpoch) {
			q = nil // ended or reset: the next spend starts a new period
		}
		used := int64(0)
		if q != nil {
			used = q.used.Load()
		}
		if n > qt.Max-used { // used+n > Max, without overflow
			setQuota(&d, qt, q, used, now)
			d.DecidedBy, d.RetryAfter = core.KindQuota, d.Quota.ResetAfter
			if n > qt.Max {
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
				if tat = e.tat.Load(); tat < frozen {
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
				setQuota(&d, qt, q, used, now)
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
				sh.refund(t, e, cr.tag, p, limited && r.Store, n)
				return core.Decision{}, errRetry
			}
			if q == nil || !q.current(now, req.QuotaEpoch) {
				if !t.periods {
					// Periods go only into Go heap tables: move the
					// shard's keys to one. That freezes e, so the next
					// round refunds the rate step and retries.
					sh.holdPeriods()
					continue
				}
				np := &period{end: now + int64(qt.Renewal), epoch: req.QuotaEpoch}
				if q != nil {
					// A period that ended keeps the newer epoch: a stale
					// request's period must not be reset again by the next
					// current one.
					np.epoch = max(np.epoch, q.epoch)
				}
				np.used.Store(n)
				if e.quota.CompareAndSwap(q, np) {
					q = np
					break
				}
				continue
			}
			used := q.used.Load()
			if n > qt.Max-used {
				// Lost a race for the last units: undo the rate step.
				sh.refund(t, e, cr.tag, p, limited && r.Store, n)
				d = core.Decision{}
				if limited {
					setRate(&d, p, p.Step(oldTAT, now, 0))
				}
				setQuota(&d, qt, q, used, now)
				d.DecidedBy, d.RetryAfter = core.KindQuota, d.Quota.ResetAfter
				d.Limit, d.Remaining, d.ResetAfter = d.Quota.Limit, d.Quota.Remaining, d.Quota.ResetAfter
				return d, nil
			}
			if q.used.CompareAndSwap(used, used+n) {
				break
			}
		}
		if spent != nil && n > 0 {
			*spent = q
		}
		used := int64(0)
		if q != nil && q.end > now {
			used = q.used.Load()
		} else {
			q = nil
		}
		setQuota(&d, qt, q, used, now)
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
// step was already stored in e, an entry of table t whose TAT is in the
// units of interval tag. Subtracting commutes with the other requests'
// steps, so the TAT ends as if this request had never happened. Until the
// refund lands, though, its step is visible: a concurrent request on the
// same key may be denied by the rate limit where the final state would
// have admitted it (fewer admitted, never more). That can happen only on a
// key with both a rate limit and a quota, while concurrent requests race
// for the quota's last units; the Redis store, which decides both in one
// script, has no such window.
//
// If a resize moved the entry meanwhile, the step was moved with it, and
// refund follows it to its new slot (waiting on the shard lock for the
// resize to finish); if a retag moved it to another interval's units, the
// step was rescaled with the rest of the TAT, and refund gives back the
// rescaled step (to the nanosecond: both are rounded up). If a sweep
// removed it, its TAT had passed, which made the step void: there is
// nothing to give back.
func (sh *shard) refund(t *table, e *entry, tag uint32, p core.GCRAParams, stored bool, n int64) {
	if !stored {
		return
	}
	step := n * p.T
	for {
		switch tat := e.tat.Load(); {
		case tat >= frozen:
			if e.tat.CompareAndSwap(tat, tat-step) {
				runtime.KeepAlive(t) // e is in t
				return
			}
		case tat == dead:
			runtime.KeepAlive(t)
			return
		case tat >= retagTo:
			sh.mu.Lock() // the retag publishes the new slot before unlocking
			sl := &t.slots[tat-retagTo]
			to := sl.tag()
			from, into := sh.tags.interval(tag), sh.tags.interval(to)
			sh.mu.Unlock()
			if from > 0 && into > 0 && from != into {
				step = int64(scaleDebt(uint64(step), from, into))
			}
			tag, e = to, &sl.entry
		default:
			sh.mu.Lock()
			t = t.next.Load()
			e = &t.slots[tat-movedTo].entry
			sh.mu.Unlock()
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

// ResetQuota implements core.Store: it deletes the quota period of
// (consumer, scope), whatever its epoch (the store keeps one period per
// key, so epoch is not needed to find it): the next request starts a new
// period.
func (s *Store) ResetQuota(_ context.Context, consumer, scope string, _ uint64) error {
	sh, f := s.locate(consumer, scope)
	t := sh.tab.Load()
	e := t.find(f)
	defer func() { runtime.KeepAlive(t) }() // e is in t
	for {
		if e == nil {
			return nil
		}
		q := e.quota.Load()
		if q == tombstone {
			// Swept or moved: look again once the sweep or resize is done.
			sh.mu.Lock()
			t = sh.tab.Load()
			e = t.find(f)
			sh.mu.Unlock()
			continue
		}
		// An ended period in its place keeps the epoch, so a stale
		// request cannot start a lower-epoch period that the next current
		// one would reset again.
		if q == nil || e.quota.CompareAndSwap(q, &period{end: math.MinInt64, epoch: q.epoch}) {
			return nil
		}
	}
}

var _ core.Store = (*Store)(nil)
