package live

import (
	"os"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/spec"
)

// NewFallback returns the in-process fallback store of failure_policy
// fallback: a memory store on clock (nil: the system clock), swept every
// minute, holding at most maxKeys keys (0: unbounded; at the cap a new key
// is refused, a store failure of its own, and seeds of new keys are
// skipped). It enforces window limits as GCRA
// (memory.Options.WindowsAsGCRA: fixed_window, sliding_window and
// sliding_log of N per period become GCRA with the same N per period and a
// burst of N), so it stands in for a store that has window algorithms
// (Redis), and it is a core.Seeder: give it to Options.Fallback and, for a
// Redis store, to StoreOptions.Redis.Seed, so that it carries on from the
// counts of this process's last Redis replies. Close stops its sweeps.
func NewFallback(clock core.Clock, maxKeys int) *memory.Store {
	return memory.New(memory.Options{Clock: clock, SweepInterval: time.Minute, MaxKeys: maxKeys, WindowsAsGCRA: true})
}

// osResolver resolves secret references from the process environment and
// the file system (relative paths from the working directory).
type osResolver struct{}

// LookupEnv implements spec.Resolver.
func (osResolver) LookupEnv(name string) (string, bool) { return os.LookupEnv(name) }

// ReadFile implements spec.Resolver.
func (osResolver) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

var _ spec.Resolver = osResolver{}
