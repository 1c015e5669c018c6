// Package redisbench compares limitplane's Redis store (core/redisstore as
// Options{} makes it, with batching off and with Options.Pipeline 64) with
// github.com/go-redis/redis_rate/v10 and github.com/ulule/limiter/v3's Redis
// store, against one throwaway redis-server started by the tests, next to a
// plain PING loop: the one-round-trip ceiling. Everything is in the _test.go
// files: server_test.go starts and stops the server, bench_test.go has the
// throughput benchmarks, rounds_test.go the same workloads interleaved in
// short slices per round for a noisy machine (BenchmarkRedisRounds), and
// overshoot_test.go the accuracy test. The numbers
// and how to reproduce them are in ../README.md, "Redis store vs peers".
package redisbench
