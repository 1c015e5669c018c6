// Package fastresp writes a response.Result on a fasthttp response: the
// one writer of adapters/fasthttp and adapters/fiber (whose Write
// functions are it), taking the Result by pointer so that a middleware
// hands over the Result its Renderer wrote into a response.Scratch
// (response.Renderer.RenderDecision) without copying it.
package fastresp

import (
	"strings"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/limitplane/limitplane/adapters/response"
)

// Write sets res's header fields on resp and, when res does not pass, its
// status and JSON body (fasthttp copies both). It reports whether the
// request should go on to the next handler.
//
// The fields of a Result a Renderer returned (res.Canonical) are handed
// to fasthttp as they are, and so are the body's Content-Type and
// X-Content-Type-Options: the same bytes as resp.Header.Set, without its
// copy, normalization and checks (TestWriteSetsAsCtxSet).
func Write(resp *fasthttp.Response, res *response.Result) bool {
	if res.Canonical {
		for _, f := range res.Headers {
			resp.Header.SetCanonical(readOnlyBytes(f.Name), readOnlyBytes(f.Value))
		}
	} else {
		for _, f := range res.Headers {
			set(resp, f.Name, f.Value)
		}
	}
	if res.Pass {
		return true
	}
	resp.Header.SetContentTypeBytes(readOnlyBytes(bodyHeaders[0].Value))
	resp.Header.SetCanonical(readOnlyBytes(bodyHeaders[1].Name), readOnlyBytes(bodyHeaders[1].Value))
	resp.SetStatusCode(res.Status)
	resp.SetBody(res.Body)
	return false
}

// bodyHeaders are response.BodyHeaders, read once.
var bodyHeaders = response.BodyHeaders()

// set is resp.Header.Set(name, value). The names adapters/response
// renders are already in the form fasthttp normalizes names to, so for a
// value without CR or LF (which Set would turn into spaces) both are
// handed to SetCanonical as they are, without the copy Set makes first.
func set(resp *fasthttp.Response, name, value string) {
	switch name {
	case response.HeaderPolicy, response.HeaderRateLimit, response.HeaderRetryAfter,
		response.HeaderXLimit, response.HeaderXRemaining, response.HeaderXReset, "X-Content-Type-Options", "Content-Type":
		if strings.IndexByte(value, '\r') < 0 && strings.IndexByte(value, '\n') < 0 {
			resp.Header.SetCanonical(readOnlyBytes(name), readOnlyBytes(value))
			return
		}
	}
	resp.Header.Set(name, value)
}

// readOnlyBytes returns s's bytes without a copy; they must not be
// written.
func readOnlyBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
