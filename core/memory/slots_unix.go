//go:build unix

package memory

import (
	"syscall"
	"unsafe"
)

// mmapMinBytes is the smallest table, in bytes, whose slots are mapped
// outside the Go heap: smaller ones are not worth a system call and a page
// each, and a store's first tables (8 slots a shard) stay on the heap.
const mmapMinBytes = 64 << 10

// mapsSlots reports whether newSlots maps large tables outside the Go heap.
const mapsSlots = true

// newSlots returns size zeroed slots, and the function that frees them
// (nil when the GC does). Tables of mmapMinBytes or more are anonymous
// private mappings: the kernel supplies zeroed pages as they are first
// touched, and free unmaps them. If the mapping fails, the slots come from
// the Go heap.
func newSlots(size int) ([]slot, func()) {
	n := size * int(unsafe.Sizeof(slot{}))
	if n < mmapMinBytes {
		return make([]slot, size), nil
	}
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]slot, size), nil
	}
	slots := unsafe.Slice((*slot)(unsafe.Pointer(unsafe.SliceData(mem))), size)
	return slots, func() { syscall.Munmap(mem) }
}
