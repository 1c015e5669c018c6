package memory

import (
	"context"
	"runtime"
	"time"

	"github.com/limitplane/limitplane/core"
)

// Penalize implements core.Store: it moves the TAT of (req.Consumer,
// req.Rule.Scope()) to at least now + d + τ − T, the earliest state in
// which a unit request conforms exactly d from now. It never moves the TAT
// backwards. d above core.MaxReservation (2^61 ns, about 73 years) is
// treated as that. A rule without a rate limit changes nothing; a foreign
// rule is refused with core.ErrForeignRule. A new key at Options.MaxKeys
// is refused with an error wrapping ErrTooManyKeys.
func (s *Store) Penalize(_ context.Context, req core.Request, d time.Duration) error {
	r := s.ruleOf(&req)
	if r == nil {
		return core.ErrForeignRule
	}
	if d <= 0 || !r.limited {
		return nil
	}
	d = min(d, core.MaxReservation) // keeps now + d + τ far from overflow
	p := r.p
	sh, f := s.locate(req.Consumer, req.Rule.Scope())
	now := s.clock.now()
	target := now + int64(d) + p.Tau - p.T
	for {
		tab, e := s.insert(sh, f, r, now) // in r's interval's units
		if e == nil {
			return s.tooMany()
		}
		for {
			t := e.tat.Load()
			if t < frozen {
				break // swept or moved; look up again
			}
			if t >= target || e.tat.CompareAndSwap(t, target) {
				runtime.KeepAlive(tab) // e is in tab
				return nil
			}
		}
		runtime.KeepAlive(tab)
	}
}
