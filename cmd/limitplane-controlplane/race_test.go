//go:build race

package main

// raceBuild: the tests (and the control plane they run, the test binary
// itself) are built with the race detector, whose own memory per
// goroutine is never given back: RSS bounds do not hold there.
const raceBuild = true
