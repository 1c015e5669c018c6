package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

// backoffConfig is gRPC's redial backoff bounded like the agent's.
func backoffConfig(b Backoff) grpcbackoff.Config {
	return grpcbackoff.Config{BaseDelay: b.Initial, Multiplier: b.Multiplier, Jitter: b.Jitter, MaxDelay: b.Max}
}

// persistedHelloTimeout bounds reading the persisted revision for Hello:
// a slow persister does not hold a reconnect back.
const persistedHelloTimeout = 500 * time.Millisecond

// session is one sync stream.
type session struct {
	a      *Agent
	stream grpc.BidiStreamingClient[syncpb.ClientMessage, syncpb.ServerMessage]
	asm    *protocol.Assembler
	sendMu sync.Mutex // the reporter and the receiver both send
	// sentNotBuilt is the list of APIs not built last sent (in an Ack or
	// a DigestReport); guarded by sendMu.
	sentNotBuilt []live.NotBuilt
}

// session runs one stream until it ends or ctx is done. It reports
// whether the control plane answered on it (sent any message), and the
// error that ended it; onAnswer is called at the first answer.
func (a *Agent) session(ctx context.Context, conn grpc.ClientConnInterface, onAnswer func()) (answered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(sctx)
	if err != nil {
		return false, fmt.Errorf("dataplane: open the sync stream: %w", err)
	}
	s := &session{a: a, stream: stream, asm: protocol.NewAssembler(protocol.AssemblerOptions{})}
	rev, digest, history := a.current()
	hello := &syncpb.Hello{Group: a.o.Group, Tags: a.o.Tags, Token: a.o.Token, LastAppliedRevision: rev,
		Digest: digest, GatewayId: a.o.GatewayID, Version: a.o.Version, History: history}
	if hp, ok := a.o.Persister.(HistoryPersister); ok {
		// What the group persisted, so a control plane restored from a
		// copy learns of later revisions no gateway runs; unknown when
		// the persister does not answer.
		pctx, cancel := context.WithTimeout(sctx, persistedHelloTimeout)
		if pr, ph, err := hp.PersistedRevision(pctx); err == nil {
			hello.PersistedRevision, hello.PersistedHistory = pr, ph
		}
		cancel()
	}
	if err := s.send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream ended (the control plane refused it): its
			// status comes from Recv.
			if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				return false, fmt.Errorf("dataplane: sync stream: %w", rerr)
			}
		}
		return false, err
	}
	wg.Go(func() { s.reportEvery(sctx, a.o.DigestInterval) })
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return answered, errors.New("dataplane: the control plane ended the sync stream")
		}
		if err != nil {
			return answered, fmt.Errorf("dataplane: sync stream: %w", err)
		}
		if !answered {
			answered = true
			onAnswer()
			a.contact()
			a.log.Info("dataplane: connected to the control plane", "gateway", a.o.GatewayID, "revision", rev)
		}
		switch k := m.GetKind().(type) {
		case *syncpb.ServerMessage_SnapshotChunk:
			err = s.chunk(sctx, k.SnapshotChunk)
		case *syncpb.ServerMessage_Changes:
			err = s.changes(sctx, k.Changes)
		case *syncpb.ServerMessage_DigestRequest:
			// The control plane asks instead of sending when the Hello
			// showed its current revision: a persisted configuration
			// is then the control plane's (a digest that differs brings
			// a snapshot).
			a.confirmPersisted()
			err = s.report()
		case *syncpb.ServerMessage_Warning:
			a.log.Warn("dataplane: the control plane warns", "gateway", a.o.GatewayID, "warning", k.Warning.GetMessage())
		default:
			a.log.Warn("dataplane: unknown message from the control plane ignored")
		}
		if err != nil {
			return answered, err
		}
	}
}

// send sends m; it is safe for concurrent use.
func (s *session) send(m *syncpb.ClientMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("dataplane: send: %w", err)
	}
	return nil
}

// report sends a DigestReport of what the gateway runs: the digest of
// the configuration as delivered, and the APIs of it not built.
func (s *session) report() error {
	rev, digest, _ := s.a.current()
	nb := s.a.g.NotBuilt()
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	m := &syncpb.ClientMessage{Kind: &syncpb.ClientMessage_DigestReport{DigestReport: &syncpb.DigestReport{Revision: rev, Digest: digest, NotBuilt: notBuiltPB(nb)}}}
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("dataplane: send: %w", err)
	}
	s.sentNotBuilt = nb
	return nil
}

// notBuiltPoll is how often the reporter looks for a change in the
// gateway's APIs not built (a retry that built one), to report it at once
// rather than at the next DigestInterval.
const notBuiltPoll = 250 * time.Millisecond

// reportEvery sends a DigestReport every interval, and one as soon as the
// list of APIs not built differs from the one last sent, until ctx is
// done. A failed send ends the stream by itself (its Recv fails too).
func (s *session) reportEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	poll := time.NewTicker(notBuiltPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poll.C:
			s.sendMu.Lock()
			same := slices.Equal(s.sentNotBuilt, s.a.g.NotBuilt())
			s.sendMu.Unlock()
			if same {
				continue
			}
		}
		if err := s.report(); err != nil {
			return
		}
	}
}

// notBuiltPB is nb in the protocol's form.
func notBuiltPB(nb []live.NotBuilt) []*syncpb.NotBuilt {
	var out []*syncpb.NotBuilt
	for _, n := range nb {
		out = append(out, &syncpb.NotBuilt{Api: n.API, Policy: n.Policy, Problem: n.Problem})
	}
	return out
}

// Delivery kinds, for counters and logs.
const (
	kindSnapshot = "snapshot"
	kindChanges  = "changes"
)

// answer Acks a delivery that applied (err nil) or Nacks it with err.
func (s *session) answer(kind string, revision uint64, nonce string, err error) error {
	a := s.a
	a.mu.Lock()
	d := &a.st.Deliveries
	switch {
	case kind == kindSnapshot && err == nil:
		d.SnapshotsApplied++
	case kind == kindSnapshot:
		d.SnapshotsRejected++
	case err == nil:
		d.ChangesApplied++
	default:
		d.ChangesRejected++
	}
	if err == nil {
		a.st.LastError = ""
	} else {
		a.st.LastError = err.Error()
	}
	a.mu.Unlock()
	if err != nil {
		a.log.Warn("dataplane: rejected a delivery; the running configuration stays", "kind", kind, "revision", revision, "err", err)
		return s.send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: revision, Nonce: nonce, Error: err.Error()}}})
	}
	nb := a.g.NotBuilt()
	if len(nb) > 0 {
		a.log.Warn("dataplane: applied without APIs this host cannot build; they answer 503 and are retried", "kind", kind, "revision", revision, "not_built", len(nb))
	} else {
		a.log.Info("dataplane: applied", "kind", kind, "revision", revision)
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := s.stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: revision, Nonce: nonce, NotBuilt: notBuiltPB(nb)}}}); err != nil {
		return fmt.Errorf("dataplane: send: %w", err)
	}
	s.sentNotBuilt = nb
	return nil
}

// chunk adds a snapshot chunk, and applies the snapshot at its last one.
func (s *session) chunk(ctx context.Context, c *syncpb.SnapshotChunk) error {
	in := c
	if c.GetLast() && c.GetDigest() != "" {
		// The agent checks the digest itself: it needs the Digester's
		// state anyway, and the Assembler would hash every object again.
		in = &syncpb.SnapshotChunk{Revision: c.GetRevision(), Nonce: c.GetNonce(), Seq: c.GetSeq(), Last: true, Data: c.GetData()}
	}
	snap, err := s.asm.Add(in)
	if err != nil {
		return s.answer(kindSnapshot, c.GetRevision(), c.GetNonce(), fmt.Errorf("dataplane: %w", err))
	}
	if snap == nil {
		return nil
	}
	return s.answer(kindSnapshot, c.GetRevision(), c.GetNonce(), s.a.applySnapshot(ctx, snap, c.GetDigest(), c.GetHistory()))
}

// changes applies a Changes message.
func (s *session) changes(ctx context.Context, ch *syncpb.Changes) error {
	if s.asm.InProgress() {
		s.asm.Reset()
		err := fmt.Errorf("dataplane: changes %d→%d came in the middle of a snapshot", ch.GetFromRevision(), ch.GetRevision())
		return s.answer(kindChanges, ch.GetRevision(), ch.GetNonce(), err)
	}
	return s.answer(kindChanges, ch.GetRevision(), ch.GetNonce(), s.a.applyChanges(ctx, ch))
}

// confirmPersisted makes a running persisted configuration the control
// plane's.
func (a *Agent) confirmPersisted() {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if a.cur.source == "persisted" {
		r := a.cur
		r.source = "control_plane"
		a.setRunning(r)
	}
}

// applySnapshot checks snap against the digest the control plane sent
// ("" for none) and applies it as a configuration of history (the
// control plane's, "" when it names none). A snapshot of another history
// than the running configuration's replaces it whatever the revisions
// (gateway.Replace): a restored control plane numbers revisions anew.
func (a *Agent) applySnapshot(ctx context.Context, snap *spec.Snapshot, want, history string) error {
	dg := protocol.DigesterOf(snap)
	got := dg.Digest()
	if want != "" && got != want {
		return fmt.Errorf("dataplane: digest mismatch: snapshot %d has digest %s, the control plane sent %s", snap.Revision, got, want)
	}
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	next := running{revision: snap.Revision, digester: dg, source: "control_plane", history: history}
	if a.cur.source != "none" && snap.Revision == a.cur.revision && got == a.cur.digester.Digest() {
		// What runs already (a reconnect, or the persisted configuration
		// the control plane confirms): no rebuild; a new history is
		// persisted.
		relabel := history != a.cur.history
		a.setRunning(next)
		if relabel {
			a.requestSave()
		}
		return nil
	}
	apply := a.g.ApplyPartial
	if a.cur.source != "none" && history != "" && history != a.cur.history {
		apply = a.g.Replace
		a.log.Warn("dataplane: a snapshot of another control-plane history replaces the running configuration",
			"revision", snap.Revision, "history", history, "running_revision", a.cur.revision, "running_history", a.cur.history)
	}
	if err := apply(ctx, snap); err != nil {
		return err
	}
	a.setRunning(next)
	a.requestSave()
	return nil
}

// applyChanges checks ch against the running revision and the digest it
// says the configuration will have, and applies it: key-only changes
// with gateway.UpdateKeys, others with protocol.ApplyChanges and
// gateway.ApplyPartial.
func (a *Agent) applyChanges(ctx context.Context, ch *syncpb.Changes) error {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	from, to := ch.GetFromRevision(), ch.GetRevision()
	if a.cur.source == "none" {
		return fmt.Errorf("dataplane: changes %d→%d: nothing is applied yet: %w", from, to, protocol.ErrRevisionMismatch)
	}
	if from != a.cur.revision {
		return fmt.Errorf("dataplane: changes %d→%d: the gateway runs %d: %w", from, to, a.cur.revision, protocol.ErrRevisionMismatch)
	}
	if to <= from {
		return fmt.Errorf("dataplane: changes %d→%d: the revision must rise", from, to)
	}
	changes, err := protocol.DecodeChanges(ch)
	if err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	keysOnly := true
	for _, c := range changes {
		if c.Object != syncpb.Change_OBJECT_KEY {
			keysOnly = false
			break
		}
	}
	var base *spec.Snapshot
	if !keysOnly {
		base = a.g.Snapshot()
	}
	dg := a.cur.digester
	final, order, err := a.digestChanges(&dg, changes, base)
	if err != nil {
		return fmt.Errorf("dataplane: changes %d→%d: %w", from, to, err)
	}
	if want := ch.GetDigest(); want != "" && dg.Digest() != want {
		return fmt.Errorf("dataplane: digest mismatch: changes %d→%d give digest %s, the control plane sent %s", from, to, dg.Digest(), want)
	}
	if keysOnly {
		var put []spec.Key
		var del []string
		for _, id := range order {
			t := final[target{syncpb.Change_OBJECT_KEY, id}]
			switch {
			case t.now != nil:
				put = append(put, *t.now.(*spec.Key))
			case t.existed:
				del = append(del, id)
			}
		}
		if err := a.g.UpdateKeys(ctx, to, put, del); err != nil {
			return err
		}
	} else {
		next, err := protocol.ApplyChanges(base, ch)
		if err != nil {
			return fmt.Errorf("dataplane: %w", err)
		}
		if err := a.g.ApplyPartial(ctx, next); err != nil {
			return err
		}
	}
	a.setRunning(running{revision: to, digester: dg, source: "control_plane", history: a.cur.history})
	a.requestSave()
	return nil
}

// target names one object a change touches.
type target struct {
	object syncpb.Change_Object
	id     string
}

// version is what a message's changes leave of one object: now is its
// latest version (*spec.Key, *spec.Policy or *spec.API; nil when
// deleted), existed whether it was in the running configuration.
type version struct {
	now     any
	existed bool
}

// digestChanges plays changes on dg: for each, it removes the object's
// version before it (from the changes before it, or the running
// configuration: keys from the gateway's registry, policies and APIs from
// base) and adds the new one. It returns each touched object's final
// version and the keys' ids in order of first appearance. A delete of an
// object that is not there is an error (drift).
func (a *Agent) digestChanges(dg *protocol.Digester, changes []protocol.Change, base *spec.Snapshot) (map[target]version, []string, error) {
	final := make(map[target]version, len(changes))
	var order []string
	for i, c := range changes {
		t := target{c.Object, c.ID}
		v, seen := final[t]
		if !seen {
			v.now = a.runningObject(c.Object, c.ID, base)
			v.existed = v.now != nil
			if c.Object == syncpb.Change_OBJECT_KEY {
				order = append(order, c.ID)
			}
		}
		if v.now != nil {
			switch o := v.now.(type) {
			case *spec.Key:
				dg.RemoveKey(o)
			case *spec.Policy:
				dg.RemovePolicy(o)
			case *spec.API:
				dg.RemoveAPI(o)
			}
		} else if c.Kind == syncpb.Change_KIND_DELETE {
			return nil, nil, fmt.Errorf("change %d: delete of %s %q, which is not there", i, protocol.ObjectName(c.Object), c.ID)
		}
		v.now = nil
		if c.Kind == syncpb.Change_KIND_PUT {
			switch c.Object {
			case syncpb.Change_OBJECT_KEY:
				dg.AddKey(c.Key)
				v.now = c.Key
			case syncpb.Change_OBJECT_POLICY:
				dg.AddPolicy(c.Policy)
				v.now = c.Policy
			case syncpb.Change_OBJECT_API:
				dg.AddAPI(c.API)
				v.now = c.API
			}
		}
		final[t] = v
	}
	return final, order, nil
}

// runningObject returns the running version of an object, or nil.
func (a *Agent) runningObject(object syncpb.Change_Object, id string, base *spec.Snapshot) any {
	switch object {
	case syncpb.Change_OBJECT_KEY:
		if k := a.g.Key(id); k != nil {
			return k
		}
	case syncpb.Change_OBJECT_POLICY:
		for i := range base.Policies {
			if base.Policies[i].ID == id {
				return &base.Policies[i]
			}
		}
	case syncpb.Change_OBJECT_API:
		for i := range base.APIs {
			if base.APIs[i].ID == id {
				return &base.APIs[i]
			}
		}
	}
	return nil
}

// requestSave asks the saver to persist the running configuration.
func (a *Agent) requestSave() {
	select {
	case a.saveNext <- struct{}{}:
	default: // one is pending: it takes the latest
	}
}

// saver persists the running configuration after each request, letting
// requests gather for SaveDelay (the latest configuration wins), until
// ctx is done; a request still waiting then is saved at once (within
// finalSaveTimeout), so a gateway stopped right after a change restarts
// from it. A failed save is tried again after SaveDelay. With a
// HistoryPersister it also reads the persisted revision every SaveDelay
// and saves at once when it is missing or older than the running one (a
// data plane's Redis restarted empty), so a gateway restarted later
// during a control-plane outage still finds the last configuration.
func (a *Agent) saver(ctx context.Context) {
	failing := false // logged once per streak of failures
	var check <-chan time.Time
	rp, _ := a.o.Persister.(HistoryPersister)
	if rp != nil {
		t := time.NewTicker(a.o.SaveDelay)
		defer t.Stop()
		check = t.C
	}
	checkFailing := false
	for {
		select {
		case <-ctx.Done():
			select {
			case <-a.saveNext:
				a.finalSave()
			default:
			}
			return
		case <-check:
			lost, err := a.persistedLost(ctx, rp)
			if err != nil && !checkFailing && ctx.Err() == nil {
				a.log.Error("dataplane: read the persisted revision", "err", err)
			}
			checkFailing = err != nil
			if !lost {
				continue
			}
		case <-a.saveNext:
			t := time.NewTimer(a.o.SaveDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				a.finalSave()
				return
			case <-t.C:
			}
		}
		rev, err := a.save(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			a.finalSave()
			return
		case err != nil:
			if !failing {
				a.log.Error("dataplane: persist the configuration; retrying every save_delay", "revision", rev, "err", err)
			}
			failing = true
			a.requestSave()
		case failing:
			a.log.Info("dataplane: persisted the configuration again", "revision", rev)
			failing = false
		}
	}
}

// persistedLost reports whether the persisted configuration is missing,
// or older than the one the agent last persisted or loaded in the same
// history (nothing persisted yet: false; another history: false, a
// gateway of the group saved what a control plane sent it since); it
// then forgets that save, so the next save writes again.
func (a *Agent) persistedLost(ctx context.Context, rp HistoryPersister) (bool, error) {
	a.mu.Lock()
	saved, savedHistory := a.st.PersistedRevision, a.persistedHistory
	a.mu.Unlock()
	if saved == 0 {
		return false, nil // nothing persisted yet, or a save is due anyway
	}
	stored, storedHistory, err := rp.PersistedRevision(ctx)
	if err != nil || stored != 0 && (storedHistory != savedHistory || stored >= saved) {
		return false, err
	}
	a.mu.Lock()
	if a.st.PersistedRevision == saved {
		a.st.PersistedRevision = stored
	}
	a.mu.Unlock()
	a.log.Warn("dataplane: the persisted configuration is missing or older than the one persisted; persisting it again",
		"persisted_revision", stored, "revision", saved)
	return true, nil
}

// finalSaveTimeout bounds the save made when Run stops.
const finalSaveTimeout = 5 * time.Second

// finalSave saves the running configuration as Run stops.
func (a *Agent) finalSave() {
	ctx, cancel := context.WithTimeout(context.Background(), finalSaveTimeout)
	defer cancel()
	if rev, err := a.save(ctx); err != nil {
		a.log.Error("dataplane: persist the configuration at stop", "revision", rev, "err", err)
	}
}

// save persists the running configuration, with its history when the
// Persister is a HistoryPersister, unless its revision of its history is
// persisted already; it returns the revision.
func (a *Agent) save(ctx context.Context) (uint64, error) {
	a.applyMu.Lock()
	snap, history := a.g.Snapshot(), a.cur.history
	a.applyMu.Unlock()
	a.mu.Lock()
	saved, savedHistory := a.st.PersistedRevision, a.persistedHistory
	a.mu.Unlock()
	if snap == nil || history == savedHistory && snap.Revision <= saved {
		return saved, nil
	}
	var err error
	if hp, ok := a.o.Persister.(HistoryPersister); ok {
		err = hp.SaveHistory(ctx, snap, history)
	} else {
		err = a.o.Persister.Save(ctx, snap)
	}
	if err != nil {
		return snap.Revision, err
	}
	a.mu.Lock()
	a.st.PersistedRevision, a.persistedHistory = snap.Revision, history
	a.mu.Unlock()
	return snap.Revision, nil
}
