// Package httpresp writes an answer rendered into a request's reused
// memory to an http.ResponseWriter: the one writer of the net/http and Gin
// middleware.
package httpresp

import (
	"net/http"
	"unsafe"

	"github.com/limitplane/limitplane/adapters/internal/admit"
	"github.com/limitplane/limitplane/adapters/response"
)

// Scratch is one request's memory in a middleware: the consumer
// admit.DecideInto writes and the answer response.RenderDecision renders.
// Keep it in a sync.Pool; Write copies what outlives the request.
type Scratch struct {
	Consumer admit.Consumer
	Answer   response.Scratch
}

// Blocks hold an answer's header values for the header map (which keeps
// them): the value slices' array and the bytes of the values rendered into
// the request's scratch memory, in one allocation. Values that are not in
// the scratch (constants, the Renderer's cached RateLimit-Policy values)
// are immutable and are not copied. With the default response.Options an
// admitted answer takes 64 bytes (96 with a quota too) and a denied one
// 112; with X-RateLimit fields 144 and 224.
type (
	fieldBlock2 struct {
		vals [2]string
		text [32]byte
	}
	fieldBlock2L struct {
		vals [2]string
		text [64]byte
	}
	fieldBlock5 struct {
		vals [5]string
		text [32]byte
	}
	fieldBlock5L struct {
		vals [5]string
		text [64]byte
	}
	fieldBlock8 struct {
		vals [8]string
		text [96]byte
	}
)

// fieldMemory returns n value slots and room for size bytes of text, in
// the smallest block that fits, or in two allocations when none does.
func fieldMemory(n, size int) ([]string, []byte) {
	switch {
	case n == 0:
		return nil, nil
	case n <= 2 && size <= 32:
		b := new(fieldBlock2)
		return b.vals[:n], b.text[:0]
	case n <= 2 && size <= 64:
		b := new(fieldBlock2L)
		return b.vals[:n], b.text[:0]
	case n <= 5 && size <= 32:
		b := new(fieldBlock5)
		return b.vals[:n], b.text[:0]
	case n <= 5 && size <= 64:
		b := new(fieldBlock5L)
		return b.vals[:n], b.text[:0]
	case n <= 8 && size <= 96:
		b := new(fieldBlock8)
		return b.vals[:n], b.text[:0]
	}
	return make([]string, n), make([]byte, 0, size)
}

// inScratch reports whether v's bytes are in s, memory the next request
// renders into, which the header map must not keep.
func inScratch(s *Scratch, v string) bool {
	p := uintptr(unsafe.Pointer(unsafe.StringData(v)))
	base := uintptr(unsafe.Pointer(s))
	return p-base < unsafe.Sizeof(*s)
}

// Write is nethttp.Write for a res rendered into s
// (response.RenderDecision), whose values and body are in memory that is
// reused once it returns: it sets the same fields, copying the values that
// are in s, in one allocation when they fit a block, and writes the same
// status and body. It reports whether the request goes on to the handler.
func Write(w http.ResponseWriter, s *Scratch, res *response.Result) bool {
	h := w.Header()
	bh := response.BodyHeaders()
	n, size := len(res.Headers), 0
	if !res.Pass {
		n += len(bh)
	}
	for _, f := range res.Headers {
		if inScratch(s, f.Value) {
			size += len(f.Value)
		}
	}
	vals, text := fieldMemory(n, size)
	for i, f := range res.Headers {
		v := f.Value
		if inScratch(s, v) {
			start := len(text)
			text = append(text, v...)
			// text never grows past size, so its array never moves.
			v = unsafe.String(unsafe.SliceData(text[start:]), len(v))
		}
		vals[i] = v
		h[f.Name] = vals[i : i+1 : i+1]
	}
	if res.Pass {
		return true
	}
	for j, f := range bh {
		i := len(res.Headers) + j
		vals[i] = f.Value
		h[f.Name] = vals[i : i+1 : i+1]
	}
	w.WriteHeader(res.Status)
	w.Write(res.Body) // a Writer does not keep what it is given
	return false
}
