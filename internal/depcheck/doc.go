// Package depcheck holds only a test: it pins the lowest versions of the
// modules and the Go toolchain that limitplane may be built with, so that a
// dependency update cannot bring back a version with a known vulnerability.
package depcheck
