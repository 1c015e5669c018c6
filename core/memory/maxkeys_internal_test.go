package memory

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestMaxKeysCountFollowsSweepsAndResizes: while goroutines insert keys
// that go idle, and another advances the clock and sweeps (growing and
// shrinking tables), the store-wide key count stays equal to the shards'
// entries and never above MaxKeys.
func TestMaxKeysCountFollowsSweepsAndResizes(t *testing.T) {
	clock := core.NewManualClock(start)
	s := New(Options{Clock: clock, MaxKeys: 300, Shards: 4})
	short := prepare(t, s, core.LimitSet{Rate: core.Limit{Rate: 1000, Period: time.Second}})
	stop := make(chan struct{})
	var sweeper sync.WaitGroup
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		for {
			select {
			case <-stop:
				return
			default:
				clock.Advance(100 * time.Microsecond)
				s.Sweep()
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				s.Take(context.Background(), core.Request{Consumer: fmt.Sprintf("%d-%d", w, i), Rule: short, Cost: 1})
			}
		}()
	}
	wg.Wait()
	close(stop)
	sweeper.Wait()
	if n, c := s.Len(), s.count.keys.Load(); int64(n) != c || n > 300 {
		t.Fatalf("Len %d, key count %d; want equal and at most 300", n, c)
	}
	clock.Advance(time.Second)
	s.Sweep()
	if n, c := s.Len(), s.count.keys.Load(); n != 0 || c != 0 {
		t.Fatalf("after all went idle: Len %d, key count %d; want 0, 0", n, c)
	}
}
