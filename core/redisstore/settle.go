package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
)

// settleQuota settles a quota charge (core.LimitSet.Settle): KEYS[1] the
// quota hash {used, end}, ARGV[1] actual − charged, ARGV[2] the end of the
// period charged, as the hash writes it (decimal ns). Only that period is
// changed, never below zero: once it has ended (the key expired, or a new
// period with another end replaced it) or was reset (the key deleted),
// nothing is. Reply {changed, used}.
const settleQuota = `
local v = redis.call('HMGET', KEYS[1], 'used', 'end')
if not v[1] or v[2] ~= ARGV[2] then return {0, 0} end
local used = tonumber(v[1]) + tonumber(ARGV[1])
if used < 0 then used = 0 end
redis.call('HSET', KEYS[1], 'used', string.format('%d', used))
return {1, used}
`

var settleQuotaScript = redis.NewScript(settleQuota)

// Asynchronous settling. A settle (settlement.Settle) is registered as
// pending on its quota key and queued; Settle then returns, without a
// round trip. Senders, goroutines started on demand (at most
// settles.workers at once, each ending when it finds the queue empty),
// send the queue in pipelines of up to settles.batch settle scripts, and
// once a settle's reply (or failure) is back, unregister it. A Take whose
// quota key has settles pending (a store-wide count says whether any
// are, so Takes pay one atomic load while none are) sees the ones
// registered before it began: a consumer over budget after settling is
// refused on its next request in this process. When every one pending
// on the key is still queued, the Take claims them (the senders skip
// them) and sends them in one pipeline before its own script, one round
// trip for all (settles.before, Store.runAfter); otherwise it waits for
// them. Beyond maxQueuedSettles waiting to be sent, and after Close,
// Settle sends its own settle on the caller's goroutine: nothing is
// dropped. Close waits for the senders.
//
// The settles pending on one key are a list in registration order (the
// settlements themselves, so registering allocates nothing). A waiting
// Take hangs a channel on the list's last settle; when a settle is done,
// its channels move to the settle before it in the list, or are closed
// when it was the first: so a Take waits for exactly the settles
// registered before it, however long others keep coming.

// maxQueuedSettles is the most settles queued for the senders; beyond it
// Settle sends its own.
const maxQueuedSettles = 4096

// maxSettleBatch is the most settles in one pipeline.
const maxSettleBatch = 64

// settleShards is the number of shards of the pending settles' map.
const settleShards = 16

// settles is a store's asynchronous settling.
type settles struct {
	s       *Store
	batch   int // settles per pipeline
	workers int // most senders at once

	pending atomic.Int64 // settles registered and not yet done, store-wide
	shards  [settleShards]settleShard

	mu      sync.Mutex
	queue   []*settlement   // guarded by mu
	running int             // senders; guarded by mu
	bufs    [][]*settlement // senders' batch buffers, reused; guarded by mu
	closed  bool            // guarded by mu
	wg      sync.WaitGroup  // senders
}

// settleShard maps quota keys to their pending settles.
type settleShard struct {
	mu sync.Mutex
	m  map[string]pendingSettles
	_  [48]byte // a shard to a 64-byte cache line
}

// pendingSettles is the list of one key's pending settles, oldest first.
type pendingSettles struct{ head, tail *settlement }

// init sets ss up for s: batches of opts.Pipeline settles (1 when
// batching is off), at most maxSettleBatch; senders as PipelineInFlight's
// default, max(2, GOMAXPROCS) at most the client's pool.
func (ss *settles) init(s *Store, client redis.UniversalClient, opts Options) {
	ss.s = s
	ss.batch = opts.Pipeline
	switch {
	case ss.batch < 0:
		ss.batch = 1
	case ss.batch == 0 || ss.batch > maxSettleBatch:
		ss.batch = maxSettleBatch
	}
	ss.workers = max(2, runtime.GOMAXPROCS(0))
	if n := poolSize(client); n > 0 {
		ss.workers = min(ss.workers, n)
	}
	for i := range ss.shards {
		ss.shards[i].m = make(map[string]pendingSettles)
	}
}

// shard returns the shard of a quota key (which starts with the store's
// head), by the value of the first hex digit of its consumer hash.
func (ss *settles) shard(c byte) *settleShard {
	return &ss.shards[(int(c&15)+9*int(c>>6))%settleShards]
}

// register adds st to its key's pending settles.
func (ss *settles) register(st *settlement) {
	sh := ss.shard(st.key[len(ss.s.head)])
	sh.mu.Lock()
	l := sh.m[st.key]
	if l.tail == nil {
		l.head = st
	} else {
		l.tail.next, st.prev = st, l.tail
	}
	l.tail = st
	sh.m[st.key] = l
	ss.pending.Add(1)
	sh.mu.Unlock()
}

// done removes st from its key's pending settles and wakes the Takes
// that waited for it and for nothing registered before it.
func (ss *settles) done(st *settlement) {
	sh := ss.shard(st.key[len(ss.s.head)])
	sh.mu.Lock()
	l := sh.m[st.key]
	var wake []chan struct{}
	if st.prev != nil {
		st.prev.next = st.next
		st.prev.waits = append(st.prev.waits, st.waits...)
	} else {
		l.head = st.next
		wake = st.waits
	}
	if st.next != nil {
		st.next.prev = st.prev
	} else {
		l.tail = st.prev
	}
	if l.head == nil {
		delete(sh.m, st.key)
	} else {
		sh.m[st.key] = l
	}
	st.prev, st.next, st.waits = nil, nil, nil
	ss.pending.Add(-1)
	sh.mu.Unlock()
	for _, w := range wake { // (after the count: a woken Take sees it)
		close(w)
	}
}

// errSettleWait is the wait's own bound (Options.Timeout) passing.
var errSettleWait = fmt.Errorf("settles pending longer than the store's timeout: %w", context.DeadlineExceeded)

// before is called by a Take of the quota key before it sends its
// script; callers check ss.pending first. When every settle of the key
// pending is still queued (no sender has taken it), it claims them all
// (the senders skip them) and returns them: the Take sends them itself,
// in one pipeline before its own script (Store.runAfter, which calls
// claimDone). Otherwise it returns nil once the settles registered before
// it was called are done, or with ctx's error, or with errSettleWait
// after Options.Timeout.
func (ss *settles) before(ctx context.Context, key []byte) ([]*settlement, error) {
	sh := ss.shard(key[len(ss.s.head)])
	sh.mu.Lock()
	l, ok := sh.m[string(key)]
	if !ok {
		sh.mu.Unlock()
		return nil, nil
	}
	ss.mu.Lock()
	all := !ss.closed
	for st := l.head; all && st != nil; st = st.next {
		all = st.queued
	}
	if all {
		var claimed []*settlement
		for st := l.head; st != nil; st = st.next {
			st.queued = false
			claimed = append(claimed, st)
		}
		ss.wg.Add(1) // Close waits for the claim's pipeline too
		ss.mu.Unlock()
		sh.mu.Unlock()
		return claimed, nil
	}
	ss.mu.Unlock()
	return nil, ss.wait(ctx, sh, l.tail)
}

// wait waits for last, the last settle pending on its key, and every
// settle before it; sh is the key's shard, locked, which wait unlocks.
func (ss *settles) wait(ctx context.Context, sh *settleShard, last *settlement) error {
	w := make(chan struct{})
	last.waits = append(last.waits, w)
	sh.mu.Unlock()
	var expired <-chan time.Time
	if ss.s.timeout > 0 {
		t := time.NewTimer(ss.s.timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-expired:
		return errSettleWait
	}
}

// claimDone ends a claim of before: the claimed settles are done.
func (ss *settles) claimDone(claimed []*settlement) {
	for _, st := range claimed {
		ss.done(st)
	}
	ss.wg.Done()
}

// enqueue queues st for the senders, starting one if fewer than workers
// are running. It reports false, queueing nothing, after close or when
// maxQueuedSettles are queued.
func (ss *settles) enqueue(st *settlement) bool {
	ss.mu.Lock()
	if ss.closed || len(ss.queue) >= maxQueuedSettles {
		ss.mu.Unlock()
		return false
	}
	ss.queue = append(ss.queue, st)
	st.queued = true
	if ss.running >= ss.workers {
		ss.mu.Unlock()
		return true
	}
	ss.running++
	var buf []*settlement
	if n := len(ss.bufs); n > 0 {
		buf, ss.bufs = ss.bufs[n-1], ss.bufs[:n-1]
	} else {
		buf = make([]*settlement, 0, ss.batch)
	}
	ss.wg.Add(1) // before close's Wait: closed is false under mu
	ss.mu.Unlock()
	go ss.send(buf) // (outside mu, which the sender takes first)
	return true
}

// send is a sender: it sends the queue, up to batch settles at a time,
// until it finds it empty.
func (ss *settles) send(buf []*settlement) {
	defer ss.wg.Done()
	for {
		ss.mu.Lock()
		n := min(len(ss.queue), ss.batch)
		if n == 0 {
			ss.running--
			ss.bufs = append(ss.bufs, buf)
			ss.mu.Unlock()
			return
		}
		buf = buf[:0]
		for _, st := range ss.queue[:n] {
			if st.queued { // not claimed by a Take
				st.queued = false
				buf = append(buf, st)
			}
		}
		rest := copy(ss.queue, ss.queue[n:])
		clear(ss.queue[rest:])
		ss.queue = ss.queue[:rest]
		ss.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		ss.s.settleBatch(buf)
		for i, st := range buf {
			st.report()
			ss.done(st)
			buf[i] = nil
		}
	}
}

// close makes later settles synchronous (and stops Takes claiming
// queued ones), then waits for the senders to send what is queued and
// for the Takes sending settles they claimed.
func (ss *settles) close() {
	ss.mu.Lock()
	ss.closed = true
	ss.mu.Unlock()
	ss.wg.Wait()
}

// settlement is the core.Settler of an admitted request under a rule
// that settles: the quota key, the period's end and the cost charged.
type settlement struct {
	s       *Store
	key     string
	charged int64
	end     string
	delta   int64 // actual − charged, once settled
	// landed is Settle's; once the script's reply is back, changed and
	// used are its {changed, used}, written by the goroutine that sent
	// it, which then calls report.
	landed  func(used int64, known bool)
	changed bool
	used    int64
	// queued: in settles.queue, for a sender to send (false once a
	// sender or a Take took it); guarded by settles.mu.
	queued bool

	// Its place among its key's pending settles, and the channels of
	// the Takes waiting for it and the settles before it; guarded by
	// the key's shard's mu.
	prev, next *settlement
	waits      []chan struct{}
}

// Release implements core.Releaser: the estimate stands.
func (*settlement) Release() {}

// Settle implements core.Settler. It returns at once: the settle script
// is sent by one of the store's senders, under the store's timeout and
// breaker on a context of its own (the request's may have ended), and
// this store's Takes of the same quota key made after Settle returned
// wait for it first. With Options.SyncSettle, after Close, or with
// maxQueuedSettles (4,096) settles waiting to be sent, it sends the
// script itself and returns once it is done. A failure keeps the
// estimate. landed is told the count the script answers, with known
// true, by the goroutine that sent it, before this store's later Takes
// of the quota stop waiting for it; not when the settle failed or its
// period had ended or was reset (the script changed nothing).
func (st *settlement) Settle(actual int64, landed func(used int64, known bool)) {
	st.delta = actual - st.charged
	if st.delta == 0 {
		return
	}
	st.landed = landed
	s := st.s
	if s.syncSettle {
		s.settleOne(st)
		st.report()
		return
	}
	s.settles.register(st)
	if !s.settles.enqueue(st) {
		s.settleOne(st)
		st.report()
		s.settles.done(st)
	}
}

// replied records the settle script's reply v ({changed, used}).
func (st *settlement) replied(v []int64) {
	if len(v) == 2 {
		st.changed, st.used = v[0] == 1, v[1]
	}
}

// report tells landed of a settle that changed its period, before the
// settle is done (settles.done): a Take waiting for the settle returns
// after the thresholds it reached were told. landed gets known true
// only, so it makes no store call (core.Settler).
func (st *settlement) report() {
	if st.landed != nil && st.changed {
		st.landed(st.used, true)
	}
}

var _ core.Settler = (*settlement)(nil)

// settleOne sends st's settle script alone (EVAL after NOSCRIPT) under
// the store's timeout and breaker. The error is the caller's to ignore:
// a failed settle keeps the estimate.
func (s *Store) settleOne(st *settlement) error {
	ctx, cancel := s.callCtx()
	defer cancel()
	v, err := s.call(ctx, func(ctx context.Context) ([]int64, error) {
		return settleQuotaScript.Run(ctx, s.client, []string{st.key}, st.delta, st.end).Int64Slice()
	})
	if err != nil {
		return fmt.Errorf("redisstore: settle: %w", err)
	}
	st.replied(v)
	return nil
}

// runAfter runs c, a Take's call, in one pipeline after the settles a
// Take claimed (settles.before): so the Take sees them, in one round trip
// for all. The settles go as EVAL, so none can meet NOSCRIPT and be left
// behind the Take; the Take's EVALSHA is sent again as EVAL after
// NOSCRIPT, after them either way. The settles are done whatever the
// outcome (a failure keeps their estimates). It ends c as run does
// (Store.done).
//
// The settles must not depend on the request's context: the pipeline runs
// on ctx without its cancellation or deadline, under Options.Timeout, so
// a Take whose caller has gone or whose deadline is sooner may return up
// to one round trip late (as a batched Take sending its batch does).
func (s *Store) runAfter(ctx context.Context, c *call, claimed []*settlement, want int) ([]int64, error) {
	cmds := make([]*redis.Cmd, len(claimed))
	defer func() {
		for i, st := range claimed {
			if v, err := cmds[i].Int64Slice(); err == nil {
				st.replied(v)
				st.report()
			}
		}
		s.settles.claimDone(claimed)
	}()
	v, err := s.call(context.WithoutCancel(ctx), func(ctx context.Context) ([]int64, error) {
		pipe := s.client.Pipeline()
		for i, st := range claimed {
			cmds[i] = settleQuotaScript.Eval(ctx, pipe, []string{st.key}, st.delta, st.end)
		}
		c.cmd = c.evalCmd(ctx)
		pipe.Process(ctx, c.cmd)
		_, err := pipe.Exec(ctx)
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			return nil, err
		}
		if isNoScript(c.cmd.Err()) {
			c.cmd = c.evalFallback(ctx)
		}
		return c.cmd.Result()
	})
	return s.done(c, v, err, want)
}

// settleBatch sends batch's settle scripts in one pipeline of EVALSHAs
// under the store's timeout and breaker; the ones Redis answers NOSCRIPT
// are sent again alone. A lone settle goes without a pipeline.
func (s *Store) settleBatch(batch []*settlement) {
	if len(batch) == 1 {
		s.settleOne(batch[0])
		return
	}
	cmds := make([]*redis.Cmd, len(batch))
	ctx, cancel := s.callCtx()
	defer cancel()
	_, err := s.call(ctx, func(ctx context.Context) ([]int64, error) {
		pipe := s.client.Pipeline()
		for i, st := range batch {
			cmds[i] = settleQuotaScript.EvalSha(ctx, pipe, []string{st.key}, st.delta, st.end)
		}
		_, err := pipe.Exec(ctx)
		var rerr redis.Error
		if err != nil && errors.As(err, &rerr) {
			err = nil // a script-level error belongs to its own settle, not to Redis's health
		}
		return nil, err
	})
	if err != nil {
		return
	}
	for i, st := range batch {
		if isNoScript(cmds[i].Err()) {
			s.settleOne(st)
		} else if v, err := cmds[i].Int64Slice(); err == nil {
			st.replied(v)
		}
	}
}
