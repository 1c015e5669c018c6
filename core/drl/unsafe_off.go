//go:build !limitplane_drl_unsafe

package drl

// unsafeBuild is true in a build with the tag limitplane_drl_unsafe only:
// every Store's allocator then grants grows before the shrinks they need
// are in force, which breaks the bound. It exists for the DRL harness
// (benchmarks/cmd/drl -unsafe), which builds its own gateway binary with
// that tag to show that its bound check catches the overshoot; no option
// or configuration of a regular build can turn it on.
const unsafeBuild = false
