// Package adapters measures what each limitplane adapter adds to its
// framework: the same handler bare and behind the middleware (or, for gRPC,
// the unary interceptor), in-process, on the allowed path of one API key
// with the in-memory store. The difference is the adapter's overhead:
// identity (API key hashing and lookup), the engine's decision, rendering
// the rate-limit fields and setting them on the response.
package adapters
