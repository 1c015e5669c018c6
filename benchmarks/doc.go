// Package benchmarks compares limitplane's limiters with peers in the same
// run: golang.org/x/time/rate and a re-implementation of the two-atomic
// lazy-refill token bucket (internal/twoatomic). The benchmarks are in
// bench_test.go, the accuracy workload in internal/accuracy and
// cmd/accuracy; README.md has the numbers and how to reproduce them.
package benchmarks
