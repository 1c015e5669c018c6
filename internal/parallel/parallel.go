// Package parallel splits work on a list over goroutines, for the control
// plane's and the sync protocol's passes over a million keys.
package parallel

import (
	"errors"
	"sync"
)

// MinPart is the fewest items Ranges gives a goroutine: below it,
// starting one costs more than it saves.
const MinPart = 4096

// Ranges calls fn on the ranges [lo, hi) that split [0, n) into at most
// maxParts (GOMAXPROCS, say) non-empty parts of whole multiples of MinPart
// items (but the last), each in its own goroutine but the first, which
// runs in the caller's, and returns when all are done, with their errors
// joined in the parts' order. Each lo is a multiple of MinPart (so
// lo/MinPart indexes a slice of n/MinPart+1 per-part results); ranges with
// a higher lo hold later items. With n = 0, fn is called once with [0, 0).
func Ranges(n, maxParts int, fn func(lo, hi int) error) error {
	blocks := (n + MinPart - 1) / MinPart
	if maxParts <= 1 || blocks <= 1 {
		return fn(0, n)
	}
	per := (blocks + maxParts - 1) / maxParts // blocks per part
	parts, size := (blocks+per-1)/per, per*MinPart
	fails := make([]error, parts)
	var wg sync.WaitGroup
	for i := 1; i < parts; i++ {
		lo, hi := i*size, min((i+1)*size, n)
		wg.Go(func() { fails[i] = fn(lo, hi) })
	}
	fails[0] = fn(0, min(size, n))
	wg.Wait()
	return errors.Join(fails...)
}
