package redisbench

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/internal/redistest"
)

// Servers come from the main module's internal/redistest (importable here:
// this module's path lies under the main module's): a throwaway
// redis-server on a free loopback port, persistence off, stopped at the end
// of the test or benchmark that started it; never 127.0.0.1:6379.

// poolSize is every client's connection pool: one connection per
// concurrent caller at concurrency 64.
const poolSize = 64

// client returns a new client of srv with poolSize connections, closed by
// tb.Cleanup.
func client(tb testing.TB, srv *redistest.Server) *redis.Client {
	tb.Helper()
	return srv.Client(tb, &redis.Options{PoolSize: poolSize})
}
