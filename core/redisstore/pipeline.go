package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// job is one Take waiting for a pipeline.
type job struct {
	script *redis.Script
	keys   []string
	args   []any
	res    chan jobResult // buffered (1): the sender never blocks
}

type jobResult struct {
	v   []int64
	err error
}

// pipeliner sends concurrent Takes to Redis in pipelines: each of its
// workers takes one waiting job, gathers whatever others are waiting (up
// to max), and sends them as one pipeline of EVALSHAs, one round trip for
// all. Each EVALSHA still runs atomically on its own, so results are the
// same as unpipelined; under low concurrency a pipeline holds one job and
// costs only a channel hand-off.
type pipeliner struct {
	s    *Store
	jobs chan *job
	max  int
	stop chan struct{}
	wg   sync.WaitGroup
}

func newPipeliner(s *Store, max, workers int) *pipeliner {
	p := &pipeliner{s: s, jobs: make(chan *job), max: max, stop: make(chan struct{})}
	p.wg.Add(workers)
	for i := 0; i < workers; i++ {
		go p.work()
	}
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

func (p *pipeliner) work() {
	defer p.wg.Done()
	batch := make([]*job, 0, p.max)
	for {
		select {
		case j := <-p.jobs:
			batch = append(batch[:0], j)
		case <-p.stop:
			return
		}
	gather:
		for len(batch) < p.max {
			select {
			case j := <-p.jobs:
				batch = append(batch, j)
			default:
				break gather
			}
		}
		p.send(batch)
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
			cmds[i] = j.script.EvalSha(ctx, pipe, j.keys, j.args...)
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
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			ctx, cancel := p.s.callCtx()
			c = j.script.Run(ctx, p.s.client, j.keys, j.args...)
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
