package drl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
)

// The defaults of Options (and of the gateway file's drl section).
const (
	// DefaultGroup is the group of a gateway that names none.
	DefaultGroup = "default"
	// DefaultInterval is H, the period of demand reports and allocations.
	DefaultInterval = time.Second
	// DefaultMaxGateways is the number of gateways a distributed limit is
	// safe for: each gateway's floor is limit / MaxGateways.
	DefaultMaxGateways = 32
	// DefaultJoinReserve is the number of floors kept free for gateways
	// that join between two tables.
	DefaultJoinReserve = 1
	// DefaultHeadroom is the share above smoothed demand given to a
	// gateway that is not saturated, as a fraction (0.02 = 2 %).
	DefaultHeadroom = 0.02
)

// Options configure a Store. The zero value is usable (with New's
// required arguments); every gateway of a group must use the same
// Interval, MaxGateways and MinFloorRate.
type Options struct {
	// Group names the data plane's DRL in Redis (keys
	// limitplane:drl:{Group}:…): the gateways that share limits use the
	// same one. Default "default". It may not contain '{' or '}'.
	Group string
	// GatewayID names this gateway in the group; it must be unique among
	// the gateways running. Default: 16 random hex digits per Store, so a
	// restarted gateway is a new one (its old report expires on its own).
	GatewayID string
	// Interval is H: the gateway reports its demand every H; the
	// allocator steps every H (and when acknowledgements arrive), renews
	// its lease every H/2 (the lease lives 1.5H), and a gateway without
	// an allocator runs for the lease every H/4. A table is fresh for 2H
	// after the report call that returned it. Default 1 s.
	Interval time.Duration
	// MaxGateways is the most gateways a limit is split between; a key's
	// floor is its limit / MaxGateways. Default 32.
	MaxGateways int
	// JoinReserve is the number of floors each key keeps free for
	// gateways that join between tables. 0 means the default, 1;
	// negative means none.
	JoinReserve int
	// Headroom is the share above its smoothed demand that a gateway that
	// is not saturated gets, as a fraction (0.02 = 2 %). 0 means the
	// default, 0.02; negative means none.
	Headroom float64
	// MinFloorRate is the smallest floor, in requests per second, a key
	// may have to be split: below it (or with floor(Burst/MaxGateways)
	// below 1) the exact store decides it. Default 1.
	MinFloorRate float64
	// MaxKeys bounds the hot keys held in memory; beyond it new keys go to
	// the exact store. Default 10000.
	MaxKeys int
	// Logger receives Redis failures (one line when a kind of call starts
	// failing, one when it succeeds again) and lease changes; nil means
	// slog.Default().
	Logger *slog.Logger
}

// seams are what this package's tests set and users cannot: a Store's
// clock is the system clock, and its allocator keeps shrinks before grows,
// unless a test (newStore) or a test build (unsafeBuild) says otherwise.
type seams struct {
	// manual: no loop is started (the subscriber is); the test drives the
	// Store with tick.
	manual bool
	// clock is the monotonic clock of the hot path and the loop; nil
	// means the system clock.
	clock core.Clock
	// unsafe: the allocator grants grows before the shrinks they need
	// are in force, which breaks the bound (see
	// AllocatorOptions.unsafeGrowsBeforeShrinks).
	unsafe bool
}

// Store is limitplane's Distributed Rate Limiter as a core.Store, one per
// gateway: it decides the requests the Limiter takes (distributed, GCRA,
// no quota, not too coarse: see Limiter.Eligible) in memory against this
// gateway's share, with no Redis call, and passes every other request to
// the exact store (normally the Redis store) unchanged. In the background
// it reports this gateway's demand, takes part in the allocator's
// election, runs the allocator while it holds the lease, and applies the
// tables the allocator publishes (see the package documentation and
// redis.go for the protocol).
//
// Quota resets, penalties, algorithm and limit checks go to the exact
// store. A penalty (Penalize) therefore holds back only the requests the
// exact store decides, not a hot key's in-memory share.
type Store struct {
	exact core.Store
	lim   *Limiter
	w     wire
	o     Options
	clock core.Clock
	log   *slog.Logger
	nonce string
	aopts AllocatorOptions

	mu       sync.Mutex // guards cur, ver, lastSent
	cur      *Table     // the table last read from Redis
	ver      string     // its version; "" none
	lastSent int64      // send time of the latest successful report call; 0 none

	allocator atomic.Bool
	ackCh     chan struct{} // acknowledgements arrived (for the allocator)

	failMu  sync.Mutex
	failing map[string]bool // call kinds now failing, for one log line each way

	// Owned by the loop goroutine (tick):
	ticks        uint64
	lead         *leader
	reportFailed bool // the last report call failed: try again next tick

	cancel    context.CancelFunc
	done      chan struct{} // closed when the loop has returned
	pubsub    *redis.PubSub
	subDone   chan struct{} // closed when the subscriber has returned
	closeOnce sync.Once
	closed    atomic.Bool // Close began: Take answers ErrClosed
	closeErr  error
}

// leader is this gateway's allocator while it holds the lease.
type leader struct {
	token      uint64
	value      string // the lease's value
	leaseUntil int64  // ns: the lease surely lapsed by then unless renewed
	holdUntil  int64  // ns: publish nothing before (see elect)
	published  bool   // this allocator has published (or found nothing to change)
	alloc      *Allocator
}

// New returns a Store over exact, using client (the data plane's Redis)
// for the DRL's own keys and channels, and starts its loop; Close stops
// it. client stays the caller's to close, after Close.
func New(client redis.UniversalClient, exact core.Store, o Options) (*Store, error) {
	return newStore(client, exact, o, seams{unsafe: unsafeBuild})
}

// newStore is New with the test seams sm: tests on a manual clock, a
// manual loop, or the unsafe allocator.
func newStore(client redis.UniversalClient, exact core.Store, o Options, sm seams) (*Store, error) {
	if client == nil {
		return nil, errors.New("drl: New: nil Redis client")
	}
	if exact == nil {
		return nil, errors.New("drl: New: nil exact store")
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if strings.ContainsAny(o.Group, "{}") {
		return nil, fmt.Errorf("drl: New: group %q contains '{' or '}'", o.Group)
	}
	if o.Interval < 0 {
		return nil, fmt.Errorf("drl: New: interval %v is negative", o.Interval)
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Interval < time.Millisecond {
		return nil, fmt.Errorf("drl: New: interval %v is below 1ms", o.Interval)
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("drl: New: %w", err)
	}
	if o.GatewayID == "" {
		var id [8]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, fmt.Errorf("drl: New: %w", err)
		}
		o.GatewayID = hex.EncodeToString(id[:])
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if sm.clock == nil {
		sm.clock = core.NewSystemClock()
	}
	forget := 30 * o.Interval
	s := &Store{
		exact: exact,
		lim: NewLimiter(LimiterOptions{Gateway: o.GatewayID, MaxGateways: o.MaxGateways, MinFloorRate: o.MinFloorRate,
			Interval: o.Interval, MaxKeys: o.MaxKeys}),
		w:     wire{c: client, k: keysFor(o.Group), gateway: o.GatewayID, h: o.Interval, keep: forget},
		o:     o,
		clock: sm.clock,
		log:   o.Logger.With("component", "drl", "group", o.Group, "gateway", o.GatewayID),
		nonce: hex.EncodeToString(nonce[:]),
		aopts: AllocatorOptions{MaxGateways: o.MaxGateways, JoinReserve: o.JoinReserve, Headroom: o.Headroom,
			Interval: o.Interval, Forget: forget, unsafeGrowsBeforeShrinks: sm.unsafe},
		ackCh:   make(chan struct{}, 1),
		failing: map[string]bool{},
		done:    make(chan struct{}),
		subDone: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.pubsub = client.Subscribe(ctx, s.w.k.tables, s.w.k.acks)
	go s.subscribe(ctx)
	if sm.unsafe {
		s.log.Warn("drl: the allocator grants grows before the shrinks they need are in force: the gateways may admit more than a distributed limit (a test build or test)")
	}
	if sm.manual {
		close(s.done)
		return s, nil
	}
	go s.run(ctx)
	return s, nil
}

// GatewayID returns this gateway's ID in the group.
func (s *Store) GatewayID() string { return s.o.GatewayID }

// Exact returns the store that decides what DRL does not.
func (s *Store) Exact() core.Store { return s.exact }

// ErrClosed is returned by Take and TakeInto after Close: a gateway that
// left its group decides nothing in memory, and the exact store behind it
// is the caller's to use or close.
var ErrClosed = errors.New("drl: store closed")

// Prepare implements core.Store: ls is prepared on the exact store, and
// the rule this store returns holds that rule for the requests it passes
// on, and whether (and how) the Limiter decides requests under ls, decided
// here once (see Limiter.Eligible) so that Take checks only the cost.
// Errors are the exact store's, or core.NewRule's.
func (s *Store) Prepare(ls core.LimitSet) (*core.Rule, error) {
	inner, err := s.exact.Prepare(ls)
	if err != nil {
		return nil, err
	}
	data := &rule{exact: inner}
	r, err := core.NewRule(ls, data)
	if err != nil {
		return nil, err
	}
	data.hot, data.inMemory = s.lim.compile(r)
	// An in-flight limit is counted exactly, by the exact store.
	data.inMemory = data.inMemory && ls.InFlight == 0
	return r, nil
}

// rule is the store's compiled form of a LimitSet: the exact store's rule
// and, when inMemory, the rule compiled for this store's Limiter.
type rule struct {
	exact    *core.Rule
	hot      hotRule
	inMemory bool
}

// ruleOf returns req's rule data, or nil when req.Rule is not this kind of
// store's.
func ruleOf(req *core.Request) *rule {
	r, _ := req.Rule.Data().(*rule) // Data is nil for a nil Rule
	return r
}

// Take implements core.Store: a request the Limiter takes is decided in
// memory (no Redis call); any other goes to the exact store.
func (s *Store) Take(ctx context.Context, req core.Request) (d core.Decision, err error) {
	if s.closed.Load() {
		return d, ErrClosed
	}
	r := ruleOf(&req)
	if r == nil {
		return d, core.ErrForeignRule
	}
	if r.inMemory && s.lim.take(s.clock.Nanotime(), &req, &r.hot, &d) {
		return d, nil
	}
	req.Rule = r.exact
	return s.exact.Take(ctx, req)
}

// TakeInto is Take writing into *d, through the exact store's TakeInto
// when it has one (memory.Store).
func (s *Store) TakeInto(ctx context.Context, req *core.Request, d *core.Decision) error {
	if s.closed.Load() {
		*d = core.Decision{}
		return ErrClosed
	}
	r := ruleOf(req)
	if r == nil {
		*d = core.Decision{}
		return core.ErrForeignRule
	}
	if r.inMemory && s.lim.take(s.clock.Nanotime(), req, &r.hot, d) {
		return nil
	}
	er := *req
	er.Rule = r.exact
	if w, ok := s.exact.(interface {
		TakeInto(context.Context, *core.Request, *core.Decision) error
	}); ok {
		return w.TakeInto(ctx, &er, d)
	}
	var err error
	*d, err = s.exact.Take(ctx, er)
	return err
}

// ResetQuota implements core.Store: quotas are the exact store's.
func (s *Store) ResetQuota(ctx context.Context, consumer, scope string, epoch uint64) error {
	return s.exact.ResetQuota(ctx, consumer, scope, epoch)
}

// Penalize implements core.Store through the exact store: the penalty
// holds back what the exact store decides, not a hot key's in-memory
// share.
func (s *Store) Penalize(ctx context.Context, req core.Request, d time.Duration) error {
	r := ruleOf(&req)
	if r == nil {
		return core.ErrForeignRule
	}
	req.Rule = r.exact
	return s.exact.Penalize(ctx, req, d)
}

// Ping checks the exact store, when it can be pinged (the Redis store).
func (s *Store) Ping(ctx context.Context) error {
	if p, ok := s.exact.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return nil
}

// Stats are a Store's counters, for metrics.
type Stats struct {
	LimiterStats
	// Allocator: this gateway holds the allocator's lease.
	Allocator bool
}

// Stats returns the Store's counters. It walks the hot keys: call it at
// scrape rate, not per request.
func (s *Store) Stats() Stats {
	return Stats{LimiterStats: s.lim.Stats(), Allocator: s.allocator.Load()}
}

// Close stops the loop and the subscriber, then leaves the group at once:
// it deletes this gateway's report and acknowledgement, gives up the lease
// if it holds it and records the leave, so the others see it without
// waiting for TTLs and the allocator hands its share (floor included) to
// them at its next step. Take and TakeInto answer ErrClosed from the
// moment Close is called (a gateway closes its store after its server has
// drained). It does not close the exact store or the client. Idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		// From here this gateway decides nothing (the allocator is told it
		// left, and keeps no floor for it).
		s.closed.Store(true)
		s.halt()
		value := ""
		if s.lead != nil {
			value = s.lead.value
		}
		s.lead = nil
		s.allocator.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), max(s.o.Interval, time.Second))
		defer cancel()
		s.closeErr = s.w.leave(ctx, value)
	})
	return s.closeErr
}

// halt stops the loop and the subscriber without leaving: what a killed
// gateway leaves behind.
func (s *Store) halt() {
	s.cancel()
	<-s.done
	s.pubsub.Close()
	<-s.subDone
	s.allocator.Store(false)
}

// run is the loop: a tick every H/4.
func (s *Store) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.o.Interval / 4)
	defer t.Stop()
	s.tick(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.tick(ctx)
		case <-s.ackCh:
			if s.lead != nil {
				s.step(ctx)
			}
		}
	}
}

// tick does what is due at this quarter of H: the report every H (and
// at the next tick after one failed, well before the table's 2H run out),
// the election while not the allocator, and as the allocator the renewal
// every H/2 and the step every H (every H/4 until its first table, so a
// hold ends within H/4).
func (s *Store) tick(ctx context.Context) {
	n := s.ticks
	s.ticks++
	if n%4 == 0 || s.reportFailed {
		s.report(ctx)
	}
	if s.lead == nil {
		s.elect(ctx)
		return
	}
	if n%2 == 1 {
		if s.renew(ctx); s.lead == nil {
			return // resigned
		}
	}
	select {
	case <-s.ackCh:
		s.step(ctx)
		return
	default:
	}
	if n%4 == 0 || !s.lead.published {
		s.step(ctx)
	}
}

// callTimeout bounds one Redis call: H/2, at least 50 ms.
func (s *Store) callTimeout() time.Duration { return max(s.o.Interval/2, 50*time.Millisecond) }

// callCtx bounds one Redis call to callTimeout.
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.callTimeout())
}

// failed logs the first failure of a kind of call; ok logs its recovery.
// The loop and the subscriber call them.
func (s *Store) failed(kind string, err error) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if !s.failing[kind] {
		s.failing[kind] = true
		s.log.Warn("drl: redis call failed; keys fall back to their floor if this lasts 2 intervals", "call", kind, "err", err)
	}
}

func (s *Store) ok(kind string) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.failing[kind] {
		delete(s.failing, kind)
		s.log.Info("drl: redis answers again", "call", kind)
	}
}

// report writes this gateway's demand and applies the table the same
// call returns: a table is fresh for 2H from the send time of the report
// call that returned it (or, by pub/sub, of the latest report call).
func (s *Store) report(ctx context.Context) {
	now := s.clock.Nanotime()
	rep := s.lim.Report(now, s.o.GatewayID)
	s.mu.Lock()
	known := s.ver
	s.mu.Unlock()
	cctx, cancel := s.callCtx(ctx)
	t, ver, err := s.w.report(cctx, &rep, known)
	cancel()
	if err != nil {
		s.reportFailed = true
		s.failed("report", err)
		return
	}
	s.reportFailed = false
	s.ok("report")
	s.mu.Lock()
	s.lastSent = now
	var applied *Table
	switch {
	case ver == "":
		s.lim.ApplyAt(s.clock.Nanotime(), now, nil) // no table yet: the report is in
	case t == nil:
		if s.cur != nil {
			s.lim.ApplyAt(s.clock.Nanotime(), now, s.cur) // the same table, fresh again
		}
	default:
		s.cur, s.ver = t, ver
		s.lim.ApplyAt(s.clock.Nanotime(), now, t)
		applied = t
	}
	s.mu.Unlock()
	if applied != nil {
		s.acknowledge(ctx, applied)
	}
}

// acknowledge tells the allocator that t is in force here (when it is:
// an older table than the one in force is not).
func (s *Store) acknowledge(ctx context.Context, t *Table) {
	if s.lim.view.Load().epoch != t.Epoch {
		return
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.w.ack(cctx, t.Epoch); err != nil {
		s.failed("ack", err)
		return
	}
	s.ok("ack")
}

// subscribe applies the tables announced on the tables channel at once,
// acknowledging each, and wakes the allocator on acknowledgements.
//
// A table is applied here only when its epoch is above the one in force,
// fresh until 2H after the latest report call (whose report is in Redis
// at least that long). A lower or equal epoch is left to the next report
// call: within a line it is the table in force or an older one (the
// Limiter would only refresh the table in force with it), and a new
// line's first tables (a Redis that lost its data numbers from 1 again)
// come with that call, which replaces the table in force with them.
func (s *Store) subscribe(ctx context.Context) {
	defer close(s.subDone)
	for m := range s.pubsub.Channel() {
		switch m.Channel {
		case s.w.k.tables:
			s.mu.Lock()
			known := s.ver
			s.mu.Unlock()
			if m.Payload == known {
				continue
			}
			cctx, cancel := s.callCtx(ctx)
			t, ver, err := s.w.readTable(cctx)
			cancel()
			if err != nil || t == nil {
				continue // the next report brings it
			}
			s.mu.Lock()
			if ver == s.ver || t.Epoch <= s.lim.view.Load().epoch {
				s.mu.Unlock()
				continue
			}
			s.cur, s.ver = t, ver
			s.lim.ApplyAt(s.clock.Nanotime(), s.lastSent, t)
			s.mu.Unlock()
			s.acknowledge(ctx, t)
		case s.w.k.acks:
			if s.allocator.Load() {
				select {
				case s.ackCh <- struct{}{}:
				default:
				}
			}
		}
	}
}

// elect runs for the lease. The winner takes over from the table in
// force; when there is none (a new group, or a Redis that lost its data)
// it publishes nothing for 2H plus a call's timeout, so that every
// gateway's table from before has gone stale and runs at its floor by the
// time a report call brings the new one: the new line knows nothing of
// the shares and bounds of the tables before it.
func (s *Store) elect(ctx context.Context) {
	sentAt := s.clock.Nanotime()
	cctx, cancel := s.callCtx(ctx)
	token, value, err := s.w.elect(cctx, s.nonce)
	cancel()
	if err != nil {
		s.failed("elect", err)
		return
	}
	s.ok("elect")
	if token == 0 {
		return
	}
	s.lead = &leader{token: token, value: value, leaseUntil: sentAt + int64(s.o.Interval+s.o.Interval/2)}
	s.allocator.Store(true)
	s.log.Info("drl: this gateway is the allocator", "token", token)
	if s.load(ctx) {
		s.step(ctx)
	}
}

// load makes the allocator from the table in force; false when Redis did
// not answer (the next step tries again).
func (s *Store) load(ctx context.Context) bool {
	cctx, cancel := s.callCtx(ctx)
	last, _, err := s.w.readTable(cctx)
	cancel()
	if err != nil {
		s.failed("allocate", err)
		return false
	}
	if last == nil {
		s.lead.holdUntil = s.clock.Nanotime() + 2*int64(s.o.Interval) + int64(s.callTimeout())
	}
	s.lead.alloc = NewAllocator(s.aopts, s.lead.token, last)
	return true
}

// resign drops the allocator's role.
func (s *Store) resign(why string) {
	s.log.Info("drl: this gateway is no longer the allocator", "token", s.lead.token, "why", why)
	s.lead = nil
	s.allocator.Store(false)
}

// renew extends the lease.
func (s *Store) renew(ctx context.Context) {
	sentAt := s.clock.Nanotime()
	cctx, cancel := s.callCtx(ctx)
	ok, err := s.w.renew(cctx, s.lead.value)
	cancel()
	switch {
	case err != nil:
		s.failed("renew", err)
		if sentAt >= s.lead.leaseUntil {
			s.resign("the lease lapsed while Redis did not answer")
		}
	case !ok:
		s.ok("renew")
		s.resign("the lease is held by another gateway")
	default:
		s.ok("renew")
		s.lead.leaseUntil = sentAt + int64(s.o.Interval+s.o.Interval/2)
	}
}

// step runs the allocator once and publishes its table when it changed.
func (s *Store) step(ctx context.Context) {
	now := s.clock.Nanotime()
	if now >= s.lead.leaseUntil {
		s.resign("the lease lapsed")
		return
	}
	if now < s.lead.holdUntil {
		return
	}
	if s.lead.alloc == nil && (!s.load(ctx) || now < s.lead.holdUntil) {
		return // not loaded, or no table found: the hold starts now
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	st, err := s.w.readState(cctx)
	if err != nil {
		s.failed("allocate", err)
		return
	}
	s.lead.alloc.Left(st.left...)
	t, changed := s.lead.alloc.Step(now, st.reports, st.acks)
	if changed {
		ok, err := s.w.publish(cctx, s.lead.value, t)
		switch {
		case err != nil:
			// It may or may not be in Redis: start again from what is.
			s.failed("allocate", err)
			s.lead.alloc = nil
			return
		case !ok:
			s.resign("the lease is held by another gateway")
			return
		}
	}
	s.lead.published = true
	s.ok("allocate")
	if err := s.w.forget(cctx, st.gone, st.left); err != nil {
		s.failed("allocate", err)
	}
}

var _ core.Store = (*Store)(nil)
