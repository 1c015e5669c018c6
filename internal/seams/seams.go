// Package seams is how this module's tests (and the gateway program's
// end-to-end tests) freeze the clocks and timers of live.Config, the
// gateway and gateway/server. Those packages' Options hold a *Seams, which
// only code inside this module can make, so the seams are not part of the
// public API: a user leaves the field nil and gets the system clock.
package seams

import (
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/failurelog"
)

// Seams replace the system clock and timers. A nil *Seams, and any nil
// field, mean the system's.
type Seams struct {
	// Clock is the monotonic clock of the in-process stores a package
	// creates itself (the fallback store; gateway/server's memory store,
	// and its Redis store's scripts instead of Redis TIME).
	Clock core.Clock
	// Now is the wall clock for key expiry, JWT validation,
	// X-RateLimit-Reset and (gateway/server) the agent's staleness.
	Now func() time.Time
	// AfterFunc times the store-failure logs' intervals.
	AfterFunc failurelog.AfterFunc
}

// Or returns *s, or the zero Seams when s is nil, with Now set to
// time.Now when it is nil. Clock and AfterFunc stay nil for the system's:
// the constructors they are passed to take nil for that.
func (s *Seams) Or() Seams {
	var v Seams
	if s != nil {
		v = *s
	}
	if v.Now == nil {
		v.Now = time.Now
	}
	return v
}
