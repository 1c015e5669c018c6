package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names the environment variable that makes the gateway
// write a CPU profile (runtime/pprof) of its whole run to the file it
// names, for benchmarks (benchmarks/README.md). It is not a flag: it is a
// measuring aid, not a setting.
const cpuProfileEnv = "LP_GATEWAY_CPUPROFILE"

// unsafeDRLEnv names the environment variable that, set to 1, turns on
// the DRL's unsafe test switch (server.Options.UnsafeGrowsBeforeShrinks):
// grows published before shrinks, which breaks the bound, so the DRL
// harness (benchmarks/internal/drlharness) can show it catches the
// overshoot. It is neither a flag nor a field of the file: it is a test
// aid, not a setting.
const unsafeDRLEnv = "LP_GATEWAY_TEST_UNSAFE_GROWS_BEFORE_SHRINKS"

// startCPUProfile starts a CPU profile into the file path names, unless
// path is "", and returns the function that ends it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
