package redisstore

import (
	"github.com/limitplane/limitplane/core"
	"github.com/redis/go-redis/v9"
)

// The Lua scripts. Each is one prelude (time, quota) plus one algorithm's
// rate_peek/rate_take plus the shared main, so a single EVALSHA checks the
// rate limit and the quota of a request together and writes only when both
// allow it.
//
// Numbers. Redis runs Lua 5.1, whose numbers are IEEE doubles: integers are
// exact below 2^53, and Redis truncates a Lua number to an integer reply.
// Absolute times therefore never appear in nanoseconds (about 2^60 today):
// a time or duration x in ns is carried as the pair (u, r) = (x div 1000,
// x mod 1000), microseconds plus a sub-microsecond remainder, and stored as
// the decimal string of x built from the pair. Every pair's u is below
// 2^61/1000 < 2^51 (core bounds τ and Renewal by 2^61 ns), so GCRA, fixed
// windows and quotas are exact to the nanosecond, and replies are pairs of
// integers that survive the integer conversion. Redis TIME has microsecond
// resolution, so in production r is 0 for "now". The sliding window and
// sliding log count in whole microseconds (see Store.Take).
//
// Arguments shared by all scripts:
//
//	KEYS[1] rate key, KEYS[2] quota key (same hash tag, so same slot)
//	ARGV[1], ARGV[2]  now as a pair, or ARGV[1] == "" to read Redis TIME
//	ARGV[3]           cost n
//	ARGV[4]           quota Max, or -1 for no quota
//	ARGV[5], ARGV[6]  quota Renewal as a pair
//	ARGV[7]           TTL margin in ms
//	ARGV[8]           "1" when a rate limit applies
//	ARGV[9...]        the algorithm's parameters
//
// Reply: {code, a, b, c, d, e, quota_used, quota_reset_u, quota_reset_r,
// quota_end_u, quota_end_r} (the quota period's end, 0 0 when none: what a
// settle names the period by)
// with code 0 allowed, 1 denied by the rate limit, 2 denied by the quota;
// a..e are the algorithm's (see each chunk).
const prelude = `
local now_u, now_r
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_u, now_r = tonumber(t[1]) * 1000000 + tonumber(t[2]), 0
else
  now_u, now_r = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local n = tonumber(ARGV[3])
local qmax = tonumber(ARGV[4])
local ren_u, ren_r = tonumber(ARGV[5]), tonumber(ARGV[6])
local margin = tonumber(ARGV[7])

-- pair arithmetic: (u, r) = u µs + r ns, 0 <= r < 1000
local function sub(au, ar, bu, br)
  local u, r = au - bu, ar - br
  if r < 0 then u, r = u - 1, r + 1000 end
  return u, r
end
local function add(au, ar, bu, br)
  local u, r = au + bu, ar + br
  if r >= 1000 then u, r = u + 1, r - 1000 end
  return u, r
end
local function lt(au, ar, bu, br)
  return au < bu or (au == bu and ar < br)
end
-- decimal ns string <-> pair
local function enc(u, r)
  return string.format('%d%03d', u, r)
end
local function dec(s)
  if not s then return nil end
  local l = string.len(s)
  if l <= 3 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, l - 3)), tonumber(string.sub(s, l - 2))
end
-- PEXPIRE value for a lifetime of (u, r) >= 0: whole ms rounded up, plus margin
local function ttl(u, r)
  local ms = math.floor(u / 1000)
  if u % 1000 > 0 or r > 0 or ms < 1 then ms = ms + 1 end
  return ms + margin
end
-- exact floor(x / y) for integers 0 <= x, 0 < y below 2^53
local function fdiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then q = q - 1 elseif (q + 1) * y <= x then q = q + 1 end
  return q
end
-- a window that opens at its first spend: hash {used, end}; returns
-- used, end pair (end_u false when no window is open at now)
local function win_load(key)
  local v = redis.call('HMGET', key, 'used', 'end')
  if v[1] and v[2] then
    local eu, er = dec(v[2])
    if lt(now_u, now_r, eu, er) then return tonumber(v[1]), eu, er end
  end
  return 0, false, 0
end
-- spends m > 0 units in the window, opening one of length (lu, lr) if needed
local function win_spend(key, used, eu, er, m, lu, lr)
  if eu then
    redis.call('HINCRBY', key, 'used', m)
    return used + m, eu, er
  end
  eu, er = add(now_u, now_r, lu, lr)
  redis.call('HSET', key, 'used', m, 'end', enc(eu, er))
  redis.call('PEXPIRE', key, ttl(lu, lr))
  return m, eu, er
end
`

// gcraChunk: ARGV[9] ":" and the emission interval T in decimal ns (see
// gcraValue), ARGV[10..11] n×T, or for a cost above the burst the bound
// plus 1 ns (no offset ≥ 0 fits under it), ARGV[12..13] the bound: τ plus
// the reservation window; all pairs. The rate key is a string, gcraValue.
// Reply a, b: the effective TAT before the call minus now, as a pair,
// after a rescale (see gcraDecode); Go derives the Decision from it with
// core.GCRAParams.Step, the one GCRA oracle, and checks that Step agrees
// with the script's verdict. A key rescaled and not otherwise written (a
// denial, a peek) is written with its rescaled TAT under the new T.
const gcraChunk = `
local ts = ARGV[9]
local nt_u, nt_r = tonumber(ARGV[10]), tonumber(ARGV[11])
local tau_u, tau_r = tonumber(ARGV[12]), tonumber(ARGV[13])
local g_conv = false
local function g_offset()
  local s = redis.call('GET', KEYS[1])
` + gcraDecode + `
  g_conv = conv
  local tu, tr = add(now_u, now_r, du, dr)
  return tu, tr, du, dr
end
-- writes a rescaled key that the call does not otherwise write
local function g_keep(tu, tr, du, dr)
  if g_conv then redis.call('SET', KEYS[1], enc(tu, tr) .. ts, 'PX', ttl(du, dr)) end
end
local function rate_peek()
  local tu, tr, du, dr = g_offset()
  g_keep(tu, tr, du, dr)
  return du, dr, 0, 0, 0
end
local function rate_take()
  local tu, tr, du, dr = g_offset()
  local xu, xr = add(du, dr, nt_u, nt_r)
  if lt(tau_u, tau_r, xu, xr) then
    g_keep(tu, tr, du, dr)
    return false, du, dr, 0, 0, 0
  end
  if n > 0 then
    local su, sr = add(tu, tr, nt_u, nt_r)
    redis.call('SET', KEYS[1], enc(su, sr) .. ts, 'PX', ttl(xu, xr))
  else
    g_keep(tu, tr, du, dr)
  end
  return true, du, dr, 0, 0, 0
end
`

// fixedChunk: ARGV[9] Rate, ARGV[10..11] Period as a pair. The rate key is
// a window hash like the quota's. Reply: a remaining (≥ 0), (b, c) time until the
// window closes (0 when none is open), (d, e) the same when denied.
const fixedChunk = `
local R = tonumber(ARGV[9])
local pu, pr = tonumber(ARGV[10]), tonumber(ARGV[11])
local function fw_reply(used, eu, er, denied)
  local ru, rr = 0, 0
  if eu then ru, rr = sub(eu, er, now_u, now_r) end
  -- (used exceeds R when R was lowered within the window)
  local rem = R - used
  if rem < 0 then rem = 0 end
  if denied then return rem, ru, rr, ru, rr end
  return rem, ru, rr, 0, 0
end
local function rate_peek()
  local used, eu, er = win_load(KEYS[1])
  return fw_reply(used, eu, er, false)
end
local function rate_take()
  local used, eu, er = win_load(KEYS[1])
  if n > R or used + n > R then return false, fw_reply(used, eu, er, true) end
  if n > 0 then used, eu, er = win_spend(KEYS[1], used, eu, er, n, pu, pr) end
  return true, fw_reply(used, eu, er, false)
end
`

// slidingChunk: ARGV[9] Rate, ARGV[10] Period in µs; time in whole µs.
// The rate key is a hash {s: current window start, c: its count, p: the
// previous window's count}. Windows are consecutive Periods from the first
// request; a request two Periods after s starts a fresh chain at now. The
// estimate is c + p×(P−e)/P with e = now − s; a request of n passes iff
// p×(P−e) ≤ (Rate−c−n)×P (exact integers: Rate×P < 2^53). Reply: a
// remaining = Rate − c − ceil(p×(P−e)/P), b reset (µs until both windows
// have faded), d retry (µs until the same request would pass).
const slidingChunk = `
local R, P = tonumber(ARGV[9]), tonumber(ARGV[10])
local now = now_u
local function sw_load()
  local v = redis.call('HMGET', KEYS[1], 's', 'c', 'p')
  local s, c, p = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if not s or now >= s + 2 * P then return now, 0, 0 end
  if now >= s + P then return s + P, 0, c end
  return s, c, p
end
local function sw_reply(s, c, p, denied)
  local e = now - s
  local w = 0
  if p > 0 then w = fdiv(p * (P - e) + P - 1, P) end
  local rem = R - c - w
  if rem < 0 then rem = 0 end
  local reset = 0
  if c > 0 then reset = s + 2 * P - now elseif p > 0 then reset = s + P - now end
  local retry = 0
  if denied and n <= R then
    local k = R - c - n
    if k >= 0 then
      retry = P - fdiv(k * P, p) - e
    else
      retry = 2 * P - e - fdiv((R - n) * P, c)
    end
  end
  return rem, reset, 0, retry, 0
end
local function rate_peek()
  local s, c, p = sw_load()
  return sw_reply(s, c, p, false)
end
local function rate_take()
  local s, c, p = sw_load()
  local k = R - c - n
  if n > R or k < 0 or p * (P - (now - s)) > k * P then return false, sw_reply(s, c, p, true) end
  if n > 0 then
    c = c + n
    redis.call('HSET', KEYS[1], 's', string.format('%d', s), 'c', c, 'p', p)
    redis.call('PEXPIRE', KEYS[1], ttl(s + 2 * P - now, 0))
  end
  return true, sw_reply(s, c, p, false)
end
`

// logChunk: ARGV[9] Rate, ARGV[10] Period in µs; time in whole µs. The
// rate key is a sorted set with one member per microsecond in which
// requests were admitted, scored by that microsecond and named
// "<µs>:<cum>:<units>": units is the cost admitted in it, cum the running
// total of units admitted through it, modulo 2^53. The live members are
// those scored in (now − P, now]; scores only grow (a request admitted at
// or before the newest member's microsecond, as after Redis TIME stepped
// back, is merged into it), so the live ones are the newest, and their
// units add up to cum(newest) − (cum(oldest live) − units(oldest live)),
// exact modulo 2^53 since at most Rate < 2^53 units are live. So a request
// costs the same whatever its cost: it adds or rewrites one member and
// removes at most 16 expired ones (the key's TTL drops the
// rest), a denied one changes nothing, and RetryAfter is found by a binary
// search over the live members, O(log² members). The set holds at most one
// member per µs of the Period and at most Rate live ones. Reply: a
// remaining, b reset (µs until the newest live member expires), d retry
// (µs until enough units expire for the same request to pass).
const logChunk = `
local R, P = tonumber(ARGV[9]), tonumber(ARGV[10])
local now = now_u
local M = 9007199254740992
-- (a + b) mod 2^53 and (a - b) mod 2^53 for 0 <= a, b < 2^53, exact in doubles
local function madd(a, b)
  if a >= M - b then return a - (M - b) end
  return a + b
end
local function msub(a, b)
  if a >= b then return a - b end
  return (a - b) + M
end
local function sl_cu(m)
  local c, u = string.match(m, ':(%d+):(%d+)$')
  return tonumber(c), tonumber(u)
end
-- live units; e, the number of expired members (ranks 0..e-1); base, the
-- running total before the oldest live member; the newest member and its
-- score (false, 0 when the set is empty)
local function sl_state()
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #top == 0 then return 0, 0, 0, false, 0 end
  local ts = tonumber(top[2])
  local e = redis.call('ZCOUNT', KEYS[1], '-inf', string.format('%d', now - P))
  if ts <= now - P then return 0, e, 0, top[1], ts end
  local c1, u1 = sl_cu(redis.call('ZRANGE', KEYS[1], e, e)[1])
  local base = msub(c1, u1)
  return msub(sl_cu(top[1]), base), e, base, top[1], ts
end
local function sl_reply(count, e, base, ts, denied)
  local reset, retry = 0, 0
  if count > 0 then reset = ts + P - now end
  if denied and n <= R then
    -- the oldest live member through which at least need units expire
    local need = count - (R - n)
    local lo, hi = e, redis.call('ZCARD', KEYS[1]) - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if msub(sl_cu(redis.call('ZRANGE', KEYS[1], mid, mid)[1]), base) >= need then hi = mid else lo = mid + 1 end
    end
    local v = redis.call('ZRANGE', KEYS[1], lo, lo, 'WITHSCORES')
    retry = tonumber(v[2]) + P - now
  end
  local rem = R - count
  if rem < 0 then rem = 0 end
  return rem, reset, 0, retry, 0
end
local function rate_peek()
  local count, e, base, _, ts = sl_state()
  return sl_reply(count, e, base, ts, false)
end
local function rate_take()
  local count, e, base, top, ts = sl_state()
  if n > R or n > R - count then return false, sl_reply(count, e, base, ts, true) end
  if n > 0 then
    local c, u = 0, 0
    if top then c, u = sl_cu(top) end
    if top and ts >= now then
      redis.call('ZREM', KEYS[1], top)
      redis.call('ZADD', KEYS[1], ts, string.format('%d:%d:%d', ts, madd(c, n), u + n))
    else
      ts = now
      redis.call('ZADD', KEYS[1], ts, string.format('%d:%d:%d', ts, madd(c, n), n))
    end
    if e > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, math.min(e, 16) - 1) end
    redis.call('PEXPIRE', KEYS[1], ttl(ts + P - now, 0))
    count = count + n
  end
  return true, sl_reply(count, e, base, ts, false)
end
`

// mainChunk checks the quota (an exhausted quota denies without touching
// the rate limit), then the rate limit, and spends the quota only when the
// rate limit allowed.
const mainChunk = `
local q_on = qmax >= 0
local rate_on = ARGV[8] == '1'
local q_used, q_eu, q_er = 0, false, 0
if q_on then q_used, q_eu, q_er = win_load(KEYS[2]) end
local function reply(code, a, b, c, d, e)
  local ru, rr = ren_u, ren_r
  if q_eu then ru, rr = sub(q_eu, q_er, now_u, now_r) end
  return {code, a, b, c, d, e, q_used, ru, rr, q_eu or 0, q_er}
end
if q_on and q_used + n > qmax then
  if rate_on then return reply(2, rate_peek()) end
  return reply(2, 0, 0, 0, 0, 0)
end
local a, b, c, d, e = 0, 0, 0, 0, 0
if rate_on then
  local ok
  ok, a, b, c, d, e = rate_take()
  if not ok then return reply(1, a, b, c, d, e) end
end
if q_on and n > 0 then
  q_used, q_eu, q_er = win_spend(KEYS[2], q_used, q_eu, q_er, n, ren_u, ren_r)
end
return reply(0, a, b, c, d, e)
`

// gcraOnly is the script for the commonest request, a GCRA rate limit
// without a quota: the same decision, key, value and TTL as prelude +
// gcraChunk + mainChunk with the quota off, without the helpers and the
// quota arguments that cost most of a call's time in Redis's Lua. It uses
// KEYS[1] (the rate key) and
//
//	ARGV[1], ARGV[2]  now as a pair, or ARGV[1] == "" to read Redis TIME
//	ARGV[3], ARGV[4]  n×T as a pair; for a cost above the burst, the
//	                  bound plus 1 ns, which no offset ≥ 0 fits under
//	ARGV[5], ARGV[6]  the bound: τ plus the reservation window, as a pair
//	ARGV[7]           TTL margin in ms
//	ARGV[8]           ":" and the emission interval T in decimal ns
//
// and replies {code, a, b}: code 0 allowed or 1 denied, (a, b) the
// effective TAT before the call minus now, as gcraChunk's. It writes when
// allowed with n×T > 0, and otherwise only a key it rescaled.
const gcraOnly = `
local now_u, now_r
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_u, now_r = t[1] * 1000000 + t[2], 0
else
  now_u, now_r = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local ts = ARGV[8]
local s = redis.call('GET', KEYS[1])
` + gcraDecode + `
local tu, tr = now_u + du, now_r + dr
if tr >= 1000 then tu, tr = tu + 1, tr - 1000 end
local nt_u, nt_r = tonumber(ARGV[3]), tonumber(ARGV[4])
local xu, xr = du + nt_u, dr + nt_r
if xr >= 1000 then xu, xr = xu + 1, xr - 1000 end
local bu, br = tonumber(ARGV[5]), tonumber(ARGV[6])
local code = 0
if xu > bu or (xu == bu and xr > br) then
  code = 1
elseif nt_u > 0 or nt_r > 0 then
  local su, sr = tu + nt_u, tr + nt_r
  if sr >= 1000 then su, sr = su + 1, sr - 1000 end
  local ms = math.floor(xu / 1000)
  if xu % 1000 > 0 or xr > 0 or ms < 1 then ms = ms + 1 end
  redis.call('SET', KEYS[1], string.format('%d%03d%s', su, sr, ts), 'PX', ms + tonumber(ARGV[7]))
  return {0, du, dr}
end
if conv then
  local ms = math.floor(du / 1000)
  if du % 1000 > 0 or dr > 0 or ms < 1 then ms = ms + 1 end
  redis.call('SET', KEYS[1], string.format('%d%03d%s', tu, tr, ts), 'PX', ms + tonumber(ARGV[7]))
end
return {code, du, dr}
`

// penalize is Store.Penalize's script: it moves the TAT of KEYS[1], a
// GCRA rate key, to at least now + (ARGV[3], ARGV[4]), never back, in one
// step with the rescale of gcraDecode. ARGV[1], ARGV[2] are now as in the
// other scripts, ARGV[5] is ":" and T (gcraValue), ARGV[6] the TTL margin
// in ms. The key is written, with the TTL the GCRA scripts give it
// (ceil(TAT − now) in ms plus the margin), when its TAT moves or it was
// rescaled. Reply {moved, a, b}: moved 1 when the TAT moved, (a, b) the
// TAT afterwards minus now, as a pair.
const penalize = `
local now_u, now_r
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_u, now_r = t[1] * 1000000 + t[2], 0
else
  now_u, now_r = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local ts = ARGV[5]
local s = redis.call('GET', KEYS[1])
` + gcraDecode + `
local pu, pr = tonumber(ARGV[3]), tonumber(ARGV[4])
local moved = 0
if du < pu or (du == pu and dr < pr) then du, dr, moved = pu, pr, 1 end
if moved == 1 or conv then
  local tu, tr = now_u + du, now_r + dr
  if tr >= 1000 then tu, tr = tu + 1, tr - 1000 end
  local ms = math.floor(du / 1000)
  if du % 1000 > 0 or dr > 0 or ms < 1 then ms = ms + 1 end
  redis.call('SET', KEYS[1], string.format('%d%03d%s', tu, tr, ts), 'PX', ms + tonumber(ARGV[6]))
end
return {moved, du, dr}
`

// gcraValue: a GCRA rate key holds the string "<TAT>:<T>", the
// theoretical arrival time and the emission interval of the limit that
// wrote it, both in decimal ns, so that a request under another T (the
// limit was changed) can carry the key's spent amount over (gcraDecode).
// A key written by an earlier release holds "<TAT>" alone: its T is
// unknown and its TAT is taken as it is. (An earlier release cannot read
// the new value: its script fails on it; see the package comment.)
//
// gcraDecode is inlined where a script reads a GCRA key. In: s (the key's
// value, or false), ts (":" and the request's T), now_u, now_r. Out:
// locals du, dr, the debt TAT − now as a pair (0 when the TAT has passed
// or there is none), and conv, true when the key was written under
// another, known T and the debt has been rescaled to this one: the same
// number of emission intervals, ⌈(TAT − now) × T_new / T_old⌉ ns, at most
// 2^62 ns (core.MaxTolerance plus core.MaxReservation), as core/memory
// rescales. That is exact integer arithmetic: Lua numbers are doubles, so
// the product (up to 2^124) is computed in base-2^24 limbs (every limb
// product and sum below 2^53) and divided by T_old limb by limb, each
// quotient limb estimated in doubles and corrected exactly; it runs only
// when a key's T changes, the common path pays one string comparison. A stored T that is
// not a decimal of at most 19 digits without leading zeros counts as
// unknown.
const gcraDecode = `
local du, dr, conv = 0, 0, false
if s then
  local L, told = #s - #ts, false
  if string.sub(s, L + 1) ~= ts then
    local c = string.find(s, ':', 1, true)
    if c then L, told = c - 1, string.sub(s, c + 1) else L = #s end
  end
  local u, r = 0, tonumber(string.sub(s, 1, L))
  if L > 3 then u, r = tonumber(string.sub(s, 1, L - 3)), tonumber(string.sub(s, L - 2, L)) end
  if u > now_u or (u == now_u and r > now_r) then
    du, dr = u - now_u, r - now_r
    if dr < 0 then du, dr = du - 1, dr + 1000 end
    if told and #told <= 19 and string.find(told, '^[1-9]%d*$') then
` + rescaleFn + `
      du, dr = rescale(du, dr, told, string.sub(ts, 2))
      conv = true
    end
  end
end
`

// rescaleFn defines rescale(du, dr, from, to): ⌈(du µs + dr ns) × to /
// from⌉ as a pair, at most 2^62 ns, for a debt below 2^63 ns and from,
// to decimal strings of integers in [1, 10^19) (see gcraDecode). It is
// defined where it is called, so a call that does not rescale creates no
// closures for it.
const rescaleFn = `
local function rescale(du, dr, from, to)
  -- (x % y and (x - x % y) / y are exact for the integers below 2^53
  -- here, and cheaper in Redis's Lua than math.floor and tonumber)
  local B = 16777216
  -- base-2^24 limbs, least significant first, of x·k + y for integers
  -- 0 ≤ x < 2^53, 0 < k ≤ 10^6, 0 ≤ y < k
  local function limbs(x, k, y)
    local l0 = x % B
    x = (x - l0) / B
    local l1 = x % B
    local L, carry = {l0, l1, (x - l1) / B}, y
    for i = 1, 3 do
      local v = L[i] * k + carry
      L[i] = v % B
      carry = (v - L[i]) / B
    end
    if carry > 0 then L[4] = carry end
    while #L > 1 and L[#L] == 0 do L[#L] = nil end
    return L
  end
  -- of a decimal string of at most 19 digits: (its head) × 10^6 + its
  -- last 6 digits
  local function dlimbs(x)
    local n = #x
    if n <= 6 then return limbs(0, 1000000, x + 0) end
    return limbs(string.sub(x, 1, n - 6) + 0, 1000000, string.sub(x, n - 5) + 0)
  end
  local a, b, d = limbs(du, 1000, dr), dlimbs(to), dlimbs(from)
  -- p = a × b
  local p = {}
  for k = 1, #a + #b do p[k] = 0 end
  for i = 1, #a do
    for j = 1, #b do p[i + j - 1] = p[i + j - 1] + a[i] * b[j] end
  end
  local carry = 0
  for k = 1, #p do
    local v = p[k] + carry
    p[k] = v % B
    carry = (v - p[k]) / B
  end
  -- q = p div d, one limb at a time (schoolbook): rem < d before each
  -- step; a quotient limb is estimated in doubles and corrected exactly
  local nd = #d
  local rem, q, m = {}, {}, {}
  for k = 1, nd + 1 do rem[k] = 0 end
  for k = 1, #p do q[k] = 0 end
  local df = 0
  for i = nd, 1, -1 do df = df * B + d[i] end
  -- x >= y, x -= y, both of nd + 1 limbs (d's top limb is nil: 0)
  local function ge(x, y)
    for i = nd + 1, 1, -1 do
      local a, b = x[i], y[i] or 0
      if a ~= b then return a > b end
    end
    return true
  end
  local function subi(x, y)
    local br = 0
    for i = 1, nd + 1 do
      local v = x[i] - (y[i] or 0) - br
      if v < 0 then x[i], br = v + B, 1 else x[i], br = v, 0 end
    end
  end
  local top = #p
  while top > 1 and p[top] == 0 do top = top - 1 end
  for k = top, 1, -1 do
    for i = nd + 1, 2, -1 do rem[i] = rem[i - 1] end
    rem[1] = p[k]
    local rf = 0
    for i = nd + 1, 1, -1 do rf = rf * B + rem[i] end
    local qd = math.floor(rf / df)
    if qd > B - 1 then qd = B - 1 end
    -- m = qd × d, then down to at most rem
    local c = 0
    for i = 1, nd do
      local v = qd * d[i] + c
      m[i] = v % B
      c = (v - m[i]) / B
    end
    m[nd + 1] = c
    while not ge(rem, m) do subi(m, d); qd = qd - 1 end
    subi(rem, m)
    while ge(rem, d) do subi(rem, d); qd = qd + 1 end
    q[k] = qd
  end
  local exact = true
  for i = 1, nd + 1 do if rem[i] ~= 0 then exact = false end end
  -- at most 2^62 = 2^14 × B^2 = (4611686018427387 µs, 904 ns)
  local q3 = q[3] or 0
  local big = q3 > 16384 or (q3 == 16384 and (q[2] > 0 or q[1] > 0 or not exact))
  for k = 4, #q do if q[k] > 0 then big = true end end
  if big then return 4611686018427387, 904 end
  -- (q div 1000, q mod 1000), rounded up
  local u, r = 0, 0
  for k = 3, 1, -1 do
    local v = r * B + (q[k] or 0)
    r = v % 1000
    u = u * B + (v - r) / 1000
  end
  if not exact then
    r = r + 1
    if r == 1000 then u, r = u + 1, 0 end
  end
  return u, r
end
`

// script is a Lua script with its SHA-1 already boxed as an EVALSHA
// argument, so building a call does not allocate for it.
type script struct {
	src string
	sha any
}

func newScript(src string) script {
	return script{src, redis.NewScript(src).Hash()}
}

// gcraOnlyScript runs gcraOnly.
var gcraOnlyScript = newScript(gcraOnly)

// penalizeScript runs penalize (through go-redis, which reloads it after
// NOSCRIPT; Penalize is rare and need not avoid allocations).
var penalizeScript = redis.NewScript(penalize)

// scripts holds one script per algorithm, indexed by core.Algorithm.
var scripts = [...]script{
	core.GCRA:          newScript(prelude + gcraChunk + mainChunk),
	core.SlidingWindow: newScript(prelude + slidingChunk + mainChunk),
	core.FixedWindow:   newScript(prelude + fixedChunk + mainChunk),
	core.SlidingLog:    newScript(prelude + logChunk + mainChunk),
}
