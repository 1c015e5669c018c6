//go:build !limitplane_lease_unsafe

package quotaledger

// undebitedLeases is the negative control of issue 22's harness: built
// with the tag limitplane_lease_unsafe (benchmarks/cmd/globalquota
// -negative-control, never by an option), a grant does not raise the
// entry's committed units, so the ledger grants without bound and the sum
// admitted over the data planes overshoots Q. It is false in every other
// build.
const undebitedLeases = false
