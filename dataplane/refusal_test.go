package dataplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/gateway"
)

// readyz serves g's admin endpoint with a's status as its control plane
// and returns a function that GETs /readyz: its status and body.
func readyz(t *testing.T, g *testGateway, a *dataplane.Agent) func() (int, string) {
	t.Helper()
	srv := httptest.NewServer(g.gw.AdminHandler(gateway.AdminOptions{ReadsWithoutToken: true,
		ControlPlane: func() any { return a.Status() }}))
	t.Cleanup(srv.Close)
	return func() (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
}

// refusedLogLine is the start of the line the agent logs when the control
// plane refuses its credentials.
const refusedLogLine = "the control plane refused this data plane's credentials; this data-plane member is not ready"

// TestAgentRefusedAtStart: a control plane that refuses the token
// (Unauthenticated) is an answer: after StartTimeout the persisted
// configuration is NOT applied (requests get 503 "no configuration
// applied yet"), /readyz answers 503 with the refusal, Status says
// "refused" with the refusal as LastError, the agent keeps retrying and
// logs the refusal once. Once the control plane accepts the token, its
// snapshot applies, LastError is cleared and /readyz answers 200.
func TestAgentRefusedAtStart(t *testing.T) {
	persister := dataplane.FilePersister{Path: filepath.Join(t.TempDir(), "state.json")}
	if err := persister.Save(context.Background(), snapshot(1, "k1")); err != nil {
		t.Fatal(err)
	}
	f, addr := newFakeCP(t, 0)
	f.refuseWith(status.Error(codes.Unauthenticated, "bad token"))
	g := newGateway(t)
	log := &lockedBuffer{}
	o := agentOptions(g.gw, addr, log)
	o.Persister = persister
	o.StartTimeout = 100 * time.Millisecond
	a, err := dataplane.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ready := readyz(t, g, a)
	start := time.Now()
	runAgent(t, a)
	// 8 attempts take at least 10+20+40+4×50 ms = 270 ms > StartTimeout.
	waitFor(t, "8 attempts", func() bool { return f.attemptCount() >= 8 })
	if time.Since(start) < 3*o.StartTimeout {
		waitFor(t, "3 StartTimeouts", func() bool { return time.Since(start) >= 3*o.StartTimeout })
	}
	const refusal = "dataplane: the control plane refused this data plane's credentials: bad token"
	if st := a.Status(); st.State != "refused" || st.Source != "none" || st.AppliedRevision != 0 || st.LastError != refusal || st.Stale {
		t.Fatalf("status while refused: %+v", st)
	}
	if st, body := g.get(t, "k1"); st != 503 || body != `{"error":"no configuration applied yet"}`+"\n" {
		t.Fatalf("a request while refused: %d %s", st, body)
	}
	code, body := ready()
	if code != 503 || !strings.HasPrefix(body, `{"ready":false,"revision":0,"failure_policy":"open","error":"not ready: the control plane refused this data plane's credentials: bad token","control_plane":{"state":"refused",`) {
		t.Fatalf("/readyz while refused: %d %s", code, body)
	}
	if n := strings.Count(log.String(), refusedLogLine); n != 1 {
		t.Fatalf("the refusal logged %d times, want 1:\n%s", n, log)
	}

	f.refuseWith(nil)
	s := f.next(t)
	snap := snapshot(2, "k1")
	s.sendSnapshot(t, snap, "snap-2")
	s.wantAck(t, 2, "snap-2")
	if st := a.Status(); st.State != "connected" || st.Source != "control_plane" || st.AppliedRevision != 2 || st.LastError != "" {
		t.Fatalf("status once accepted: %+v", st)
	}
	if code, body := ready(); code != 200 || !strings.HasPrefix(body, `{"ready":true,"revision":2,"store":"in-process","failure_policy":"open","control_plane":{"state":"connected",`) {
		t.Fatalf("/readyz once accepted: %d %s", code, body)
	}
	if !strings.Contains(log.String(), "the control plane accepts this data plane's credentials again") {
		t.Fatalf("no log of the acceptance:\n%s", log)
	}
}

// TestAgentRefusedWhileRunning: a token revoked while the gateway runs
// (the stream ends, the next ones are refused with PermissionDenied)
// keeps the running configuration serving (k1 still gets 200) but
// Status says "refused" and /readyz answers 503 with the refusal, so a
// load balancer takes the gateway out; the refusal is logged once over
// many retries.
func TestAgentRefusedWhileRunning(t *testing.T) {
	f, addr := newFakeCP(t, 0)
	g := newGateway(t)
	log := &lockedBuffer{}
	a, err := dataplane.New(agentOptions(g.gw, addr, log))
	if err != nil {
		t.Fatal(err)
	}
	ready := readyz(t, g, a)
	runAgent(t, a)
	s := f.next(t)
	s.sendSnapshot(t, snapshot(1, "k1"), "snap-1")
	s.wantAck(t, 1, "snap-1")
	if code, _ := ready(); code != 200 {
		t.Fatalf("/readyz while connected: %d", code)
	}

	f.refuseWith(status.Error(codes.PermissionDenied, "token revoked"))
	n := f.attemptCount()
	s.end <- errors.New("cut")
	waitFor(t, "5 refused attempts", func() bool { return f.attemptCount() >= n+5 })
	const refusal = "dataplane: the control plane refused this data plane's credentials: token revoked"
	if st := a.Status(); st.State != "refused" || st.Source != "control_plane" || st.AppliedRevision != 1 || st.LastError != refusal || st.Stale {
		t.Fatalf("status while refused: %+v", st)
	}
	if st, _ := g.get(t, "k1"); st != 200 {
		t.Fatalf("k1 while refused: %d, want 200 (the running configuration serves)", st)
	}
	code, body := ready()
	if code != 503 || !strings.HasPrefix(body, `{"ready":false,"revision":1,"failure_policy":"open","error":"not ready: the control plane refused this data plane's credentials: token revoked","control_plane":{"state":"refused",`) {
		t.Fatalf("/readyz while refused: %d %s", code, body)
	}
	if n := strings.Count(log.String(), refusedLogLine); n != 1 {
		t.Fatalf("the refusal logged %d times, want 1:\n%s", n, log)
	}
}

// TestAgentStatusJSON: Status's JSON exactly, with a frozen clock: before
// any contact there is no last_contact member; after two streams refused
// with Unavailable last_error shows the failure; once the control plane
// answers, last_error is "" and last_contact is the clock's time.
func TestAgentStatusJSON(t *testing.T) {
	f, addr := newFakeCP(t, 2)
	g := newGateway(t)
	o := agentOptions(g.gw, addr, &lockedBuffer{})
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o.Now = func() time.Time { return now }
	a, err := dataplane.New(o)
	if err != nil {
		t.Fatal(err)
	}
	js := func() string {
		b, err := json.Marshal(a.Status())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	const deliveries = `"deliveries":{"snapshots_applied":0,"snapshots_rejected":0,"changes_applied":0,"changes_rejected":0}`
	empty := protocol.Digest(nil)
	if got, want := js(), `{"state":"connecting","applied_revision":0,"digest":"`+empty+`","history":"","source":"none","staleness_seconds":0,"stale":false,"last_error":"","persisted_revision":0,"reconnects":0,`+deliveries+`}`; got != want {
		t.Fatalf("before Run:\n got %s\nwant %s", got, want)
	}
	runAgent(t, a)
	waitFor(t, "two refused attempts", func() bool { return f.attemptCount() >= 2 && a.Status().LastError != "" })
	if got := a.Status().LastError; got != "dataplane: sync stream: rpc error: code = Unavailable desc = fake: not yet" {
		t.Fatalf("LastError after a refused attempt: %q", got)
	}
	if got := js(); strings.Contains(got, "last_contact") {
		t.Fatalf("last_contact before any contact: %s", got)
	}
	s := f.next(t)
	// A DigestRequest is an answer that applies nothing.
	if err := s.stream.Send(&syncpb.ServerMessage{Kind: &syncpb.ServerMessage_DigestRequest{DigestRequest: &syncpb.DigestRequest{}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "connected", func() bool { return a.Status().State == "connected" })
	if got, want := js(), `{"state":"connected","applied_revision":0,"digest":"`+empty+`","history":"","source":"none","last_contact":"2026-01-02T03:04:05Z","staleness_seconds":0,"stale":false,"last_error":"","persisted_revision":0,"reconnects":2,`+deliveries+`,"address":"`+addr+`"}`; got != want {
		t.Fatalf("connected, nothing applied:\n got %s\nwant %s", got, want)
	}
	s.sendSnapshot(t, snapshot(1), "snap-1")
	s.wantAck(t, 1, "snap-1")
	want := `{"state":"connected","applied_revision":1,"digest":"` + protocol.Digest(snapshot(1)) + `","history":"","source":"control_plane","last_contact":"2026-01-02T03:04:05Z","staleness_seconds":0,"stale":false,"last_error":"","persisted_revision":0,"reconnects":2,"deliveries":{"snapshots_applied":1,"snapshots_rejected":0,"changes_applied":0,"changes_rejected":0},"address":"` + addr + `"}`
	if got := js(); got != want {
		t.Fatalf("connected:\n got %s\nwant %s", got, want)
	}
}
