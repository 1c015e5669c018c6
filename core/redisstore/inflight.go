package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/limitplane/limitplane/core"
	"github.com/redis/go-redis/v9"
)

// DefaultInFlightLease is a slot's lease unless Options.InFlightLease is
// set.
const DefaultInFlightLease = 30 * time.Second

// In-flight limits (core.LimitSet.InFlight). Each (consumer, scope) with
// requests in flight has a sorted set, <prefix>{<consumer-hash>}:inflight:
// <scope>, one member per slot held, scored by the slot's expiry in ms of
// Redis TIME. Taking a slot (inFlightAcquire) first removes the members
// whose lease has passed, then adds one only when fewer than the cap are
// left, atomically. The store renews the leases of the slots it holds
// every lease/3, from one goroutine for all of them (started with the
// first slot, stopped by Close), and a release removes the member. So a
// slot of a process that died (or lost Redis for longer than the lease)
// is free again at most a lease after its last renewal. Every write sets
// the key's TTL to the lease: the latest member's expiry.
//
// A take whose call failed (a timeout, a caller gone, a connection lost)
// may still run in Redis later (a paused server runs what it had read
// when it resumes), adding a slot nobody holds: that locked the consumer
// out for a lease. So the store cancels every member whose take failed
// (inFlightCancel, sent from the renewing goroutine and retried until
// Redis answers): it removes the member when the take ran first, and
// otherwise marks the member canceled in KEYS[2], <key>:canceled, a sorted
// set scored by the mark's expiry, which the take checks before it adds.
const inFlightAcquire = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= cap or ARGV[4] == '1' or redis.call('ZSCORE', KEYS[2], ARGV[3]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], lease)
return {1, n + 1}
`

// inFlightRenew moves the expiry of the members ARGV[2:] that are still
// held (ZADD XX: a lapsed member is not revived) to now + lease.
const inFlightRenew = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 0
`

// inFlightCancel cancels member ARGV[1] of KEYS[1], whose take failed:
// removed if the take ran, and marked in KEYS[2] for ARGV[2] ms so that a
// take that runs later adds nothing; lapsed marks are dropped.
const inFlightCancel = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ttl)
return 0
`

var (
	inFlightAcquireScript = redis.NewScript(inFlightAcquire)
	inFlightRenewScript   = redis.NewScript(inFlightRenew)
	inFlightCancelScript  = redis.NewScript(inFlightCancel)
)

// canceledSuffix makes of an in-flight set's key that of its canceled
// members (same hash slot: the key's hash tag comes first, and no scope
// holds a ':').
const canceledSuffix = ":canceled"

// canceledKey is the sorted set of key's canceled members.
func canceledKey(key string) string { return key + canceledSuffix }

// canceledMark is how long a canceled member stays marked: how late after
// its cancel a failed take may still run. A take reaches Redis after its
// cancel only if it was held up on its way (the cancel is sent later, by
// the time the take failed); five minutes covers TCP's retransmissions
// on a connection that comes back. A slot added later than that is still
// freed by its lease.
const canceledMark = 5 * time.Minute

// maxCancels bounds the cancels a store keeps to retry while Redis does
// not answer; beyond it a failed take's slot, if it ran, is freed by its
// lease alone.
const maxCancels = 4096

// inFlightKind names the in-flight sorted set.
var inFlightKind = []byte("inflight")

// flights is a store's registry of the slots it holds, renewed by one
// goroutine.
type flights struct {
	lease   time.Duration
	leaseMs int64
	retry   time.Duration // first wait before a failed cancel is sent again (50 ms; tests set it)
	prefix  string        // random per store: members are <prefix>:<n>
	seq     atomic.Uint64 // n
	start   sync.Once
	stop    chan struct{}
	done    chan struct{}
	wake    chan struct{} // a cancel is queued (buffered, 1)
	mu      sync.Mutex
	held    map[string]map[string]struct{} // key → members; guarded by mu
	cancels []cancel                       // guarded by mu; at most maxCancels
	queued  atomic.Int64                   // len(cancels), read without mu
	closed  bool                           // guarded by mu
}

// cancel is a member whose take or release failed, to be canceled
// (inFlightCancel).
type cancel struct{ key, member string }

func (f *flights) init(lease time.Duration) {
	if lease <= 0 {
		lease = DefaultInFlightLease
	}
	f.lease = lease
	f.leaseMs = max(int64(lease/time.Millisecond), 1)
	f.retry = 50 * time.Millisecond
	var b [8]byte
	rand.Read(b[:])
	f.prefix = hex.EncodeToString(b[:])
	f.stop, f.done, f.wake = make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	f.held = make(map[string]map[string]struct{})
}

// slot is one held slot: its core.Releaser.
type slot struct {
	s           *Store
	key, member string
}

// Release implements core.Releaser: it removes the slot's member, under
// the store's timeout and a context of its own (the request's may have
// ended), and stops renewing it. A release that fails is retried as a
// failed take's cancel is, until Redis answers.
func (sl *slot) Release() {
	f := &sl.s.flights
	f.mu.Lock()
	if m := f.held[sl.key]; m != nil {
		delete(m, sl.member)
		if len(m) == 0 {
			delete(f.held, sl.key)
		}
	}
	f.mu.Unlock()
	ctx, cancel := sl.s.callCtx()
	defer cancel()
	if sl.s.client.ZRem(ctx, sl.key, sl.member).Err() != nil {
		f.cancel(sl.key, sl.member)
	}
}

// cancel queues member of key to be canceled by the renewing goroutine
// (which takeInFlight started) and wakes it; at most maxCancels wait.
func (f *flights) cancel(key, member string) {
	f.mu.Lock()
	if len(f.cancels) < maxCancels {
		f.cancels = append(f.cancels, cancel{key, member})
		f.queued.Store(int64(len(f.cancels)))
	}
	f.mu.Unlock()
	f.kick()
}

// kick wakes the renewing goroutine to send the queued cancels.
func (f *flights) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// takeCancels removes from the queue and returns the cancels of key, or
// every cancel when key is "".
func (f *flights) takeCancels(key string) []cancel {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cancel
	if key == "" {
		out, f.cancels = f.cancels, nil
	} else {
		f.cancels = slices.DeleteFunc(f.cancels, func(c cancel) bool {
			if c.key == key {
				out = append(out, c)
				return true
			}
			return false
		})
	}
	f.queued.Store(int64(len(f.cancels)))
	return out
}

// requeue puts back cancels that could not be sent, ahead of those queued
// since, keeping at most maxCancels.
func (f *flights) requeue(batch []cancel) {
	f.mu.Lock()
	f.cancels = append(batch, f.cancels...)
	if len(f.cancels) > maxCancels {
		f.cancels = f.cancels[:maxCancels]
	}
	f.queued.Store(int64(len(f.cancels)))
	f.mu.Unlock()
}

// sendCancels sends batch in one pipeline under ctx.
func (f *flights) sendCancels(ctx context.Context, s *Store, batch []cancel) error {
	// EVAL, not EVALSHA: a cancel that waits in a paused server's socket
	// must not fail there for a script the server does not have.
	mark := int64(canceledMark / time.Millisecond)
	pipe := s.client.Pipeline()
	for _, c := range batch {
		inFlightCancelScript.Eval(ctx, pipe, []string{c.key, canceledKey(c.key)}, c.member, mark)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// cancelQueued sends the queued cancels in one pipeline, under the
// store's timeout; when the pipeline fails they are queued again (the
// cancel is idempotent). It reports whether none is left to retry.
func (f *flights) cancelQueued(s *Store) bool {
	batch := f.takeCancels("")
	if len(batch) == 0 {
		return true
	}
	ctx, stop := s.callCtx()
	defer stop()
	if err := f.sendCancels(ctx, s, batch); err != nil {
		f.requeue(batch)
		return false
	}
	return true
}

// takeInFlight is Take for a rule with an in-flight limit: a slot is taken
// first, in one script call (a denial there spends nothing), then the rate
// limit and quota as for any rule, and the slot is given back unless they
// allow: two round trips for an admitted request, three for one the rate
// limit or quota denies. A cost of 0 peeks: denied when the cap is held,
// nothing taken.
func (s *Store) takeInFlight(ctx context.Context, req core.Request, r *rule) (core.Decision, error) {
	f := &s.flights
	f.start.Do(func() { go f.renew(s) })
	// Both keys in one string: the set's is the canceled set's less its
	// suffix.
	hx, _ := consumerHash(nil, req.Consumer)
	marked := string(append(s.appendKey(nil, &hx, inFlightKind, req.Rule.Scope()), canceledSuffix...))
	key := marked[:len(marked)-len(canceledSuffix)]
	member := f.prefix + ":" + strconv.FormatUint(f.seq.Add(1), 10)
	peek := "0"
	if req.Cost == 0 {
		peek = "1"
	}
	keys := []string{key, marked}
	acquire := func(ctx context.Context) ([]int64, error) {
		return inFlightAcquireScript.Run(ctx, s.client, keys, r.inFlight, f.leaseMs, member, peek).Int64Slice()
	}
	v, err := s.call(ctx, acquire)
	if err == nil && len(v) == 2 && v[0] == 0 && peek == "0" && f.queued.Load() > 0 {
		// Refused while cancels wait: after Redis was paused, the takes
		// that failed then may hold the slots now. Cancel this key's and
		// ask again, once.
		if batch := f.takeCancels(key); len(batch) > 0 {
			_, err = s.call(ctx, func(ctx context.Context) ([]int64, error) {
				return nil, f.sendCancels(ctx, s, batch)
			})
			if err != nil {
				f.requeue(batch)
			} else {
				v, err = s.call(ctx, acquire)
			}
		}
	}
	if err != nil {
		if peek == "0" && !errors.Is(err, ErrCircuitOpen) {
			f.cancel(key, member) // it may have been sent, and may still run
		}
		return core.Decision{}, fmt.Errorf("redisstore: take in-flight slot: %w", err)
	}
	if f.queued.Load() > 0 {
		f.kick() // Redis answers again: send the other keys' cancels now
	}
	if len(v) != 2 {
		return core.Decision{}, fmt.Errorf("redisstore: take in-flight slot: script replied %d values, want 2", len(v))
	}
	got, held := v[0] == 1, v[1]
	if !got && (req.Cost > 0 || held >= r.inFlight) {
		return core.Decision{DecidedBy: core.KindInFlight, Limit: r.inFlight}, nil
	}
	var d core.Decision
	if r.limited || r.quota {
		d, err = s.takeLimits(ctx, req, r)
	} else {
		d = core.Decision{Allowed: true, DecidedBy: core.KindInFlight, Limit: r.inFlight, Remaining: r.inFlight - held}
	}
	if !got {
		return d, err
	}
	sl := &slot{s: s, key: key, member: member}
	if err != nil || !d.Allowed {
		sl.Release()
		return d, err
	}
	f.mu.Lock()
	m := f.held[key]
	if m == nil {
		m = make(map[string]struct{})
		f.held[key] = m
	}
	m[member] = struct{}{}
	f.mu.Unlock()
	d.Hold = core.JoinHolds(core.NewHold(sl), d.Hold) // d's: a settlement
	return d, nil
}

// renew renews the leases of the slots s holds every lease/3 until Close,
// and sends queued cancels as they come, retrying those that fail with
// exponential backoff from 50 ms up to lease/3: a cancel that waited for a
// server that was paused or unreachable goes out soon after it answers.
func (f *flights) renew(s *Store) {
	defer close(f.done)
	every := max(f.lease/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = min(f.retry, every), every
	retry := time.NewTimer(every)
	retry.Stop() // armed by a failed send
	defer retry.Stop()
	send := func() {
		if f.cancelQueued(s) {
			b.Reset()
			retry.Stop()
			return
		}
		retry.Reset(b.NextBackOff())
	}
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.renewOnce(s)
			send()
		case <-f.wake:
			send()
		case <-retry.C:
			send()
		}
	}
}

// renewOnce renews every held slot's lease: one script call per key, all
// in one pipeline.
func (f *flights) renewOnce(s *Store) {
	f.mu.Lock()
	if len(f.held) == 0 {
		f.mu.Unlock()
		return
	}
	batch := make(map[string][]any, len(f.held))
	for key, m := range f.held {
		args := make([]any, 0, len(m)+1)
		args = append(args, f.leaseMs)
		for member := range m {
			args = append(args, member)
		}
		batch[key] = args
	}
	f.mu.Unlock()
	ctx, cancel := s.callCtx()
	defer cancel()
	pipe := s.client.Pipeline()
	for key, args := range batch {
		inFlightRenewScript.EvalSha(ctx, pipe, []string{key}, args...)
	}
	if _, err := pipe.Exec(ctx); err != nil && isNoScript(err) {
		pipe := s.client.Pipeline()
		for key, args := range batch {
			inFlightRenewScript.Eval(ctx, pipe, []string{key}, args...)
		}
		pipe.Exec(ctx)
	}
}

// close stops the renewing goroutine, if it started. Slots still held are
// left to expire within the lease; their Release still removes them.
func (f *flights) close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.mu.Unlock()
	f.start.Do(func() { close(f.done) }) // never started: nothing to stop
	close(f.stop)
	<-f.done
}

// InFlight returns the slots of (consumer, scope) held now in Redis, by
// every process, lapsed leases left out: for tests and tools.
func (s *Store) InFlight(ctx context.Context, consumer, scope string) (int64, error) {
	key := s.key(consumer, inFlightKind, scope)
	v, err := inFlightAcquireScript.Run(ctx, s.client, []string{key, canceledKey(key)}, 0, 1, "", "1").Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("redisstore: in flight: %w", err)
	}
	return v[1], nil
}
