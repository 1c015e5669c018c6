package drl

import (
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitplane/limitplane/core"
)

// LimiterOptions configure a Limiter. The zero value is usable.
type LimiterOptions struct {
	// Gateway is this gateway's ID, under which tables list its shares.
	// Default: the gateway named in the latest Report call (a gateway is
	// listed only once it has reported, so nothing is missed).
	Gateway string
	// MaxGateways is the most gateways the limit is split over; a key's
	// floor is its limit / MaxGateways. It must be the allocator's.
	// Default 32.
	MaxGateways int
	// MinFloorRate is the smallest floor rate, in requests per second, a
	// key may have to be decided here: a key whose R/MaxGateways is below
	// it (or whose floor(B/MaxGateways) is below 1) is left to the exact
	// store (Tyk DRL #1287: low rates over many gateways). Default 1.
	MinFloorRate float64
	// Interval is H, the reporting period; a table is fresh until the
	// send time of the call that returned it + 2H. Default 1 s.
	Interval time.Duration
	// MaxKeys bounds the keys held; a request that would add a key beyond
	// it is left to the exact store (Take returns false). Default 10000.
	MaxKeys int
}

func (o LimiterOptions) withDefaults() LimiterOptions {
	if o.MaxGateways <= 0 {
		o.MaxGateways = DefaultMaxGateways
	}
	if !(o.MinFloorRate > 0) {
		o.MinFloorRate = 1
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 10000
	}
	return o
}

// LimiterStats are a Limiter's counters, for metrics.
type LimiterStats struct {
	// Epoch is the epoch of the table in force (0: none yet).
	Epoch uint64
	// HotKeys is the number of keys held.
	HotKeys int
	// ShareRate is the sum over the keys held of this gateway's rate share
	// as of each key's latest decision, in requests per second.
	ShareRate float64
	// Fallbacks counts keys falling back to their floor because the table
	// went stale (2H without a fresh one: Redis down or unreachable).
	Fallbacks uint64
	// Tables counts tables applied (new epochs).
	Tables uint64
	// Runs counts the runs started (Report.Run): the first, one each time
	// this gateway's report may have expired in Redis (cut off from Redis
	// for 2.5 intervals), and one each time a table listed it on a run of
	// another process.
	Runs uint64
	// KeysRefused counts requests left to the exact store at MaxKeys.
	KeysRefused uint64
}

// Marks in a bucket's TAT; a live TAT is a time on the caller's clock,
// never below frozen.
const (
	deadTAT  = math.MinInt64     // the key was swept: look it up again
	movedTAT = math.MinInt64 + 1 // the key switched to a new bucket
	frozen   = -1 << 62
)

// staleTag is a bucket's tag while the table is stale (floor share).
const staleTag = 1

// bucket is a key's local GCRA state at one share of one limit. Its share
// and limit never change: a switch freezes it (TAT movedTAT) and publishes
// a new one.
type bucket struct {
	tat      atomic.Int64  // GCRA TAT on the caller's clock; deadTAT/movedTAT once frozen
	admitted atomic.Int64  // units admitted since the last Report (and carried counts)
	tag      atomic.Uint64 // view generation<<1 the share was checked against, or staleTag
	p        core.GCRAParams
	share    Share
	since    int64   // when the share took effect
	lim      hotRule // the rate limit the share is of
	id       KeyID   // the key's name under lim
	_        [64]byte
	// refused counts the units refused since the last Report, striped
	// over cache lines of their own: a refusal then writes nothing the
	// other cores read on every request (the TAT's line), and refusals on
	// several cores seldom write the same line.
	refused [refusedStripes]stripe
}

// refusedStripes is the number of refusal counters per bucket.
const refusedStripes = 4

// stripe is one counter on a cache line of its own.
type stripe struct {
	n atomic.Int64
	_ [56]byte
}

// count records n units offered: admitted or refused.
func (b *bucket) count(n int64, ok bool) {
	if ok {
		b.admitted.Add(n)
		return
	}
	b.refused[rand.Uint32()%refusedStripes].n.Add(n)
}

// takeOffered returns the units offered since the last call and resets
// the counts. Caller holds the key's mu (no switch in between).
func (b *bucket) takeOffered() int64 {
	n := b.admitted.Swap(0)
	for i := range b.refused {
		n += b.refused[i].n.Swap(0)
	}
	return n
}

// key is one hot key: a consumer's counters of one scope. Its limit is
// its bucket's (a limit change switches the bucket, see switchKey).
type key struct {
	b  atomic.Pointer[bucket]
	mu sync.Mutex // serialises switches and sweeps
	// Guarded by Limiter.mu (Report):
	demand float64
	idle   int
}

// view is the table in force, as this gateway reads it.
type view struct {
	gen        uint64 // +1 per change of shares
	epoch      uint64
	token      uint64
	freshUntil int64 // ns; at and after it the table is stale
	since      int64 // when these shares were applied here (ApplyAt's now)
	shares     map[KeyID]Share
}

// Limiter is one gateway's DRL hot path: it decides distributed keys in
// memory against this gateway's share, a local GCRA per key, and measures
// the demand that the allocator splits the limits by. Time is an argument
// (ns on a monotonic clock). Safe for concurrent use.
//
// A key is found without locks (a sharded open-addressing table of keys
// indexed by maphash fingerprints of consumer and scope, as in
// core/memory); its state is an atomic TAT updated by a CAS. When the share
// a key must run changes (a new table, the table going stale), the next
// request on it switches the key exactly: it freezes the old state,
// carries the tokens (clamped to the new burst) into a new state and
// publishes it; a request that meets frozen state retries on the new one.
// A shrink takes effect from the moment the table was sent (or went
// stale), a grow from the switch, so no admission is ever counted against
// a larger share than the allocator accounts for.
//
// A request under another rate limit than the key's (a policy changed)
// switches the key to that limit the same way, keeping the tokens spent,
// not the time: the units spent from the old share are spent from the new
// limit's share too (3 of 3 spent per minute, raised to 6 per minute,
// leaves 3 at once), as the memory and Redis stores keep them. The key
// takes the new limit's name (KeyID names one limit), so it runs the share
// the table gives that name, its floor until the allocator lists it, and
// its demand is reported under that name from then on (see KeyID).
type Limiter struct {
	o         LimiterOptions
	minPerNs  float64 // MinFloorRate×MaxGateways per ns: Rate ≥ minPerNs×Period
	seeds     [4]maphash.Seed
	shift     uint
	shards    []lshard
	view      atomic.Pointer[view]
	keys      atomic.Int64
	refused   atomic.Uint64
	fallbacks atomic.Uint64
	tables    atomic.Uint64
	runs      atomic.Uint64

	mu      sync.Mutex // serialises Apply and Report
	gateway string     // the ID in force (Options.Gateway or the latest Report's)
	run     uint64     // this gateway's run (Report.Run); 0 until the first Report
	runFrom int64      // when the run began (ns)
	heard   int64      // send time (ns) of the latest report call answered (ApplyAt's sentAt)
	table   *Table     // the table in force
	gen     uint64
	last    int64 // time of the previous Report; 0: none
}

// NewLimiter returns a Limiter; every key starts at its floor until a table
// is applied.
func NewLimiter(o LimiterOptions) *Limiter {
	o = o.withDefaults()
	l := &Limiter{o: o, gateway: o.Gateway, shift: 64 - 4, shards: make([]lshard, 16)}
	l.minPerNs = o.MinFloorRate * float64(o.MaxGateways) / float64(time.Second)
	for i := range l.seeds {
		l.seeds[i] = maphash.MakeSeed()
	}
	for i := range l.shards {
		l.shards[i].tab.Store(newLTable(8))
	}
	l.view.Store(&view{freshUntil: math.MinInt64, shares: map[KeyID]Share{}})
	return l
}

// Eligible reports whether req is decided by DRL: Request.Distributed, a
// GCRA rate limit, no quota enforced (rate and quota go to the exact store
// together, atomically), a valid cost, and a floor that is not too coarse
// (R/MaxGateways ≥ MinFloorRate per second, floor(B/MaxGateways) ≥ 1).
// It depends on the request and the options only, so every gateway routes
// a key the same way. A Store decides the part that depends on the rule
// alone once, when it prepares the rule.
func (l *Limiter) Eligible(req *core.Request) bool {
	_, ok := l.compile(req.Rule)
	return ok && validCost(req.Cost)
}

// validCost reports whether n is a cost a request may carry.
func validCost(n int64) bool { return uint64(n) <= core.MaxCost }

// hotRule is what the Limiter needs of a rule it decides, computed once
// per rule (drl.Store.Prepare; Limiter.Take for a direct caller).
type hotRule struct {
	limit  core.Limit    // the rate limit
	kl     KeyLimit      // its global rate and burst
	floor  Share         // kl.Floor(MaxGateways)
	window time.Duration // the global τ = B×T
}

// compile returns r's hotRule, or false when the Limiter does not decide
// requests under r (see Eligible: everything but the cost).
func (l *Limiter) compile(r *core.Rule) (hotRule, bool) {
	if r == nil || !r.Distributed() || !r.RateEnforced() || r.QuotaEnforced() {
		return hotRule{}, false
	}
	rate := r.Rate()
	if rate.Algorithm != core.GCRA || rate.EffectiveBurst() < int64(l.o.MaxGateways) || float64(rate.Rate) < l.minPerNs*float64(rate.Period) {
		return hotRule{}, false
	}
	kl := LimitOf(rate)
	return hotRule{limit: rate, kl: kl, floor: kl.Floor(l.o.MaxGateways), window: time.Duration(r.GCRA().Tau)}, true
}

// Take decides req at now (ns) against this gateway's share, writing the
// decision into *d, and returns true; it returns false, touching nothing,
// when req is not eligible (see Eligible) or the key would be one more
// than MaxKeys: the caller then asks the exact store. (A Rule's limits are
// valid: core.NewRule checked them.) A request under another rate limit
// than its key's switches the key to it, keeping the units spent (see
// Limiter).
//
// The decision: Allowed, RetryAfter, Remaining and ResetAfter come from
// the local share (Remaining is this gateway's, at most the global one);
// Limit and Rate.Limit are the key's global burst B and Rate.Window its
// global B×T, what the consumer's headers advertise. A cost above the
// local burst but within B is refused with RetryAfter H (a later table may
// grant more); above B, with RetryAfter -1. MaxDelay reservations are
// honoured against the local share.
//
// Take compiles req's rule on every call; a Store compiles each rule once,
// in Prepare, and takes through the compiled form.
func (l *Limiter) Take(now int64, req *core.Request, d *core.Decision) (handled bool) {
	hr, ok := l.compile(req.Rule)
	if !ok {
		return false
	}
	return l.take(now, req, &hr, d)
}

// take is Take under hr, req's rule compiled by this Limiter.
func (l *Limiter) take(now int64, req *core.Request, hr *hotRule, d *core.Decision) bool {
	if !validCost(req.Cost) {
		return false
	}
	sh, f := l.locate(req)
	n, md := req.Cost, req.Reservation()
	var k *key
	for {
		var b *bucket
		var tat int64
		if k, b, tat = l.current(now, sh, f, req, hr, k); k == nil {
			return false
		}
		p := &b.p
		next, ok := p.ConformWithin(tat, now, n, md)
		after := next
		if !ok {
			after = max(tat, now)
		}
		rem := p.Remaining(after, now)
		if ok && n > 0 && !b.tat.CompareAndSwap(tat, next) {
			continue
		}
		b.count(n, ok)
		*d = core.Decision{}
		d.Allowed, d.DecidedBy = ok, core.KindRate
		retry := int64(0)
		if !ok {
			retry = p.RetryAfter(tat, now, n)
			if retry < 0 && n <= hr.kl.Burst {
				retry = int64(l.o.Interval)
			}
		} else if wait := next - p.Tau - now; wait > 0 {
			d.Delay = time.Duration(wait)
		}
		reset := time.Duration(after - now)
		d.Limit, d.Remaining, d.ResetAfter, d.RetryAfter = hr.kl.Burst, rem, reset, time.Duration(retry)
		d.Rate = core.Status{Limit: hr.kl.Burst, Remaining: rem, ResetAfter: reset, Window: hr.window}
		return true
	}
}

// takeUpTo decides n unit-cost requests arriving together at now exactly
// as n Take calls of cost 1 would (each admitted while a token is left):
// it returns how many were admitted, or -1 when req is not eligible. The
// simulator (sim_test.go) drives the Limiter through it, one call per
// gateway and time step instead of one per request.
func (l *Limiter) takeUpTo(now int64, req *core.Request, n int64) int64 {
	one := *req
	one.Cost = 1
	hr, ok := l.compile(one.Rule)
	if !ok || n < 0 {
		return -1
	}
	sh, f := l.locate(&one)
	var k *key
	for {
		var b *bucket
		var tat int64
		if k, b, tat = l.current(now, sh, f, &one, &hr, k); k == nil {
			return -1
		}
		a := min(n, b.p.Remaining(tat, now))
		if a > 0 && !b.tat.CompareAndSwap(tat, max(tat, now)+a*b.p.T) {
			continue
		}
		b.count(a, true)
		b.count(n-a, false)
		return a
	}
}

// current returns the key req maps to (k, or found or inserted when k is
// nil), the bucket it must run at now (switched to the latest view's
// share first if need be) and that bucket's TAT, never a frozen one: a
// key swept meanwhile is inserted again. It returns a nil key when the key
// cannot be held (MaxKeys). Take and takeUpTo call it once per round of
// their CAS loops.
func (l *Limiter) current(now int64, sh *lshard, f fingerprint, req *core.Request, hr *hotRule, k *key) (*key, *bucket, int64) {
	if k == nil {
		if k = sh.tab.Load().find(f); k == nil {
			if k = l.insert(sh, f, req, hr, now); k == nil {
				return nil, nil, 0
			}
		}
	}
	for {
		v := l.view.Load()
		want := v.gen << 1
		if now >= v.freshUntil {
			want = staleTag
		}
		b := k.b.Load()
		if b.tag.Load() != want || b.lim.limit != hr.limit {
			if b = l.switchKey(k, req, hr, v, now); b == nil {
				if k = l.insert(sh, f, req, hr, now); k == nil {
					return nil, nil, 0
				}
				continue
			}
		}
		if tat := b.tat.Load(); tat >= frozen {
			return k, b, tat
		} else if tat == deadTAT {
			if k = l.insert(sh, f, req, hr, now); k == nil {
				return nil, nil, 0
			}
		}
	}
}

// shareParams returns the local GCRA constants of share s of a key: T =
// 1 s / Rate rounded up (never faster than the share), τ = Burst×T.
func shareParams(s Share) core.GCRAParams {
	t := int64(math.Ceil(float64(time.Second) / s.Rate))
	if t < 1 {
		t = 1
	}
	b := max(s.Burst, 1)
	if t > core.MaxTolerance/b {
		t = core.MaxTolerance / b
	}
	return core.GCRAParams{T: t, Tau: b * t, Burst: b}
}

// shareOf returns the share the key named id, of floor floor, must run
// under view v at now.
func shareOf(floor Share, id KeyID, v *view, now int64) (Share, uint64) {
	if now >= v.freshUntil {
		return floor, staleTag
	}
	s, ok := v.shares[id]
	if !ok {
		s = floor
	}
	return s, v.gen << 1
}

// switchKey makes k's bucket run hr's limit (req's, whose key k is) at the
// share the latest view gives it at now and returns the bucket, or nil
// when k was swept.
func (l *Limiter) switchKey(k *key, req *core.Request, hr *hotRule, v *view, now int64) *bucket {
	k.mu.Lock()
	defer k.mu.Unlock()
	if nv := l.view.Load(); nv.gen >= v.gen {
		v = nv
	}
	b := k.b.Load()
	if b.tat.Load() == deadTAT {
		return nil
	}
	if b.lim.limit != hr.limit {
		return l.changeLimit(k, b, req, hr, v, now)
	}
	s, tag := shareOf(b.lim.floor, b.id, v, now)
	if tag == staleTag && b.tag.Load() != staleTag && b.tag.Load() != 0 {
		l.fallbacks.Add(1)
	}
	if s == b.share {
		b.tag.Store(tag)
		return b
	}
	// A shrink counts from when it was due: the table's send time, or the
	// moment the table went stale; a grow from now.
	at := now
	if s.Rate < b.share.Rate || s.Burst < b.share.Burst {
		due := v.since
		if tag == staleTag {
			due = v.freshUntil
		}
		at = min(now, max(due, b.since))
	}
	old := b.tat.Swap(movedTAT)
	nb := &bucket{p: shareParams(s), share: s, since: at, lim: b.lim, id: b.id}
	nb.tat.Store(at + carry(b.p, nb.p, max(old, at)-at))
	nb.admitted.Store(b.takeOffered())
	nb.tag.Store(tag)
	k.b.Store(nb)
	return nb
}

// changeLimit switches k from bucket b, of another limit, to hr's limit,
// named for req's consumer and scope, at the share the view v gives that
// name at now (its floor until a table lists it: the allocator counts an
// unlisted gateway at its floor). The units spent from b's share (its
// deficit at now) are spent from the new share: tokens spent, not time,
// are kept. The units offered since the last Report and the key's smoothed
// demand go with it, reported under the new name. Caller holds k.mu.
//
// The old name is not reported again by this gateway: the allocator keeps
// allocating it while other gateways (not yet on the new limit) report it,
// then forgets it (AllocatorOptions.Forget); no gateway on the new limit
// runs its shares, so the bound holds for each limit apart.
func (l *Limiter) changeLimit(k *key, b *bucket, req *core.Request, hr *hotRule, v *view, now int64) *bucket {
	nb := &bucket{lim: *hr, id: MakeKeyID(req.Consumer, req.Rule.Scope(), hr.limit), since: now}
	s, tag := shareOf(hr.floor, nb.id, v, now)
	nb.p, nb.share = shareParams(s), s
	old := b.tat.Swap(movedTAT)
	nb.tat.Store(now + convert(b.p, nb.p, max(old, now)-now))
	nb.admitted.Store(b.takeOffered())
	nb.tag.Store(tag)
	k.b.Store(nb)
	return nb
}

// convert converts a deficit of d ns under params from (the time until
// that bucket is full again: d/from.T units spent) into the deficit under
// to with the same units spent, d×to.T/from.T, rounded up (never fewer
// spent) and at most MaxTolerance. A limit change keeps this much spent.
func convert(from, to core.GCRAParams, d int64) int64 {
	// In 128 bits.
	hi, lo := bits.Mul64(uint64(d), uint64(to.T))
	if hi >= uint64(from.T) {
		return core.MaxTolerance
	}
	q, r := bits.Div64(hi, lo, uint64(from.T))
	if r > 0 {
		q++
	}
	return int64(min(q, uint64(core.MaxTolerance)))
}

// carry converts a deficit of d ns under params from (the time until that
// bucket is full again) into the deficit under to: the tokens held,
// Burst − d/T, carried over and clamped to the new burst, rounded so the
// new state never holds more than the old. A share switch keeps this much
// held: the spent units converted, less the difference of the bursts.
func carry(from, to core.GCRAParams, d int64) int64 {
	nd := convert(from, to, d) + (to.Burst-from.Burst)*to.T
	return min(max(nd, 0), core.MaxTolerance)
}

// Apply is ApplyAt(sentAt, sentAt, t): the table applied at the moment
// the call that brought it was sent. It checks whether the run lapsed at
// sentAt, not when the answer came: a caller whose answers may come late
// uses ApplyAt.
func (l *Limiter) Apply(sentAt int64, t *Table) { l.ApplyAt(sentAt, sentAt, t) }

// ApplyAt makes t the table in force if it is newer than the current one
// (a higher epoch, or a table of another line: Table.Line); a table that
// is the same or older only refreshes the one in force. now is the
// time (ns) of this call; sentAt is the time the Redis call that returned
// t was sent: the table is fresh until sentAt + 2H (only ever extended).
// That call must be one that also wrote this gateway's report (whose TTL,
// 2H + H/2, then outlives the table's freshness): for a table delivered by
// pub/sub, pass the send time of the latest report call, not of the read.
// Shrinks take effect from now, on each key's next request: a key's state
// is exactly what it was at now (every request after now switches it
// first), so its tokens at now are carried, clamped to the new burst, and
// the new share refills from now. (Counting from sentAt instead charged
// the old share's idle refill between sentAt and now as spent.) The
// allocator counts the old share until this gateway acknowledges, which
// it does after this call.
//
// This gateway runs t's shares only when t lists them for its run (see
// Report); an answer that comes after the run may have lapsed (its report
// expired in Redis: 2H + H/2 after the send of the latest call answered
// before) starts a new run first, and so does a new table in force that
// lists this gateway on another incarnation's run or on a later run than
// its own. A nil t (Redis holds no table yet) changes no table, and
// counts the call as answered.
func (l *Limiter) ApplyAt(now, sentAt int64, t *Table) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.run != 0 && l.lapsed(now) {
		// The answer came too late to tell that this gateway's report
		// stayed live: nothing applied for the run may run again.
		l.newRun(now)
	}
	l.heard = max(l.heard, sentAt)
	if t == nil {
		return
	}
	cur := l.view.Load()
	fresh := sentAt + 2*int64(l.o.Interval)
	if l.table != nil && t.Line == l.table.Line && (t.Epoch == cur.epoch && t.Token == cur.token || t.Epoch < cur.epoch) {
		// The same table, or an older one of its line (pub/sub brought a
		// newer one first, maybe a shrink this gateway has acknowledged):
		// the call proves contact, so the table in force stays fresh
		// longer, and an older table never replaces it.
		if fresh > cur.freshUntil {
			nv := *cur
			nv.freshUntil = fresh
			l.view.Store(&nv)
		}
		return
	}
	l.table = t
	l.tables.Add(1)
	if r, ok := t.Runs[l.gateway]; ok && l.run != 0 && r != 0 && (otherIncarnation(r, l.run) || r > l.run) {
		// The allocator has this ID on a run of another Limiter (a late
		// report of a process gone, or two sharing the ID), or on one this
		// Limiter has not started: a new run of this one (above that one
		// when of this incarnation) is one the allocator takes for the
		// gateway's latest.
		if !otherIncarnation(r, l.run) {
			l.run = r
		}
		l.newRun(now)
	}
	l.publish(max(now, sentAt), max(fresh, cur.freshUntil))
}

// lapsed reports whether this gateway's run has lapsed at now (ns): this
// gateway's report may have expired in Redis since the allocator first
// saw the run, so the allocator may have stopped counting the shares
// tables give the run. The allocator saw the run in a report sent at
// runFrom at the earliest, and each call answered wrote one sent at heard
// at the latest; the latest report Redis received before now lives at
// least 2H + H/2 from its send, until max(runFrom, heard) + 2H + H/2.
// (This holds while Redis keeps what it acknowledged: a replica promoted
// after a failover may have lost the latest report.) Caller holds l.mu.
func (l *Limiter) lapsed(now int64) bool {
	h := int64(l.o.Interval)
	return now >= max(l.runFrom, l.heard)+2*h+h/2
}

// runSeqBits are the low bits of a run (Report.Run) that count one
// Limiter's runs; the high bits are its incarnation, drawn at random at
// its first run. Runs of one incarnation are ordered: a report of a lower
// one is a late report of a run this gateway has left.
const runSeqBits = 24

// otherIncarnation reports whether runs a and b (both nonzero) come from
// different Limiters (or from one whose counter wrapped).
func otherIncarnation(a, b uint64) bool { return a>>runSeqBits != b>>runSeqBits }

// newRun starts a new run at now (ns) and publishes the view for it: no
// table applied so far gives this gateway a share in it. (A run lapses
// only after its table went stale, so the keys run their floors already.)
// Caller holds l.mu.
func (l *Limiter) newRun(now int64) {
	if l.run == 0 {
		l.run = (rand.Uint64() | 1) << runSeqBits
	}
	l.run++
	l.runs.Add(1)
	l.runFrom = now
	cur := l.view.Load()
	l.publish(max(now, cur.since), cur.freshUntil)
}

// publish stores a new view of l.table for l.gateway. Caller holds l.mu.
func (l *Limiter) publish(since, freshUntil int64) {
	l.gen++
	nv := &view{gen: l.gen, freshUntil: freshUntil, since: since, shares: map[KeyID]Share{}}
	if t := l.table; t != nil {
		nv.epoch, nv.token = t.Epoch, t.Token
		// A table without runs comes from an allocator of an earlier
		// release (a rolling upgrade): its shares are run as then.
		if l.gateway != "" && (t.Runs == nil || t.Runs[l.gateway] == l.run) {
			for id, ks := range t.Keys {
				if s, ok := ks.Shares[l.gateway]; ok && validLimit(ks.Limit) {
					nv.shares[id] = clampShare(s, ks.Limit, ks.Limit.Floor(l.o.MaxGateways))
				}
			}
		}
	}
	l.view.Store(nv)
}

// clampShare keeps a table's share within [floor, limit] (a table is data
// from Redis: nothing in it may break the hot path).
func clampShare(s Share, lim KeyLimit, floor Share) Share {
	if !(s.Rate >= floor.Rate) {
		s.Rate = floor.Rate
	}
	s.Rate = min(s.Rate, lim.Rate)
	s.Burst = min(max(s.Burst, floor.Burst, 1), lim.Burst)
	return s
}

// Report returns this gateway's demand report at now (ns): for each key
// held, its limit and its offered load (admitted plus refused) in requests
// per second, smoothed (a rise is taken at once, a fall halves the
// distance to the new rate per report), the epoch applied, and the run.
// It also drops keys idle for 3 reports whose bucket is full (the same
// state as no key). The first call has no interval to measure: it divides
// by H.
//
// The first call starts a run (Report.Run), and so does a call once the
// run may have lapsed: 2H + H/2 (a report's TTL in Redis) after the send
// of the latest call answered (see ApplyAt), or after the run began when
// none was. From then on this gateway runs a table's shares only when the
// table lists them for the new run, so a table it ran before, brought
// again by the call that sends this report or by any later one, keeps it
// at its floors: the allocator may have given those shares away while
// this gateway's report was expired. The allocator drops what it knew of
// a gateway on a new run of the same incarnation (its bound is its floor;
// its next share at most the one the last table gave it, grows waiting
// for slack). A table stale for less than H/2 comes back with the next
// answer, on the same run.
//
// Call it every H and send the report with the call that returns the
// table (see Apply). Retry a call that fails well before the next one is
// due (the simulator retries once after H/4): a table stays fresh for 2H
// from the send time of the call that returned it, so two calls lost in a
// row put the gateway at its floors.
func (l *Limiter) Report(now int64, gateway string) Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gateway != "" && l.o.Gateway == "" && gateway != l.gateway {
		l.gateway = gateway
		cur := l.view.Load()
		l.publish(cur.since, cur.freshUntil)
	}
	if l.run == 0 || l.lapsed(now) {
		l.newRun(now)
	}
	// This report goes out on the run at now: a run a concurrent ApplyAt
	// started after now was reported from now on.
	l.runFrom = min(l.runFrom, now)
	elapsed := float64(l.o.Interval) / float64(time.Second)
	if l.last != 0 && now > l.last {
		elapsed = float64(now-l.last) / float64(time.Second)
	}
	l.last = now
	rep := Report{Gateway: gateway, Applied: l.view.Load().epoch, Run: l.run, Keys: map[KeyID]KeyDemand{}}
	for i := range l.shards {
		sh := &l.shards[i]
		if sh.tab.Load().empty() {
			continue // a key added meanwhile is reported next time
		}
		sh.mu.Lock()
		t := sh.tab.Load()
		for j := range t.slots {
			sl := &t.slots[j]
			if sl.hash.Load() < firstHash {
				continue
			}
			k := sl.k.Load()
			k.mu.Lock()
			b := k.b.Load()
			off := b.takeOffered()
			rate := float64(off) / elapsed
			if rate >= k.demand {
				k.demand = rate
			} else {
				k.demand = (k.demand + rate) / 2
			}
			if off == 0 {
				k.idle++
			} else {
				k.idle = 0
			}
			if tat := b.tat.Load(); k.idle >= idleReports && tat >= frozen && tat <= now && b.tat.CompareAndSwap(tat, deadTAT) {
				k.mu.Unlock()
				sl.hash.Store(deletedHash)
				sh.live--
				l.keys.Add(-1)
				continue
			}
			k.mu.Unlock()
			rep.Keys[b.id] = KeyDemand{Limit: b.lim.kl, Demand: k.demand}
		}
		if len(t.slots) > 8 && 8*sh.live < len(t.slots) {
			sh.resize(sh.live)
		}
		sh.mu.Unlock()
	}
	return rep
}

// idleReports is how many reports without requests make a key idle.
const idleReports = 3

// Stats returns the limiter's counters.
func (l *Limiter) Stats() LimiterStats {
	st := LimiterStats{Epoch: l.view.Load().epoch, Fallbacks: l.fallbacks.Load(), Tables: l.tables.Load(), Runs: l.runs.Load(), KeysRefused: l.refused.Load()}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		t := sh.tab.Load()
		for j := range t.slots {
			sl := &t.slots[j]
			if sl.hash.Load() >= firstHash {
				st.HotKeys++
				st.ShareRate += sl.k.Load().b.Load().share.Rate
			}
		}
		sh.mu.Unlock()
	}
	return st
}

// locate returns the shard and fingerprint of req's key: consumer and
// scope (the counters the other stores keep; the limit is the key's state,
// see switchKey).
func (l *Limiter) locate(req *core.Request) (*lshard, fingerprint) {
	hc := maphash.String(l.seeds[0], req.Consumer)
	f := fingerprint{h: hc, check: maphash.String(l.seeds[1], req.Consumer)}
	if scope := req.Rule.Scope(); scope != "" {
		f.h ^= maphash.String(l.seeds[2], scope)
		f.check ^= maphash.String(l.seeds[3], scope)
	}
	if f.h < firstHash {
		f.h += firstHash
	}
	return &l.shards[hc>>l.shift], f
}

// insert returns the live key for f, adding it under hr's limit (at its
// share in the current view, with a full bucket) if needed; nil at
// MaxKeys. A live key may hold another limit: the caller switches it.
func (l *Limiter) insert(sh *lshard, f fingerprint, req *core.Request, hr *hotRule, now int64) *key {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if k := sh.tab.Load().find(f); k != nil && k.b.Load().tat.Load() != deadTAT {
		return k
	}
	if l.keys.Add(1) > int64(l.o.MaxKeys) {
		l.keys.Add(-1)
		l.refused.Add(1)
		return nil
	}
	k := &key{}
	b := &bucket{lim: *hr, id: MakeKeyID(req.Consumer, req.Rule.Scope(), hr.limit), since: now}
	s, tag := shareOf(hr.floor, b.id, l.view.Load(), now)
	b.p, b.share = shareParams(s), s
	b.tat.Store(now)
	b.tag.Store(tag)
	k.b.Store(b)
	sh.add(f, k)
	return k
}

// Marks in a slot's hash; a key's first hash is never one of them.
const (
	emptyHash   = 0
	deletedHash = 1
	firstHash   = 2
)

// fingerprint identifies a key: two hashes under independent seeds.
type fingerprint struct{ h, check uint64 }

// lslot is one cell of a shard's table: a fingerprint and its key. An
// empty slot is filled once (check and key first, then hash, which
// publishes it) and can then only become deleted.
type lslot struct {
	hash  atomic.Uint64
	check atomic.Uint64
	k     atomic.Pointer[key]
}

// ltable is an open-addressing table with linear probing, at most 3/4
// used. It holds pointers, so a resize copies them and a reader still on
// the old table finds the same keys.
type ltable struct {
	slots []lslot
	mask  uint64
}

func newLTable(size int) *ltable { return &ltable{slots: make([]lslot, size), mask: uint64(size - 1)} }

// empty reports whether t holds no key (read without the lock).
func (t *ltable) empty() bool {
	for i := range t.slots {
		if t.slots[i].hash.Load() >= firstHash {
			return false
		}
	}
	return true
}

func (t *ltable) find(f fingerprint) *key {
	for i := f.h & t.mask; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		switch h := sl.hash.Load(); {
		case h == emptyHash:
			return nil
		case h == f.h && sl.check.Load() == f.check:
			return sl.k.Load()
		}
	}
}

type lshard struct {
	tab  atomic.Pointer[ltable]
	mu   sync.Mutex // serialises inserts, sweeps, resizes
	live int        // guarded by mu
	used int        // live plus deleted slots; guarded by mu
	_    [64]byte
}

// add inserts k under f. Caller holds sh.mu; f is not live in the table.
func (sh *lshard) add(f fingerprint, k *key) {
	t := sh.tab.Load()
	if 4*(sh.used+1) > 3*len(t.slots) {
		t = sh.resize(sh.live + 1)
	}
	t.put(f, k)
	sh.live++
	sh.used++
}

func (t *ltable) put(f fingerprint, k *key) {
	for i := f.h & t.mask; ; i = (i + 1) & t.mask {
		if sl := &t.slots[i]; sl.hash.Load() == emptyHash {
			sl.check.Store(f.check)
			sl.k.Store(k)
			sl.hash.Store(f.h)
			return
		}
	}
}

// resize publishes a table that n keys fill at most half of, holding the
// live keys. Caller holds sh.mu.
func (sh *lshard) resize(n int) *ltable {
	size := 8
	for 2*n > size {
		size <<= 1
	}
	old := sh.tab.Load()
	t := newLTable(size)
	for i := range old.slots {
		sl := &old.slots[i]
		if h := sl.hash.Load(); h >= firstHash {
			t.put(fingerprint{h: h, check: sl.check.Load()}, sl.k.Load())
		}
	}
	sh.tab.Store(t)
	sh.used = sh.live
	return t
}
