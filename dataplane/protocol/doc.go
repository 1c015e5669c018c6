// Package protocol holds the hand-written side of the configuration sync
// protocol (package syncpb): the digest of a configuration, cutting a
// snapshot into SnapshotChunks and assembling them again, and applying a
// Changes message to a snapshot. It imports only spec, identity and the
// generated syncpb: a control plane uses it without pulling in a counter
// store, Redis or the gateway.
//
// Every function here is pure: it reads its arguments and returns new
// values, and never modifies a snapshot it was given. Snapshots are shared
// with their successors (ApplyChanges copies only the lists a change
// touches, and the objects it leaves alone are the same values), so treat
// every snapshot as immutable once made.
package protocol
