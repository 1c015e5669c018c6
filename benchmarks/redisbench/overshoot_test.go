package redisbench

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

// The overshoot workload: 64 goroutines hammer one key with a limit of 100
// per second, burst 100, for 3 s of real time.
const (
	overshootPerSec   = 100
	overshootBurst    = 100
	overshootDuration = 3 * time.Second
)

// overshootLimit is the workload's limit.
var overshootLimit = limit{perSec: overshootPerSec, burst: overshootBurst}

// overshootRun is what one limiter did under the overshoot workload.
type overshootRun struct {
	admitted, denied, failed int64
	// elapsed is Redis TIME after the last reply minus Redis TIME before
	// the first call: every limiter here reads the server's clock (TIME in
	// the script, or PEXPIRE's expiry), so this bounds what they saw.
	elapsed  time.Duration
	firstErr error
}

// bound is the most a limiter may admit in r.elapsed, as its own algorithm
// defines it. GCRA (redis_rate, limitplane): burst + ⌊elapsed/T⌋ with
// T = 1 s/perSec, since each admission moves the theoretical arrival time
// T further and it may lead now by at most burst×T. ulule/limiter: a fixed
// window of perSec that opens at the key's first request and expires one
// second later, so at most ⌊elapsed/1 s⌋ + 1 windows open in elapsed, each
// admitting perSec (it has no burst: 2×perSec can pass in an instant
// across a window boundary, within its own bound).
func (r overshootRun) bound(name string, l limit) int64 {
	if name == "ulule" {
		return l.perSec * (int64(r.elapsed/time.Second) + 1)
	}
	return l.burst + int64(r.elapsed/(time.Second/time.Duration(l.perSec)))
}

// runOvershoot drives allow with the overshoot workload on key.
func runOvershoot(t *testing.T, srv *redistest.Server, allow allowFunc, key string) overshootRun {
	t.Helper()
	c := client(t, srv)
	ctx := context.Background()
	t0, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var admitted, denied, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	var stopAt time.Time
	for g := 0; g < concurrency; g++ {
		wg.Go(func() {
			<-startGate
			for time.Now().Before(stopAt) {
				ok, err := allow(ctx, key)
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case ok:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	stopAt = time.Now().Add(overshootDuration)
	close(startGate)
	wg.Wait()
	t1, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	r := overshootRun{admitted: admitted.Load(), denied: denied.Load(), failed: failed.Load(), elapsed: t1.Sub(t0)}
	if e, ok := firstErr.Load().(error); ok {
		r.firstErr = e
	}
	return r
}

var overshootSeq atomic.Int64

// TestOvershoot runs every limiter through the same workload and reports
// admitted against its own bound. Only limitplane's store must never
// exceed it (default, direct and pipelined); the peers' overshoot is reported.
func TestOvershoot(t *testing.T) {
	// limitplane's timeout is raised to go-redis's default read timeout,
	// the only bound the peers have, so a stall of the loaded machine is
	// no failure for one and a slow success for the others.
	opts := redisstore.Options{Timeout: 3 * time.Second}
	srv := redistest.Start(t)
	for _, ct := range contenders {
		t.Run(ct.name, func(t *testing.T) {
			key := "overshoot-" + ct.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 10) + "-" + strconv.FormatInt(overshootSeq.Add(1), 10)
			r := runOvershoot(t, srv, ct.build(t, srv, overshootLimit, opts), key)
			b := r.bound(ct.name, overshootLimit)
			over := max(r.admitted-b, 0)
			t.Logf("%s: admitted %d, denied %d, failed %d in %v (Redis TIME): bound %d, overshoot %d",
				ct.name, r.admitted, r.denied, r.failed, r.elapsed, b, over)
			if !strings.HasPrefix(ct.name, "limitplane") {
				return
			}
			if r.failed != 0 {
				t.Errorf("%d calls failed, first: %v; want 0", r.failed, r.firstErr)
			}
			if over != 0 {
				t.Errorf("admitted %d, bound %d: overshoot %d, want 0", r.admitted, b, over)
			}
			// The workload did reach the limit: the whole burst passed
			// at once and the rest was refused.
			if r.admitted < overshootBurst || r.denied == 0 {
				t.Errorf("admitted %d, denied %d: want at least the burst (%d) admitted and some denied", r.admitted, r.denied, overshootBurst)
			}
		})
	}
}
