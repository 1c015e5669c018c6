package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/syncpb"
)

// rssBytes is the resident set size of process pid, from
// /proc/<pid>/status.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// metric returns the value of the sample named series (with its labels,
// as the text format writes them) in GET /metrics, or -1 when absent.
func metric(t *testing.T, p *process, series string) float64 {
	t.Helper()
	resp, err := http.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", series, line)
			}
			return f
		}
	}
	return -1
}

// helloLess opens a sync stream on conn that never sends anything.
func helloLess(t *testing.T, conn *grpc.ClientConn) syncStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// rawSync is a raw HTTP/2 connection to the sync port that opens Sync
// streams by writing HEADERS only: what a client that never sends a
// Hello costs the server, without a gRPC client's own cost in the test.
type rawSync struct {
	fr   *http2.Framer
	conn net.Conn
	hdr  []byte // the HEADERS block of a Sync call
	next uint32 // the next stream ID
	// MaxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS.
	maxStreams uint32
}

// dialRaw connects to addr and reads the server's SETTINGS.
func dialRaw(t *testing.T, addr string) *rawSync {
	t.Helper()
	fr, conn := http2Conn(t, addr)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", syncpb.SyncService_Sync_FullMethodName},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	r := &rawSync{fr: fr, conn: conn, hdr: hdr.Bytes(), next: 1}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no SETTINGS from the server: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			v, ok := s.Value(http2.SettingMaxConcurrentStreams)
			if !ok {
				t.Fatal("the server's SETTINGS have no MAX_CONCURRENT_STREAMS")
			}
			r.maxStreams = v
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
}

// open opens a stream and returns its ID.
func (r *rawSync) open(t *testing.T) uint32 {
	t.Helper()
	id := r.next
	r.next += 2
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hdr, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	return id
}

// end reads frames until a stream ends, and returns its ID and how: its
// grpc-status from trailers, or -1 and the code of a RST_STREAM.
func (r *rawSync) end() (id uint32, grpcStatus int, rst http2.ErrCode, err error) {
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			return 0, 0, 0, err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				continue
			}
			code, err := -2, error(nil)
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					code, err = strconv.Atoi(hf.Value)
				}
			}
			if err != nil {
				code = -2
			}
			return f.StreamID, code, 0, nil
		case *http2.RSTStreamFrame:
			return f.StreamID, -1, f.ErrCode, nil
		case *http2.SettingsFrame:
			if !f.IsAck() {
				r.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				r.fr.WritePing(true, f.Data)
			}
		}
	}
}

// TestHelloLessStreamsReleased is issue 18's row 6 against the control
// plane as a process: 5,000 sync streams that never send a Hello (313
// connections of at most 16 streams, the default per-connection bound)
// are all ended with DeadlineExceeded within -hello-timeout (2s) plus 1s
// of being opened; once they are gone the process's RSS comes back
// within 10 MB of where it started; the refusals are counted in
// /metrics and logged in a few lines, not 5,000; 2,000 admin calls
// without the token are answered 401 and logged in a few lines too.
func TestHelloLessStreamsReleased(t *testing.T) {
	const (
		streams = 5000
		timeout = 2 * time.Second
	)
	p := startSync(t, "-hello-timeout", timeout.String())
	pid := p.cmd.Process.Pid
	// A round of 100 first, so the start is a control plane that has
	// served (its code paged in), not a cold process.
	if _, _, ended := helloLessRound(t, p, 100, timeout); ended[codes.DeadlineExceeded] != 100 {
		t.Fatalf("warm-up round: %v, want 100 DeadlineExceeded", ended)
	}
	eventually(t, "sync_streams back to 0", func() bool { return metric(t, p, "limitplane_controlplane_sync_streams") == 0 })
	startRSS := rssBytes(t, pid)
	began := time.Now()
	slowest, peakRSS, ended := helloLessRound(t, p, streams, timeout)
	all := time.Since(began)
	peakRSS = max(peakRSS, startRSS)
	if slowest > timeout+time.Second {
		t.Fatalf("the slowest of %d Hello-less streams ended after %v, want within %v", streams, slowest, timeout+time.Second)
	}
	// At most DefaultMaxPendingHellos wait for their Hello; the others
	// are refused at once.
	timedOut, refused := ended[codes.DeadlineExceeded], ended[codes.ResourceExhausted]
	if timedOut < controlplane.DefaultMaxPendingHellos || timedOut+refused != streams {
		t.Fatalf("%d streams timed out, %d refused; want at least %d timed out, %d in all", timedOut, refused, controlplane.DefaultMaxPendingHellos, streams)
	}
	if got := metric(t, p, `limitplane_controlplane_sync_refused_total{reason="hello_timeout"}`); got != float64(timedOut+100) {
		t.Fatalf("sync_refused_total{hello_timeout} = %v, want %d", got, timedOut+100)
	}
	if got := metric(t, p, `limitplane_controlplane_sync_refused_total{reason="too_many_hellos"}`); got != float64(refused) {
		t.Fatalf("sync_refused_total{too_many_hellos} = %v, want %d", got, refused)
	}
	eventually(t, "sync_streams back to 0", func() bool { return metric(t, p, "limitplane_controlplane_sync_streams") == 0 })

	// The program returns freed memory to the system every 10s: poll
	// for it.
	var endRSS int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if endRSS = rssBytes(t, pid); endRSS <= startRSS+10<<20 || raceBuild {
			break // (the race detector's memory is its own: no bound)
		}
		if time.Now().After(deadline) {
			t.Fatalf("RSS %.1f MB 30s after the streams ended; started at %.1f MB (peak %.1f MB): want within 10 MB", mb(endRSS), mb(startRSS), mb(peakRSS))
		}
	}
	t.Logf("%d Hello-less streams (%d timed out, %d refused at once): all ended in %v (slowest %v after it opened); RSS start %.1f MB, peak %.1f MB, after %.1f MB",
		streams, timedOut, refused, all.Round(time.Millisecond), slowest.Round(time.Millisecond), mb(startRSS), mb(peakRSS), mb(endRSS))

	const calls = 2000
	var calling sync.WaitGroup
	codesSeen := make(chan int, calls)
	for w := range 8 {
		calling.Go(func() {
			for i := w; i < calls; i += 8 {
				req, err := http.NewRequest("GET", p.base+"/api/revision", nil)
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 1 {
					req.Header.Set("Authorization", "Bearer wrong-"+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				codesSeen <- resp.StatusCode
			}
		})
	}
	calling.Wait()
	close(codesSeen)
	n := 0
	for c := range codesSeen {
		if c != http.StatusUnauthorized {
			t.Fatalf("an admin call without the token answered %d, want 401", c)
		}
		n++
	}
	if n != calls {
		t.Fatalf("%d admin calls answered, want %d", n, calls)
	}
	if got := metric(t, p, "limitplane_controlplane_admin_refused_total"); got != calls {
		t.Fatalf("admin_refused_total = %v, want %d", got, calls)
	}
	elapsed := time.Since(began)
	// The first refusal at once, then at most one line per 5s interval.
	maxLines := 2 + int(elapsed/(5*time.Second))
	stderr := p.stderr.String()
	if got := strings.Count(stderr, `msg="controlplane: sync stream refused"`); got < 1 || got > maxLines {
		t.Fatalf("%d lines of sync refusals in %v, want 1 to %d:\n%s", got, elapsed, maxLines, stderr)
	}
	if got := strings.Count(stderr, `msg="controlplane: admin call refused: missing or wrong bearer token"`); got < 1 || got > maxLines {
		t.Fatalf("%d lines of admin refusals in %v, want 1 to %d:\n%s", got, elapsed, maxLines, stderr)
	}
	t.Logf("log after %d refused streams and %d refused admin calls in %v: %d bytes", streams, calls, elapsed.Round(time.Millisecond), len(stderr))
}

// helloLessRound opens n Sync streams that send nothing, over raw
// connections of DefaultMaxStreamsPerConn streams each, checks that each
// ends with DeadlineExceeded (its Hello timeout) or ResourceExhausted
// (refused at once: too many wait for their Hello), closes the
// connections, and returns the longest time from a stream's HEADERS to
// its end, the highest RSS of p seen meanwhile and the count of each
// ending.
func helloLessRound(t *testing.T, p *process, n int, timeout time.Duration) (slowest time.Duration, peakRSS int64, endings map[codes.Code]int) {
	t.Helper()
	const perConn = controlplane.DefaultMaxStreamsPerConn
	type ended struct {
		took time.Duration
		code int // grpc-status; -1 for RST_STREAM
	}
	results := make(chan ended, n)
	var wg sync.WaitGroup
	var conns []*rawSync
	for c := 0; c*perConn < n; c++ {
		r := dialRaw(t, p.sync)
		conns = append(conns, r)
		if r.maxStreams != perConn {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want %d", r.maxStreams, perConn)
		}
		opened := map[uint32]time.Time{}
		for range min(perConn, n-c*perConn) {
			opened[r.open(t)] = time.Now()
		}
		wg.Go(func() {
			for len(opened) > 0 {
				id, code, _, err := r.end()
				if err != nil {
					t.Errorf("reading the streams' ends: %v", err)
					return
				}
				if at, ok := opened[id]; ok {
					results <- ended{time.Since(at), code}
					delete(opened, id)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(50 * time.Millisecond):
		}
		peakRSS = max(peakRSS, rssBytes(t, p.cmd.Process.Pid))
	}
	for _, r := range conns {
		r.conn.Close()
	}
	close(results)
	if len(results) != n {
		t.Fatalf("%d streams ended, want %d", len(results), n)
	}
	endings = map[codes.Code]int{}
	for r := range results {
		switch c := codes.Code(r.code); c {
		case codes.DeadlineExceeded, codes.ResourceExhausted:
			endings[c]++
		default:
			t.Fatalf("a Hello-less stream ended with grpc-status %d, want DeadlineExceeded (4) or ResourceExhausted (8)", r.code)
		}
		slowest = max(slowest, r.took)
	}
	return slowest, peakRSS, endings
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// TestSyncStreamBounds: with -sync-max-streams 4 and
// -sync-max-streams-per-conn 2, the server's HTTP/2 SETTINGS say 2
// concurrent streams, and a third stream on that connection is reset
// with REFUSED_STREAM while the first two are open; a second connection's
// two fill the total; a fifth stream, on a third connection, is refused
// at once with ResourceExhausted; the Hello timeout then ends the four.
func TestSyncStreamBounds(t *testing.T) {
	p := startSync(t, "-hello-timeout", "3s", "-sync-max-streams", "4", "-sync-max-streams-per-conn", "2")
	open := func() float64 { return metric(t, p, "limitplane_controlplane_sync_streams") }

	r := dialRaw(t, p.sync)
	if r.maxStreams != 2 {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want 2", r.maxStreams)
	}
	r.open(t)
	r.open(t)
	eventually(t, "two streams open on the raw connection", func() bool { return open() == 2 })
	if id := r.open(t); id != 5 {
		t.Fatalf("third stream %d", id)
	}
	if id, _, rst, err := r.end(); err != nil || id != 5 || rst != http2.ErrCodeRefusedStream {
		t.Fatalf("after a third stream: stream %d ended with RST_STREAM %v (%v), want stream 5 REFUSED_STREAM", id, rst, err)
	}
	if got := open(); got != 2 {
		t.Fatalf("sync_streams = %v after a refused third stream, want 2", got)
	}

	b, c := dial(t, p.sync, insecure.NewCredentials()), dial(t, p.sync, insecure.NewCredentials())
	onB := []syncStream{helloLess(t, b), helloLess(t, b)}
	eventually(t, "four streams open", func() bool { return open() == 4 })
	if _, err := helloLess(t, c).Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a fifth stream: %v, want ResourceExhausted", err)
	}
	if got := metric(t, p, `limitplane_controlplane_sync_refused_total{reason="too_many_streams"}`); got != 1 {
		t.Fatalf("sync_refused_total{too_many_streams} = %v, want 1", got)
	}
	for _, s := range onB {
		if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a Hello-less stream: %v, want DeadlineExceeded\n%s", err, p.stderr)
		}
	}
	eventually(t, "every stream ended", func() bool { return open() == 0 })
	if got := metric(t, p, `limitplane_controlplane_sync_refused_total{reason="hello_timeout"}`); got != 4 {
		t.Fatalf("sync_refused_total{hello_timeout} = %v, want 4", got)
	}
}

// The probes and /metrics answer without the token; after two writes and
// a gateway's snapshot, Ack and Nack the metrics say so exactly.
func TestProbesAndMetrics(t *testing.T) {
	p := startSync(t)
	for _, c := range [][2]string{{"/healthz", `{"ok":true}`}, {"/readyz", `{"ready":true,"revision":0}`}} {
		resp, err := http.Get(p.base + c[0])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != c[1]+"\n" {
			t.Fatalf("GET %s without the token: %d %s, want 200 %s", c[0], resp.StatusCode, b, c[1])
		}
	}
	_, rev := putDemo(t, p)
	stream := openSync(t, dial(t, p.sync, insecure.NewCredentials()), "dp1", dp1Token, "dp1")
	_, nonce := recvSnapshot(t, stream)
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: rev, Nonce: nonce}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: rev, Nonce: nonce, Error: "refused for the test"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Nack counted", func() bool { return metric(t, p, "limitplane_controlplane_sync_nacks_total") == 1 })
	for series, want := range map[string]float64{
		"limitplane_controlplane_revision":                                     float64(rev),
		`limitplane_controlplane_admin_writes_total{result="ok"}`:              2,
		`limitplane_controlplane_admin_writes_total{result="error"}`:           0,
		"limitplane_controlplane_admin_write_duration_seconds_count":           2,
		`limitplane_controlplane_gateways_connected{group="dp1"}`:              1,
		`limitplane_controlplane_sync_deliveries_total{kind="snapshot"}`:       1,
		`limitplane_controlplane_sync_deliveries_total{kind="changes"}`:        0,
		"limitplane_controlplane_sync_acks_total":                              1,
		"limitplane_controlplane_sync_streams":                                 1,
		`limitplane_controlplane_sync_refused_total{reason="unauthenticated"}`: 0,
		"limitplane_controlplane_admin_refused_total":                          0,
	} {
		if got := metric(t, p, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if st, b := do(t, "PUT", p.base+"/api/policies/gold", `{"rate":{"requests":0,"per":"1m"}}`); st != 422 {
		t.Fatal(st, b)
	}
	if got := metric(t, p, `limitplane_controlplane_admin_writes_total{result="error"}`); got != 1 {
		t.Errorf("admin_writes_total{error} = %v after a refused write, want 1", got)
	}
}
