package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/spec"
)

// DataPlaneToken is one data-plane token the sync server accepts, stored
// hashed: the token itself is never kept.
type DataPlaneToken struct {
	// Hash is HashToken of the token: "sha256:" and 64 hex digits.
	Hash string
	// Group is the only data-plane group the token may open a stream for.
	Group string
	// Tags are the tags the token may ask for; a Hello with a tag outside
	// them is refused. Empty: only a Hello without tags is accepted.
	Tags []string
}

// HashToken returns the form DataPlaneToken.Hash holds for a plaintext
// token: "sha256:" and the 64 lower-case hex digits of its SHA-256.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RevisionWatcher is a Store that announces writes (Bolt is one). The sync
// server pushes a store that is not one by polling its revision.
type RevisionWatcher interface {
	// RevisionChanged returns a channel closed once the revision has
	// risen after the call.
	RevisionChanged() <-chan struct{}
}

// Defaults of SyncOptions.
const (
	// DefaultMaxChanges is the most changes one Changes message carries
	// when SyncOptions.MaxChanges is 0.
	DefaultMaxChanges = 10000
	// DefaultMaxChangesBytes bounds the JSON of one Changes message when
	// SyncOptions.MaxChangesBytes is 0: 1 MiB.
	DefaultMaxChangesBytes = 1 << 20
	// DefaultDigestCacheEntries bounds the digest cache when
	// SyncOptions.DigestCacheEntries is 0.
	DefaultDigestCacheEntries = 4096
	// DefaultHelloTimeout is how long a new stream may take to send its
	// Hello when SyncOptions.HelloTimeout is 0.
	DefaultHelloTimeout = 10 * time.Second
	// DefaultDuplicateGrace is SyncOptions.DuplicateGrace when 0.
	DefaultDuplicateGrace = 2 * time.Second
	// DefaultMaxStreams bounds the open streams, all connections
	// together, when SyncOptions.MaxStreams is 0.
	DefaultMaxStreams = 10000
	// DefaultMaxPendingHellos bounds the streams waiting for their
	// Hello when SyncOptions.MaxPendingHellos is 0.
	DefaultMaxPendingHellos = 1024
	// DefaultMaxStreamsPerConn is the bound on one HTTP/2 connection's
	// concurrent streams that the control plane program gives gRPC
	// (grpc.MaxConcurrentStreams); a gateway needs one.
	DefaultMaxStreamsPerConn = 16
)

// SyncOptions configure NewSyncServer.
type SyncOptions struct {
	// Store holds the state sent to data planes. Required.
	Store Store
	// DataPlanes records each gateway's connection, acknowledged
	// revision and last rejection; nil means a registry of its own.
	DataPlanes *DataPlanes
	// Tokens are the accepted data-plane tokens. Required (a sync server
	// without tokens would refuse every gateway).
	Tokens []DataPlaneToken
	// ChunkBytes is the data size of one SnapshotChunk; 0 means
	// protocol.DefaultChunkBytes.
	ChunkBytes int
	// MaxChanges is the most changes one Changes message carries; a data
	// plane that needs more gets a snapshot. 0 means DefaultMaxChanges.
	MaxChanges int
	// MaxChangesBytes bounds the size of one Changes message, counted as
	// the bytes of its changes' ids and JSON; a larger one is replaced by
	// a snapshot. 0 means DefaultMaxChangesBytes.
	MaxChangesBytes int
	// DigestCacheEntries bounds the server-wide cache of the digests of
	// the deliveries made, by (tags, revision), which lets a gateway that
	// reconnects get the changes since the revision it runs instead of a
	// snapshot. The oldest entries go first. 0 means
	// DefaultDigestCacheEntries.
	DigestCacheEntries int
	// PollInterval is how often the revision is read to find writes when
	// Store is not a RevisionWatcher; 0 means one second.
	PollInterval time.Duration
	// Now is the clock of LastSeen and rejection times; nil means
	// time.Now.
	Now func() time.Time
	// HelloTimeout is how long a stream may take to send its Hello; a
	// stream without one by then is ended with DeadlineExceeded. 0 means
	// DefaultHelloTimeout.
	HelloTimeout time.Duration
	// DuplicateGrace is how long a stream whose gateway_id another open
	// stream has too waits before the control plane logs it and warns
	// both gateways, if both are still open then: a gateway that
	// reconnects after a frozen control plane resumed (its old stream
	// ended on its side, not yet on this one) is no duplicate. Both are
	// flagged DataPlane.Duplicate at once all the same. 0 means
	// DefaultDuplicateGrace.
	DuplicateGrace time.Duration
	// MaxStreams bounds the open streams, counting those still waiting
	// for their Hello; one more is refused at once with
	// ResourceExhausted. 0 means DefaultMaxStreams. (Streams per
	// connection are bounded by the gRPC server: see
	// DefaultMaxStreamsPerConn.)
	MaxStreams int
	// MaxPendingHellos bounds the streams still waiting for their Hello
	// (a gateway sends it at once: many waiting is a client that never
	// will); one more is refused at once with ResourceExhausted. 0 means
	// DefaultMaxPendingHellos.
	MaxPendingHellos int
	// Metrics counts streams, refusals, deliveries, Acks and Nacks; nil
	// counts nothing.
	Metrics *Metrics
	// Log receives refused streams (rate-limited: the first at once,
	// then one line per failurelog.DefaultInterval with their count) and
	// rejected revisions; nil means slog.Default().
	Log *slog.Logger
}

// SyncServer serves syncpb.SyncService: each gateway's configuration
// stream. A data plane's view of the state is Select of it for the tags
// of its Hello.
//
// After an accepted Hello it brings the gateway to the store's revision,
// and again whenever the revision rises, with one delivery of a fresh
// nonce: Changes from the revision the gateway runs when that is known
// and the changes can be sent, a snapshot (in chunks) otherwise. Writes
// that come while a delivery is sent are folded into the next. Every
// Changes carries the digest of the view after it. A gateway whose Hello
// shows it at the store's revision already (see below) is sent a
// DigestRequest instead of a delivery.
//
// Changes are sent when all of these hold, and a snapshot otherwise:
//
//   - the server knows what the gateway runs: the revision of its last
//     delivery on this stream, or, on connect, the Hello's
//     last_applied_revision when the digest of the view of that
//     revision for these tags equals the Hello's digest. The server
//     takes that view from its cache (filled by every delivery it made,
//     on any stream; bounded by DigestCacheEntries) or, when it is not
//     there (a replica the gateway moved to from another replica of the
//     same store, or a restarted control plane), computes it from the
//     store: Select of the current state, digested (once for all the
//     streams with the same tags that connect meanwhile, and cached),
//     with the changes after that revision undone. So a gateway that
//     fails over between replicas gets changes, and its digest is the
//     same whichever replica it talks to;
//   - Store.ChangesSince still has the changes after that revision;
//   - they can be filtered exactly: changes of policies and APIs only
//     when the tags select every API before, after and in between (the
//     view is the identity: they are sent as they are); key changes in a
//     view that leaves APIs out are mapped by Select's rule for keys (a
//     PUT of the key as the view holds it, a DELETE when the view held it
//     and no longer does, nothing when it holds it neither before nor
//     after);
//   - they are within MaxChanges and MaxChangesBytes.
//
// Ack records the acknowledged revision in DataPlanes, with the APIs the
// gateway applied it without (DataPlane.NotBuilt), Nack the rejection. A Nack of Changes brings a snapshot at once (once: Nacks of
// the Changes that were already on their way do not bring more); a Nack
// of a snapshot is not answered, and the next revision comes as a
// snapshot. DigestReport refreshes LastSeen and NotBuilt (its digest is
// of the revision as delivered, APIs not built included), and a digest that differs
// from the one sent for that revision brings a fresh snapshot.
//
// When the store's database is unavailable (a read fails with
// ErrStoreUnavailable), open streams stay open: the gateways keep what
// they were sent, the failed delivery is tried again every PollInterval
// (and on every write announced), and the failures are logged a line per
// failurelog interval. A stream that opens meanwhile is ended with
// Unavailable when its Hello cannot be answered (the history or the
// revision cannot be read), and its gateway retries with backoff.
type SyncServer struct {
	syncpb.UnimplementedSyncServiceServer
	o      SyncOptions
	tokens []token
	cache  *digestCache

	refusals *failurelog.Log // refused streams, rate-limited
	outages  *failurelog.Log // reads failed by ErrStoreUnavailable, rate-limited
	open     atomic.Int64    // open streams
	pending  atomic.Int64    // streams waiting for their Hello

	mu   sync.Mutex
	warn map[uint64]chan string // open stream → its queue of warnings
	next uint64

	shutdown     chan struct{} // closed by Shutdown
	shutdownOnce sync.Once

	flightMu sync.Mutex
	flights  map[string]*flight // current views being computed, by tags
}

// errShutdown ends streams once Shutdown was called.
var errShutdown = status.Error(codes.Unavailable, "controlplane: the control plane is shutting down; reconnect with backoff")

// Shutdown ends every open stream, and refuses new ones, with
// Unavailable, so gateways reconnect (to this control plane's successor)
// with backoff, and writes the count of refusals not logged yet. Call it
// before grpc.Server.GracefulStop, which otherwise waits for streams that
// never end by themselves. It is safe to call more than once.
func (s *SyncServer) Shutdown() {
	s.shutdownOnce.Do(func() {
		close(s.shutdown)
		s.refusals.Close()
		s.outages.Close()
	})
}

// refuse logs (rate-limited) and counts a refused stream, and returns
// err, the stream's answer.
func (s *SyncServer) refuse(reason string, err error, attrs ...any) error {
	s.o.Metrics.refusedStream(reason)
	msg := status.Convert(err).Message()
	for i := 0; i+1 < len(attrs); i += 2 {
		msg += fmt.Sprintf(" %v=%q", attrs[i], fmt.Sprint(attrs[i+1]))
	}
	s.refusals.Failed(errors.New(msg))
	return err
}

type token struct {
	hash  [sha256.Size]byte
	group string
	tags  []string
}

// NewSyncServer returns a SyncServer. It fails when Store is nil, no
// token is given, a token's Hash is not "sha256:" and 64 hex digits (in
// either case), or two tokens have the same hash.
func NewSyncServer(o SyncOptions) (*SyncServer, error) {
	if o.Store == nil {
		return nil, errors.New("controlplane: sync: no store")
	}
	if len(o.Tokens) == 0 {
		return nil, errors.New("controlplane: sync: no data-plane tokens")
	}
	if o.DataPlanes == nil {
		o.DataPlanes = &DataPlanes{}
	}
	if o.MaxChanges <= 0 {
		o.MaxChanges = DefaultMaxChanges
	}
	if o.MaxChangesBytes <= 0 {
		o.MaxChangesBytes = DefaultMaxChangesBytes
	}
	if o.DigestCacheEntries <= 0 {
		o.DigestCacheEntries = DefaultDigestCacheEntries
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = DefaultHelloTimeout
	}
	if o.DuplicateGrace <= 0 {
		o.DuplicateGrace = DefaultDuplicateGrace
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxPendingHellos <= 0 {
		o.MaxPendingHellos = DefaultMaxPendingHellos
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &SyncServer{o: o, warn: map[uint64]chan string{}, shutdown: make(chan struct{}), cache: newDigestCache(o.DigestCacheEntries), flights: map[string]*flight{},
		refusals: failurelog.New(o.Log, failurelog.Options{Msg: "controlplane: sync stream refused"}),
		outages:  failurelog.New(o.Log, failurelog.Options{Msg: "controlplane: sync: the store's database is unavailable; open streams keep what they were sent"})}
	for i, t := range o.Tokens {
		h, ok := strings.CutPrefix(t.Hash, "sha256:")
		b, err := hex.DecodeString(h)
		if !ok || err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("controlplane: sync: token %d (group %q): hash is not \"sha256:\" and 64 hex digits", i, t.Group)
		}
		if slices.ContainsFunc(s.tokens, func(o token) bool { return o.hash == [sha256.Size]byte(b) }) {
			return nil, fmt.Errorf("controlplane: sync: token %d (group %q): the same token is listed twice (its scope would be ambiguous)", i, t.Group)
		}
		s.tokens = append(s.tokens, token{hash: [sha256.Size]byte(b), group: t.Group, tags: slices.Clone(t.Tags)})
	}
	return s, nil
}

// authenticate finds the Hello's token (comparing it with every
// configured hash in constant time) and checks its group and tags.
func (s *SyncServer) authenticate(h *syncpb.Hello, peer string) error {
	sum := sha256.Sum256([]byte(h.GetToken()))
	var found *token
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].hash[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	if found == nil {
		return s.refuse(refusedUnauthenticated, status.Error(codes.Unauthenticated, "controlplane: unknown data-plane token"),
			"group", cutProblem(h.GetGroup()), "gateway", cutProblem(h.GetGatewayId()), "peer", peer)
	}
	if h.GetGroup() != found.group {
		return s.refuse(refusedPermissionDenied, status.Errorf(codes.PermissionDenied, "controlplane: the token is not for group %q", cutProblem(h.GetGroup())),
			"token_group", found.group, "gateway", cutProblem(h.GetGatewayId()), "peer", peer)
	}
	for _, t := range h.GetTags() {
		if !slices.Contains(found.tags, t) {
			return s.refuse(refusedPermissionDenied, status.Errorf(codes.PermissionDenied, "controlplane: the token may not ask for tag %q", cutProblem(t)),
				"group", cutProblem(h.GetGroup()), "gateway", cutProblem(h.GetGatewayId()), "peer", peer)
		}
	}
	return nil
}

// connect records a new stream of the gateway of Hello h in DataPlanes
// and numbers it. The revision the gateway runs is the one its Hello
// names. When another open stream has the same gateway_id, both are
// flagged Duplicate, and dup is true: the stream calls warnDuplicates
// after DuplicateGrace. It returns the stream's number and its warnings
// channel.
func (s *SyncServer) connect(h *syncpb.Hello, tags []string, peer string) (n uint64, warn chan string, dup bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	n, warn = s.next, make(chan string, 8)
	s.warn[n] = warn
	others := s.o.DataPlanes.Connect(DataPlane{GatewayID: h.GetGatewayId(), Stream: n, Peer: peer, Group: h.GetGroup(), Tags: tags,
		AppliedRevision: h.GetLastAppliedRevision(), LastSeen: s.o.Now()})
	return n, warn, len(others) > 0
}

// warnDuplicates logs, and sends both gateways a Warning (through the
// channels connect registers), for each stream other than n still open
// with the gateway_id of stream n, whose Hello is h.
func (s *SyncServer) warnDuplicates(h *syncpb.Hello, n uint64, peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.o.DataPlanes.openStreams(h.GetGatewayId()) {
		if o.Stream == n {
			continue
		}
		s.o.Log.Warn("controlplane: sync: two open streams with the same gateway_id; each gateway needs its own",
			"gateway", h.GetGatewayId(), "stream", n, "peer", peer, "group", h.GetGroup(),
			"other_stream", o.Stream, "other_peer", o.Peer, "other_group", o.Group)
		s.warnLocked(o.Stream, fmt.Sprintf("another gateway opened a sync stream with this gateway_id %q (stream %d from %s): each gateway needs its own gateway_id", h.GetGatewayId(), n, peer))
		s.warnLocked(n, fmt.Sprintf("another gateway has a sync stream open with this gateway_id %q (stream %d from %s): each gateway needs its own gateway_id", h.GetGatewayId(), o.Stream, o.Peer))
	}
}

// warnLocked queues a warning for stream n, dropping it when the stream's
// queue is full; s.mu is held.
func (s *SyncServer) warnLocked(n uint64, msg string) {
	select {
	case s.warn[n] <- msg:
	default:
	}
}

// disconnect marks stream n of gateway id ended.
func (s *SyncServer) disconnect(id string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.warn, n)
	s.o.DataPlanes.Disconnect(id, n)
}

// view is a data plane's configuration as the control plane knows it:
// the revision, the digest state of Select of the state at that revision
// for its tags, and that Select's rule (nil when not known).
type view struct {
	revision uint64
	digest   protocol.Digester
	filter   *filter
}

// digestCache is the server-wide bounded cache of the views delivered,
// by tags and revision. Safe for concurrent use.
type digestCache struct {
	mu    sync.Mutex
	max   int
	m     map[cacheKey]view
	order []cacheKey // oldest first
}

type cacheKey struct {
	tags     string // tagsKey
	revision uint64
}

func newDigestCache(max int) *digestCache {
	return &digestCache{max: max, m: map[cacheKey]view{}}
}

// tagsKey names a set of tags: Select depends only on the set.
func tagsKey(tags []string) string {
	t := slices.Clone(tags)
	slices.Sort(t)
	t = slices.Compact(t)
	var b strings.Builder
	for _, s := range t {
		b.WriteString(strconv.Quote(s))
	}
	return b.String()
}

func (c *digestCache) get(tags string, rev uint64) (view, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[cacheKey{tags, rev}]
	return v, ok
}

func (c *digestCache) put(tags string, v view) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{tags, v.revision}
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = v
	for len(c.m) > c.max {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}

// flight is one computation of a current view (see currentView) that
// callers wait for.
type flight struct {
	done chan struct{}
	v    view
	err  error
}

// currentView returns the view of the store's state at its current
// revision for tags (named tkey), from the cache or computed from
// Store.Snapshot: streams with the same tags that need it at once share
// one computation, and the view is cached.
func (s *SyncServer) currentView(ctx context.Context, tags []string, tkey string) (view, error) {
	s.flightMu.Lock()
	f, ok := s.flights[tkey]
	if !ok {
		f = &flight{done: make(chan struct{})}
		s.flights[tkey] = f
		s.flightMu.Unlock()
		// Waiters share the result: a stream that ends does not end it.
		f.v, f.err = s.computeCurrentView(context.WithoutCancel(ctx), tags, tkey)
		s.flightMu.Lock()
		delete(s.flights, tkey)
		close(f.done)
	}
	s.flightMu.Unlock()
	select {
	case <-f.done:
		return f.v, f.err
	case <-ctx.Done():
		return view{}, ctx.Err()
	}
}

// computeCurrentView reads and digests Select of the state for tags and
// the rule of that Select, at one revision (read again when a write came
// in between, up to 3 times).
func (s *SyncServer) computeCurrentView(ctx context.Context, tags []string, tkey string) (view, error) {
	for range 3 {
		rev, err := s.revision(ctx)
		if err != nil {
			return view{}, err
		}
		if v, ok := s.cache.get(tkey, rev); ok && v.filter != nil {
			return v, nil
		}
		snap, err := s.o.Store.Snapshot(ctx, tags)
		if err != nil {
			return view{}, fmt.Errorf("controlplane: sync: read snapshot: %w", err)
		}
		rule, err := s.filterAt(ctx, snap.Revision, tags)
		if err != nil {
			return view{}, fmt.Errorf("controlplane: sync: read policies and APIs: %w", err)
		}
		if rule == nil {
			continue // written meanwhile
		}
		v := view{revision: snap.Revision, digest: protocol.DigesterOf(snap), filter: rule}
		s.cache.put(tkey, v)
		return v, nil
	}
	return view{}, errors.New("controlplane: sync: the state kept changing while it was read")
}

// viewAt returns the view of revision rev for tags (named tkey) when the
// store still can tell it: the current view (currentView) with the
// changes after rev undone. That is how a replica that did not make a
// data plane's deliveries (or a restarted control plane) knows what the
// data plane runs, so a data plane that moves between replicas of one
// store gets changes, not a snapshot; the data plane's digest must equal
// the view's for it to be used. It reports false when the view cannot be
// told: rev is above the store's revision, more than MaxChanges
// revisions behind, its changes are no longer in the change log, or a
// policy or API changed since in a view that leaves APIs out (those
// would bring a snapshot anyway). The view is cached. Errors are the
// store's, as status errors.
func (s *SyncServer) viewAt(ctx context.Context, tags []string, tkey string, rev uint64) (view, bool, error) {
	cur, err := s.currentView(ctx, tags, tkey)
	if err != nil {
		s.o.Log.Error("controlplane: sync: read the current view", "err", err)
		return view{}, false, status.Errorf(codes.Unavailable, "%v", err)
	}
	if rev > cur.revision {
		// A shared computation that started before the data plane got
		// rev (from another replica): read again.
		if cur, err = s.computeCurrentView(ctx, tags, tkey); err != nil {
			s.o.Log.Error("controlplane: sync: read the current view", "err", err)
			return view{}, false, status.Errorf(codes.Unavailable, "%v", err)
		}
	}
	if rev == cur.revision {
		return cur, true, nil
	}
	if rev > cur.revision || cur.revision-rev > uint64(s.o.MaxChanges) {
		return view{}, false, nil
	}
	changes, err := s.o.Store.ChangesSince(ctx, rev)
	if errors.Is(err, ErrTooFarBehind) || errors.Is(err, ErrRevisionAhead) {
		return view{}, false, nil
	}
	if err != nil {
		s.o.Log.Error("controlplane: sync: read changes", "err", err)
		return view{}, false, status.Errorf(codes.Unavailable, "controlplane: read changes: %v", err)
	}
	n := len(changes)
	for n > 0 && changes[n-1].Revision > cur.revision {
		n-- // written after the current view was read
	}
	changes = changes[:n]
	if n == 0 || changes[0].Revision != rev+1 || changes[n-1].Revision != cur.revision {
		return view{}, false, nil
	}
	d, ok, err := undoChanges(changes, tags, cur.filter, cur.digest)
	if err != nil {
		s.o.Log.Error("controlplane: sync: undo changes", "err", err)
		return view{}, false, status.Errorf(codes.Internal, "%v", err)
	}
	if !ok {
		return view{}, false, nil
	}
	// With policy or API changes the rule is the identity all along
	// (undoChanges checked every API changed was selected); with key
	// changes only, the policies and APIs at rev are those now.
	v := view{revision: rev, digest: d, filter: cur.filter}
	s.cache.put(tkey, v)
	return v, true, nil
}

// undoChanges takes the changes (in order) out of d, the digest state of
// the view after them, and returns the digest state before them. rule is
// Select's rule after them. It reports false when the view before them
// cannot be told from them: a policy or API changed and the tags do not
// select every API then.
func undoChanges(changes []Change, tags []string, rule *filter, d protocol.Digester) (protocol.Digester, bool, error) {
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		if c.Object != ObjectKey && !rule.identity {
			return d, false, nil
		}
		var err error
		switch c.Object {
		case ObjectPolicy:
			err = undoAsIs(c, d.RemovePolicy, d.AddPolicy)
		case ObjectAPI:
			var o, n *spec.API
			if o, err = decodeOpt[spec.API](c.Old); err == nil {
				n, err = decodeOpt[spec.API](c.Value)
			}
			if err == nil && (o != nil && !Selects(o.Tags, tags) || n != nil && !Selects(n.Tags, tags)) {
				return d, false, nil
			}
			if err == nil {
				err = undoAsIs(c, d.RemoveAPI, d.AddAPI)
			}
		case ObjectKey:
			if rule.identity {
				err = undoAsIs(c, d.RemoveKey, d.AddKey)
				break
			}
			var o, n *spec.Key
			if o, err = decodeOpt[spec.Key](c.Old); err == nil {
				n, err = decodeOpt[spec.Key](c.Value)
			}
			if err != nil {
				break
			}
			if n != nil {
				if fn, has := rule.key(*n); has {
					d.RemoveKey(&fn)
				}
			}
			if o != nil {
				if fo, had := rule.key(*o); had {
					d.AddKey(&fo)
				}
			}
		default:
			err = fmt.Errorf("unknown object %q", c.Object)
		}
		if err != nil {
			return d, false, fmt.Errorf("controlplane: sync: undo the change of %s %q at revision %d: %w", c.Object, c.ID, c.Revision, err)
		}
	}
	return d, true, nil
}

// undoAsIs takes change c out of a digest: removes its new object and
// adds back its old one.
func undoAsIs[T any](c Change, remove, add func(*T)) error {
	o, err := decodeOpt[T](c.Old)
	if err != nil {
		return err
	}
	n, err := decodeOpt[T](c.Value)
	if err != nil {
		return err
	}
	if n != nil && c.Op != OpDelete {
		remove(n)
	}
	if o != nil {
		add(o)
	}
	return nil
}

// sent is a delivery made on a stream.
type sent struct {
	seq      uint64 // numbers the stream's deliveries from 1
	snapshot bool   // a snapshot, else Changes
	nonce    string
	revision uint64
	digest   string
}

// maxSent bounds the deliveries a stream remembers for late Acks and
// Nacks.
const maxSent = 256

// syncStream is one gateway's stream as Sync serves it.
type syncStream struct {
	s      *SyncServer
	stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]
	hello  *syncpb.Hello
	n      uint64 // the stream's number in DataPlanes
	tags   []string
	tkey   string
	// history is the history the gateway's configuration belongs to, as
	// far as the server knows: the Hello's, then that of each snapshot
	// sent ("": unknown, an agent that names none).
	history string

	base       *view  // what the gateway runs once it applies what was sent; nil: unknown
	deliveries []sent // latest last
	seq        uint64
	lastSnap   uint64 // seq of the latest snapshot sent
	force      bool   // send a snapshot now, even of the same revision
	nacked     bool   // the latest snapshot was Nacked ...
	nackedRev  uint64 // ... at this revision: no snapshot until the revision rises
	heldEmpty  bool   // an empty store's snapshot was held back (see deliver)
}

// Sync implements syncpb.SyncServiceServer.
func (s *SyncServer) Sync(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]) error {
	ctx := stream.Context()
	select {
	case <-s.shutdown:
		s.o.Metrics.refusedStream(refusedShutdown)
		return errShutdown
	default:
	}
	if n := s.open.Add(1); n > int64(s.o.MaxStreams) {
		s.open.Add(-1)
		return s.refuse(refusedTooManyStreams, status.Errorf(codes.ResourceExhausted, "controlplane: %d sync streams open already; retry with backoff", s.o.MaxStreams),
			"peer", peerAddr(stream))
	}
	s.o.Metrics.streamOpened(1)
	defer func() {
		s.open.Add(-1)
		s.o.Metrics.streamOpened(-1)
	}()
	// One goroutine receives, the Hello first; it ends when the stream
	// does, which gRPC ensures once Sync returns.
	msgs := make(chan *syncpb.ClientMessage)
	recvErr := make(chan error, 1)
	receive := func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}
	if n := s.pending.Add(1); n > int64(s.o.MaxPendingHellos) {
		s.pending.Add(-1)
		return s.refuse(refusedTooManyHellos, status.Errorf(codes.ResourceExhausted, "controlplane: %d sync streams wait for their Hello already; retry with backoff", s.o.MaxPendingHellos),
			"peer", peerAddr(stream))
	}
	go receive()
	h, err := s.recvHello(ctx, stream, msgs, recvErr)
	s.pending.Add(-1)
	if err != nil {
		return err
	}
	if err := s.authenticate(h, peerAddr(stream)); err != nil {
		return err
	}
	if err := protocol.CheckGatewayID(h.GetGatewayId()); err != nil {
		return s.refuse(refusedInvalid, status.Error(codes.InvalidArgument, "controlplane: Hello: "+cutProblem(err.Error())),
			"group", h.GetGroup(), "peer", peerAddr(stream))
	}
	id, tags := h.GetGatewayId(), slices.Clone(h.GetTags())
	n, warnings, dup := s.connect(h, tags, peerAddr(stream))
	defer s.disconnect(id, n)
	var dupCheck <-chan time.Time // fires once when dup
	if dup {
		t := time.NewTimer(s.o.DuplicateGrace)
		defer t.Stop()
		dupCheck = t.C
	}
	st := &syncStream{s: s, stream: stream, hello: h, n: n, tags: tags, tkey: tagsKey(tags), history: h.GetHistory()}
	hist, err := s.history(ctx)
	if err != nil {
		return err
	}
	r, pr := h.GetLastAppliedRevision(), h.GetPersistedRevision()
	if st.history != "" && st.history == hist || h.GetPersistedHistory() != "" && h.GetPersistedHistory() == hist {
		cur, err := s.revision(ctx)
		if err != nil {
			return err
		}
		if st.history == hist && r > cur || h.GetPersistedHistory() == hist && pr > cur {
			// The data plane ran a revision of this history the store
			// does not have: the store went back (restored from a copy).
			// Its revisions from now on must not be taken for the lost
			// ones: a new history.
			if hist, err = s.o.Store.ForkHistory(ctx, hist); err != nil {
				return s.storeFailed("fork the history", err)
			}
			s.o.Log.Warn("controlplane: a data plane runs or persisted a revision above the store's in the same history (was the store restored from a copy?); the store takes a new history and sends every data plane a snapshot of it",
				"gateway", id, "revision", r, "persisted_revision", pr, "store_revision", cur, "history", hist)
		}
	}
	if r > 0 && h.GetDigest() != "" && (st.history == "" || st.history == hist) {
		v, ok := s.cache.get(st.tkey, r)
		if !ok {
			// Not delivered by this process (a replica the data plane
			// moved to, or a restart): the view of r from the store.
			if v, ok, err = s.viewAt(ctx, tags, st.tkey, r); err != nil {
				return err
			}
		}
		if ok && v.digest.Digest() == h.GetDigest() {
			st.base = &v
		}
	}

	watcher, _ := s.o.Store.(RevisionWatcher)
	var poll <-chan time.Time
	if watcher == nil {
		t := time.NewTicker(s.o.PollInterval)
		defer t.Stop()
		poll = t.C
	}
	var changed <-chan struct{}
	// retry fires after a delivery failed for ErrStoreUnavailable: the
	// stream stays open (the gateway keeps what it runs) and tries again.
	var retry <-chan time.Time
	stale := true // the data plane may lack the current revision
	for first := true; ; first = false {
		if stale {
			if watcher != nil {
				changed = watcher.RevisionChanged()
			}
			err := st.deliver(ctx)
			switch {
			case errors.Is(err, ErrStoreUnavailable):
				retry = time.After(s.o.PollInterval)
			case err != nil:
				return err
			default:
				stale = false
			}
		}
		if first && !stale && len(st.deliveries) == 0 {
			// The gateway runs the current revision: nothing to send. A
			// DigestRequest tells it the control plane answered, and its
			// report confirms the digest.
			if err := stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_DigestRequest{DigestRequest: &syncpb.DigestRequest{}}}); err != nil {
				return err
			}
		}
		select {
		case <-changed:
			stale = true
		case <-poll:
			// Reading the revision is cheap; the state is read only
			// when it has risen.
			rev, err := s.revision(ctx)
			switch {
			case errors.Is(err, ErrStoreUnavailable):
				// Keep the stream; the next tick reads again.
			case err != nil:
				return err
			case rev != st.latest():
				stale = true
				// A revision that has not risen keeps a delivery still
				// due (a retry, a snapshot a Nack asked for).
			}
		case <-retry:
		case m := <-msgs:
			// A message can make the stream stale (a Nack, a digest
			// that differs) but never clears a delivery still due
			// (one that failed while the store was unavailable).
			if st.receive(m) {
				stale = true
			}
		case <-dupCheck:
			s.warnDuplicates(h, n, peerAddr(stream))
		case w := <-warnings:
			if err := stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_Warning{Warning: &syncpb.Warning{Message: w}}}); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.shutdown:
			return errShutdown
		}
	}
}

// recvHello waits HelloTimeout at most for the stream's first message,
// from msgs (or its end, from recvErr), which must be a Hello.
func (s *SyncServer) recvHello(ctx context.Context, stream grpc.ServerStream, msgs <-chan *syncpb.ClientMessage, recvErr <-chan error) (*syncpb.Hello, error) {
	t := time.NewTimer(s.o.HelloTimeout)
	defer t.Stop()
	select {
	case m := <-msgs:
		h := m.GetHello()
		if h == nil {
			return nil, s.refuse(refusedNotHello, status.Error(codes.InvalidArgument, "controlplane: the first message must be Hello"),
				"peer", peerAddr(stream))
		}
		return h, nil
	case err := <-recvErr:
		return nil, err
	case <-t.C:
		return nil, s.refuse(refusedHelloTimeout, status.Errorf(codes.DeadlineExceeded, "controlplane: no Hello within %s", s.o.HelloTimeout),
			"peer", peerAddr(stream))
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.shutdown:
		s.o.Metrics.refusedStream(refusedShutdown)
		return nil, errShutdown
	}
}

// latest is the revision of the latest delivery, or of the view the
// Hello named; 0 for none.
func (st *syncStream) latest() uint64 {
	if n := len(st.deliveries); n > 0 {
		return st.deliveries[n-1].revision
	}
	if st.base != nil {
		return st.base.revision
	}
	return 0
}

// history reads the store's history id.
func (s *SyncServer) history(ctx context.Context) (string, error) {
	h, err := s.o.Store.History(ctx)
	if err != nil {
		return "", s.storeFailed("read the history", err)
	}
	return h, nil
}

// revision reads the store's revision.
func (s *SyncServer) revision(ctx context.Context) (uint64, error) {
	var rev uint64
	err := s.o.Store.View(ctx, func(r Reader) error { rev = r.Revision(); return nil })
	if err != nil {
		return 0, s.storeFailed("read revision", err)
	}
	return rev, nil
}

// storeError is the Unavailable status a stream ends with when the store
// fails, keeping the store's error for errors.Is (ErrStoreUnavailable).
type storeError struct {
	st  *status.Status
	err error
}

func (e *storeError) Error() string              { return e.st.Err().Error() }
func (e *storeError) GRPCStatus() *status.Status { return e.st }
func (e *storeError) Unwrap() error              { return e.err }

// storeFailed logs a failed store read (rate-limited when the store's
// database is unavailable: every open stream meets it) and returns it as
// an Unavailable status.
func (s *SyncServer) storeFailed(what string, err error) error {
	if errors.Is(err, ErrStoreUnavailable) {
		s.outages.Failed(fmt.Errorf("%s: %w", what, err))
	} else {
		s.o.Log.Error("controlplane: sync: "+what, "err", err)
	}
	return &storeError{status.Newf(codes.Unavailable, "controlplane: %s: %v", what, err), err}
}

// deliver brings the gateway to the store's revision: Changes when it
// can, a snapshot otherwise, nothing when it is there already or only a
// Nacked snapshot of this revision could be sent. A gateway whose
// configuration belongs to another history than the store's is sent a
// snapshot at once.
func (st *syncStream) deliver(ctx context.Context) error {
	s := st.s
	hist, err := s.history(ctx)
	if err != nil {
		return err
	}
	foreign := st.history != "" && st.history != hist
	if foreign && st.hello.GetLastAppliedRevision() > 0 {
		// A store never written (a control plane started on a new or
		// wrong data file) would replace what the gateway runs, of
		// another history, with nothing: every request of every data
		// plane answered 503. It is held back until the store's first
		// write; an import of an export, or any write, is sent.
		rev, err := s.revision(ctx)
		if err != nil {
			return err
		}
		if rev == 0 {
			if !st.heldEmpty {
				st.heldEmpty = true
				runs := "runs revision " + strconv.FormatUint(st.hello.GetLastAppliedRevision(), 10) + " of another history"
				s.o.Log.Error("controlplane: sync: the store is empty (revision 0, never written) and this data plane "+runs+"; its configuration is not replaced with nothing (is -data the right file? import an export, or write anything to send this store's configuration)",
					"gateway", st.hello.GetGatewayId(), "group", st.hello.GetGroup(), "running_history", st.history, "store_history", hist)
				msg := "this control plane's store is empty (never written) and this data plane " + runs + ": its configuration is kept until the store is written"
				if err := st.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_Warning{Warning: &syncpb.Warning{Message: msg}}}); err != nil {
					return err
				}
			}
			return nil
		}
	}
	force := st.force || foreign
	st.force = false
	if st.base != nil && !force {
		ch, next, why, err := s.planChanges(ctx, st.tags, *st.base)
		if err != nil {
			return s.storeFailed("read changes", err)
		}
		if why == "" {
			if ch != nil {
				ch.Nonce = rand.Text()
				if err := st.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_Changes{Changes: ch}}); err != nil {
					return err
				}
				st.record(sent{nonce: ch.Nonce, revision: ch.Revision, digest: ch.Digest})
				s.o.Metrics.delivered(false)
			}
			st.base = &next
			s.cache.put(st.tkey, next)
			return nil
		}
		s.o.Log.Debug("controlplane: sync: sending a snapshot instead of changes",
			"gateway", st.hello.GetGatewayId(), "from_revision", st.base.revision, "reason", why)
	}
	if !force {
		rev, err := s.revision(ctx)
		if err != nil {
			return err
		}
		if st.nacked && rev <= st.nackedRev {
			return nil // the gateway refused this revision; wait for the next
		}
		if st.base == nil && len(st.deliveries) > 0 && st.latest() == rev && !st.nacked {
			return nil
		}
	}
	nonce := rand.Text()
	snap, chunks, v, err := s.snapshotView(ctx, st.tags, nonce)
	if errors.Is(err, errEncodeSnapshot) {
		return status.Errorf(codes.Internal, "%v", err)
	}
	if err != nil {
		return s.storeFailed("read snapshot", err)
	}
	chunks[len(chunks)-1].History = hist
	for _, c := range chunks {
		if err := st.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: c}}); err != nil {
			return err
		}
	}
	st.record(sent{snapshot: true, nonce: nonce, revision: snap.Revision, digest: chunks[len(chunks)-1].Digest})
	s.o.Metrics.delivered(true)
	st.lastSnap, st.nacked, st.history = st.seq, false, hist
	st.base = &v
	s.cache.put(st.tkey, v)
	return nil
}

// record numbers and remembers a delivery.
func (st *syncStream) record(d sent) {
	st.seq++
	d.seq = st.seq
	st.deliveries = append(st.deliveries, d)
	if len(st.deliveries) > maxSent {
		st.deliveries = slices.Delete(st.deliveries, 0, len(st.deliveries)-maxSent)
	}
}

// errEncodeSnapshot wraps snapshotView's failure to encode a snapshot.
var errEncodeSnapshot = errors.New("controlplane: encode snapshot")

// snapshotView reads the data plane's snapshot, cuts it into chunks with
// nonce, and returns it with the chunks and its view. The view's digest
// state comes from the encoding (protocol.ChunksDigester), so a snapshot
// is digested once.
func (s *SyncServer) snapshotView(ctx context.Context, tags []string, nonce string) (*spec.Snapshot, []*syncpb.SnapshotChunk, view, error) {
	snap, err := s.o.Store.Snapshot(ctx, tags)
	if err != nil {
		return nil, nil, view{}, err
	}
	chunks, digest, err := protocol.ChunksDigester(snap, nonce, s.o.ChunkBytes)
	if err != nil {
		return nil, nil, view{}, fmt.Errorf("%w: %w", errEncodeSnapshot, err)
	}
	v := view{revision: snap.Revision, digest: digest}
	// Select's rule at the snapshot's revision, when the state has not
	// moved since (else it is read when the next changes are planned).
	v.filter, err = s.filterAt(ctx, snap.Revision, tags)
	return snap, chunks, v, err
}

// filterAt returns Select's rule for tags at revision rev, read from the
// store's policies and APIs; nil when the state has moved past rev.
func (s *SyncServer) filterAt(ctx context.Context, rev uint64, tags []string) (*filter, error) {
	var rule *filter
	err := s.o.Store.View(ctx, func(r Reader) error {
		if r.Revision() != rev {
			return nil
		}
		pols, err := r.Policies()
		if err != nil {
			return err
		}
		apis, err := r.APIs()
		if err != nil {
			return err
		}
		rule = newFilter(pols, apis, tags)
		return nil
	})
	return rule, err
}

// planChanges returns the Changes that bring a data plane with tags from
// base to the store's revision and the view they make; nil Changes when
// base is at that revision. When Changes cannot be sent (see SyncServer),
// it returns why instead. Errors are the store's.
//
// The changes and the state they are filtered with are read in two
// transactions: the state's revision is read first and the changes past
// it are dropped, so both describe the same revision.
func (s *SyncServer) planChanges(ctx context.Context, tags []string, base view) (*syncpb.Changes, view, string, error) {
	readRule := base.filter == nil
	for range 3 {
		var cur uint64
		var pols []spec.Policy
		var apis []spec.API
		err := s.o.Store.View(ctx, func(r Reader) error {
			cur = r.Revision()
			if !readRule {
				return nil
			}
			var err error
			if pols, err = r.Policies(); err != nil {
				return err
			}
			apis, err = r.APIs()
			return err
		})
		if err != nil {
			return nil, view{}, "", err
		}
		switch {
		case cur == base.revision:
			if base.filter == nil {
				base.filter = newFilter(pols, apis, tags)
			}
			return nil, base, "", nil
		case cur < base.revision:
			return nil, view{}, fmt.Sprintf("the data plane's revision %d is above the store's %d", base.revision, cur), nil
		case cur-base.revision > uint64(s.o.MaxChanges):
			return nil, view{}, fmt.Sprintf("%d revisions behind, more than %d changes", cur-base.revision, s.o.MaxChanges), nil
		}
		changes, err := s.o.Store.ChangesSince(ctx, base.revision)
		if errors.Is(err, ErrTooFarBehind) || errors.Is(err, ErrRevisionAhead) {
			return nil, view{}, err.Error(), nil
		}
		if err != nil {
			return nil, view{}, "", err
		}
		// Writes after the View are for the next delivery.
		n := len(changes)
		for n > 0 && changes[n-1].Revision > cur {
			n--
		}
		changes = changes[:n]
		if n == 0 || changes[0].Revision != base.revision+1 || changes[n-1].Revision != cur {
			return nil, view{}, fmt.Sprintf("the change log after %d does not end at the state's revision %d", base.revision, cur), nil
		}
		structural := slices.ContainsFunc(changes, func(c Change) bool { return c.Object != ObjectKey })
		if structural && !readRule {
			readRule = true // the rule may change: read it at cur
			continue
		}
		rule := base.filter
		if readRule {
			// With key changes only, the policies and APIs at cur are
			// those at base.revision: the rule holds all along.
			rule = newFilter(pols, apis, tags)
		}
		ch, d, why, err := s.filterChanges(changes, tags, rule, structural, base.digest)
		if err != nil || why != "" {
			return nil, view{}, why, err
		}
		ch.FromRevision, ch.Revision, ch.Digest = base.revision, cur, d.Digest()
		return ch, view{revision: cur, digest: d, filter: rule}, "", nil
	}
	return nil, view{}, "the state kept changing while it was read", nil
}

// filterChanges maps the store's changes onto the view of tags (see
// SyncServer) and updates the digest state d with them. rule is Select's
// rule at the end of the changes; structural says some change a policy
// or an API.
func (s *SyncServer) filterChanges(changes []Change, tags []string, rule *filter, structural bool, d protocol.Digester) (*syncpb.Changes, protocol.Digester, string, error) {
	if structural && !rule.identity {
		return nil, d, "a policy or an API changed and the tags do not select every API", nil
	}
	out := &syncpb.Changes{}
	size := 0
	for _, c := range changes {
		var pc *syncpb.Change
		var err error
		switch c.Object {
		case ObjectPolicy:
			pc, err = asIs(c, syncpb.Change_OBJECT_POLICY, d.RemovePolicy, d.AddPolicy)
		case ObjectAPI:
			var o, n *spec.API
			if o, err = decodeOpt[spec.API](c.Old); err == nil {
				n, err = decodeOpt[spec.API](c.Value)
			}
			if err == nil && (o != nil && !Selects(o.Tags, tags) || n != nil && !Selects(n.Tags, tags)) {
				// The view was not the identity in between.
				return nil, d, fmt.Sprintf("API %q changed at revision %d is not selected by the tags", c.ID, c.Revision), nil
			}
			if err == nil {
				pc, err = asIs(c, syncpb.Change_OBJECT_API, d.RemoveAPI, d.AddAPI)
			}
		case ObjectKey:
			pc, err = filterKey(c, rule, &d)
		default:
			err = fmt.Errorf("unknown object %q", c.Object)
		}
		if err != nil {
			return nil, d, "", fmt.Errorf("controlplane: sync: change of %s %q at revision %d: %w", c.Object, c.ID, c.Revision, err)
		}
		if pc == nil {
			continue
		}
		size += len(pc.Id) + len(pc.Json)
		if len(out.Changes) == s.o.MaxChanges || size > s.o.MaxChangesBytes {
			return nil, d, fmt.Sprintf("the changes exceed %d changes or %d bytes", s.o.MaxChanges, s.o.MaxChangesBytes), nil
		}
		out.Changes = append(out.Changes, pc)
	}
	return out, d, "", nil
}

// asIs returns change c as it is, removing its old object from the
// digest and adding its new one.
func asIs[T any](c Change, object syncpb.Change_Object, remove, add func(*T)) (*syncpb.Change, error) {
	o, err := decodeOpt[T](c.Old)
	if err != nil {
		return nil, err
	}
	n, err := decodeOpt[T](c.Value)
	if err != nil {
		return nil, err
	}
	if o != nil {
		remove(o)
	}
	if c.Op == OpDelete {
		return protocol.Delete(object, c.ID), nil
	}
	if n == nil {
		return nil, errors.New("a put without a value")
	}
	add(n)
	return &syncpb.Change{Kind: syncpb.Change_KIND_PUT, Object: object, Id: c.ID, Json: c.Value}, nil
}

// filterKey maps a key change by rule: a PUT of the key as the view holds
// it, a DELETE when the view held it and no longer does, nil when the
// view holds it neither before nor after.
func filterKey(c Change, rule *filter, d *protocol.Digester) (*syncpb.Change, error) {
	if rule.identity {
		return asIs(c, syncpb.Change_OBJECT_KEY, d.RemoveKey, d.AddKey)
	}
	o, err := decodeOpt[spec.Key](c.Old)
	if err != nil {
		return nil, err
	}
	n, err := decodeOpt[spec.Key](c.Value)
	if err != nil {
		return nil, err
	}
	var had, has bool
	var fo, fn spec.Key
	if o != nil {
		fo, had = rule.key(*o)
	}
	if n != nil {
		fn, has = rule.key(*n)
	}
	if had {
		d.RemoveKey(&fo)
	}
	switch {
	case has:
		d.AddKey(&fn)
		return protocol.PutKey(&fn)
	case had:
		return protocol.Delete(syncpb.Change_OBJECT_KEY, c.ID), nil
	}
	return nil, nil
}

// decodeOpt decodes an object's JSON; nil for none.
func decodeOpt[T any](b []byte) (*T, error) {
	if len(b) == 0 {
		return nil, nil
	}
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return v, nil
}

// receive handles a message after Hello; it reports whether a delivery
// is due now (a snapshot: the data plane's digest differs from the one
// sent, or it refused Changes).
func (st *syncStream) receive(m *syncpb.ClientMessage) bool {
	s := st.s
	now := s.o.Now()
	id := st.hello.GetGatewayId()
	find := func(nonce string, rev uint64) *sent {
		i := slices.IndexFunc(st.deliveries, func(d sent) bool { return d.nonce == nonce && d.revision == rev })
		if i < 0 {
			return nil
		}
		return &st.deliveries[i]
	}
	switch k := m.GetKind().(type) {
	case *syncpb.ClientMessage_Ack:
		ok := find(k.Ack.GetNonce(), k.Ack.GetRevision()) != nil
		s.o.Metrics.acked(true)
		s.o.DataPlanes.Update(id, st.n, func(dp *DataPlane) {
			dp.LastSeen = now
			if ok {
				dp.AppliedRevision = k.Ack.GetRevision()
				dp.AppliedRevision = k.Ack.GetRevision()
				dp.NotBuilt = notBuilt(k.Ack.GetNotBuilt())
				if dp.LastRejection != nil && dp.LastRejection.Revision <= dp.AppliedRevision {
					dp.LastRejection = nil // it runs that revision, or a later one, now
				}
			}
		})
		if !ok {
			s.o.Log.Warn("controlplane: sync: Ack of a delivery not made on this stream ignored",
				"gateway", id, "revision", k.Ack.GetRevision(), "nonce", k.Ack.GetNonce())
		}
	case *syncpb.ClientMessage_Nack:
		s.o.Metrics.acked(false)
		problem := cutProblem(k.Nack.GetError())
		s.o.Log.Warn("controlplane: sync: data plane rejected a revision",
			"group", st.hello.GetGroup(), "gateway", id, "revision", k.Nack.GetRevision(), "problem", problem)
		s.o.DataPlanes.Update(id, st.n, func(dp *DataPlane) {
			dp.LastSeen = now
			dp.LastRejection = &Rejection{Revision: k.Nack.GetRevision(), Problem: problem, At: now}
		})
		d := find(k.Nack.GetNonce(), k.Nack.GetRevision())
		switch {
		case d == nil, d.seq < st.lastSnap:
			// Unknown, or a snapshot sent since replaces it.
		case d.snapshot:
			// The gateway runs what it ran before; the next revision
			// comes as a snapshot.
			st.base, st.nacked, st.nackedRev = nil, true, d.revision
		default:
			// Changes refused (later ones on their way will be too):
			// one snapshot now.
			st.base, st.force = nil, true
			return true
		}
	case *syncpb.ClientMessage_DigestReport:
		r := k.DigestReport
		s.o.DataPlanes.Update(id, st.n, func(dp *DataPlane) {
			dp.LastSeen = now
			dp.NotBuilt = notBuilt(r.GetNotBuilt())
		})
		var want string
		if i := slices.IndexFunc(st.deliveries, func(d sent) bool { return d.revision == r.GetRevision() }); i >= 0 {
			want = st.deliveries[i].digest
		} else if v, ok := s.cache.get(st.tkey, r.GetRevision()); ok {
			want = v.digest.Digest()
		}
		if want != "" && want != r.GetDigest() {
			s.o.Log.Warn("controlplane: sync: data plane's digest differs; sending a fresh snapshot",
				"gateway", id, "revision", r.GetRevision())
			st.base, st.force = nil, true
			return true
		}
	default:
		s.o.DataPlanes.Update(id, st.n, func(dp *DataPlane) { dp.LastSeen = now })
	}
	return false
}

// Bounds of what a gateway reports as the control plane keeps it: the
// entries of its list of APIs not built, and the bytes of a problem (a
// Nack's error, each API's).
const (
	maxNotBuilt = 1000
	maxProblem  = 1024
)

// notBuilt is a gateway's list of APIs not built, as DataPlane keeps it
// (nil when empty; at most maxNotBuilt entries, each problem cut by
// cutProblem).
func notBuilt(nb []*syncpb.NotBuilt) []NotBuilt {
	var out []NotBuilt
	for _, n := range nb[:min(len(nb), maxNotBuilt)] {
		out = append(out, NotBuilt{API: n.GetApi(), Policy: n.GetPolicy(), Problem: cutProblem(n.GetProblem())})
	}
	return out
}

// cutProblem returns a gateway's text (a Nack's error, a NotBuilt's
// problem; a Hello's gateway_id, group or tag before they are checked) as
// the control plane logs and keeps it: cut to maxProblem bytes, "…"
// marking a cut.
func cutProblem(p string) string {
	if len(p) > maxProblem {
		p = strings.ToValidUTF8(p[:maxProblem], "") + "…"
	}
	return p
}

// peerAddr is the remote address of a stream, for logs ("" when
// unknown).
func peerAddr(stream grpc.ServerStream) string {
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
