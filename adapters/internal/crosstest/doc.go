// Package crosstest holds the cross-framework conformance test: the same
// scenarios run through the net/http, Gin and Fiber adapters, served for
// real, must produce byte-identical statuses, rate-limit fields and bodies.
// It has no non-test code.
package crosstest
