package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// job is one Take waiting for a pipeline.
type job struct {
	script script
	args   []any          // the whole EVALSHA (see evalHeader)
	res    chan jobResult // buffered (1): the sender never blocks
}

type jobResult struct {
	v   []int64
	err error
}

// pipeliner sends concurrent Takes to Redis in pipelines of EVALSHAs, one
// round trip for all the Takes in one. Each EVALSHA still runs atomically
// on its own, so results are the same as unpipelined.
//
// One collector goroutine gathers waiting jobs into a batch and hands it to
// one of the sender goroutines. It starts a pipeline at once when none is
// in flight, so a lone Take costs only channel hand-offs; while one is in
// flight, jobs wait and the batch grows, and another pipeline starts early
// only when the batch is full (max jobs) and fewer than workers are in
// flight. Under load this sends few, full pipelines instead of many small
// ones racing each other, which is what saves Redis's and the client's
// per-request work (one read and one write system call per pipeline, not
// per Take).
type pipeliner struct {
	s       *Store
	jobs    chan *job
	batches chan []*job
	done    chan struct{} // one per finished pipeline; buffered (workers)
	max     int
	workers int
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newPipeliner(s *Store, max, workers int) *pipeliner {
	p := &pipeliner{
		s:       s,
		jobs:    make(chan *job),
		batches: make(chan []*job),
		done:    make(chan struct{}, workers),
		max:     max,
		workers: workers,
		stop:    make(chan struct{}),
	}
	p.wg.Add(workers + 1)
	for i := 0; i < workers; i++ {
		go p.sender()
	}
	go p.collect()
	return p
}

// ErrClosed is returned by Take after Close when pipelining is on.
var ErrClosed = errors.New("redisstore: store closed")

// do queues j and waits for its result or ctx's end.
func (p *pipeliner) do(ctx context.Context, j *job) ([]int64, error) {
	select {
	case p.jobs <- j:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.stop:
		return nil, ErrClosed
	}
	select {
	case r := <-j.res:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err() // the pipeline's result is dropped into the buffer
	}
}

// collect gathers jobs into batches and hands them to the senders (see
// pipeliner). On stop, jobs gathered but not yet sent get ErrClosed.
func (p *pipeliner) collect() {
	defer p.wg.Done()
	defer close(p.batches)
	inflight := 0
	batch := make([]*job, 0, p.max)
	for {
		if len(batch) > 0 && (inflight == 0 || len(batch) == p.max && inflight < p.workers) {
			p.batches <- batch // a sender is free: fewer than workers are busy
			inflight++
			batch = make([]*job, 0, p.max)
			continue
		}
		var in chan *job
		if len(batch) < p.max {
			in = p.jobs
		}
		select {
		case j := <-in:
			batch = append(batch, j)
		gather:
			for len(batch) < p.max {
				select {
				case j := <-p.jobs:
					batch = append(batch, j)
				default:
					break gather
				}
			}
		case <-p.done:
			inflight--
		case <-p.stop:
			for _, j := range batch {
				j.res <- jobResult{err: ErrClosed}
			}
			return
		}
	}
}

// sender runs the batches it is handed, one at a time.
func (p *pipeliner) sender() {
	defer p.wg.Done()
	for batch := range p.batches {
		p.send(batch)
		p.done <- struct{}{} // never blocks: at most workers are pending
	}
}

// send runs batch as one pipeline under the store's timeout and breaker;
// jobs whose script the server lacks (NOSCRIPT) are retried one by one with
// Script.Run, which loads it.
func (p *pipeliner) send(batch []*job) {
	cmds := make([]*redis.Cmd, len(batch))
	_, err := p.s.call(context.Background(), func(ctx context.Context) ([]int64, error) {
		pipe := p.s.client.Pipeline()
		for i, j := range batch {
			cmds[i] = evalCmd(ctx, j.args)
			pipe.Process(ctx, cmds[i])
		}
		_, err := pipe.Exec(ctx)
		var rerr redis.Error
		if err != nil && errors.As(err, &rerr) {
			err = nil // a script-level error belongs to its own job, not to Redis's health
		}
		return nil, err
	})
	for i, j := range batch {
		if err != nil {
			j.res <- jobResult{err: err}
			continue
		}
		c := cmds[i]
		if isNoScript(c.Err()) {
			ctx, cancel := p.s.callCtx()
			c = evalFallback(ctx, p.s.client, j.script, j.args)
			cancel()
		}
		v, err := c.Int64Slice()
		j.res <- jobResult{v, err}
	}
}

// close stops the workers and waits for them; queued callers get ErrClosed.
func (p *pipeliner) close() {
	close(p.stop)
	p.wg.Wait()
}
