package dataplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/limitplane/limitplane/dataplane/threshold"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane/lease"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// QuotaRunnerOptions configure a QuotaRunner.
type QuotaRunnerOptions struct {
	// Client is the data plane's Redis, the one its redisstore.Store
	// (made with Options.FollowsControlPlane) spends global quotas in;
	// KeyPrefix is that store's (default redisstore.DefaultKeyPrefix).
	Client    redis.UniversalClient
	KeyPrefix string
	// Group and Token are the data plane's group and secret, as the
	// agent's (AgentOptions.Group, Token): the ledger's data plane name is
	// Group.
	Group, Token string
	// Address, TLS and DialOptions reach the control plane's QuotaService
	// as AgentOptions' reach its sync service: one connection at a time
	// to one part of a comma-separated list, the next after a failed
	// call. Conn, when set, is used instead (not closed by the runner).
	Address     string
	TLS         *tls.Config
	DialOptions []grpc.DialOption
	Conn        grpc.ClientConnInterface
	// Tick is the time between rounds (default 100 ms): each reads the
	// spend of every active slot from Redis, polls its holder and sends
	// one QuotaService.Lease call for all of them.
	Tick time.Duration
	// ElectionTTL is the holder's election lease in Redis (default 1 s),
	// renewed every round: another runner of the data plane takes over
	// within about ElectionTTL + Tick of the holder's death.
	ElectionTTL time.Duration
	// CallTimeout bounds one Lease call (default 2 s).
	CallTimeout time.Duration
	// PeriodGrace is how long after a period's end a slot's new holder
	// waits before its first request unless the old holder is done
	// (default 500 ms), so the control plane's clock has passed the end.
	PeriodGrace time.Duration
	// Holder is the template of every slot's lease.Options (Horizon,
	// MinRequest, LowWater, …); DataPlane, Token, Entry, Mode and Floor
	// are the runner's.
	Holder lease.Options
	// OnError, if set, is told about failed rounds and calls (for logs);
	// it must not block.
	OnError func(error)
}

// maxThresholdsPerBatch bounds the threshold events one round sends.
const maxThresholdsPerBatch = 100

// QuotaRunner is a data plane's lease holder for its global quotas (issue
// 22): elected among the data plane's processes through its Redis with a
// fencing token (an INCR counter), as the DRL's allocator is, it keeps one
// lease.Holder per active slot (consumer, scope, policy, epoch) whose state
// lives in Redis beside the spend, asks the control plane for
// demand-sized chunks, reports cumulative spend and writes the leases the
// gateways' Takes spend (redisstore's global quota script). A runner that
// takes over restores every holder from Redis under its own, higher token.
// No request waits on it: a Take spends what Redis holds.
type QuotaRunner struct {
	o      QuotaRunnerOptions
	addrs  []string
	prefix string
	active string
	leaseK string
	fenceK string
	// thresholdK is the list of threshold events to report
	// (threshold.ReportKey).
	thresholdK string
	mu         sync.Mutex
	token      uint64
	rounds     uint64
	elected    bool
}

// NewQuotaRunner checks o and returns a runner; Run runs it.
func NewQuotaRunner(o QuotaRunnerOptions) (*QuotaRunner, error) {
	switch {
	case o.Client == nil:
		return nil, errors.New("dataplane: QuotaRunnerOptions.Client is nil")
	case o.Group == "":
		return nil, errors.New("dataplane: QuotaRunnerOptions.Group is empty")
	case o.Conn == nil && o.Address == "":
		return nil, errors.New("dataplane: QuotaRunnerOptions needs Address or Conn")
	}
	r := &QuotaRunner{o: o, prefix: o.KeyPrefix}
	if r.prefix == "" {
		r.prefix = redisstore.DefaultKeyPrefix
	}
	if o.Conn == nil {
		var err error
		if r.addrs, err = splitAddresses(o.Address); err != nil {
			return nil, err
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&r.o.Tick, 100*time.Millisecond)
	def(&r.o.ElectionTTL, time.Second)
	def(&r.o.CallTimeout, 2*time.Second)
	def(&r.o.PeriodGrace, 500*time.Millisecond)
	r.active = redisstore.GlobalActiveKey(r.prefix)
	r.leaseK = r.prefix + "{gq}:lease"
	r.fenceK = r.prefix + "{gq}:fence"
	r.thresholdK = threshold.ReportKey(r.prefix)
	return r, nil
}

// Token returns the runner's fencing token while it is the data plane's
// holder, else 0.
func (r *QuotaRunner) Token() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.elected {
		return 0
	}
	return r.token
}

// Rounds is the number of rounds the runner has run as holder.
func (r *QuotaRunner) Rounds() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rounds
}

func (r *QuotaRunner) fail(err error) {
	if r.o.OnError != nil && err != nil {
		r.o.OnError(err)
	}
}

// Redis scripts of the runner. Election as core/drl's: KEYS lease,
// fence; ARGV PX, nonce; returns the new token or 0 when held.
var (
	qElect = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. ':' .. ARGV[2], 'PX', ARGV[1])
return t
`)
	// KEYS lease; ARGV value, PX: 1 renewed, 0 not ours.
	qRenew = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)
	// KEYS lease; ARGV value: deletes the lease if ours.
	qResign = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`)
	// qClaim: KEYS slot; ARGV token. Sets tok to token unless a higher one
	// holds the slot; returns {ok, st, old}.
	qClaim = redis.NewScript(`
local t = tonumber(redis.call('HGET', KEYS[1], 'tok') or '0')
local mine = tonumber(ARGV[1])
if t > mine then return {0, '', ''} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, '', ''} end
redis.call('HSET', KEYS[1], 'tok', ARGV[1])
return {1, redis.call('HGET', KEYS[1], 'st') or '', redis.call('HGET', KEYS[1], 'old') or ''}
`)
	// qSave: KEYS slot; ARGV token, st, old ('' deletes it), L, pe, fa,
	// ct, co, ttl ms, then lease ids whose s:<id> to delete. Fenced:
	// returns 0 (nothing written) unless tok is the token, -1 when the
	// slot has no holder (it expired and a request made it again).
	qSave = redis.NewScript(`
local t = redis.call('HGET', KEYS[1], 'tok')
if not t then return -1 end
if t ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'L', ARGV[4], 'pe', ARGV[5], 'fa', ARGV[6], 'ct', ARGV[7], 'co', ARGV[8])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], 'old') else redis.call('HSET', KEYS[1], 'old', ARGV[3]) end
for i = 10, #ARGV do redis.call('HDEL', KEYS[1], 's:' .. ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[9])
return 1
`)
	// qMove: KEYS slot; ARGV token, old state. Moves the slot to a new
	// period: returns {ok, a, x, fl} as they were, and zeroes them, the
	// leases and the period end.
	qMove = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then return {0, 0, 0, 0} end
local v = redis.call('HMGET', KEYS[1], 'a', 'x', 'fl')
redis.call('HSET', KEYS[1], 'a', 0, 'x', 0, 'fl', 0, 'L', '', 'pe', 0, 'old', ARGV[2])
redis.call('HDEL', KEYS[1], 'st', 'o')
return {1, tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')}
`)
	// qDrop: KEYS slot, active; ARGV token, slot key. Drops an idle slot.
	qDrop = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'tok') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)
)

// spendMargin: the gateways stop spending a lease this long before its
// holder's StopAt, so a final report read at the runner's clock (Redis
// TIME of one node) covers every spend made at the slot's (on a Cluster,
// another node's clock).
const spendMargin = 100 * time.Millisecond

// slot is one active slot's holders in the runner.
type slot struct {
	key     string
	cur     *lease.Holder
	old     *lease.Holder // the previous period's, until it is done
	waitTil time.Time     // the new holder's first request waits until then
	ren     time.Duration
	lastUse time.Time
	// saved is the arguments of the last save, which a save that would
	// write the same skips.
	saved string
}

// Run runs the runner until ctx ends: it stands for election every Tick,
// and while elected runs a round every Tick. It returns nil when ctx
// ends; on the way out an elected runner gives up its election lease so
// another takes over at once.
func (r *QuotaRunner) Run(ctx context.Context) error {
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	var value string
	slots := map[string]*slot{}
	cl := &quotaClient{r: r}
	defer cl.close()
	t := time.NewTicker(r.o.Tick)
	defer t.Stop()
	px := r.o.ElectionTTL.Milliseconds()
	stepDown := func() {
		r.mu.Lock()
		r.elected = false
		r.mu.Unlock()
		value = ""
		clear(slots)
	}
	defer func() {
		if value != "" {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = qResign.Run(cctx, r.o.Client, []string{r.leaseK}, value).Err()
			cancel()
		}
	}()
	for {
		if value == "" {
			tok, err := qElect.Run(ctx, r.o.Client, []string{r.leaseK, r.fenceK}, px, nonce).Uint64()
			if err != nil && ctx.Err() == nil {
				r.fail(fmt.Errorf("dataplane: quota runner: election: %w", err))
			}
			if err == nil && tok > 0 {
				// The save script runs in pipelines, which cannot load it
				// after NOSCRIPT themselves.
				_ = qSave.Load(ctx, r.o.Client).Err()
				value = strconv.FormatUint(tok, 10) + ":" + nonce
				r.mu.Lock()
				r.token, r.elected = tok, true
				r.mu.Unlock()
			}
		} else {
			ok, err := qRenew.Run(ctx, r.o.Client, []string{r.leaseK}, value, px).Int()
			switch {
			case err != nil:
				if ctx.Err() == nil {
					r.fail(fmt.Errorf("dataplane: quota runner: renew: %w", err))
				}
			case ok == 0:
				stepDown()
			}
		}
		if value != "" {
			if fenced := r.round(ctx, cl, slots); fenced {
				if value != "" {
					cctx, cancel := context.WithTimeout(context.Background(), time.Second)
					_ = qResign.Run(cctx, r.o.Client, []string{r.leaseK}, value).Err()
					cancel()
				}
				stepDown()
			}
			r.mu.Lock()
			r.rounds++
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// slotFields is what a round reads of one slot's hash.
type slotFields map[string]string

func (f slotFields) int(k string) int64 {
	v, _ := strconv.ParseInt(f[k], 10, 64)
	return v
}

func modeOf(m int64) lease.Mode {
	switch core.GlobalMode(m) {
	case core.GlobalReserved:
		return lease.Reserved
	case core.GlobalOptimistic:
		return lease.Optimistic
	}
	return lease.Strict
}

func (r *QuotaRunner) holderOptions(f slotFields, tok uint64) lease.Options {
	o := r.o.Holder
	o.DataPlane, o.Token = r.o.Group, tok
	o.Entry = lease.EntryKey{Consumer: f["c"], Scope: f["s"], Policy: f["p"], Epoch: uint64(f.int("e"))}
	o.Mode = modeOf(f.int("m"))
	o.Quota = f.int("q")
	if ld := time.Duration(f.int("ld")); ld > 0 {
		o.LeaseDuration = ld
	}
	o.Floor = f.int("f0")
	if _, ok := f["fa"]; ok && f["st"] != "" {
		o.Floor = f.int("fa")
	}
	return o
}

// observe feeds the slot's Redis counters into h.
func observe(h *lease.Holder, f slotFields) {
	o := lease.Observed{Spent: map[lease.RequestID]int64{}, Admitted: f.int("a"), Refused: f.int("x"), FloorSpent: f.int("fl"), Offered: f.int("a") + f.int("x")}
	for _, l := range h.Leases() {
		o.Spent[l.ID] = f.int("s:" + leaseField(l.ID))
	}
	h.Observe(o)
}

// leaseField is a lease's ID as the Redis hash names it (no spaces).
func leaseField(id lease.RequestID) string {
	return strings.ReplaceAll(id.DataPlane, " ", "%20") + "/" + strconv.FormatUint(id.Token, 10) + "/" + strconv.FormatUint(id.Seq, 10)
}

// round runs one round as holder; fenced reports that a higher token
// holds the data plane (Redis or the ledger said so).
func (r *QuotaRunner) round(ctx context.Context, cl *quotaClient, slots map[string]*slot) (fenced bool) {
	tok := r.Token()
	if tok == 0 {
		return false
	}
	tm, err := r.o.Client.Time(ctx).Result()
	if err != nil {
		r.fail(fmt.Errorf("dataplane: quota runner: time: %w", err))
		return false
	}
	now := tm
	zs, err := r.o.Client.ZRangeWithScores(ctx, r.active, 0, -1).Result()
	if err != nil {
		r.fail(fmt.Errorf("dataplane: quota runner: active slots: %w", err))
		return false
	}
	pipe := r.o.Client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(zs))
	for i, z := range zs {
		cmds[i] = pipe.HGetAll(ctx, z.Member.(string))
	}
	if len(zs) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			r.fail(fmt.Errorf("dataplane: quota runner: read slots: %w", err))
			return false
		}
	}
	seen := map[string]bool{}
	for i, z := range zs {
		key := z.Member.(string)
		f := slotFields(cmds[i].Val())
		seen[key] = true
		lastUse := time.UnixMicro(int64(z.Score))
		if len(f) == 0 || f["c"] == "" {
			// The hash expired (idle) or vanished: drop it from the set.
			r.o.Client.ZRem(ctx, r.active, key)
			delete(slots, key)
			continue
		}
		s := slots[key]
		if s == nil {
			v, err := qClaim.Run(ctx, r.o.Client, []string{key}, tok).Slice()
			if err != nil {
				r.fail(fmt.Errorf("dataplane: quota runner: claim %s: %w", key, err))
				continue
			}
			switch v[0].(int64) {
			case 0:
				return true
			case -1:
				continue
			}
			s = &slot{key: key}
			o := r.holderOptions(f, tok)
			var oldState *lease.State
			if old, _ := v[2].(string); old != "" {
				var state lease.State
				if err := json.Unmarshal([]byte(old), &state); err == nil {
					oldState = &state
					// The current holder asks for no period up to the old
					// one's (GrantRequest.After).
					o.After = state.Entry.PeriodStart
				}
			}
			if st, _ := v[1].(string); st != "" {
				var state lease.State
				if err := json.Unmarshal([]byte(st), &state); err != nil {
					r.fail(fmt.Errorf("dataplane: quota runner: slot %s: state: %w", key, err))
					s.cur = lease.NewHolder(now, o)
				} else {
					s.cur = lease.Restore(o, state)
				}
			} else {
				s.cur = lease.NewHolder(now, o)
			}
			if oldState != nil {
				oo := o
				oo.Entry, oo.After = oldState.Entry, time.Time{}
				s.old = lease.Restore(oo, *oldState)
			}
			slots[key] = s
		}
		s.ren = time.Duration(f.int("ren"))
		s.lastUse = lastUse
		observe(s.cur, f)
	}
	for k := range slots {
		if !seen[k] {
			delete(slots, k)
		}
	}
	// Period ends: the old holder final-reports, the slot starts afresh.
	for _, s := range slots {
		pe := s.cur.State().PeriodEnd
		if pe.IsZero() || now.Before(pe) || s.old != nil {
			continue
		}
		oldState, _ := json.Marshal(s.cur.State())
		v, err := qMove.Run(ctx, r.o.Client, []string{s.key}, tok, string(oldState)).Int64Slice()
		if err != nil {
			r.fail(fmt.Errorf("dataplane: quota runner: new period %s: %w", s.key, err))
			continue
		}
		if v[0] == 0 {
			return true
		}
		h := s.cur
		o := lease.Observed{Admitted: v[1], Refused: v[2], FloorSpent: v[3], Offered: v[1] + v[2]}
		h.Observe(o)
		st := h.State()
		o2 := r.o.Holder
		o2.DataPlane, o2.Token = r.o.Group, tok
		e := h.Entry()
		o2.After = e.PeriodStart
		e.PeriodStart = time.Time{}
		o2.Entry, o2.Mode, o2.Floor = e, h.Mode(), h.Floor()
		// The new holder goes on counting the old one's sequences, so the
		// two never share a number even if the ledger named one entry.
		// The demand carries over (the first request need not wait for a
		// new rate), and the sequence numbers go on above the old
		// holder's, so the two never share one.
		base := max(st.GrantSeq, st.ReportSeq) + 1<<20
		s.cur = lease.Restore(o2, lease.State{GrantSeq: base, ReportSeq: base, Rate: st.Rate, RateAt: now,
			LastContact: st.LastContact, LastReport: now, Remaining: -1})
		s.old = h
		s.waitTil = pe.Add(r.o.PeriodGrace)
	}
	// Poll, persist (requests in flight must be in Redis before they are
	// sent, so a successor resends them under their IDs), send.
	var batch lease.Batch
	sentThresholds := 0
	for _, s := range slots {
		if s.old != nil {
			g, rep := s.old.Poll(now)
			if g != nil {
				batch.Grants = append(batch.Grants, *g)
			}
			if rep != nil {
				batch.Reports = append(batch.Reports, *rep)
			}
			if s.old.Done() || s.old.Fenced() {
				s.old = nil
			}
		}
		if s.old != nil && now.Before(s.waitTil) {
			continue
		}
		g, rep := s.cur.Poll(now)
		if g != nil {
			batch.Grants = append(batch.Grants, *g)
		}
		if rep != nil {
			batch.Reports = append(batch.Reports, *rep)
		}
	}
	if r.save(ctx, slots, tok, nil) {
		return true
	}
	held := map[string]map[lease.RequestID]bool{}
	for k, s := range slots {
		held[k] = leaseIDs(s)
	}
	// Threshold events the data plane's members claimed (threshold's
	// report list), oldest first; the list is trimmed once the control
	// plane kept them (only this runner trims, members only append).
	if raw, err := r.o.Client.LRange(ctx, r.thresholdK, 0, maxThresholdsPerBatch-1).Result(); err != nil {
		r.fail(fmt.Errorf("dataplane: quota runner: threshold events: %w", err))
	} else {
		for _, v := range raw {
			var ev lease.ThresholdEvent
			if json.Unmarshal([]byte(v), &ev) == nil {
				batch.Thresholds = append(batch.Thresholds, ev)
			}
		}
		sentThresholds = len(raw)
	}
	if len(batch.Grants)+len(batch.Reports)+sentThresholds > 0 {
		ans, err := cl.lease(ctx, batch)
		if err != nil {
			r.fail(err)
		} else {
			if sentThresholds > 0 {
				r.o.Client.LTrim(ctx, r.thresholdK, int64(sentThresholds), -1)
			}
			after := now
			if tm2, err := r.o.Client.Time(ctx).Result(); err == nil {
				after = tm2
			}
			if r.apply(after, slots, ans) {
				return true
			}
		}
	}
	// Drop acked leases' spend fields, and idle slots.
	drop := map[string][]string{}
	for k, s := range slots {
		now := leaseIDs(s)
		for id := range held[k] {
			if !now[id] {
				drop[k] = append(drop[k], leaseField(id))
			}
		}
	}
	if r.save(ctx, slots, tok, drop) {
		return true
	}
	for k, s := range slots {
		idle := max(s.ren, time.Second)
		if s.old == nil && s.cur.Done() && now.Sub(s.lastUse) > idle {
			if ok, err := qDrop.Run(ctx, r.o.Client, []string{k}, tok).Int(); err == nil && ok == 1 {
				r.o.Client.ZRem(ctx, r.active, k)
				delete(slots, k)
			}
		}
	}
	return false
}

// leaseIDs is the set of leases s's holders hold.
func leaseIDs(s *slot) map[lease.RequestID]bool {
	ids := map[lease.RequestID]bool{}
	for _, h := range []*lease.Holder{s.cur, s.old} {
		if h != nil {
			for _, l := range h.Leases() {
				ids[l.ID] = true
			}
		}
	}
	return ids
}

// save writes every slot's holders into Redis (fenced), deleting the spend
// fields of the leases in drop (slot key → lease fields); true when a slot
// is held by a higher token.
func (r *QuotaRunner) save(ctx context.Context, slots map[string]*slot, tok uint64, drop map[string][]string) bool {
	if len(slots) == 0 {
		return false
	}
	pipe := r.o.Client.Pipeline()
	cmds := make([]*redis.Cmd, 0, len(slots))
	keys := make([]string, 0, len(slots))
	for _, s := range slots {
		st := s.cur.State()
		b, _ := json.Marshal(st)
		var old []byte
		if s.old != nil {
			old, _ = json.Marshal(s.old.State())
		}
		var L strings.Builder
		for _, l := range st.Leases {
			fmt.Fprintf(&L, "%s %d %d\n", leaseField(l.ID), l.StopAt.Add(-spendMargin).UnixMicro(), l.Amount)
		}
		var pe int64
		if !st.PeriodEnd.IsZero() {
			pe = st.PeriodEnd.UnixMicro()
		}
		ttl := max(time.Minute, 2*s.ren).Milliseconds()
		floor := s.cur.Floor()
		if s.cur.Mode() == lease.Reserved && s.cur.Entry().PeriodStart.IsZero() {
			// A reserved floor is the ledger's, debited when it opened the
			// entry: none until a grant of the period has named it (the
			// entry may not open at all, when the floors exceed the quota).
			floor = 0
		}
		args := []any{tok, string(b), string(old), L.String(), pe, floor, st.LastContact.UnixMicro(), s.cur.CutOffAfter().Microseconds(), ttl}
		for _, f := range drop[s.key] {
			args = append(args, f)
		}
		sum := fmt.Sprint(args...)
		if sum == s.saved {
			continue
		}
		s.saved = sum
		cmds = append(cmds, qSave.Run(ctx, pipe, []string{s.key}, args...))
		keys = append(keys, s.key)
	}
	if len(cmds) == 0 {
		return false
	}
	_, _ = pipe.Exec(ctx)
	fenced := false
	for i, c := range cmds {
		n, err := c.Int()
		switch {
		case err != nil:
			slots[keys[i]].saved = "" // not written: write it next time
			if isNoScriptErr(err) {
				// The pipeline met an unloaded script: load it and go on;
				// the next round saves again.
				_ = qSave.Load(ctx, r.o.Client).Err()
				continue
			}
			r.fail(fmt.Errorf("dataplane: quota runner: save: %w", err))
		case n == -1:
			// Made again by a request after it expired: claimed afresh
			// next round.
			delete(slots, keys[i])
		case n == 0:
			fenced = true
		}
	}
	return fenced
}

func isNoScriptErr(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// apply routes the ledger's answers to the holders; true when the ledger
// fenced this runner's token. A grant or a grant's refusal goes to the
// holder whose request it answers: the same request ID on the same slot.
// Request IDs alone repeat across slots, since every slot's holder numbers
// its own requests (dp1/7/1 is the first request of each), and a grant of
// one slot's entry spent in another's would overshoot that entry's quota.
func (r *QuotaRunner) apply(now time.Time, slots map[string]*slot, ans lease.BatchAnswer) bool {
	type reqKey struct {
		slot lease.SlotID
		id   lease.RequestID
	}
	byReq := map[reqKey]*lease.Holder{}
	byEntry := map[lease.EntryID][]*lease.Holder{}
	for _, s := range slots {
		for _, h := range []*lease.Holder{s.cur, s.old} {
			if h == nil {
				continue
			}
			if p := h.State().Pending; p != nil {
				byReq[reqKey{h.Entry().Slot(), p.Request.ID}] = h
			}
			byEntry[h.Entry().ID()] = append(byEntry[h.Entry().ID()], h)
		}
	}
	for _, g := range ans.Grants {
		if h := byReq[reqKey{g.Entry.Slot(), g.ID}]; h != nil {
			h.HandleGrant(now, g)
		}
	}
	for _, a := range ans.Acks {
		for _, h := range byEntry[a.Entry.ID()] {
			h.HandleAck(now, a)
		}
	}
	fenced := false
	for _, f := range ans.Refusals {
		switch {
		case f.Request != nil:
			if h := byReq[reqKey{f.Entry.Slot(), *f.Request}]; h != nil {
				h.HandleGrantRefusal(now, *f.Request, f.Why)
				fenced = fenced || h.Fenced()
			}
		case f.Report != nil:
			for _, h := range byEntry[f.Entry.ID()] {
				h.HandleReportRefusal(now, f.Report.Token, f.Why)
				fenced = fenced || h.Fenced()
			}
		}
	}
	return fenced
}

// quotaClient is the runner's connection to the control plane's
// QuotaService, redialled with backoff after a failed call.
type quotaClient struct {
	r     *QuotaRunner
	cc    *grpc.ClientConn
	next  int
	bo    *backoff.ExponentialBackOff
	until time.Time // no call before (backoff after a failure)
}

func (c *quotaClient) close() {
	if c.cc != nil {
		_ = c.cc.Close()
		c.cc = nil
	}
}

func (c *quotaClient) conn() (grpc.ClientConnInterface, error) {
	if c.r.o.Conn != nil {
		return c.r.o.Conn, nil
	}
	if c.cc != nil {
		return c.cc, nil
	}
	addr := c.r.addrs[c.next%len(c.r.addrs)]
	c.next++
	creds := insecure.NewCredentials()
	if c.r.o.TLS != nil {
		creds = credentials.NewTLS(c.r.o.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, c.r.o.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dataplane: quota runner: dial %s: %w", addr, err)
	}
	c.cc = cc
	return cc, nil
}

// lease sends one batch. While backing off after a failure it sends
// nothing (the holders resend with the same IDs later).
func (c *quotaClient) lease(ctx context.Context, b lease.Batch) (lease.BatchAnswer, error) {
	if time.Now().Before(c.until) {
		return lease.BatchAnswer{}, errors.New("dataplane: quota runner: backing off")
	}
	cc, err := c.conn()
	if err == nil {
		var body []byte
		body, err = json.Marshal(b)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, c.r.o.CallTimeout)
			var resp syncpb.LeaseResponse
			err = cc.Invoke(cctx, syncpb.QuotaService_Lease_FullMethodName, &syncpb.LeaseRequest{Token: c.r.o.Token, Group: c.r.o.Group, Body: body}, &resp)
			cancel()
			if err == nil {
				var ans lease.BatchAnswer
				if err = json.Unmarshal(resp.GetBody(), &ans); err == nil {
					c.bo = nil
					return ans, nil
				}
				err = fmt.Errorf("decode answer: %w", err)
			}
		}
	}
	if c.bo == nil {
		c.bo = backoff.NewExponentialBackOff()
		c.bo.InitialInterval = 50 * time.Millisecond
		c.bo.MaxInterval = time.Second
		c.bo.Reset()
	}
	c.until = time.Now().Add(min(c.bo.NextBackOff(), time.Second))
	c.close()
	return lease.BatchAnswer{}, fmt.Errorf("dataplane: quota runner: lease call: %w", err)
}
