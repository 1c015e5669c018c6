package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestPipelineInFlightDefault checks Options.PipelineInFlight's and
// PipelineWorkers' defaults: max(2, GOMAXPROCS) in flight, at most the
// client's pool (a Cluster's per node, a Ring's per shard), and workers at
// least that many. New does not contact Redis, so the clients here need no
// server.
func TestPipelineInFlightDefault(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	cases := []struct {
		name                  string
		client                redis.UniversalClient
		opts                  Options
		wantEager, wantWorker int
	}{
		{"pool 64", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 64}), Options{}, max(2, procs), 4 * procs},
		{"pool 1", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 1}), Options{}, 1, 4 * procs},
		{"pool default", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Options{}, max(2, procs), 4 * procs},
		{"explicit", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 1}), Options{PipelineInFlight: 5, PipelineWorkers: 3}, 5, 5},
		{"cluster pool 1", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, PoolSize: 1}), Options{}, 1, 4 * procs},
		{"ring pool 1", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, PoolSize: 1}), Options{}, 1, 4 * procs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { tc.client.Close() })
			s, err := New(tc.client, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if s.pipe.eager != tc.wantEager || s.pipe.workers != tc.wantWorker || s.pipe.max != DefaultPipeline {
				t.Errorf("in flight %d, workers %d, pipeline %d; want %d, %d, %d", s.pipe.eager, s.pipe.workers, s.pipe.max, tc.wantEager, tc.wantWorker, DefaultPipeline)
			}
		})
	}
}

// TestBatchQueuedTakeCancelled holds the first PipelineInFlight Takes'
// round trips, queues 4 Takes whose context is then cancelled and 3 that
// stay: the cancelled ones return context.Canceled at once, while the
// others are still held, and leave the queue; the 3 go as one pipeline
// when the first are back, and no cancelled Take was counted (the
// remaining counts come out exact).
func TestBatchQueuedTakeCancelled(t *testing.T) {
	const cancelled, kept = 4, 3
	srv := redistest.Start(t)
	c := srv.Client(t, &redis.Options{PoolSize: 4})
	s, err := New(c, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	held := s.pipe.eager
	h := newGateHook(held)
	c.AddHook(h)
	// Burst held+kept+1: after the held and kept Takes one more is allowed
	// (remaining 0) only if no cancelled Take was counted.
	burst := held + kept + 1
	req := request(t, s, core.Call{Consumer: "cancelled", Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: int64(burst)}, Cost: 1})
	type result struct {
		d   core.Decision
		err error
	}
	results := make(chan result, held+kept)
	for range held {
		go func() {
			d, err := s.Take(context.Background(), req)
			results <- result{d, err}
		}()
		<-h.entered
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, cancelled)
	for range cancelled {
		go func() {
			_, err := s.Take(ctx, req)
			errs <- err
		}()
	}
	waitQueued(t, s, cancelled)
	for range kept {
		go func() {
			d, err := s.Take(context.Background(), req)
			results <- result{d, err}
		}()
	}
	waitQueued(t, s, cancelled+kept)
	cancel()
	for range cancelled {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled Take: %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a cancelled Take had not returned after 10 s while the first were held")
		}
	}
	waitQueued(t, s, kept)
	close(h.release)
	var remaining []int64
	for range held + kept {
		r := <-results
		if r.err != nil || !r.d.Allowed {
			t.Fatalf("Take: %+v, %v; want allowed", r.d, r.err)
		}
		remaining = append(remaining, r.d.Remaining)
	}
	slices.Sort(remaining)
	for i, r := range remaining {
		if r != int64(i+1) {
			t.Fatalf("remaining %v, want 1 to %d once each", remaining, burst-1)
		}
	}
	if d := take(t, s, req); !d.Allowed || d.Remaining != 0 {
		t.Errorf("Take %d: %+v, want allowed with 0 remaining (cancelled Takes must not count)", held+kept+1, d)
	}
	if d := take(t, s, req); d.Allowed {
		t.Errorf("Take %d: %+v, want denied", held+kept+2, d)
	}
	if singles, pipelines := h.counts(); singles != held+2 || !slices.Equal(pipelines, []int{kept}) {
		t.Errorf("go-redis saw %d lone EVALSHAs and pipelines of %v EVALSHAs; want %d and [%d]", singles, pipelines, held+2, kept)
	}
}

// flightHook counts the EVALSHAs go-redis processes, alone or in
// pipelines, and the most sends (lone or pipelined) in flight at once.
type flightHook struct {
	mu                      sync.Mutex
	evalshas, now, maxNow   int
	lone, pipelined, piped1 int // sends by kind; piped1: pipelines of 1 (there must be none)
}

func (h *flightHook) enter(n int, pipe bool) {
	h.mu.Lock()
	h.evalshas += n
	h.now++
	h.maxNow = max(h.maxNow, h.now)
	if pipe {
		h.pipelined++
		if n == 1 {
			h.piped1++
		}
	} else {
		h.lone++
	}
	h.mu.Unlock()
}

func (h *flightHook) leave() {
	h.mu.Lock()
	h.now--
	h.mu.Unlock()
}

func (h *flightHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *flightHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		h.enter(1, false)
		defer h.leave()
		return next(ctx, cmd)
	}
}
func (h *flightHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				n++
			}
		}
		if n == 0 { // a new connection's HELLO and CLIENT SETINFO
			return next(ctx, cmds)
		}
		h.enter(n, true)
		defer h.leave()
		return next(ctx, cmds)
	}
}

// TestBatchExactUnderConcurrency runs 128 goroutines × 40 Takes against
// one redis-server, spread over four GCRA keys (burst 400 at 1 per hour,
// the small script) and one quota key (300 per hour, the general script),
// for several in-flight bounds and pipeline sizes: every key admits
// exactly its limit, the admitted Takes' remaining counts are limit−1 …
// 0 once each, every Take is exactly one EVALSHA, and no more than
// PipelineWorkers sends are in flight at once.
func TestBatchExactUnderConcurrency(t *testing.T) {
	const goroutines, per = 128, 40
	srv := redistest.Start(t)
	type key struct {
		req   core.Request
		limit int64
	}
	for _, o := range []Options{
		{PipelineInFlight: 1},
		{PipelineInFlight: 2},
		{PipelineInFlight: 8},
		{}, // the default
		{PipelineInFlight: 2, Pipeline: 4, PipelineWorkers: 6},
		{PipelineInFlight: 16, PipelineWorkers: 16},
	} {
		name := fmt.Sprintf("InFlight=%d/Pipeline=%d/Workers=%d", o.PipelineInFlight, o.Pipeline, o.PipelineWorkers)
		t.Run(name, func(t *testing.T) {
			c := srv.Client(t, &redis.Options{PoolSize: 16})
			h := &flightHook{}
			c.AddHook(h)
			o.Timeout = 30 * time.Second // a loaded machine under -race
			s, err := New(c, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			var keys []key
			for i := range 4 {
				keys = append(keys, key{request(t, s, core.Call{Consumer: fmt.Sprint(name, "/gcra-", i), Rate: core.Limit{Rate: 1, Period: time.Hour, Burst: 400}, Cost: 1}), 400})
			}
			keys = append(keys, key{request(t, s, core.Call{Consumer: name + "/quota", Quota: core.Quota{Max: 300, Renewal: time.Hour}, Cost: 1}), 300})
			var mu sync.Mutex
			remaining := make([][]int64, len(keys))
			denied := make([]int, len(keys))
			var failures []error
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range per {
						k := (g + i) % len(keys)
						d, err := s.Take(context.Background(), keys[k].req)
						mu.Lock()
						switch {
						case err != nil:
							failures = append(failures, err)
						case d.Allowed:
							remaining[k] = append(remaining[k], d.Remaining)
						default:
							denied[k]++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(failures) > 0 {
				t.Fatalf("%d Takes failed, first: %v", len(failures), failures[0])
			}
			const perKey = goroutines * per / 5
			for k, kk := range keys {
				slices.Sort(remaining[k])
				ok := int64(len(remaining[k])) == kk.limit
				for i, r := range remaining[k] {
					ok = ok && r == int64(i)
				}
				if !ok || denied[k] != perKey-int(kk.limit) {
					t.Errorf("%s: %d admitted (remaining %v…), %d denied; want %d admitted with remaining 0 to %d once each, %d denied",
						kk.req.Consumer, len(remaining[k]), remaining[k][:min(len(remaining[k]), 5)], denied[k], kk.limit, kk.limit-1, perKey-int(kk.limit))
				}
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Logf("%d lone EVALSHAs and %d pipelines (%.1f each), at most %d in flight (in flight bound %d, workers %d)",
				h.lone, h.pipelined, float64(h.evalshas-h.lone)/float64(max(h.pipelined, 1)), h.maxNow, s.pipe.eager, s.pipe.workers)
			if h.evalshas != goroutines*per {
				t.Errorf("go-redis saw %d EVALSHAs, want one per Take: %d", h.evalshas, goroutines*per)
			}
			if h.maxNow > s.pipe.workers {
				t.Errorf("%d sends in flight at once, want at most PipelineWorkers = %d", h.maxNow, s.pipe.workers)
			}
			if h.piped1 > 0 {
				t.Errorf("%d pipelines of one EVALSHA; a batch of one goes alone", h.piped1)
			}
		})
	}
}
