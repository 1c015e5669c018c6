package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
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

// settlement is the core.Settler of an admitted request under a rule
// that settles: the quota key, the period's end and the cost charged.
type settlement struct {
	s       *Store
	key     string
	charged int64
	end     string
}

// Release implements core.Releaser: the estimate stands.
func (*settlement) Release() {}

// Settle implements core.Settler: one script call, under the store's
// timeout and breaker on a context of its own (the request's may have
// ended); a failure keeps the estimate.
func (st *settlement) Settle(actual int64) {
	delta := actual - st.charged
	if delta == 0 {
		return
	}
	ctx, cancel := st.s.callCtx()
	defer cancel()
	st.s.call(ctx, func(ctx context.Context) ([]int64, error) {
		return settleQuotaScript.Run(ctx, st.s.client, []string{st.key}, delta, st.end).Int64Slice()
	})
}
