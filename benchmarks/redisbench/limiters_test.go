package redisbench

import (
	"context"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// limit is one limit stated once and built for each limiter: perSec events
// per second with a burst of burst. ulule/limiter has no burst: it is a
// fixed window of perSec per second that opens at a key's first request.
type limit struct {
	perSec, burst int64
}

// allowFunc makes one decision for key: admitted or not. Each limiter is
// reached through this func value; an indirect call costs a nanosecond or
// two against a Redis round trip of tens of microseconds.
type allowFunc func(ctx context.Context, key string) (bool, error)

// contender is one limiter under test. build makes it on a fresh client of
// srv (with poolSize connections); what it needs closed is
// closed by tb.Cleanup.
type contender struct {
	name  string
	build func(tb testing.TB, srv *redistest.Server, l limit, opts redisstore.Options) allowFunc
}

// pipelineDepth is Options.Pipeline for the explicitly pipelined
// limitplane store: up to 64 Takes per pipeline.
const pipelineDepth = 64

var contenders = []contender{
	{"redis_rate", func(tb testing.TB, srv *redistest.Server, l limit, _ redisstore.Options) allowFunc {
		rl := redis_rate.NewLimiter(client(tb, srv))
		lim := redis_rate.Limit{Rate: int(l.perSec), Period: time.Second, Burst: int(l.burst)}
		return func(ctx context.Context, key string) (bool, error) {
			r, err := rl.Allow(ctx, key, lim)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}
	}},
	{"ulule", func(tb testing.TB, srv *redistest.Server, l limit, _ redisstore.Options) allowFunc {
		store, err := ululeredis.NewStoreWithOptions(client(tb, srv), ulule.StoreOptions{Prefix: ulule.DefaultPrefix, MaxRetry: ulule.DefaultMaxRetry})
		if err != nil {
			tb.Fatal(err)
		}
		lim := ulule.New(store, ulule.Rate{Period: time.Second, Limit: l.perSec})
		return func(ctx context.Context, key string) (bool, error) {
			c, err := lim.Get(ctx, key)
			if err != nil {
				return false, err
			}
			return !c.Reached, nil
		}
	}},
	// limitplane is the store as Options{} makes it: each Take its own
	// EVALSHA before issue 13, batched since.
	{"limitplane", func(tb testing.TB, srv *redistest.Server, l limit, opts redisstore.Options) allowFunc {
		return limitplane(tb, srv, l, opts)
	}},
	// limitplane-direct has batching off: each Take its own EVALSHA (a
	// negative Pipeline is "off" before and after issue 13).
	{"limitplane-direct", func(tb testing.TB, srv *redistest.Server, l limit, opts redisstore.Options) allowFunc {
		opts.Pipeline = -1
		return limitplane(tb, srv, l, opts)
	}},
	{"limitplane-pipeline", func(tb testing.TB, srv *redistest.Server, l limit, opts redisstore.Options) allowFunc {
		opts.Pipeline = pipelineDepth
		return limitplane(tb, srv, l, opts)
	}},
}

func limitplane(tb testing.TB, srv *redistest.Server, l limit, opts redisstore.Options) allowFunc {
	s, err := redisstore.New(client(tb, srv), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	rule, err := s.Prepare(core.LimitSet{Rate: core.Limit{Rate: l.perSec, Period: time.Second, Burst: l.burst}})
	if err != nil {
		tb.Fatal(err)
	}
	return func(ctx context.Context, key string) (bool, error) {
		d, err := s.Take(ctx, core.Request{Consumer: key, Rule: rule, Cost: 1})
		return d.Allowed, err
	}
}
