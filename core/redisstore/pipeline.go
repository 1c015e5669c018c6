package redisstore

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by Take after Close when batching is on.
var ErrClosed = errors.New("redisstore: store closed")

// batcher sends concurrent Takes to Redis in pipelines of EVALSHAs, one
// round trip for all the Takes in one. Each EVALSHA still runs atomically
// on its own, so results are the same as unbatched.
//
// It has no goroutines and no timer: the callers send. A Take that finds
// fewer than eager pipelines (or lone calls) in flight sends its own
// EVALSHA at once, from its own goroutine, exactly as the direct mode does
// (a lone request waits for nothing, and below eager concurrent callers
// every Take is one round trip of its own). Takes that come while eager
// are in flight queue up; when one of those is back, its sender hands the
// queue (up to max) to the first queued Take, which sends it as the next
// pipeline and passes each Take its result. So eager are in flight at a
// time and each batch is whatever queued while they were; one more starts
// early only when max Takes are queued and fewer than workers are in
// flight. Several in flight keep Redis and the client busy at once (one
// alone leaves Redis idle while the client reads its reply and wakes its
// callers); few, not one per caller, keep the pipelines full under load,
// which is what saves Redis's and the client's per-request work (one read
// and one write system call per pipeline, not per Take).
type batcher struct {
	s       *Store
	max     int // Takes per pipeline (Options.Pipeline)
	eager   int // in flight below which a Take is sent at once (Options.PipelineInFlight)
	workers int // most in flight, for full pipelines (Options.PipelineWorkers)

	mu       sync.Mutex
	queue    []*call // queued, not yet handed to a sender
	inflight int     // pipelines (or lone calls) being sent
	closed   bool
}

// newBatcher returns the batcher of s for opts (opts.Pipeline ≥ 0), with
// Options' defaults applied; client is s's, whose pool bounds the default
// PipelineInFlight.
func newBatcher(s *Store, client redis.UniversalClient, opts Options) *batcher {
	b := &batcher{s: s, max: opts.Pipeline, eager: opts.PipelineInFlight, workers: opts.PipelineWorkers}
	if b.max == 0 {
		b.max = DefaultPipeline
	}
	if b.eager <= 0 {
		b.eager = max(2, runtime.GOMAXPROCS(0))
		if n := poolSize(client); n > 0 {
			b.eager = min(b.eager, n)
		}
	}
	if b.workers <= 0 {
		b.workers = 4 * runtime.GOMAXPROCS(0)
	}
	b.workers = max(b.workers, b.eager)
	return b
}

// poolSize returns the connection pool size of client (per node for a
// Cluster, per shard for a Ring), or 0 for a client of another type.
func poolSize(client redis.UniversalClient) int {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().PoolSize
	case *redis.ClusterClient:
		return c.Options().PoolSize
	case *redis.Ring:
		return c.Options().PoolSize
	}
	return 0
}

// do runs c, alone or in a pipeline with others, and returns its reply or
// ctx's error. A caller whose ctx ends while it waits in the queue leaves
// it; one whose call is already in a batch returns at once, unless it was
// chosen to send the batch, which it then does first (bounded by
// Options.Timeout) so the others get their results.
func (b *batcher) do(ctx context.Context, c *call) ([]int64, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	if b.inflight < b.eager {
		b.inflight++
		b.mu.Unlock()
		v, err := b.s.direct(ctx, c)
		b.next()
		return v, err
	}
	b.queue = append(b.queue, c)
	c.queued = true
	if len(b.queue) >= b.max && b.inflight < b.workers {
		batch := b.take()
		b.inflight++
		mine := !c.queued
		b.mu.Unlock()
		b.lead(batch, c)
		if mine {
			return c.v, c.err
		}
	} else {
		b.mu.Unlock()
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
		b.mu.Lock()
		if c.queued {
			b.queue = slices.DeleteFunc(b.queue, func(q *call) bool { return q == c })
			c.queued = false
			b.mu.Unlock()
			return nil, ctx.Err()
		}
		leader := c.batch != nil
		b.mu.Unlock()
		if !leader {
			c.abandoned = true // its result is still coming: not reused
			return nil, ctx.Err()
		}
		<-c.ready
		b.lead(c.batch, c)
		return nil, ctx.Err()
	}
	if c.batch != nil {
		b.lead(c.batch, c)
	}
	return c.v, c.err
}

// take removes up to max calls from the front of the queue; b.mu is held.
func (b *batcher) take() []*call {
	n := min(len(b.queue), b.max)
	batch := make([]*call, n)
	copy(batch, b.queue)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	for _, q := range batch {
		q.queued = false
	}
	return batch
}

// next is called by a sender whose pipeline is done: it hands the queue to
// its first call, which sends it, or, with nothing queued, ends the
// sender's turn.
func (b *batcher) next() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	batch := b.take()
	batch[0].batch = batch
	b.mu.Unlock()
	batch[0].ready <- struct{}{}
}

// lead sends batch, gives every call in it but self (the caller's own) its
// result, and passes the turn on.
func (b *batcher) lead(batch []*call, self *call) {
	b.s.pipeline(batch)
	for _, q := range batch {
		if q != self {
			q.ready <- struct{}{}
		}
	}
	b.next()
}

// close makes later Takes fail with ErrClosed; queued ones are still sent.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// pipeline runs batch as one pipeline under the store's timeout and
// breaker, and sets each call's reply; calls whose script the server lacks
// (NOSCRIPT) are retried one by one with EVAL, which loads it.
func (s *Store) pipeline(batch []*call) {
	if len(batch) == 1 {
		// The same round trip without the pipeline's own allocations.
		c := batch[0]
		c.v, c.err = s.direct(context.Background(), c)
		return
	}
	_, err := s.call(context.Background(), func(ctx context.Context) ([]int64, error) {
		pipe := s.client.Pipeline()
		for _, c := range batch {
			c.cmd = c.evalCmd(ctx)
			pipe.Process(ctx, c.cmd)
		}
		_, err := pipe.Exec(ctx)
		var rerr redis.Error
		if err != nil && errors.As(err, &rerr) {
			err = nil // a script-level error belongs to its own call, not to Redis's health
		}
		return nil, err
	})
	for _, c := range batch {
		if err != nil {
			c.v, c.err = nil, err
			continue
		}
		if isNoScript(c.cmd.Err()) {
			ctx, cancel := s.callCtx()
			c.cmd = c.evalFallback(ctx)
			cancel()
		}
		c.v, c.err = c.cmd.Result()
	}
}

// direct runs c as its own EVALSHA (EVAL after NOSCRIPT) under the
// store's timeout and breaker.
func (s *Store) direct(ctx context.Context, c *call) ([]int64, error) {
	c.ctx = ctx
	return s.guard(c.attemptFn)
}

// call is one Take's EVALSHA: its arguments, encoded without allocating
// (numbers and keys as pointers to reused buffers),
// and, when batched, its place in the queue and its reply. Calls are
// pooled (Store.calls) and reused once their Take has returned.
type call struct {
	s      *Store
	script script
	args   []any       // "evalsha", SHA-1, nkeys, keys, ARGV
	argBuf [5 + 23]any // the global quota's script has 23 arguments
	nums   [17]intArg
	nnums  int
	keys   [2]keyArg
	cons   keyArg   // the consumer, for the global quota's script
	kind   [32]byte // room for the quota key's kind
	cmd    *redis.IntSliceCmd

	// The direct call's context and its attempt under the store's
	// timeout, made once per call value so a Take allocates no closure.
	ctx       context.Context
	attemptFn func() ([]int64, error)
	runFn     func(context.Context) ([]int64, error)

	// Batching. ready gets one value, when the call has its reply or is
	// to send batch.
	ready     chan struct{}
	queued    bool    // in batcher.queue; guarded by batcher.mu
	batch     []*call // set (under batcher.mu) for the call that sends it
	abandoned bool    // its Take returned early: the call is not reused
	v         []int64
	err       error
}

func newCall(s *Store) *call {
	c := &call{s: s, ready: make(chan struct{}, 1)}
	c.runFn = c.run
	c.attemptFn = func() ([]int64, error) { return c.s.attempt(c.ctx, c.runFn) }
	return c
}

// reset prepares c for sc's call with nkeys keys (filled in by the
// caller through c.keys[i].b).
func (c *call) reset(sc script, nkeys int) {
	c.script, c.nnums = sc, 0
	c.args = append(c.argBuf[:0], "evalsha", sc.sha, nkeys)
	for i := 0; i < nkeys; i++ {
		c.args = append(c.args, &c.keys[i])
	}
	c.batch, c.v, c.err, c.cmd, c.ctx = nil, nil, nil, nil, nil
}

// int appends x as an argument.
func (c *call) int(x int64) {
	a := &c.nums[c.nnums]
	a.b = strconv.AppendInt(a.buf[:0], x, 10)
	c.args = append(c.args, a)
	c.nnums++
}

// pair appends x ≥ 0 (ns) as the script's (µs, ns remainder) pair.
func (c *call) pair(x int64) {
	c.int(x / 1000)
	c.int(x % 1000)
}

// evalCmd returns the EVALSHA command, routed (on a Cluster) by its first
// key. Its reply, an array of integers, is read straight into an []int64.
func (c *call) evalCmd(ctx context.Context) *redis.IntSliceCmd {
	cmd := redis.NewIntSliceCmd(ctx, c.args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// run is the direct call: EVALSHA, then EVAL if the script is not loaded.
func (c *call) run(ctx context.Context) ([]int64, error) {
	c.cmd = c.evalCmd(ctx)
	if err := c.s.client.Process(ctx, c.cmd); isNoScript(err) {
		c.cmd = c.evalFallback(ctx)
	}
	return c.cmd.Result()
}

// evalFallback runs c with EVAL (which loads the script) after Redis
// answered NOSCRIPT to the EVALSHA.
func (c *call) evalFallback(ctx context.Context) *redis.IntSliceCmd {
	args := slices.Clone(c.args)
	args[0], args[1] = "eval", c.script.src
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = c.s.client.Process(ctx, cmd) // the error is cmd's
	return cmd
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// keyArg is a Redis key written into a reused buffer. go-redis writes it
// through MarshalBinary (a pointer in an interface needs no allocation);
// String is for a Cluster client, which reads the key to find its slot,
// and for hooks that print commands.
type keyArg struct{ b []byte }

// MarshalBinary implements encoding.BinaryMarshaler for go-redis.
func (k *keyArg) MarshalBinary() ([]byte, error) { return k.b, nil }

// String returns the key.
func (k *keyArg) String() string { return string(k.b) }

// intArg is an integer argument in decimal, in a reused buffer, passed as
// keyArg is (an int64 of 256 or more would be boxed on the heap; a
// pointer to one would print as an address in a hook's log).
type intArg struct {
	b   []byte
	buf [20]byte
}

// MarshalBinary implements encoding.BinaryMarshaler for go-redis.
func (a *intArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// String returns the number in decimal.
func (a *intArg) String() string { return string(a.b) }
