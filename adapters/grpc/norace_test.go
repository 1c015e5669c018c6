//go:build !race

package grpc_test

// raceEnabled: the race detector is on, under which sync.Pool drops a
// quarter of what it is given, so allocation counts are not exact.
const raceEnabled = false
