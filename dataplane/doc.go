// Package dataplane keeps a data plane's gateways in step with a control
// plane. Agent is the gateway's side of the sync stream: it applies what
// the control plane sends to a *gateway.Gateway, persists it (Persister:
// RedisPersister, FilePersister) and starts from it when the control
// plane is away. This package also holds the protocol's documentation;
// the generated gRPC code is in dataplane/syncpb (service
// limitplane.sync.v1.SyncService, from sync.proto) and the hand-written
// helpers (digest, chunking, applying changes) in dataplane/protocol.
// Neither imports a counter store, Redis or the gateway, so a control
// plane may import them.
//
// # The stream
//
// Each gateway holds one bidirectional stream, Sync, to the control plane:
//
//  1. The gateway sends Hello: its data-plane group, tags, token, the
//     revision it last applied and the digest of the configuration it runs
//     (protocol.Digest), the control-plane history that revision counts in,
//     its id and version. A wrong token ends the stream with
//     Unauthenticated, tags outside the token's scope with
//     PermissionDenied.
//  2. The control plane answers with the Changes after that revision when
//     its bounded change log still holds them and the digest is the one it
//     expects, and with a snapshot otherwise: SnapshotChunks of the
//     snapshot's spec JSON, bounded in size, numbered, the last marked and
//     carrying the digest and the control plane's history. Every delivery
//     has a revision, monotonic within a history, and a nonce. A Hello of
//     another history, or ahead of the control plane in its own (a
//     restored control plane, which then takes a new history), gets a
//     snapshot, which the agent applies whatever its revision
//     (gateway.Replace) because its history differs. APIs are included only when the gateway's tags select them;
//     keys and policies always.
//  3. The gateway applies the whole delivery or none of it
//     (protocol.Assembler or protocol.ApplyChanges, then gateway.ApplyPartial),
//     and answers Ack{revision, nonce}, or Nack{revision, nonce, error}
//     keeping its running configuration. A Nack is shown to operators; the
//     control plane does not resend the same delivery in a loop: a Nack of
//     Changes brings one snapshot, a Nack of a snapshot waits for a later
//     revision, and a digest mismatch brings a snapshot. An API that only
//     the gateway's host can fail to build (a JWT secret's environment
//     variable or file, a JWKS it cannot fetch) is no reason to Nack: the
//     delivery is applied without it (it answers 503; gateway.NotBuilt),
//     the Ack lists every such API (not_built), and the gateway retries
//     them on its own, so a key delete is never held up by them. So is a
//     policy the gateway's counter store cannot enforce (a window
//     algorithm on the in-process store): the requests that need it
//     answer 503 and not_built lists it (policy), until a revision changes
//     it.
//  4. Later changes arrive as Changes whose from_revision is the revision
//     of the delivery before (sent without waiting for its Ack), each
//     with the digest of the configuration after it; one that does not
//     match is Nacked (protocol.ErrRevisionMismatch) and answered with a
//     snapshot. A gateway whose Hello shows it at the current revision
//     already gets a DigestRequest instead.
//  5. Periodically, and when asked by DigestRequest, the gateway sends
//     DigestReport{revision, digest, not_built}, and at once when its list
//     of APIs not built changes (polled every 250 ms: a retry built one).
//     The digest is of the configuration as delivered, APIs not built
//     included. A digest that differs from the control plane's for that
//     revision is drift: the control plane sends a fresh snapshot.
//
// # The agent
//
// Agent.Run holds the stream and reconnects when it ends, after an
// exponential backoff with jitter (github.com/cenkalti/backoff/v5; 100 ms
// growing to 1 s by default, no wait longer than the maximum with jitter
// included, reset after a stream on which the control plane answered).
// It is the only backoff: each attempt dials a connection of its own, so
// gRPC's connect backoff does not add to it, and a gateway is connected
// again within about a second of its control plane's return; a
// stream the control plane refuses with Unauthenticated or
// PermissionDenied makes Status.State "refused" (Status.NotReady, which
// the gateway's GET /readyz answers 503 with) until the control plane
// answers, and is logged once per change; gRPC keepalive pings (every 10 s, 5 s to answer) find
// a dead peer. It applies
//
//   - a snapshot with gateway.ApplyPartial, after checking the digest the last
//     chunk carries (a snapshot of what already runs, same revision and
//     digest, is acknowledged without a rebuild);
//   - Changes of keys only with gateway.UpdateKeys, which changes the
//     running key registry in place (several changes of one key in a
//     message collapse into its final version). The digest the
//     configuration will have is computed first, incrementally (the old
//     version of each key read with gateway.Key), and a mismatch is a
//     Nack: one key changed among a million costs microseconds
//     (BenchmarkKeyChange);
//   - other Changes with protocol.ApplyChanges on gateway.Snapshot, the
//     same incremental digest check, and gateway.ApplyPartial.
//
// Changes whose from_revision is not the running revision are Nacked
// (wrapping protocol.ErrRevisionMismatch), as is a delete of an object
// that is not there. Every delivery is answered with Ack{revision,
// nonce} or Nack{revision, nonce, error}; a Nack leaves the running
// configuration untouched.
//
// Each applied configuration is persisted in the background (saves
// gather for SaveDelay and the latest wins), and persisted again when a
// RevisionPersister shows, at the next check (every SaveDelay), that the
// persisted one is gone or older (a data plane's Redis restarted empty).
// When no configuration was
// applied within StartTimeout of Run's start, the persisted one is
// applied (Status.Source "persisted") until the control plane answers,
// unless the control plane refused the credentials (a refusal is an
// answer: nothing is applied until it accepts them). MaxStale and OnStale
// say what happens when the control plane is away too long: keep serving,
// or fail closed (gateway.SetUnavailable: every API request answered
// 503) until it answers again. Staleness counts from the last contact,
// which a ContactPersister keeps beside the configuration, so a gateway
// started from the persisted configuration counts from the persisted
// contact, not from its start.
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
