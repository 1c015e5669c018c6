//go:build !linux

package dataplane_test

// threadCPU reports false: only Linux's thread CPU clock is read.
func threadCPU() (int64, bool) { return 0, false }
