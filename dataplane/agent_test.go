package dataplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/spec"
)

// TestAgentAppliesSnapshotsFromControlPlane runs an agent against a real
// controlplane.SyncServer over loopback gRPC: the first snapshot is
// applied and acknowledged (the control plane records the revision), a
// key written on the control plane reaches the gateway as Changes applied
// in place (same engine), and a request with the new key passes through
// the gateway.
func TestAgentAppliesSnapshotsFromControlPlane(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		cp := newControlPlane(t, snapshot(0, "k1"))
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, cp.addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		if s := a.Status(); s.State != "connecting" || s.Source != "none" || s.AppliedRevision != 0 || s.Digest != protocol.Digest(nil) {
			t.Fatalf("status before Run: %+v", s)
		}
		runAgent(t, a)
		waitFor(t, "revision 1 acknowledged", func() bool { return cp.applied("gw-test") == 1 })
		s := a.Status()
		if s.State != "connected" || s.AppliedRevision != 1 || s.Source != "control_plane" || s.Digest != protocol.Digest(snapshot(1, "k1")) ||
			s.Staleness != 0 || s.LastError != "" || s.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1}) {
			t.Fatalf("status after the first snapshot: %+v", s)
		}
		if st, _ := g.get(t, "k1"); st != 200 {
			t.Fatalf("k1: %d", st)
		}
		if st, _ := g.get(t, "k2"); st != 403 {
			t.Fatalf("k2 before the write: %d", st)
		}

		engine := g.tg.Engine()
		rev := cp.write(t, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}})
		})
		waitFor(t, "revision 2 acknowledged", func() bool { return cp.applied("gw-test") == rev })
		if got := fmt.Sprint(g.statuses(t, "k2", 4)); got != "[200 200 200 429]" {
			t.Fatalf("k2 after the write: %s, want 3 of a quota of 3", got)
		}
		// The control plane sent the key as Changes, applied in place.
		if s := a.Status(); s.AppliedRevision != 2 || s.Digest != protocol.Digest(snapshot(2, "k1", "k2")) ||
			s.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, ChangesApplied: 1}) {
			t.Fatalf("status after the write: %+v", s)
		}
		if g.tg.Engine() != engine {
			t.Fatal("the key write rebuilt the gateway")
		}
	})
}

// TestAgentKeyChangesUpdateKeysInPlace: a Changes message of keys only
// (one key put twice, one new, one deleted) is applied through
// UpdateKeys: the engine is the same (nothing rebuilt), the final version
// of the twice-changed key holds, and the new key authenticates on a real
// request. A later policy change goes through Apply (a new engine).
func TestAgentKeyChangesUpdateKeysInPlace(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		if h := s.hello; h.GetGroup() != testGroup || h.GetToken() != testToken || h.GetGatewayId() != "gw-test" ||
			h.GetVersion() != "test" || h.GetLastAppliedRevision() != 0 || h.GetDigest() != protocol.Digest(nil) {
			t.Fatalf("Hello %v", h)
		}
		base := snapshot(1, "k1", "k2")
		s.sendSnapshot(t, base, "snap-1")
		s.wantAck(t, 1, "snap-1")
		engine := g.tg.Engine()

		ch := changes(t, base, 1, 2,
			putKey(t, spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}, Inactive: true}),
			putKey(t, spec.Key{KeyHash: hash("k3"), Policies: []string{"p"}}),
			protocol.Delete(syncpb.Change_OBJECT_KEY, hash("k1")),
			// The same key, its hash in upper case.
			putKey(t, spec.Key{KeyHash: "sha256:" + strings.ToUpper(strings.TrimPrefix(hash("k2"), "sha256:")), Policies: []string{"p"}}),
		)
		s.sendChanges(t, ch)
		s.wantAck(t, 2, ch.Nonce)
		if g.tg.Engine() != engine {
			t.Fatal("key changes rebuilt the engine")
		}
		if got := fmt.Sprint(g.statuses(t, "k3", 4)); got != "[200 200 200 429]" {
			t.Errorf("new key k3: %s", got)
		}
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[200]" {
			t.Errorf("k2 (put inactive, then active): %s", got)
		}
		if got := fmt.Sprint(g.statuses(t, "k1", 1)); got != "[403]" {
			t.Errorf("deleted k1: %s", got)
		}
		next := snapshot(2, "k2", "k3")
		if st := a.Status(); st.AppliedRevision != 2 || st.Digest != protocol.Digest(next) || st.Digest != ch.Digest ||
			st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, ChangesApplied: 1}) {
			t.Fatalf("status: %+v", st)
		}
		if got := protocol.Digest(g.tg.Snapshot()); got != ch.Digest {
			t.Fatalf("gateway's snapshot has digest %s, want %s", got, ch.Digest)
		}

		pol, err := protocol.PutPolicy(&spec.Policy{ID: "p", Quota: perHour(5)})
		if err != nil {
			t.Fatal(err)
		}
		ch3 := changes(t, g.tg.Snapshot(), 2, 3, pol)
		s.sendChanges(t, ch3)
		s.wantAck(t, 3, ch3.Nonce)
		if g.tg.Engine() == engine {
			t.Fatal("a policy change did not rebuild the engine")
		}
		// k3 spent 3 of a quota now 5: 2 more.
		if got := fmt.Sprint(g.statuses(t, "k3", 3)); got != "[200 200 429]" {
			t.Errorf("k3 under the new quota: %s", got)
		}
		if st := a.Status(); st.AppliedRevision != 3 || st.Digest != ch3.Digest {
			t.Fatalf("status after the policy change: %+v", st)
		}

		// Changes with nothing in them (a write this data plane does not
		// see) only raise the revision.
		engine = g.tg.Engine()
		empty := changes(t, g.tg.Snapshot(), 3, 4)
		s.sendChanges(t, empty)
		s.wantAck(t, 4, empty.Nonce)
		if st := a.Status(); st.AppliedRevision != 4 || st.Digest != ch3.Digest || g.tg.Revision() != 4 || g.tg.Engine() != engine {
			t.Fatalf("status after empty changes: %+v (gateway revision %d)", st, g.tg.Revision())
		}
	})
}

// TestAgentRejectsBadDeliveries: an invalid snapshot, Changes from
// another revision, Changes whose digest differs and a delete of a key
// that is not there are each Nacked with the problem, and the running
// configuration is untouched: a request with the old key still passes,
// and later good Changes still apply.
func TestAgentRejectsBadDeliveries(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		base := snapshot(1, "k1")
		s.sendSnapshot(t, base, "snap-1")
		s.wantAck(t, 1, "snap-1")

		bad := snapshot(2, "k1")
		bad.Keys[0].Policies = []string{"gold"}
		verr := bad.Validate()
		if verr == nil {
			t.Fatal("the bad snapshot is valid")
		}
		s.sendSnapshot(t, bad, "snap-2")
		s.wantNack(t, 2, "snap-2", verr.Error())
		if verr.Error() != `spec: keys[0].policies[0]: unknown policy "gold"` {
			t.Errorf("spec's problem is %q", verr.Error())
		}

		wrong := changes(t, snapshot(5, "k1"), 5, 6, putKey(t, spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}}))
		s.sendChanges(t, wrong)
		s.wantNack(t, 6, wrong.Nonce, "dataplane: changes 5→6: the gateway runs 1: protocol: changes do not start at the running revision")

		mism := changes(t, base, 1, 2, putKey(t, spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}}))
		sent := mism.Digest
		mism.Digest = protocol.Digest(base)
		s.sendChanges(t, mism)
		s.wantNack(t, 2, mism.Nonce, fmt.Sprintf("dataplane: digest mismatch: changes 1→2 give digest %s, the control plane sent %s", sent, mism.Digest))

		gone := &syncpb.Changes{FromRevision: 1, Revision: 2, Nonce: "gone", Changes: []*syncpb.Change{protocol.Delete(syncpb.Change_OBJECT_KEY, hash("k9"))}}
		s.sendChanges(t, gone)
		s.wantNack(t, 2, "gone", fmt.Sprintf("dataplane: changes 1→2: change 0: delete of key %q, which is not there", hash("k9")))

		badSnapDigest, err := protocol.Chunks(snapshot(3, "k1", "k2"), "snap-3", 0)
		if err != nil {
			t.Fatal(err)
		}
		badSnapDigest[0].Digest = protocol.Digest(base)
		if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_SnapshotChunk{SnapshotChunk: badSnapDigest[0]}}); err != nil {
			t.Fatal(err)
		}
		s.wantNack(t, 3, "snap-3", fmt.Sprintf("dataplane: digest mismatch: snapshot 3 has digest %s, the control plane sent %s", protocol.Digest(snapshot(3, "k1", "k2")), protocol.Digest(base)))

		if got := fmt.Sprint(g.statuses(t, "k1", 1)); got != "[200]" {
			t.Errorf("old key k1 after the rejections: %s", got)
		}
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[403]" {
			t.Errorf("k2, never applied: %s", got)
		}
		st := a.Status()
		if st.AppliedRevision != 1 || st.Digest != protocol.Digest(base) || g.tg.Revision() != 1 ||
			st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, SnapshotsRejected: 2, ChangesRejected: 3}) ||
			!strings.HasPrefix(st.LastError, "dataplane: digest mismatch: snapshot 3") {
			t.Fatalf("status after the rejections: %+v", st)
		}

		good := changes(t, base, 1, 2, putKey(t, spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}}))
		s.sendChanges(t, good)
		s.wantAck(t, 2, good.Nonce)
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[200]" {
			t.Errorf("k2 after good changes: %s", got)
		}
		if st := a.Status(); st.LastError != "" {
			t.Errorf("LastError after an applied delivery: %q", st.LastError)
		}
	})
}

// TestAgentReconnectsWithBackoff: a control plane that refuses the first
// four streams sees five attempts, spaced by the exponential backoff (no
// jitter here: 20, 40, 80, 80 ms, capped at 80), each logged at DEBUG with
// its delay and at WARN once (the first; the others within the next 30 s
// are counted, and logged in one line when the control plane answers);
// once a stream is cut after a delivery, the agent
// reconnects after the reset delay (20 ms), logged at WARN, and its Hello
// carries the applied revision and digest.
func TestAgentReconnectsWithBackoff(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 4)
		g := newTarget(t)
		log := &lockedBuffer{}
		o := agentOptions(g.tg, addr, log)
		o.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.Backoff = dataplane.Backoff{Initial: 20 * time.Millisecond, Max: 80 * time.Millisecond, Multiplier: 2, Jitter: -1}
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		times := f.times()
		if len(times) != 5 {
			t.Fatalf("%d attempts, want 5", len(times))
		}
		wantGaps := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond}
		for i, w := range wantGaps {
			if gap := times[i+1].Sub(times[i]); gap < w {
				t.Errorf("gap before attempt %d: %v, want at least %v", i+2, gap, w)
			}
		}
		delays := regexp.MustCompile(`reconnecting".*? in=(\S+)`).FindAllStringSubmatch(log.String(), -1)
		var got []string
		for _, d := range delays {
			got = append(got, d[1])
		}
		if fmt.Sprint(got) != "[20ms 40ms 80ms 80ms]" {
			t.Errorf("logged delays %v, want [20ms 40ms 80ms 80ms]\n%s", got, log)
		}
		for _, d := range got {
			if w, err := time.ParseDuration(d); err != nil || w > o.Backoff.Max {
				t.Errorf("logged delay %s (%v): more than Max %v", d, err, o.Backoff.Max)
			}
		}
		if st := a.Status(); st.Reconnects != 4 || !strings.Contains(st.LastError, "fake: not yet") {
			t.Errorf("status: %+v", st)
		}
		if n := strings.Count(log.String(), `level=WARN msg="dataplane: no answer from the control plane; reconnecting with backoff"`); n != 1 {
			t.Errorf("%d WARN lines on the refused attempts, want 1:\n%s", n, log)
		}
		if n := strings.Count(log.String(), "level=WARN"); n != 1 {
			t.Errorf("%d WARN lines in all, want 1:\n%s", n, log)
		}

		snap := snapshot(7, "k1")
		s.sendSnapshot(t, snap, "snap-7")
		s.wantAck(t, 7, "snap-7")
		// The answer ends the run of unanswered attempts: the three
		// counted since the first line are logged now, before
		// "connected", not 30 s later, after it.
		if !regexp.MustCompile(`level=WARN msg="dataplane: no answer from the control plane; reconnecting with backoff" [^\n]*failures=3 total=4 [^\n]*\n[^\n]*level=INFO msg="dataplane: connected to the control plane"`).MatchString(log.String()) {
			t.Errorf("no summary of the 3 later unanswered attempts before \"connected\":\n%s", log)
		}
		s.end <- fmt.Errorf("cut")
		s2 := f.next(t)
		if h := s2.hello; h.GetLastAppliedRevision() != 7 || h.GetDigest() != protocol.Digest(snap) {
			t.Fatalf("Hello after the cut: revision %d digest %s, want 7 %s", h.GetLastAppliedRevision(), h.GetDigest(), protocol.Digest(snap))
		}
		times = f.times()
		if gap := times[5].Sub(times[4]); gap < 20*time.Millisecond {
			t.Errorf("reconnect after the cut took %v, want at least 20ms", gap)
		}
		delays = regexp.MustCompile(`reconnecting".*? in=(\S+)`).FindAllStringSubmatch(log.String(), -1)
		if last := delays[len(delays)-1][1]; len(delays) != 5 || last != "20ms" {
			t.Errorf("delay after a good stream: %d delays, last %s; want 5, 20ms (reset)", len(delays), last)
		}
		if !regexp.MustCompile(`level=WARN msg="dataplane: sync stream ended; reconnecting" .*err=.*cut.* in=20ms`).MatchString(log.String()) {
			t.Errorf("the end of a stream that had answered not logged at WARN:\n%s", log)
		}
		if st := a.Status(); st.Reconnects != 5 || st.AppliedRevision != 7 || st.Source != "control_plane" {
			t.Errorf("status after the reconnect: %+v", st)
		}
		// Already running revision 7 with this digest: the same snapshot
		// again is acknowledged without a rebuild.
		engine := g.tg.Engine()
		s2.sendSnapshot(t, snap, "snap-7b")
		s2.wantAck(t, 7, "snap-7b")
		if g.tg.Engine() != engine {
			t.Error("the running snapshot again rebuilt the gateway")
		}
	})
}

// TestAgentBackoffCapIncludesJitter: with a jitter of 0.5 and Max 40 ms,
// none of ten reconnect delays logged (at DEBUG) exceeds Max (the library
// caps the delay before jitter, which let waits reach Max×1.5), and the
// attempts are spaced by at least 20 ms × 0.5.
func TestAgentBackoffCapIncludesJitter(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 10)
		g := newTarget(t)
		log := &lockedBuffer{}
		o := agentOptions(g.tg, addr, log)
		o.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.Backoff = dataplane.Backoff{Initial: 20 * time.Millisecond, Max: 40 * time.Millisecond, Multiplier: 2, Jitter: 0.5}
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		f.next(t)
		delays := regexp.MustCompile(`reconnecting".*? in=(\S+)`).FindAllStringSubmatch(log.String(), -1)
		if len(delays) != 10 {
			t.Fatalf("%d delays logged, want 10\n%s", len(delays), log)
		}
		for i, d := range delays {
			got, err := time.ParseDuration(d[1])
			if err != nil {
				t.Fatal(err)
			}
			if got > o.Backoff.Max || got < 10*time.Millisecond {
				t.Errorf("delay %d: %v, want within [10ms, %v]", i+1, got, o.Backoff.Max)
			}
		}
	})
}

// TestAgentAnswersDigestRequests: a DigestRequest is answered with a
// DigestReport of the running revision and digest, and reports come by
// themselves every DigestInterval.
func TestAgentAnswersDigestRequests(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		f, addr := newFakeCP(t, 0)
		g := newTarget(t)
		o := agentOptions(g.tg, addr, &lockedBuffer{})
		o.DigestInterval = 50 * time.Millisecond
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		snap := snapshot(3, "k1")
		s.sendSnapshot(t, snap, "snap-3")
		s.wantAck(t, 3, "snap-3")
		if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_DigestRequest{DigestRequest: &syncpb.DigestRequest{}}}); err != nil {
			t.Fatal(err)
		}
		for range 3 { // the answer, then periodic ones
			select {
			case m := <-s.recv:
				if r := m.GetDigestReport(); r == nil || r.GetRevision() != 3 || r.GetDigest() != protocol.Digest(snap) {
					t.Fatalf("got %v, want DigestReport{3, %s}", m, protocol.Digest(snap))
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no digest report")
			}
		}
	})
}

// TestAgentReconnectGetsChanges: cut off from a real sync server while a
// key is written, the agent reconnects with the revision and digest it
// runs, and the server answers with the Changes since then (not a
// snapshot), applied in place.
func TestAgentReconnectGetsChanges(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		cp := newControlPlane(t, snapshot(0, "k1"))
		g := newTarget(t)
		a, err := dataplane.New(agentOptions(g.tg, cp.addr, &lockedBuffer{}))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		waitFor(t, "revision 1 acknowledged", func() bool { return cp.applied("gw-test") == 1 })
		engine := g.tg.Engine()
		cp.Stop()
		waitFor(t, "disconnected", func() bool { return a.Status().State == "disconnected" })
		rev := cp.write(t, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}})
		})
		cp.Start(t)
		waitFor(t, "revision 2 acknowledged", func() bool { return cp.applied("gw-test") == rev })
		if st := a.Status(); st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, ChangesApplied: 1}) || st.Reconnects < 1 ||
			st.AppliedRevision != 2 || st.Digest != protocol.Digest(snapshot(2, "k1", "k2")) {
			t.Fatalf("status: %+v", st)
		}
		if g.tg.Engine() != engine {
			t.Fatal("the reconnect rebuilt the gateway")
		}
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[200]" {
			t.Fatalf("k2: %s", got)
		}
	})
}

// Two gateways configured with one gateway_id against a real control
// plane: both are listed, flagged duplicate, and each agent logs the
// control plane's warning.
func TestAgentsWithOneGatewayIDAreWarned(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		cp := newControlPlane(t, snapshot(0, "k1"))
		var logs [2]lockedBuffer
		for i := range logs {
			a, err := dataplane.New(agentOptions(newTarget(t).tg, cp.addr, &logs[i]))
			if err != nil {
				t.Fatal(err)
			}
			runAgent(t, a)
			waitFor(t, "the agent's revision acknowledged", func() bool {
				n := 0
				for _, dp := range cp.dps.List() {
					if dp.AppliedRevision == 1 {
						n++
					}
				}
				return n == i+1
			})
		}
		for i := range logs {
			waitFor(t, "the warning logged", func() bool {
				return strings.Contains(logs[i].String(), `msg="dataplane: the control plane warns" component=dataplane group=dp1 gateway=gw-test warning="another gateway `)
			})
		}
		dps := cp.dps.List()
		if len(dps) != 2 || !dps[0].Duplicate || !dps[1].Duplicate || dps[0].GatewayID != "gw-test" || dps[1].GatewayID != "gw-test" {
			t.Fatalf("DataPlanes %+v, want gw-test twice, both flagged duplicate", dps)
		}
	})
}

// TestAgentRepairsDriftWithSnapshot: a running configuration that drifted
// from what the agent applied (k2 made inactive behind the agent's back,
// same revision) makes the next Changes of a real control plane touching
// k2 give another digest than the control plane's: the agent Nacks them
// (digest mismatch), the control plane answers with a snapshot of the
// revision, and its application repairs the drift (k2 admitted again);
// the next write comes as Changes again and applies in place.
func TestAgentRepairsDriftWithSnapshot(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		cp := newControlPlane(t, snapshot(0, "k1", "k2"))
		g := newTarget(t)
		log := &lockedBuffer{}
		a, err := dataplane.New(agentOptions(g.tg, cp.addr, log))
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		waitFor(t, "revision 1 acknowledged", func() bool { return cp.applied("gw-test") == 1 })

		drifted := snapshot(1, "k1", "k2")
		drifted.Keys[1].Inactive = true
		if err := g.tg.Replace(context.Background(), drifted); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[403]" {
			t.Fatalf("k2 drifted inactive: %s", got)
		}
		rev := cp.write(t, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash("k2"), Policies: []string{"p"}, QuotaEpoch: 7})
		})
		want := snapshot(rev, "k1", "k2")
		want.Keys[1].QuotaEpoch = 7
		waitFor(t, "revision 2 acknowledged", func() bool { return cp.applied("gw-test") == rev })
		if st := a.Status(); st.AppliedRevision != rev || st.Digest != protocol.Digest(want) || st.LastError != "" ||
			st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 2, ChangesRejected: 1}) {
			t.Fatalf("status after the repair: %+v", st)
		}
		if !strings.Contains(log.String(), `err="dataplane: digest mismatch: changes 1→2 give digest `) {
			t.Fatalf("no digest mismatch logged:\n%s", log)
		}
		if got := protocol.Digest(g.tg.Snapshot()); got != protocol.Digest(want) {
			t.Fatalf("the repaired configuration has digest %s, want %s", got, protocol.Digest(want))
		}
		if got := fmt.Sprint(g.statuses(t, "k2", 1)); got != "[200]" {
			t.Fatalf("k2 after the repair: %s", got)
		}

		engine := g.tg.Engine()
		rev = cp.write(t, func(tx controlplane.Tx) error {
			return tx.PutKey(spec.Key{KeyHash: hash("k3"), Policies: []string{"p"}})
		})
		waitFor(t, "revision 3 acknowledged", func() bool { return cp.applied("gw-test") == rev })
		if st := a.Status(); st.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 2, ChangesApplied: 1, ChangesRejected: 1}) || g.tg.Engine() != engine {
			t.Fatalf("status after the next write: %+v (engine rebuilt: %v)", st, g.tg.Engine() != engine)
		}
		if got := fmt.Sprint(g.statuses(t, "k3", 1)); got != "[200]" {
			t.Fatalf("k3: %s", got)
		}
	})
}
