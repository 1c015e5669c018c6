// Package adapters measures what each limitplane adapter adds to its
// framework: the same handler bare and behind the middleware (or, for gRPC,
// the unary interceptor), in-process, on the allowed path of one API key
// with the in-memory store. The difference is the adapter's overhead:
// identity (API key hashing and lookup), the engine's decision, rendering
// the rate-limit fields and setting them on the response.
//
// Beside them, BenchmarkPeersNetHTTP and BenchmarkPeersFiber put the
// net/http and Fiber middleware next to the middleware a user would pick
// instead (ulule/limiter, go-chi/httprate, tollbooth, Fiber's limiter),
// each on its in-memory store, keyed by client IP, for one client and for
// 10,000.
package adapters
