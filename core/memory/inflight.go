package memory

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/limitplane/limitplane/core"
)

// flights counts each key's requests in flight (core.LimitSet.InFlight),
// exactly: one atomic counter per key, found in a map of the key's shard
// (picked by the key's fingerprint; as many shards as the store has, a
// power of two). A slot is taken by a compare-and-swap below the cap and
// given back by an atomic decrement: no lock is written on either path.
// The map is read under its shard's read lock; a counter is added under
// the write lock, and counters at zero are swept under it once the map
// has doubled since the last sweep: a sweep marks a zero counter dead
// (−1) with a compare-and-swap before deleting it, so a request that
// found it just before sees the mark, fails its swap and looks again.
type flights struct {
	shards []flightShard
}

type flightShard struct {
	mu        sync.RWMutex
	m         map[fingerprint]*flight // guarded by mu
	nextSweep int                     // guarded by mu: len(m) at which an insert sweeps
	_         [24]byte                // keep shards on separate cache lines
}

// minFlightSweep is the smallest map size at which an insert sweeps.
const minFlightSweep = 64

// flight is one key's count of slots held, or −1 once swept. It is the
// core.Releaser of every slot of its key: Release gives one back
// (core.Hold makes each request's Release happen once).
type flight struct{ n atomic.Int64 }

func newFlights(n int) flights {
	return flights{shards: make([]flightShard, n)}
}

// acquire takes a slot of f's key under limit, reporting the key's flight
// (nil when limit slots are held) and the slots held after the call. With
// peek, nothing changes: the flight is nil and held is the count now.
func (fs *flights) acquire(f fingerprint, limit int64, peek bool) (*flight, int64) {
	sh := &fs.shards[f.h&uint64(len(fs.shards)-1)]
	for {
		sh.mu.RLock()
		fl := sh.m[f]
		sh.mu.RUnlock()
		if fl == nil {
			if peek {
				return nil, 0
			}
			fl = sh.insert(f)
		}
		for {
			n := fl.n.Load()
			switch {
			case n < 0: // swept: look again
			case n >= limit || peek:
				return nil, n
			case fl.n.CompareAndSwap(n, n+1):
				return fl, n + 1
			default:
				continue
			}
			break
		}
	}
}

// insert returns f's flight, adding it (and first sweeping the shard's
// counters at zero, once the map has doubled since the last sweep).
func (sh *flightShard) insert(f fingerprint) *flight {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if fl := sh.m[f]; fl != nil {
		return fl
	}
	if sh.m == nil {
		sh.m = make(map[fingerprint]*flight)
	}
	if len(sh.m) >= sh.nextSweep {
		for k, fl := range sh.m {
			if fl.n.CompareAndSwap(0, -1) {
				delete(sh.m, k)
			}
		}
		sh.nextSweep = max(2*len(sh.m), minFlightSweep)
	}
	fl := new(flight)
	sh.m[f] = fl
	return fl
}

// Release implements core.Releaser: it gives one slot of fl's key back.
func (fl *flight) Release() { fl.n.Add(-1) }

// InFlight returns the requests of (consumer, scope) holding a slot now,
// for tests and metrics.
func (s *Store) InFlight(consumer, scope string) int64 {
	_, f := s.locate(consumer, scope)
	_, held := s.flights.acquire(f, 1, true)
	return held
}

// takeInFlight is take for a rule with an in-flight limit: a slot is taken
// first (a denial there spends nothing), then the rate limit and quota
// are taken as for any rule, and the slot is given back unless they allow.
// A cost of 0 peeks: it is denied when the cap is held, and takes nothing.
func (s *Store) takeInFlight(ctx context.Context, req core.Request, r *rule) (core.Decision, error) {
	_, f := s.locate(req.Consumer, req.Rule.Scope())
	peek := req.Cost == 0
	fl, held := s.flights.acquire(f, r.inFlight, peek)
	if fl == nil && (!peek || held >= r.inFlight) {
		return core.Decision{DecidedBy: core.KindInFlight, Limit: r.inFlight}, nil
	}
	var d core.Decision
	var err error
	if r.limits != nil {
		req.Rule = r.limits // the same limits without the cap
		err = s.TakeInto(ctx, &req, &d)
	} else {
		d = core.Decision{Allowed: true, DecidedBy: core.KindInFlight, Limit: r.inFlight, Remaining: r.inFlight - held}
	}
	if fl != nil {
		if err != nil || !d.Allowed {
			fl.Release()
		} else {
			d.Hold = core.JoinHolds(core.NewHold(fl), d.Hold) // d's: a settlement
		}
	}
	return d, err
}

// settlement is the core.Settler of an admitted request under a rule that
// settles (core.LimitSet.Settle): the quota period its cost went to and
// that cost. A period is never reused: once the key's period has ended or
// been reset, settling changes only the old period, which nothing counts
// any more, so no other period is ever credited or charged.
type settlement struct {
	q       *period
	charged int64
}

// Release implements core.Releaser: the estimate stands.
func (*settlement) Release() {}

// Settle implements core.Settler: the period's count moves by actual −
// charged, never below zero. landed is told known false: the count
// moved is the period's, which may have ended or been reset, and only a
// read says which.
func (st *settlement) Settle(actual int64, landed func(used int64, known bool)) {
	delta := actual - st.charged
	if delta == 0 {
		return
	}
	for {
		u := st.q.used.Load()
		if st.q.used.CompareAndSwap(u, max(u+delta, 0)) {
			break
		}
	}
	if landed != nil {
		landed(0, false)
	}
}

var _ core.Settler = (*settlement)(nil)
