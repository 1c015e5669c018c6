package memory

import (
	"sync"

	"github.com/limitplane/limitplane/core"
)

// flights counts each key's requests in flight (core.LimitSet.InFlight),
// exactly: one counter per key holding at least one slot, in a map of the
// key's shard, changed under that shard's mutex. A counter is removed when
// its last slot is given back, so the map holds only keys with requests in
// flight. Its shards are indexed as the store's are (a consumer's keys
// share one).
type flights struct {
	shards []flightShard
}

type flightShard struct {
	mu sync.Mutex
	m  map[fingerprint]*flight
	_  [40]byte // keep shards on separate cache lines
}

// flight is one key's count of slots held. It is the core.Releaser of
// every slot of its key: Release gives one back (core.Hold makes each
// request's Release happen once).
type flight struct {
	sh *flightShard
	f  fingerprint
	n  int64 // guarded by sh.mu
}

func newFlights(n int) flights {
	return flights{shards: make([]flightShard, n)}
}

// acquire takes a slot of f's key under cap, reporting the key's flight
// (nil when cap slots are held) and the slots held after the call. With
// peek, nothing changes: the flight is nil and held is the count now.
func (fs *flights) acquire(f fingerprint, limit int64, peek bool) (fl *flight, held int64) {
	sh := &fs.shards[f.h&uint64(len(fs.shards)-1)]
	sh.mu.Lock()
	fl = sh.m[f]
	if fl != nil {
		held = fl.n
	}
	if held >= limit || peek {
		sh.mu.Unlock()
		return nil, held
	}
	if fl == nil {
		if sh.m == nil {
			sh.m = make(map[fingerprint]*flight)
		}
		fl = &flight{sh: sh, f: f}
		sh.m[f] = fl
	}
	fl.n++
	held = fl.n
	sh.mu.Unlock()
	return fl, held
}

// Release implements core.Releaser: it gives one slot of fl's key back.
func (fl *flight) Release() {
	sh := fl.sh
	sh.mu.Lock()
	if fl.n--; fl.n <= 0 && sh.m[fl.f] == fl {
		delete(sh.m, fl.f)
	}
	sh.mu.Unlock()
}

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
func (s *Store) takeInFlight(req core.Request, r *rule) (core.Decision, error) {
	_, f := s.locate(req.Consumer, req.Rule.Scope())
	peek := req.Cost == 0
	fl, held := s.flights.acquire(f, r.inFlight, peek)
	if fl == nil && (!peek || held >= r.inFlight) {
		return core.Decision{DecidedBy: core.KindInFlight, Limit: r.inFlight}, nil
	}
	var d core.Decision
	var err error
	if r.limited || r.quota {
		d, err = s.takeLimits(req, r)
	} else {
		d = core.Decision{Allowed: true, DecidedBy: core.KindInFlight, Limit: r.inFlight, Remaining: r.inFlight - held}
	}
	if fl != nil {
		if err != nil || !d.Allowed {
			fl.Release()
		} else {
			d.Hold = core.NewHold(fl)
		}
	}
	return d, err
}
