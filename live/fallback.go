package live

import (
	"context"
	"os"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/spec"
)

// WindowsAsGCRA is the fallback store for failure_policy fallback over a
// store that has window algorithms (Redis). The in-process store
// implements only GCRA, so while the main store is down a window limit
// (fixed_window, sliding_window, sliding_log) of N per period is enforced
// as GCRA with the same N per period and a burst of N: the same long-run
// rate, without the fixed window's 2× burst at a boundary.
//
// It holds the memory store as a named field, not embedded, so it has
// exactly the methods written here: an embedded store would pass on
// TakeInto and SupportsAlgorithm and so skip the conversion.
type WindowsAsGCRA struct{ mem *memory.Store }

// NewWindowsAsGCRA returns mem as a fallback store enforcing every
// algorithm.
func NewWindowsAsGCRA(mem *memory.Store) WindowsAsGCRA { return WindowsAsGCRA{mem: mem} }

// Take implements core.Store: req's limit, converted to GCRA if it names
// a window algorithm, is applied to the in-process store.
func (s WindowsAsGCRA) Take(ctx context.Context, req core.Request) (core.Decision, error) {
	if req.Rate.Algorithm != core.GCRA {
		req.Rate.Algorithm, req.Rate.Burst = core.GCRA, 0
	}
	return s.mem.Take(ctx, req)
}

// ResetQuota implements core.Store.
func (s WindowsAsGCRA) ResetQuota(ctx context.Context, consumer, scope string) error {
	return s.mem.ResetQuota(ctx, consumer, scope)
}

// SupportsAlgorithm implements core.AlgorithmSupporter: every algorithm
// is enforced, the window ones as GCRA.
func (s WindowsAsGCRA) SupportsAlgorithm(a core.Algorithm) bool {
	switch a {
	case core.GCRA, core.SlidingWindow, core.FixedWindow, core.SlidingLog:
		return true
	}
	return false
}

// Seed implements core.Seeder: d, the Redis store's decision for req, is
// recorded in the in-process store (memory.Store.Seed) as the state to
// carry on from when Redis fails. A window limit's state is converted as
// Take converts the limit: Remaining r of Rate becomes a GCRA bucket with
// r left, Rate − r emission intervals (Period / Rate) from full.
func (s WindowsAsGCRA) Seed(req core.Request, d core.Decision) {
	if req.Rate.Algorithm != core.GCRA {
		l := &req.Rate
		if l.Enforced() && l.Rate > 0 && d.Rate.Remaining < l.Rate {
			d.Rate.ResetAfter = time.Duration((l.Rate - max(d.Rate.Remaining, 0)) * (int64(l.Period) / l.Rate))
		} else {
			d.Rate.ResetAfter = 0
		}
		l.Algorithm, l.Burst = core.GCRA, 0
	}
	s.mem.Seed(req, d)
}

// Fallback is the in-process fallback store of failure_policy fallback: a
// WindowsAsGCRA over a memory store, swept every minute, that the Redis
// store can seed (redisstore.Options.Seed) so that it carries on from the
// counts of this process's last Redis replies. Create it with
// NewFallback; Close stops its sweeps.
type Fallback struct {
	WindowsAsGCRA
	mem *memory.Store
}

// NewFallback returns a fallback store on clock (nil: the system clock)
// holding at most maxKeys keys (0: unbounded; at the cap a new key is
// refused, a store failure of its own, and seeds of new keys are
// skipped). Give it to Options.Fallback and, for a Redis store, to
// StoreOptions.Redis.Seed.
func NewFallback(clock core.Clock, maxKeys int) *Fallback {
	m := memory.New(memory.Options{Clock: clock, SweepInterval: time.Minute, MaxKeys: maxKeys})
	return &Fallback{WindowsAsGCRA: NewWindowsAsGCRA(m), mem: m}
}

// Memory returns the in-process store under the fallback (for metrics:
// Len, KeysRefused).
func (f *Fallback) Memory() *memory.Store { return f.mem }

// Close stops the fallback store's sweeps.
func (f *Fallback) Close() error { return f.mem.Close() }

// osResolver resolves secret references from the process environment and
// the file system (relative paths from the working directory).
type osResolver struct{}

// LookupEnv implements spec.Resolver.
func (osResolver) LookupEnv(name string) (string, bool) { return os.LookupEnv(name) }

// ReadFile implements spec.Resolver.
func (osResolver) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

var (
	_ core.AlgorithmSupporter = WindowsAsGCRA{}
	_ core.Seeder             = WindowsAsGCRA{}
	_ spec.Resolver           = osResolver{}
)
