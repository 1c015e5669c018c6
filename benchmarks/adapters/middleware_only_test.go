package adapters

import (
	"fmt"
	"net/http"
	"testing"
)

// headerOnlyWriter is an http.ResponseWriter that keeps one header map,
// cleared rather than remade between requests, and discards the rest: what
// is left of a request's cost is the middleware's own.
type headerOnlyWriter struct{ h http.Header }

func (w *headerOnlyWriter) Header() http.Header         { return w.h }
func (w *headerOnlyWriter) WriteHeader(int)             {}
func (w *headerOnlyWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkNetHTTPMiddlewareOnly times limitplane's net/http middleware
// (the peers' setup: identity.Keyless, core/memory) around a handler that
// does nothing, on a headerOnlyWriter: admitted and denied, one client and
// 10,000. Unlike the peers' rows it has no per-request harness garbage,
// so its ns/op and cpu-ns/op are the middleware's work and the garbage
// collection of what it allocates.
func BenchmarkNetHTTPMiddlewareOnly(b *testing.B) {
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, rate := range peerRates {
		for _, n := range peerShapes {
			b.Run(fmt.Sprintf("%s/keys=%d", rate.name, n), func(b *testing.B) {
				if netHTTPPeers[1].name != "limitplane" {
					b.Fatal("netHTTPPeers[1] is not limitplane")
				}
				w := &headerOnlyWriter{h: http.Header{}}
				serveClients(b, netHTTPPeers[1].wrap(b, nop, rate.r), remoteAddrs(n), func(h http.Handler, r *http.Request) {
					clear(w.h)
					h.ServeHTTP(w, r)
				})
			})
		}
	}
}
