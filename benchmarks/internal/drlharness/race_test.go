//go:build race

package drlharness

// raceEnabled: the race detector slows the harness's own HTTP client
// several-fold, which bunches its arrivals (see TestSkew).
const raceEnabled = true
