//go:build limitplane_drl_unsafe

package drl

// unsafeBuild: see unsafe_off.go. This build breaks the bound on purpose.
const unsafeBuild = true
