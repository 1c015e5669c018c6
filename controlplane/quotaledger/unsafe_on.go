//go:build limitplane_lease_unsafe

package quotaledger

// undebitedLeases: see unsafe_off.go. TEST ONLY: this build breaks the
// bound Σ admitted ≤ Q on purpose.
const undebitedLeases = true
