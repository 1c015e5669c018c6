// Package dataplane keeps a data plane's gateways in step with a control
// plane. This package holds the protocol's documentation; the generated
// gRPC code is in dataplane/syncpb (service limitplane.sync.v1.SyncService,
// from sync.proto) and the hand-written helpers (digest, chunking,
// applying changes) in dataplane/protocol. Neither imports a counter
// store, Redis or the gateway, so a control plane may import them.
//
// # The stream
//
// Each gateway holds one bidirectional stream, Sync, to the control plane:
//
//  1. The gateway sends Hello: its data-plane group, tags, token, the
//     revision it last applied and the digest of the configuration it runs
//     (protocol.Digest), its id and version. A wrong token ends the stream
//     with Unauthenticated, tags outside the token's scope with
//     PermissionDenied.
//  2. The control plane answers with the Changes after that revision when
//     its bounded change log still holds them and the digest is the one it
//     expects, and with a snapshot otherwise: SnapshotChunks of the
//     snapshot's spec JSON, bounded in size, numbered, the last marked and
//     carrying the digest. Every delivery has a monotonic revision and a
//     nonce. APIs are included only when the gateway's tags select them;
//     keys and policies always.
//  3. The gateway applies the whole delivery or none of it
//     (protocol.Assembler or protocol.ApplyChanges, then gateway.Apply),
//     and answers Ack{revision, nonce}, or Nack{revision, nonce, error}
//     keeping its running configuration. A Nack is shown to operators; the
//     control plane does not resend the same delivery in a loop: a Nack of
//     Changes brings one snapshot, a Nack of a snapshot waits for a later
//     revision, and a digest mismatch brings a snapshot.
//  4. Later changes arrive as Changes whose from_revision is the revision
//     of the delivery before (sent without waiting for its Ack), each
//     with the digest of the configuration after it; one that does not
//     match is Nacked (protocol.ErrRevisionMismatch) and answered with a
//     snapshot. A gateway whose Hello shows it at the current revision
//     already gets a DigestRequest instead.
//  5. Periodically, and when asked by DigestRequest, the gateway sends
//     DigestReport{revision, digest}. A digest that differs from the
//     control plane's for that revision is drift: the control plane sends
//     a fresh snapshot.
//
// # Compared with Envoy xDS and Tyk MDCB
//
// The Ack/Nack with version and nonce follows Envoy's xDS: the nonce ties
// an answer to one delivery, and a rejected update leaves the running
// configuration alone. Unlike state-of-the-world xDS, changes are deltas
// against a named revision (as in delta xDS), so changing one key among a
// million sends one key; unlike xDS, the digest exchange repairs drift a
// lost or misapplied delta would leave. Tyk's MDCB gateways poll the
// control plane every key_space_sync_interval (10 s by default) and learn
// of a quota reset from a one-off message that can be missed; here changes
// are pushed as they are made, and resets are data inside the objects
// (quota epochs), so a replayed or late delivery still lands once.
package dataplane
