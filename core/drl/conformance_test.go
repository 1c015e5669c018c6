package drl

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/storetest"
	"github.com/limitplane/limitplane/internal/redistest"
)

// conformance runs the conformance suite against Stores over the
// in-process store, on the suite's clock, with options o (a group of its
// own each). With distributed, every limit set is prepared distributed,
// and it returns how many vectors' stores decided some key in memory.
func conformance(t *testing.T, o Options, distributed bool) (inMemory int64) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	var n, hot atomic.Int64
	o.Logger = quiet
	storetest.Run(t, storetest.Suite{
		New: func(t *testing.T, clock core.Clock) core.Store {
			exact := memory.New(memory.Options{Clock: clock})
			t.Cleanup(func() { exact.Close() })
			so := o
			so.Group = fmt.Sprintf("conf%d", n.Add(1))
			s, err := newStore(c, exact, so, seams{manual: true, clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if s.Stats().HotKeys > 0 {
					hot.Add(1)
				}
				s.Close()
			})
			if distributed {
				return distributedStore{s}
			}
			return s
		},
	})
	return hot.Load()
}

// distributedStore prepares every limit set distributed.
type distributedStore struct{ *Store }

func (s distributedStore) Prepare(ls core.LimitSet) (*core.Rule, error) {
	ls.Distributed = true
	return s.Store.Prepare(ls)
}

// TestConformance: a Store passes on what the DRL does not decide in
// memory (here every vector: their limits are not distributed) to the
// exact store with the exact store's rule, so it answers every vector as
// the exact store does, the limit-change vectors (tokens spent kept)
// included, through Take and TakeInto.
func TestConformance(t *testing.T) {
	if n := conformance(t, Options{}, false); n != 0 {
		t.Fatalf("%d vectors decided keys in memory, want none (nothing distributed)", n)
	}
}

// TestConformanceDistributed: with every limit set distributed and one
// gateway holding each whole limit (MaxGateways 1, a MinFloorRate of
// 1e-6/s, no table: every key at its floor, the whole limit), the Limiter
// decides every GCRA rate limit alone in memory, and the Store still
// passes the whole suite: the DRL's decisions are the exact store's, the
// limit-change vectors (3 of 3 per minute raised to 6: 3 more; 3 of 6
// lowered to 3: none until one new interval; partly refilled, burst
// changes, a peek, concurrent requests across the change) included.
func TestConformanceDistributed(t *testing.T) {
	n := conformance(t, Options{MaxGateways: 1, MinFloorRate: 1e-6}, true)
	if n < 20 {
		t.Fatalf("%d vectors decided keys in memory, want the GCRA ones (20 or more)", n)
	}
	t.Logf("%d vectors' stores decided keys in memory", n)
}
