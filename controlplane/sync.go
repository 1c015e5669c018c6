package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
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
	// PollInterval is how often the revision is read to find writes when
	// Store is not a RevisionWatcher; 0 means one second.
	PollInterval time.Duration
	// Now is the clock of LastSeen and rejection times; nil means
	// time.Now.
	Now func() time.Time
	// Log receives refused streams and rejected revisions; nil means
	// slog.Default().
	Log *slog.Logger
}

// SyncServer serves syncpb.SyncService: each gateway's configuration
// stream.
//
// After an accepted Hello it sends the data plane's snapshot (Select of
// the state for the Hello's tags) in chunks with a fresh nonce, and again
// whenever the store's revision rises. It always sends a whole snapshot,
// on connect as on each write, and never Changes: the change log is not
// yet filtered by tags, and a snapshot is right whatever the gateway
// runs. The cost is a snapshot's encoding per connected gateway per
// write (writes that come while one is sent are folded into the next).
//
// Ack records the acknowledged revision in DataPlanes, Nack the
// rejection; DigestReport refreshes LastSeen, and a digest that differs
// from the one sent for that revision makes the server send a fresh
// snapshot.
type SyncServer struct {
	syncpb.UnimplementedSyncServiceServer
	o      SyncOptions
	tokens []token

	mu      sync.Mutex
	streams map[string]uint64 // gateway ID → its latest stream's number
	next    uint64

	shutdown     chan struct{} // closed by Shutdown
	shutdownOnce sync.Once
}

// errShutdown ends streams once Shutdown was called.
var errShutdown = status.Error(codes.Unavailable, "controlplane: the control plane is shutting down; reconnect with backoff")

// Shutdown ends every open stream, and refuses new ones, with
// Unavailable, so gateways reconnect (to this control plane's successor)
// with backoff. Call it before grpc.Server.GracefulStop, which otherwise
// waits for streams that never end by themselves. It is safe to call more
// than once.
func (s *SyncServer) Shutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdown) })
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
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &SyncServer{o: o, streams: map[string]uint64{}, shutdown: make(chan struct{})}
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
		s.o.Log.Warn("controlplane: sync stream refused: unknown data-plane token",
			"group", h.GetGroup(), "gateway", h.GetGatewayId(), "peer", peer)
		return status.Error(codes.Unauthenticated, "controlplane: unknown data-plane token")
	}
	if h.GetGroup() != found.group {
		s.o.Log.Warn("controlplane: sync stream refused: group outside the token's scope",
			"group", h.GetGroup(), "token_group", found.group, "gateway", h.GetGatewayId(), "peer", peer)
		return status.Errorf(codes.PermissionDenied, "controlplane: the token is not for group %q", h.GetGroup())
	}
	for _, t := range h.GetTags() {
		if !slices.Contains(found.tags, t) {
			s.o.Log.Warn("controlplane: sync stream refused: tag outside the token's scope",
				"group", h.GetGroup(), "tag", t, "gateway", h.GetGatewayId(), "peer", peer)
			return status.Errorf(codes.PermissionDenied, "controlplane: the token may not ask for tag %q", t)
		}
	}
	return nil
}

// connect records a new stream of gateway id in DataPlanes and numbers
// it, so that the end of an earlier stream of the same gateway (a
// reconnect before the old stream noticed it was dead) does not mark the
// new one disconnected. It returns the stream's number.
func (s *SyncServer) connect(id, group string, tags []string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.streams[id] = s.next
	s.o.DataPlanes.Update(id, func(dp *DataPlane) {
		dp.Group, dp.Tags, dp.Connected, dp.LastSeen = group, tags, true, s.o.Now()
	})
	return s.next
}

// disconnect marks gateway id disconnected when stream n is its latest.
func (s *SyncServer) disconnect(id string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams[id] != n {
		return
	}
	delete(s.streams, id)
	s.o.DataPlanes.Update(id, func(dp *DataPlane) { dp.Connected = false })
}

// sent is a snapshot delivered on a stream and not yet superseded.
type sent struct {
	nonce    string
	revision uint64
	digest   string
}

// maxSent bounds the deliveries a stream remembers for late Acks.
const maxSent = 16

// Sync implements syncpb.SyncServiceServer.
func (s *SyncServer) Sync(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage]) error {
	ctx := stream.Context()
	select {
	case <-s.shutdown:
		return errShutdown
	default:
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHello()
	if h == nil {
		return status.Error(codes.InvalidArgument, "controlplane: the first message must be Hello")
	}
	if err := s.authenticate(h, peerAddr(stream)); err != nil {
		return err
	}
	if h.GetGatewayId() == "" {
		return status.Error(codes.InvalidArgument, "controlplane: Hello without gateway_id")
	}
	id, tags := h.GetGatewayId(), slices.Clone(h.GetTags())
	defer s.disconnect(id, s.connect(id, h.GetGroup(), tags))

	// One goroutine receives; it ends when the stream does, which gRPC
	// ensures once Sync returns.
	msgs := make(chan *syncpb.ClientMessage)
	recvErr := make(chan error, 1)
	go func() {
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
	}()

	watcher, _ := s.o.Store.(RevisionWatcher)
	var poll <-chan time.Time
	if watcher == nil {
		t := time.NewTicker(s.o.PollInterval)
		defer t.Stop()
		poll = t.C
	}
	var deliveries []sent
	var changed <-chan struct{}
	stale := true // the data plane may lack the current revision
	for {
		if stale {
			if watcher != nil {
				changed = watcher.RevisionChanged()
			}
			d, err := s.send(stream, tags, deliveries)
			if err != nil {
				return err
			}
			if d != nil {
				deliveries = append(deliveries, *d)
				if len(deliveries) > maxSent {
					deliveries = deliveries[len(deliveries)-maxSent:]
				}
			}
			stale = false
		}
		select {
		case <-changed:
			stale = true
		case <-poll:
			// Reading the revision is cheap; the snapshot is read only
			// when it has risen.
			rev, err := s.revision(ctx)
			if err != nil {
				return err
			}
			stale = len(deliveries) == 0 || rev != deliveries[len(deliveries)-1].revision
		case m := <-msgs:
			resend := s.receive(h, m, deliveries)
			stale = stale || resend
			if resend && len(deliveries) > 0 {
				deliveries = deliveries[:0] // force a fresh delivery
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

// revision reads the store's revision.
func (s *SyncServer) revision(ctx context.Context) (uint64, error) {
	var rev uint64
	err := s.o.Store.View(ctx, func(r Reader) error { rev = r.Revision(); return nil })
	if err != nil {
		s.o.Log.Error("controlplane: sync: read revision", "err", err)
		return 0, status.Errorf(codes.Unavailable, "controlplane: read revision: %v", err)
	}
	return rev, nil
}

// send sends the data plane's snapshot unless the latest delivery
// already carried its revision; it returns the new delivery or nil.
func (s *SyncServer) send(stream grpc.BidiStreamingServer[syncpb.ClientMessage, syncpb.ServerMessage], tags []string, deliveries []sent) (*sent, error) {
	snap, err := s.o.Store.Snapshot(stream.Context(), tags)
	if err != nil {
		s.o.Log.Error("controlplane: sync: read snapshot", "err", err)
		return nil, status.Errorf(codes.Unavailable, "controlplane: read snapshot: %v", err)
	}
	if n := len(deliveries); n > 0 && deliveries[n-1].revision == snap.Revision {
		return nil, nil
	}
	nonce := rand.Text()
	chunks, err := protocol.Chunks(snap, nonce, s.o.ChunkBytes)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "controlplane: encode snapshot: %v", err)
	}
	for _, c := range chunks {
		if err := stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: c}}); err != nil {
			return nil, err
		}
	}
	return &sent{nonce: nonce, revision: snap.Revision, digest: chunks[len(chunks)-1].Digest}, nil
}

// receive handles a message after Hello; it reports whether the data
// plane needs a fresh snapshot (its digest differs from the one sent).
func (s *SyncServer) receive(h *syncpb.Hello, m *syncpb.ClientMessage, deliveries []sent) bool {
	now := s.o.Now()
	id := h.GetGatewayId()
	find := func(nonce string, rev uint64) bool {
		return slices.ContainsFunc(deliveries, func(d sent) bool { return d.nonce == nonce && d.revision == rev })
	}
	switch k := m.GetKind().(type) {
	case *syncpb.ClientMessage_Ack:
		ok := find(k.Ack.GetNonce(), k.Ack.GetRevision())
		s.o.DataPlanes.Update(id, func(dp *DataPlane) {
			dp.LastSeen = now
			if ok {
				dp.AppliedRevision = k.Ack.GetRevision()
			}
		})
		if !ok {
			s.o.Log.Warn("controlplane: sync: Ack of a delivery not made on this stream ignored",
				"gateway", id, "revision", k.Ack.GetRevision(), "nonce", k.Ack.GetNonce())
		}
	case *syncpb.ClientMessage_Nack:
		s.o.Log.Warn("controlplane: sync: data plane rejected a revision",
			"group", h.GetGroup(), "gateway", id, "revision", k.Nack.GetRevision(), "problem", k.Nack.GetError())
		s.o.DataPlanes.Update(id, func(dp *DataPlane) {
			dp.LastSeen = now
			dp.LastRejection = &Rejection{Revision: k.Nack.GetRevision(), Problem: k.Nack.GetError(), At: now}
		})
	case *syncpb.ClientMessage_DigestReport:
		s.o.DataPlanes.Update(id, func(dp *DataPlane) { dp.LastSeen = now })
		r := k.DigestReport
		i := slices.IndexFunc(deliveries, func(d sent) bool { return d.revision == r.GetRevision() })
		if i >= 0 && deliveries[i].digest != r.GetDigest() {
			s.o.Log.Warn("controlplane: sync: data plane's digest differs; sending a fresh snapshot",
				"gateway", id, "revision", r.GetRevision())
			return true
		}
	default:
		s.o.DataPlanes.Update(id, func(dp *DataPlane) { dp.LastSeen = now })
	}
	return false
}

// peerAddr is the remote address of a stream, for logs ("" when
// unknown).
func peerAddr(stream grpc.ServerStream) string {
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
