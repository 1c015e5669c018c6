package core

import (
	"testing"
	"unsafe"
)

// TestRequestIsSixWords pins Request at six machine words, 48 bytes on
// 64-bit platforms. Go's register ABI passes a struct argument in
// registers only when all of it fits in the integer registers left: amd64
// has nine, and Store.Take's call through the interface already uses one
// for the receiver and two for the context, so six words for the Request
// fill them exactly. A seventh word (one more field, or a Limit put back
// into it) would send the whole Request through memory on every call of
// every store: Engine.Decide paid that copy with the 112-byte Request of
// before Store.Prepare. Add what a request needs to know about its limits
// to the Rule instead.
func TestRequestIsSixWords(t *testing.T) {
	word := unsafe.Sizeof(uintptr(0))
	if got := unsafe.Sizeof(Request{}); got != 6*word {
		t.Fatalf("unsafe.Sizeof(Request{}) = %d, want 6 words (%d bytes)", got, 6*word)
	}
	if word == 8 && unsafe.Sizeof(Request{}) != 48 {
		t.Fatalf("unsafe.Sizeof(Request{}) = %d on a 64-bit platform, want 48", unsafe.Sizeof(Request{}))
	}
}
