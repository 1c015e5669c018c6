package redisstore

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/redis/go-redis/v9"
)

// Global quotas (issue 22). With Options.FollowsControlPlane set, a quota
// marked global (core.Quota.Global) is not counted against Max here: the
// data plane's lease holder (dataplane.QuotaRunner) leases chunks of it
// from the control plane's ledger and writes them into a per-slot hash,
// and every Take spends them in the same script that checks the rate
// limit, exactly and atomically across the data plane's gateways.
//
// A slot is one ledger entry less its period start: (consumer, scope,
// policy, quota epoch). Its hash, in the consumer's hash tag beside the
// rate key (one script, one Cluster slot), is
//
//	<prefix>{<consumer-hash>}:gq.<epoch>:<escaped scope>:<escaped policy>
//
// with the fields (times in µs of the data plane's clock, Redis TIME or
// a test clock (Options.Seams); counts in units):
//
//	c s p e       consumer, scope, policy, epoch (written with each mark)
//	m f0 ren      mode (core.GlobalMode), configured floor, renewal (ns)
//	q ld          the quota's max and its lease duration (ns; 0 the
//	              ledger's default), which size the holder's requests
//	mk            the last mark: the slot was added to the active set then
//	L             leases, one "<id> <stop µs> <amount>" per line (the runner's)
//	s:<id>        units spent on lease <id>
//	pe            the period's end (0: not yet known)
//	fa            the data plane's floor in this period (the ledger's)
//	fl            floor units spent
//	ct co         the holder's last contact with the control plane, and the
//	              cut-off after which optimistic floors are spent
//	a x           units admitted and refused in the period (refused for
//	              want of budget; offered is a + x)
//	tok st old    the holder's fencing token, its state (JSON) and the state
//	              of the previous period's holder while it reports (JSON)
//
// and the active set, a sorted set of slot keys scored by last mark (µs):
//
//	<prefix>{gq}:active
//
// The spend takes the live lease that stops first, then the next, then the
// floor by mode: reserved always, optimistic while the holder's last
// contact is older than its cut-off, strict never. A request is admitted
// whole or refused whole (its cost). After the period's end nothing is
// spent until the runner moves the slot to the next period. The slot
// hash's TTL is two renewals (at least a minute), refreshed by marks and
// by the runner; the runner drops slots idle for a period.

// GlobalActiveKey returns the active set's key under prefix ("" is
// DefaultKeyPrefix).
func GlobalActiveKey(prefix string) string {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + "{gq}:active"
}

// GlobalSlotKey returns the hash key of the global quota slot (consumer,
// scope, policy, epoch) under prefix ("" is DefaultKeyPrefix).
func GlobalSlotKey(prefix, consumer, scope, policy string, epoch uint64) string {
	hx, _ := consumerHash(nil, consumer)
	return string(appendGlobalSlotKey(nil, prefix, &hx, scope, policy, epoch))
}

// DefaultGlobalCutOff is the cut-off of Options.GlobalCutOff's zero value.
const DefaultGlobalCutOff = 3 * time.Second

// globalMain replaces mainChunk for a global quota. KEYS[2] is the slot
// hash; ARGV[9..13] the algorithm's (padded), ARGV[14] consumer, [15]
// scope, [16] policy, [17] epoch, [18] mode, [19] configured floor, [20]
// cut-off µs, [21] the active set's key (written by Go, named for the
// reply), [22] renewal ns. Reply: {code, a..e, remaining after the call,
// reset pair (µs, ns), mark (1: add the slot to the active set), now µs}.
const globalMain = `
local H = KEYS[2]
local rate_on = ARGV[8] == '1'
local mode = tonumber(ARGV[18])
local g = redis.call('HMGET', H, 'L', 'pe', 'fl', 'fa', 'ct', 'co', 'mk')
-- A reserved floor is spent only once the ledger has debited it (fa, from
-- a grant of this period); an optimistic one is not debited in advance.
local floor = tonumber(g[4] or (mode == 2 and '0' or ARGV[19]))
local pe = tonumber(g[2] or '0')
local over = pe > 0 and now_u >= pe
-- The live leases with budget left: the first in l1 (id, budget, stop),
-- and only when there are more, all of them in ls (a table each, sorted
-- by stop); one lease, the common case, builds no table.
local ls, avail = nil, 0
local id1, a1, st1
if g[1] and not over then
  local L, i = g[1], 1
  while true do
    local _, e, id, stop, amt = string.find(L, '(%S+) (%d+) (%d+)', i)
    if not e then break end
    i = e + 1
    stop = tonumber(stop)
    if now_u < stop then
      local a = tonumber(amt) - tonumber(redis.call('HGET', H, 's:' .. id) or '0')
      if a > 0 then
        avail = avail + a
        if not id1 then
          id1, a1, st1 = id, a, stop
        else
          if not ls then ls = {{id1, a1, st1}} end
          ls[#ls + 1] = {id, a, stop}
        end
      end
    end
  end
end
if ls then table.sort(ls, function(x, y) return x[3] < y[3] end) end
local fused = tonumber(g[3] or '0')
local ct = tonumber(g[5] or '-1')
if ct < 0 then
  ct = now_u
  redis.call('HSET', H, 'ct', string.format('%d', now_u))
end
local fav = 0
if not over and (mode == 2 or (mode == 3 and now_u - ct >= tonumber(g[6] or ARGV[20]))) then
  fav = math.max(0, floor - fused)
end
local mark = 0
local mk = tonumber(g[7] or '0')
if n > 0 and now_u - mk >= 1000000 then
  mark = 1
  redis.call('HSET', H, 'mk', string.format('%d', now_u), 'c', ARGV[14], 's', ARGV[15], 'p', ARGV[16], 'e', ARGV[17], 'm', ARGV[18], 'f0', ARGV[19], 'ren', ARGV[22], 'q', ARGV[4], 'ld', ARGV[23])
  local ttl_ms = math.max(60000, math.floor(2 * tonumber(ARGV[22]) / 1000000)) + margin
  redis.call('PEXPIRE', H, ttl_ms)
end
local function reply(code, rem, a, b, c, d, e)
  local ru, rr = ren_u, ren_r
  if pe > 0 then
    ru, rr = pe - now_u, 0
    if ru < 0 then ru = 0 end
  end
  if code == 2 and not over and ru > 1000000 then
    -- Refused for want of budget while the period runs: the holder may
    -- get more from the ledger at any moment, so the retry is a second
    -- away, not the period's end.
    ru, rr = 1000000, 0
  end
  return {code, a, b, c, d, e, rem, ru, rr, mark, now_u}
end
if n > avail + fav then
  if n > 0 then
    redis.call('HINCRBY', H, 'x', n)
  end
  if rate_on then return reply(2, avail + fav, rate_peek()) end
  return reply(2, avail + fav, 0, 0, 0, 0, 0)
end
local a, b, c, d, e = 0, 0, 0, 0, 0
if rate_on then
  local ok
  ok, a, b, c, d, e = rate_take()
  if not ok then return reply(1, avail + fav, a, b, c, d, e) end
end
if n > 0 then
  local left = n
  if ls then
    for i = 1, #ls do
      if left == 0 then break end
      local t = math.min(left, ls[i][2])
      redis.call('HINCRBY', H, 's:' .. ls[i][1], t)
      left = left - t
    end
  elseif id1 then
    local t = math.min(left, a1)
    redis.call('HINCRBY', H, 's:' .. id1, t)
    left = left - t
  end
  if left > 0 then redis.call('HINCRBY', H, 'fl', left) end
  redis.call('HINCRBY', H, 'a', n)
end
return reply(0, avail + fav - n, a, b, c, d, e)
`

// globalScripts holds one global-quota script per rate algorithm.
var globalScripts = [...]script{
	core.GCRA:          newScript(prelude + gcraChunk + globalMain),
	core.SlidingWindow: newScript(prelude + slidingChunk + globalMain),
	core.FixedWindow:   newScript(prelude + fixedChunk + globalMain),
	core.SlidingLog:    newScript(prelude + logChunk + globalMain),
}

// appendGlobalSlotKey appends to b the slot key GlobalSlotKey names, from
// the consumer's hash hx.
func appendGlobalSlotKey(b []byte, prefix string, hx *[32]byte, scope, policy string, epoch uint64) []byte {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	b = append(b, prefix...)
	b = append(b, '{')
	b = append(b, hx[:]...)
	b = append(b, "}:gq."...)
	b = strconv.AppendUint(b, epoch, 10)
	b = append(b, ':')
	b = appendScope(b, scope)
	b = append(b, ':')
	return appendScope(b, policy)
}

// takeGlobal is Take for a rule whose quota is global (rule.global). It
// runs like every other Take, batched with the others unless
// Options.Pipeline is negative.
func (s *Store) takeGlobal(ctx context.Context, req core.Request, r *rule) (core.Decision, error) {
	n := req.Cost
	scope := req.Rule.Scope()
	g := r.qt.Global
	c := s.calls.Get().(*call)
	c.reset(globalScripts[r.alg], 2)
	var hx [32]byte
	hx, c.keys[1].b = consumerHash(c.keys[1].b, req.Consumer)
	c.keys[0].b = s.appendKey(c.keys[0].b, &hx, kindNames[r.alg], scope)
	c.keys[1].b = appendGlobalSlotKey(c.keys[1].b[:0], s.prefix, &hx, scope, g.Policy, req.QuotaEpoch)
	s.appendNow(c)
	ren := int64(r.qt.Renewal)
	c.int(n)
	c.int(r.qt.Max)
	c.pair(ren)
	c.int(s.margin)
	if r.limited {
		c.args = append(c.args, "1")
		switch r.alg {
		case core.GCRA:
			p := &r.p
			bound := p.Tau + req.Reservation()
			nt := bound + 1
			if n <= p.Burst {
				nt = n * p.T
			}
			c.args = append(c.args, r.tsuf)
			c.pair(nt)
			c.pair(bound)
		case core.FixedWindow:
			c.int(r.rate.Rate)
			c.pair(int64(r.rate.Period))
			c.args = append(c.args, "0", "0")
		default:
			c.int(r.rate.Rate)
			c.int(r.rate.Period.Microseconds())
			c.args = append(c.args, "0", "0", "0")
		}
	} else {
		c.args = append(c.args, "0", "0", "0", "0", "0", "0")
	}
	c.cons.b = append(c.cons.b[:0], req.Consumer...) // (a string in an interface would be a heap allocation)
	c.args = append(c.args, &c.cons, r.gargs[0], r.gargs[1])
	c.int(int64(req.QuotaEpoch))
	c.int(int64(g.Mode))
	c.int(g.Floor)
	c.int(s.cutoff.Microseconds())
	c.args = append(c.args, s.activeArg)
	c.int(ren)
	c.int(int64(g.LeaseDuration))
	v, err := s.run(ctx, c, 11)
	if err != nil {
		return core.Decision{}, err
	}
	if v[9] == 1 {
		// The script marks a slot at most once a second; the marker adds it
		// to the active set off the request path.
		var kb [128]byte
		s.marks.add(string(appendGlobalSlotKey(kb[:0], s.prefix, &hx, scope, g.Policy, req.QuotaEpoch)), v[10])
	}
	// decision reads the quota's used count at v[6]: give it Max −
	// remaining, so Remaining is the budget left to this data plane.
	v[6] = r.qt.Max - v[6]
	d, err := decision(req, r, v[:9])
	if err == nil && r.seed != nil {
		s.seedWith(req, r, d)
	}
	return d, err
}

// maxPendingMarks bounds the marks waiting for the marker's next write; a
// mark beyond it is dropped, and made again by the slot's next request a
// second later, as a mark whose write fails is.
const maxPendingMarks = 1 << 16

// marker adds global quota slots to the active set (GlobalActiveKey) off
// the request path. takeGlobal hands it the slots its script marked (each
// at most once a second); one goroutine, started by the first mark and
// stopped by Store.Close, writes whatever has gathered meanwhile with one
// ZADD. A Take therefore makes no round trip of its own for its mark. The
// runner reads the active set a second or more apart, so a mark written a
// few milliseconds after its request changes nothing it does.
type marker struct {
	s       *Store
	start   sync.Once
	mu      sync.Mutex
	pending map[string]int64 // slot key → mark (µs); nil once closed
	wake    chan struct{}    // cap 1: something is pending
	ctx     context.Context  // ended by close
	cancel  context.CancelFunc
	done    chan struct{} // closed when run has returned
}

func (m *marker) init(s *Store) {
	m.s = s
	m.pending = make(map[string]int64)
	m.wake = make(chan struct{}, 1)
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.done = make(chan struct{})
}

// add queues slot's mark at (µs). It never blocks on Redis.
func (m *marker) add(slot string, at int64) {
	m.start.Do(func() { go m.run() })
	m.mu.Lock()
	if m.pending == nil || (len(m.pending) >= maxPendingMarks && m.pending[slot] == 0) {
		m.mu.Unlock()
		return
	}
	m.pending[slot] = at
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run writes the pending marks until close.
func (m *marker) run() {
	defer close(m.done)
	ctx := m.ctx
	next := make(map[string]int64)
	var zs []redis.Z
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
		m.mu.Lock()
		if m.pending == nil {
			m.mu.Unlock()
			return
		}
		cur := m.pending
		m.pending = next
		m.mu.Unlock()
		zs = zs[:0]
		for k, at := range cur {
			zs = append(zs, redis.Z{Score: float64(at), Member: k})
		}
		clear(cur)
		next = cur
		// A failed write is not retried: each slot's next request marks it
		// again a second later.
		_, _ = m.s.call(ctx, func(ctx context.Context) ([]int64, error) {
			return nil, m.s.client.ZAdd(ctx, m.s.activeKey, zs...).Err()
		})
		clear(zs)
	}
}

// close stops the goroutine, if one started, and waits for it; marks not
// yet written are dropped. It may be called more than once.
func (m *marker) close() {
	m.mu.Lock()
	m.pending = nil
	m.mu.Unlock()
	m.start.Do(func() { close(m.done) }) // never started: nothing to wait for
	m.cancel()
	<-m.done
}
