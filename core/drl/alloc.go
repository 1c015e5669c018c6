package drl

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Share is one gateway's part of a key's rate limit: Rate requests per
// second with bursts of up to Burst requests, enforced in memory by that
// gateway's Limiter as a local GCRA.
type Share struct {
	// Rate is the sustained rate, in requests per second.
	Rate float64 `json:"rate"`
	// Burst is the local bucket's size, in requests.
	Burst int64 `json:"burst"`
}

// KeyLimit is a key's global rate limit, the one all gateways share.
type KeyLimit struct {
	// Rate is the limit's sustained rate R, in requests per second.
	Rate float64 `json:"rate"`
	// Burst is the limit's burst B, in requests.
	Burst int64 `json:"burst"`
}

// Floor returns the key's floor for maxGateways gateways:
// Share{Rate: R/maxGateways, Burst: floor(B/maxGateways)}. A gateway runs
// a key at its floor whenever it has no fresh table share for it, so that
// up to maxGateways gateways at their floors never exceed the limit.
func (l KeyLimit) Floor(maxGateways int) Share {
	m := max(maxGateways, 1)
	return Share{Rate: l.Rate / float64(m), Burst: l.Burst / int64(m)}
}

// burstFor returns the burst that goes with rate share r: B×r/R rounded
// down, at least the floor's burst, so the bursts of shares whose rates sum
// to at most R sum to at most B.
func (l KeyLimit) burstFor(r float64, floor Share) int64 {
	if l.Rate <= 0 {
		return floor.Burst
	}
	// The 1e-6 absorbs the rate's rounding (shares sum to a hair below R);
	// n shares' bursts still sum to at most B for n < 10^6.
	b := math.Floor(float64(l.Burst)*r/l.Rate + 1e-6)
	if !(b >= float64(floor.Burst)) { // NaN too
		return floor.Burst
	}
	return min(int64(b), l.Burst)
}

// KeyDemand is one gateway's report on one key.
type KeyDemand struct {
	// Limit is the key's global limit.
	Limit KeyLimit `json:"limit"`
	// Demand is the gateway's smoothed offered load on the key (admitted
	// plus refused), in requests per second.
	Demand float64 `json:"demand"`
}

// Report is what a gateway writes every interval H: its demand on each of
// its hot keys and the epoch of the table it has applied.
type Report struct {
	// Gateway is the reporting gateway's ID.
	Gateway string `json:"gateway"`
	// Applied is the epoch of the table the gateway runs (0: none).
	Applied uint64 `json:"applied"`
	// Run identifies the gateway's current run (see Limiter.Report): a
	// gateway starts a new run at its first report, whenever its report
	// may have expired in Redis, and when a table lists it on a run it is
	// not on (see Limiter.ApplyAt), and runs a table's shares only when
	// the table lists them for its run (Table.Runs). Never 0 from a
	// gateway of this release. Runs of one gateway process are ordered (a
	// random incarnation in the high bits, a counter in the low ones: see
	// runSeqBits). On a new run a gateway runs nothing but its floors
	// until a table for that run reaches it, so the allocator drops what
	// it knew of the gateway when its counter rises (its bound is its
	// floor). A report of a lower counter is a late report of a run the
	// gateway has left, taken for the run it is on; a report of another
	// incarnation (a restarted process with the same ID) keeps what the
	// allocator knew, which only holds back grows until the gateway's
	// acknowledgements trim it. 0: a gateway of an earlier release, which
	// knows no runs (it starts again from its floor when it reports after
	// a Step it was not live at).
	Run uint64 `json:"run,omitempty"`
	// Keys holds the demand per key.
	Keys map[KeyID]KeyDemand `json:"keys"`
}

// KeyShares is one key's entry in a Table.
type KeyShares struct {
	// Limit is the key's global limit.
	Limit KeyLimit `json:"limit"`
	// Shares maps a gateway ID to its share. A gateway not listed runs
	// the key at its floor.
	Shares map[string]Share `json:"shares"`
	// Bounds maps a gateway ID to the largest share it may still be
	// running when the table is published (its share in this table or in
	// any earlier one it has not acknowledged). An allocator that takes
	// over from this table starts from these bounds.
	Bounds map[string]Share `json:"bounds"`
}

// Table is one allocation: every gateway's share of every hot key. Tables
// are published with rising epochs; JSON-encodable.
type Table struct {
	// Epoch numbers the publication; +1 per table, continuing across
	// allocators (an allocator taking over starts at the last table's
	// epoch + 1).
	Epoch uint64 `json:"epoch"`
	// Token is the fencing token of the allocator that published it.
	Token uint64 `json:"token"`
	// Line identifies the line of allocators the table comes from: a
	// random nonzero ID drawn by an allocator that found no table (a new
	// group, or a Redis that lost its data), kept by every allocator that
	// takes over from a table. A Redis that lost its data numbers epochs
	// and tokens from 1 again, so only the line tells a new line's first
	// table from an old line's table of the same epoch and token.
	Line uint64 `json:"line,omitempty"`
	// Keys holds the shares per key.
	Keys map[KeyID]KeyShares `json:"keys"`
	// Departed are the gateways counted as departed when the table was
	// made (not live, not forgotten: a floor kept for each, as one may be
	// cut off from Redis and serving at its floor), each with how long
	// before (ns) it was last live. An allocator taking over keeps their
	// floors until Forget has passed since then, as the allocator that
	// made the table would have: the gateways it learns from the table's
	// bounds are only those live at the time.
	Departed map[string]int64 `json:"departed,omitempty"`
	// Runs maps each gateway listed in Shares to the run (Report.Run) its
	// shares are for. A gateway on another run runs the table at its
	// floors: its shares were computed while the allocator counted it on
	// that run, before it went stale, and the allocator may have given
	// them away since (its report expired). A table with no Runs at all
	// comes from an allocator of an earlier release, and its shares are
	// run whatever the run (as they were then).
	Runs map[string]uint64 `json:"runs,omitempty"`
}

// AllocatorOptions configure an Allocator. The zero value is usable.
type AllocatorOptions struct {
	// MaxGateways is the most gateways the guarantee covers; a key's floor
	// is its limit / MaxGateways. Default 32.
	MaxGateways int
	// JoinReserve is how many floors each key keeps free for gateways that
	// join between two tables (they run at their floor until listed).
	// Default 1; negative means none.
	JoinReserve int
	// Headroom is the share given above the smoothed demand of a gateway
	// that is not saturated, as a fraction (0.02 = 2 %). Default 0.02;
	// negative means none.
	Headroom float64
	// Interval is H, the reporting and allocation period. Default 1 s.
	Interval time.Duration
	// Forget is how long a gateway whose report expired still counts as
	// possibly running at its floor (a gateway partitioned from Redis keeps
	// serving at its floor), and how long a key nobody reports is kept.
	// Default 30×Interval.
	Forget time.Duration

	// unsafeGrowsBeforeShrinks, for this package's tests and the unsafe
	// test build only (see unsafeBuild), grants grows from the capacity the
	// new table leaves, ignoring shares gateways may still be running until
	// they acknowledge their shrinks. It breaks the bound; it exists to show
	// that the bound's check catches it.
	unsafeGrowsBeforeShrinks bool
}

func (o AllocatorOptions) withDefaults() AllocatorOptions {
	if o.MaxGateways <= 0 {
		o.MaxGateways = DefaultMaxGateways
	}
	switch {
	case o.JoinReserve == 0:
		o.JoinReserve = DefaultJoinReserve
	case o.JoinReserve < 0:
		o.JoinReserve = 0
	}
	switch {
	case o.Headroom == 0:
		o.Headroom = DefaultHeadroom
	case o.Headroom < 0 || math.IsNaN(o.Headroom):
		o.Headroom = 0
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Forget <= 0 {
		o.Forget = 30 * o.Interval
	}
	return o
}

// histEntry is a share published for one gateway from epoch on.
type histEntry struct {
	epoch uint64
	share Share
}

// maxRetiredRuns bounds the runs a gateway has left that the allocator
// remembers (a report of one that arrives late is not a new run).
const maxRetiredRuns = 8

// maxHist bounds a gateway's history per key; beyond it the oldest two
// entries merge (keeping the larger share: a bound never shrinks by it).
const maxHist = 16

// allocKey is the allocator's state of one key.
type allocKey struct {
	limit        KeyLimit
	lastReported int64
	// hist holds, per gateway, the shares published since the one in
	// force at its acknowledged epoch (that one included), oldest first.
	hist map[string][]histEntry
}

// Allocator computes the tables of one data plane (the control loop of
// limitplane's DRL). It is pure: time is an argument, and Redis (the
// lease, the reports, the acknowledgements, publishing) is the caller's.
// Not safe for concurrent use: one goroutine of the lease holder calls Step.
//
// For each key, every live gateway gets a share: max-min fair
// (water-filling) on want = max(floor, demand×(1+Headroom)), the capacity
// left over split equally, never below the floor. Shares never sum above
// the limit less the reserved floors (JoinReserve plus the gateways that
// departed less than Forget ago), counting for each gateway the largest
// share it may still be running (its bound): a table lowers shares at once
// but grants a grow only from the capacity the bounds leave, so grows wait
// for the shrinks they need to be acknowledged (shrink before grow).
type Allocator struct {
	o         AllocatorOptions
	token     uint64
	epoch     uint64 // of the last table published (or taken over)
	line      uint64 // Table.Line
	published bool   // this allocator published a table
	last      *Table // last table published or taken over; nil: none
	seen      map[string]int64
	runs      map[string]uint64   // gateway seen → its run (Report.Run)
	retired   map[string][]uint64 // gateway → runs it has left, oldest first (a report on one is late)
	wasLive   map[string]bool     // gateways live at the previous Step (for Run 0)
	left      map[string]bool     // gateways that left cleanly, for the next Step
	keys      map[KeyID]*allocKey
}

// Left tells the allocator that gateways left cleanly (their drl.Store
// closed: they decide nothing any more), so the next Step keeps no floor
// for them, where a gateway whose report merely expired (it may be cut
// off from Redis, running at its floor) keeps one for Forget. A gateway
// named here that reports at that Step is live.
func (a *Allocator) Left(gateways ...string) {
	if len(gateways) == 0 {
		return
	}
	if a.left == nil {
		a.left = make(map[string]bool, len(gateways))
	}
	for _, g := range gateways {
		a.left[g] = true
	}
}

// NewAllocator returns an Allocator publishing with fencing token token.
// last is the table in force (read from Redis) or nil: an allocator taking
// over continues its line and epochs and starts from its shares and
// bounds, counting its gateways that no longer report as departed; with
// nil it starts a new line (Table.Line).
func NewAllocator(o AllocatorOptions, token uint64, last *Table) *Allocator {
	a := &Allocator{o: o.withDefaults(), token: token, seen: map[string]int64{}, runs: map[string]uint64{}, keys: map[KeyID]*allocKey{}}
	if last == nil {
		a.line = rand.Uint64() | 1
		return a
	}
	a.epoch, a.last, a.line = last.Epoch, last, last.Line
	a.wasLive = map[string]bool{}
	a.seen = nil // filled by the first Step, which knows the time
	maps.Copy(a.runs, last.Runs)
	for id, ks := range last.Keys {
		k := &allocKey{limit: ks.Limit, lastReported: math.MinInt64, hist: map[string][]histEntry{}}
		for g, b := range ks.Bounds {
			k.hist[g] = append(k.hist[g], histEntry{0, b})
			a.wasLive[g] = true
		}
		for g, s := range ks.Shares {
			k.hist[g] = append(k.hist[g], histEntry{last.Epoch, s})
		}
		a.keys[id] = k
	}
	return a
}

// follow records run, reported by live gateway id, as its run (or keeps
// the one it is on, for a late report), and reports whether the gateway
// runs its floors whatever it ran before: its run lapsed (a higher counter
// of its incarnation), or, for a gateway of an earlier release (run 0),
// it was not live at the previous Step.
func (a *Allocator) follow(id string, run uint64) (atFloor bool) {
	prev, ok := a.runs[id]
	atFloor = run == 0 && !a.wasLive[id]
	switch {
	case !ok || run == prev || run == 0 || prev == 0:
	case a.late(id, run, prev):
		run = prev
	case !otherIncarnation(run, prev):
		atFloor = true
	}
	if ok && prev != run {
		if a.retired == nil {
			a.retired = map[string][]uint64{}
		}
		a.retired[id] = append(a.retired[id], prev)
		if len(a.retired[id]) > maxRetiredRuns {
			a.retired[id] = a.retired[id][1:]
		}
	}
	a.runs[id] = run
	return atFloor
}

// late reports whether run, reported by gateway id whose run is prev, is
// one the gateway has left: a lower counter of prev's incarnation, or of a
// retired run's.
func (a *Allocator) late(id string, run, prev uint64) bool {
	left := func(r uint64) bool { return r == run || r != 0 && !otherIncarnation(run, r) && run < r }
	return left(prev) || slices.ContainsFunc(a.retired[id], left)
}

// Epoch returns the epoch of the last table published or taken over.
func (a *Allocator) Epoch() uint64 { return a.epoch }

// Step computes the next table at time now (ns, on the caller's
// monotonic clock) from the reports of the live gateways (those whose
// report has not expired in Redis) and the acknowledged epochs (gateway →
// epoch of the table it applied; a Report's Applied counts too). It
// returns the table and whether it must be published: true when the
// shares changed or this allocator has not published yet; otherwise it
// returns the last table. Step may be called more often than every H (the
// simulator calls it every H/4): it publishes only changes, and calling it
// soon after acknowledgements arrive lets grows follow their shrinks
// sooner.
//
// A table Step returns for publication counts as published from then on
// (its shares enter the bounds): a caller that cannot publish it (its
// lease lapsed, the fenced write failed) must stop using this Allocator
// and, once it holds the lease again, start a new one from the stored
// table.
func (a *Allocator) Step(now int64, live []Report, acks map[string]uint64) (*Table, bool) {
	g := a.gateways(now, live, acks)
	demand, ids := a.keysAt(now, g)
	t, unsettled := a.nextTable(g, demand, ids)
	return a.publish(t, unsettled)
}

// stepGateways are the gateways of one Step.
type stepGateways struct {
	reports  map[string]*Report // the live gateways' reports
	names    []string           // their IDs, sorted
	departed int                // gateways not live but not forgotten: a floor kept for each
	ages     map[string]int64   // those gateways → ns since they were last live
	acked    map[string]uint64  // live gateway → the epoch it acknowledged (0: unknown)
}

// gateways is Step's first phase: live gateways are seen now; the others
// count as departed (possibly partitioned, at their floor) until Forget,
// unless they left cleanly; a gateway on a new run starts again from its
// floor; and each live gateway's acknowledged epoch.
func (a *Allocator) gateways(now int64, live []Report, acks map[string]uint64) stepGateways {
	o := a.o
	g := stepGateways{reports: make(map[string]*Report, len(live))}
	for i := range live {
		if live[i].Gateway != "" {
			g.reports[live[i].Gateway] = &live[i]
		}
	}
	g.names = make([]string, 0, len(g.reports))
	for id := range g.reports {
		g.names = append(g.names, id)
	}
	slices.Sort(g.names)

	if a.seen == nil {
		a.seen = map[string]int64{}
		if a.last != nil {
			// Taking over: the gateways of the table's bounds as live
			// now, its departed ones as departed when it was made (the
			// time since it was published is not known here, and
			// counting it as none keeps their floors longer, never
			// shorter).
			for id, age := range a.last.Departed {
				a.seen[id] = now - max(age, 0)
			}
			for _, ks := range a.last.Keys {
				for id := range ks.Bounds {
					a.seen[id] = now
				}
			}
		}
	}
	for _, id := range g.names {
		a.seen[id] = now
	}
	// A gateway that left cleanly decides nothing any more: no floor is
	// kept for it (one that reports again is live again).
	for id := range a.left {
		if _, ok := g.reports[id]; !ok {
			delete(a.seen, id)
			delete(a.runs, id)
			delete(a.retired, id)
		}
	}
	a.left = nil
	for id, t := range a.seen {
		if _, ok := g.reports[id]; ok {
			continue
		}
		if now-t >= int64(o.Forget) {
			delete(a.seen, id)
			delete(a.runs, id)
			delete(a.retired, id)
		} else {
			g.departed++
			if g.ages == nil {
				g.ages = map[string]int64{}
			}
			g.ages[id] = now - t
		}
	}
	// A gateway on a new run runs its floors, whatever it ran before
	// (Report.Run): it starts again from its floor. A gateway whose report
	// expired comes back on a new run (its Limiter counts the report's
	// 2H + H/2 from the send of the latest call answered).
	isLive := make(map[string]bool, len(g.names))
	for _, id := range g.names {
		if a.follow(id, g.reports[id].Run) {
			for _, k := range a.keys {
				delete(k.hist, id)
			}
		}
		isLive[id] = true
	}
	a.wasLive = isLive
	g.acked = make(map[string]uint64, len(g.names))
	for _, id := range g.names {
		g.acked[id] = max(validEpoch(acks[id], a.epoch), validEpoch(g.reports[id].Applied, a.epoch))
	}
	return g
}

// keysAt is Step's second phase: every key some live gateway reports (with
// the limit its KeyID names) is held, with each gateway's demand on it; a
// key nobody reported for Forget is forgotten. It returns the demand per
// key and the keys held, sorted.
func (a *Allocator) keysAt(now int64, g stepGateways) (map[KeyID]map[string]float64, []KeyID) {
	demand := map[KeyID]map[string]float64{}
	for _, gw := range g.names {
		for id, kd := range g.reports[gw].Keys {
			if !validLimit(kd.Limit) {
				continue
			}
			k := a.keys[id]
			if k == nil {
				k = &allocKey{limit: kd.Limit, hist: map[string][]histEntry{}}
				a.keys[id] = k
			}
			if kd.Limit != k.limit {
				continue // a KeyID names one limit; ignore a report that disagrees
			}
			k.lastReported = now
			if demand[id] == nil {
				demand[id] = map[string]float64{}
			}
			d := kd.Demand
			if !(d >= 0) || math.IsInf(d, 1) {
				d = math.MaxFloat64
			}
			demand[id][gw] = d
		}
	}
	ids := make([]KeyID, 0, len(a.keys))
	for id, k := range a.keys {
		if k.lastReported == math.MinInt64 {
			k.lastReported = now // taken over: kept Forget from now
		}
		if now-k.lastReported >= int64(a.o.Forget) {
			delete(a.keys, id)
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return demand, ids
}

// nextTable is Step's third phase: the table of the keys ids (sorted)
// for the live gateways, each key allocated on its own (see allocate),
// its forgotten gateways' history dropped. unsettled reports that some
// share is off its target by more than publishTolerance.
func (a *Allocator) nextTable(g stepGateways, demand map[KeyID]map[string]float64, ids []KeyID) (t *Table, unsettled bool) {
	t = &Table{Epoch: a.epoch + 1, Token: a.token, Line: a.line, Keys: make(map[KeyID]KeyShares, len(ids)), Departed: g.ages}
	for _, id := range ids {
		k := a.keys[id]
		for gw := range k.hist { // forget the history of forgotten gateways
			if _, ok := a.seen[gw]; !ok {
				delete(k.hist, gw)
			}
		}
		if len(g.names) == 0 {
			continue
		}
		ks, ok, off := a.allocate(k, id, g.names, demand[id], g.acked, g.departed)
		if ok {
			t.Keys[id] = ks
			unsettled = unsettled || off
			if t.Runs == nil {
				t.Runs = make(map[string]uint64, len(g.names))
			}
			for gw := range ks.Shares {
				t.Runs[gw] = a.runs[gw]
			}
		}
	}
	return t, unsettled
}

// publish is Step's last phase: t is published when it changes a share
// beyond the tolerance, or a fifth of it while some share is still off its
// target by more than the tolerance (shrinks that are small one by one may
// be what a grow waits for), or when this allocator has published nothing
// yet; it then counts as published (its shares enter the history, hence
// the bounds). Otherwise Step returns the last table, unchanged.
func (a *Allocator) publish(t *Table, unsettled bool) (*Table, bool) {
	if a.published && a.last != nil && sameShares(a.last, t, publishTolerance) && (!unsettled || sameShares(a.last, t, publishTolerance/5)) {
		return a.last, false
	}
	a.epoch++
	a.published = true
	a.last = t
	for id, ks := range t.Keys {
		k := a.keys[id]
		for gw, s := range ks.Shares {
			h := k.hist[gw]
			if n := len(h); n > 0 && h[n-1].share == s {
				continue
			}
			h = append(h, histEntry{t.Epoch, s})
			if len(h) > maxHist {
				h[1] = histEntry{h[0].epoch, maxShare(h[0].share, h[1].share)}
				h = h[1:]
			}
			k.hist[gw] = h
		}
	}
	return t, true
}

// validEpoch returns e, or 0 when e is above the newest epoch (an
// acknowledgement from another allocator's numbering: unknown).
func validEpoch(e, newest uint64) uint64 {
	if e > newest {
		return 0
	}
	return e
}

// validLimit reports whether a reported limit can be split.
func validLimit(l KeyLimit) bool {
	return l.Rate > 0 && !math.IsInf(l.Rate, 1) && l.Burst > 0
}

// allocate computes one key's shares for the live gateways names (sorted).
// It returns false when the key cannot be split (floor burst below 1), and
// off when some gateway's share is off its target by more than
// publishTolerance.
func (a *Allocator) allocate(k *allocKey, id KeyID, names []string, demand map[string]float64, acked map[string]uint64, departed int) (ks KeyShares, ok, off bool) {
	o := a.o
	floor := k.limit.Floor(o.MaxGateways)
	if floor.Burst < 1 || !(floor.Rate > 0) {
		return KeyShares{}, false, false
	}
	n := len(names)
	// A hair below R, so rounding never lets the shares sum above it.
	avail := k.limit.Rate*(1-1e-9) - float64(o.JoinReserve+departed)*floor.Rate

	// The shares in force now (the last table's; a gateway not listed
	// runs at its floor) and the bounds from the history.
	var lastKey KeyShares
	if a.last != nil {
		lastKey = a.last.Keys[id]
	}
	cur := make([]float64, n)
	hb := make([]Share, n)
	for i, g := range names {
		cur[i] = floor.Rate
		if s, ok := lastKey.Shares[g]; ok {
			cur[i] = max(s.Rate, floor.Rate)
		}
		h := k.hist[g]
		// Drop entries superseded before the acknowledged epoch.
		j := 0
		for j+1 < len(h) && h[j+1].epoch <= acked[g] {
			j++
		}
		h = h[j:]
		k.hist[g] = h
		b := floor
		for _, e := range h {
			b = maxShare(b, e.share)
		}
		hb[i] = b
	}

	// Target: water-filling on want, the rest split equally.
	target := make([]float64, n)
	if avail < float64(n)*floor.Rate {
		// More gateways than the limit has floors for: everyone at the
		// floor (the bound is only promised up to MaxGateways).
		for i := range target {
			target[i] = floor.Rate
		}
	} else {
		want := make([]float64, n)
		for i, g := range names {
			d := demand[g]
			want[i] = max(floor.Rate, min(d*(1+o.Headroom), k.limit.Rate))
		}
		waterfill(target, want, avail)
	}

	// Shrinks at once; grows from the slack the bounds leave.
	next := make([]float64, n)
	if o.unsafeGrowsBeforeShrinks {
		copy(next, target)
	} else {
		slack := avail
		for i := range next {
			next[i] = min(cur[i], target[i])
			// A grow up to the bound costs nothing: the gateway may be
			// running that much already.
			if target[i] > next[i] {
				next[i] = max(next[i], min(target[i], hb[i].Rate))
			}
			slack -= max(hb[i].Rate, next[i])
		}
		need := 0.0
		for i := range next {
			need += target[i] - next[i]
		}
		if slack > 0 && need > 0 {
			f := min(slack/need, 1)
			for i := range next {
				if d := target[i] - next[i]; d > 0 {
					next[i] += d * f
				}
			}
		}
	}

	ks = KeyShares{Limit: k.limit, Shares: make(map[string]Share, n), Bounds: make(map[string]Share, n)}
	for i, g := range names {
		r := max(next[i], floor.Rate)
		s := Share{Rate: r, Burst: k.limit.burstFor(r, floor)}
		ks.Shares[g] = s
		ks.Bounds[g] = maxShare(hb[i], s)
		off = off || math.Abs(cur[i]-target[i]) > publishTolerance*k.limit.Rate
	}
	return ks, true, off
}

// waterfill sets out to the max-min fair split of avail among wants: each
// gets min(want, level) for the level that uses avail; when the wants sum
// to less than avail, each gets its want plus an equal part of the rest.
func waterfill(out, want []float64, avail float64) {
	n := len(want)
	sum := 0.0
	for _, w := range want {
		sum += w
	}
	if sum <= avail {
		extra := (avail - sum) / float64(n)
		for i, w := range want {
			out[i] = w + extra
		}
		return
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		switch {
		case want[x] < want[y]:
			return -1
		case want[x] > want[y]:
			return 1
		}
		return 0
	})
	left := avail
	for j, i := range order {
		level := left / float64(n-j)
		if want[i] <= level {
			out[i] = want[i]
			left -= want[i]
			continue
		}
		for _, i := range order[j:] {
			out[i] = level
		}
		return
	}
}

func maxShare(a, b Share) Share {
	return Share{Rate: max(a.Rate, b.Rate), Burst: max(a.Burst, b.Burst)}
}

// publishTolerance is the change of a share, as a fraction of the key's
// rate, below which a new table is not published: demand measurements
// jitter, and every table costs a publication and acknowledgements.
const publishTolerance = 0.005

// sameShares reports whether a and b give every gateway the same shares of
// the same keys for the same runs, up to tolerance×rate (bounds aside: a
// table's bounds only need to be at least the true ones). Not publishing
// is always safe: only published tables are run, and only they enter the
// bounds.
func sameShares(a, b *Table, tolerance float64) bool {
	if len(a.Keys) != len(b.Keys) || !maps.Equal(a.Runs, b.Runs) {
		return false
	}
	for id, x := range a.Keys {
		y, ok := b.Keys[id]
		if !ok || x.Limit != y.Limit || len(x.Shares) != len(y.Shares) {
			return false
		}
		tol := tolerance * x.Limit.Rate
		for g, s := range x.Shares {
			if t, ok := y.Shares[g]; !ok || math.Abs(s.Rate-t.Rate) > tol {
				return false
			}
		}
	}
	return true
}
