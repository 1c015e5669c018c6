//go:build !race

package drlharness

// raceEnabled: see race_test.go.
const raceEnabled = false
