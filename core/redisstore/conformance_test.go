package redisstore_test

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/core/storetest"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/redis/go-redis/v9"
)

// suite runs the conformance suite against stores over client. Each store
// reads the suite's manual clock through the Options.Clock test seam; the
// TTL margin keeps keys alive while the manual clock stands still; the
// long timeout keeps a loaded CI machine from failing correctness tests.
// pipeline is Options.Pipeline: 0 the default (batching on), -1 off.
func suite(client redis.UniversalClient, pipeline int) storetest.Suite {
	return storetest.Suite{
		New: func(t *testing.T, clock core.Clock) core.Store {
			s, err := redisstore.New(client, redisstore.Options{Seams: &seams.Seams{Clock: clock}, TTLMargin: time.Minute, Pipeline: pipeline, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Algorithms:  []core.Algorithm{core.FixedWindow, core.SlidingWindow, core.SlidingLog},
		Granularity: time.Microsecond,
	}
}

func TestConformanceStandalone(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t, &redis.Options{PoolSize: 64})
	t.Run("Direct", func(t *testing.T) { storetest.Run(t, suite(c, -1)) })
	t.Run("Default", func(t *testing.T) { storetest.Run(t, suite(c, 0)) })
}

func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t, &redis.ClusterOptions{PoolSize: 64})
	t.Run("Direct", func(t *testing.T) { storetest.Run(t, suite(c, -1)) })
	t.Run("Default", func(t *testing.T) { storetest.Run(t, suite(c, 0)) })
}
