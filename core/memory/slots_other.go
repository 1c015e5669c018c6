//go:build !unix

package memory

// mapsSlots reports whether newSlots maps large tables outside the Go heap.
const mapsSlots = false

// newSlots returns size zeroed slots on the Go heap; the GC frees them.
func newSlots(size int) ([]slot, func()) { return make([]slot, size), nil }
