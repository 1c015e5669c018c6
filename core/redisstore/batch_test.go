package redisstore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLoneTakeNotDelayed shows that batching (the default) does not delay
// a lone Take: many Takes one after the other, alternating between a store
// with batching off and one with the default, each on its own client of
// the same redis-server, so both see the same load. The default's median
// latency must be within 1.5× the direct one's. A round trip here is tens
// of µs, so a batching window of even 100 µs would make it 3× or more
// (with a 1 ms sleep in batcher.do's lone path this test fails at about
// 20×); 1.5× leaves room for a loaded two-CPU machine.
func TestLoneTakeNotDelayed(t *testing.T) {
	const rounds = 600
	srv := redistest.Start(t)
	ctx := context.Background()
	direct, err := New(srv.Client(t, &redis.Options{PoolSize: 4}), Options{Pipeline: -1})
	if err != nil {
		t.Fatal(err)
	}
	batched, err := New(srv.Client(t, &redis.Options{PoolSize: 4}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { batched.Close() })
	if direct.pipe != nil || batched.pipe == nil {
		t.Fatalf("batching: direct store %v, default store %v; want off, on", direct.pipe != nil, batched.pipe != nil)
	}
	req := request(t, direct, core.Call{Consumer: "lone", Rate: core.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}, Cost: 1})
	lat := map[*Store][]time.Duration{}
	for i := -20; i < rounds; i++ { // the first 20 of each are warm-up
		for _, s := range []*Store{direct, batched} {
			t0 := time.Now()
			d, err := s.Take(ctx, req)
			el := time.Since(t0)
			if err != nil || !d.Allowed {
				t.Fatalf("Take %d: %+v, %v; want allowed", i, d, err)
			}
			if i >= 0 {
				lat[s] = append(lat[s], el)
			}
		}
	}
	median := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	md, mb := median(lat[direct]), median(lat[batched])
	ratio := float64(mb) / float64(md)
	t.Logf("median of %d lone Takes: direct %v, default (batching) %v: ratio %.3f", rounds, md, mb, ratio)
	if ratio > 1.5 {
		t.Errorf("lone Take with batching: median %v against %v direct, ratio %.2f; want ≤ 1.5", mb, md, ratio)
	}
}

// gateHook holds the first hold EVALSHAs go-redis processes on their own
// (not in a pipeline) until release is closed, telling entered as each
// arrives, and records the number of EVALSHAs in every pipeline.
type gateHook struct {
	hold             int
	entered, release chan struct{}
	mu               sync.Mutex
	singles          int
	pipelines        []int
}

func newGateHook(hold int) *gateHook {
	return &gateHook{hold: hold, entered: make(chan struct{}, hold), release: make(chan struct{})}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.mu.Lock()
			h.singles++
			held := h.singles <= h.hold
			h.mu.Unlock()
			if held {
				h.entered <- struct{}{}
				<-h.release
			}
		}
		return next(ctx, cmd)
	}
}
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				n++
			}
		}
		if n > 0 { // (not a new connection's HELLO and CLIENT SETINFO)
			h.mu.Lock()
			h.pipelines = append(h.pipelines, n)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// counts returns the lone EVALSHAs and the pipelines' sizes seen so far.
func (h *gateHook) counts() (int, []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.singles, slices.Clone(h.pipelines)
}

// waitQueued waits up to 10 s for s's batcher to hold n queued Takes.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.pipe.mu.Lock()
		q := len(s.pipe.queue)
		s.pipe.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Takes queued after 10 s, want %d", q, n)
		}
	}
}

// TestBatchSendsQueuedTakesTogether holds the round trips of the first
// PipelineInFlight Takes (each sent at once, on its own, while fewer were
// in flight), queues 10 more behind them, and checks that those 10 go to
// Redis as one pipeline sent as soon as one of the first is back, each
// with its own exact decision: with one in flight (the behaviour before
// issue 20), three, and the default (2 on a client of 4 connections and
// 2 CPUs: max(2, GOMAXPROCS), at most PoolSize).
func TestBatchSendsQueuedTakesTogether(t *testing.T) {
	const queued = 10
	srv := redistest.Start(t)
	for _, inFlight := range []int{1, 3, 0} {
		t.Run(fmt.Sprintf("PipelineInFlight=%d", inFlight), func(t *testing.T) {
			c := srv.Client(t, &redis.Options{PoolSize: 4})
			want := inFlight
			if want == 0 {
				want = min(max(2, runtime.GOMAXPROCS(0)), 4)
			}
			h := newGateHook(want)
			c.AddHook(h)
			s, err := New(c, Options{Timeout: 10 * time.Second, PipelineInFlight: inFlight})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if s.pipe.eager != want {
				t.Fatalf("PipelineInFlight %d: batcher keeps %d in flight, want %d", inFlight, s.pipe.eager, want)
			}
			// Burst want+10 at 1 per hour: the Takes leave want+9, ..., 0
			// remaining.
			total := want + queued
			req := request(t, s, core.Call{Consumer: fmt.Sprint("batch-", inFlight), Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: int64(total)}, Cost: 1})
			ctx := context.Background()
			type result struct {
				d   core.Decision
				err error
			}
			results := make(chan result, total)
			takeAsync := func() {
				go func() {
					d, err := s.Take(ctx, req)
					results <- result{d, err}
				}()
			}
			for range want { // each sent at once: all of them reach go-redis
				takeAsync()
				<-h.entered
			}
			for range queued {
				takeAsync()
			}
			waitQueued(t, s, queued)
			close(h.release)
			var remaining []int64
			for range total {
				r := <-results
				if r.err != nil || !r.d.Allowed {
					t.Fatalf("Take: %+v, %v; want allowed", r.d, r.err)
				}
				remaining = append(remaining, r.d.Remaining)
			}
			slices.Sort(remaining)
			for i, r := range remaining {
				if r != int64(i) {
					t.Fatalf("remaining %v, want 0 to %d once each", remaining, total-1)
				}
			}
			if singles, pipelines := h.counts(); singles != want || !slices.Equal(pipelines, []int{queued}) {
				t.Errorf("go-redis saw %d lone EVALSHAs and pipelines of %v EVALSHAs; want %d and [%d]", singles, pipelines, want, queued)
			}
			if d := take(t, s, req); d.Allowed {
				t.Errorf("Take %d: %+v, want denied", total+1, d)
			}
		})
	}
}

func request(t *testing.T, s *Store, c core.Call) core.Request {
	t.Helper()
	r, err := s.Prepare(c.Limits())
	if err != nil {
		t.Fatalf("Prepare(%+v): %v", c.Limits(), err)
	}
	return c.Request(r)
}

func take(t *testing.T, s *Store, r core.Request) core.Decision {
	t.Helper()
	d, err := s.Take(context.Background(), r)
	if err != nil {
		t.Fatalf("Take(%+v): %v", r, err)
	}
	return d
}

// printHook records how go-redis prints every EVALSHA it processes.
type printHook struct {
	mu   sync.Mutex
	seen []string
}

func (h *printHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *printHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "evalsha" {
			h.mu.Lock()
			h.seen = append(h.seen, cmd.String())
			h.mu.Unlock()
		}
		return err
	}
}
func (h *printHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCommandPrintsArguments: the pooled arguments print as the values
// sent (a hook that logs or traces commands shows them), not as pointers.
func TestCommandPrintsArguments(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, nil)
	h := &printHook{}
	c.AddHook(h)
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// 1 per hour, burst 11: n×T = 3,600 s and the bound τ = 39,600 s, as
	// (µs, ns) pairs. (The first EVALSHA meets NOSCRIPT, so its reply is
	// not compared.)
	take(t, s, request(t, s, core.Call{Consumer: "printed", Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: 11}, Cost: 1}))
	sum := sha256.Sum256([]byte("printed"))
	want := fmt.Sprintf("evalsha %s 1 limitplane:{%x}:gcra:  0 3600000000 0 39600000000 0 0 :3600000000000", gcraOnlyScript.sha, sum[:16])
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) != 1 || h.seen[0][:max(strings.LastIndex(h.seen[0], ": "), 0)] != want {
		t.Errorf("go-redis printed %q, want one EVALSHA printed as %q", h.seen, want)
	}
}
