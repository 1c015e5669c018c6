package gqharness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bins are the control plane and gateway, built once by TestMain.
var bins struct{ controlPlane, gateway string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gqharness-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.controlPlane, bins.gateway, err = Build(context.Background(), dir)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// logWriter passes the harness's progress lines to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// started records the PIDs of every process a run starts
// (Options.OnStart).
type started struct {
	mu   sync.Mutex
	pids map[int]string
}

func (s *started) add(name string, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pids == nil {
		s.pids = map[int]string{}
	}
	s.pids[pid] = name
}

// leftOver returns the processes still running that the run started
// (by PID, and by pgrep over dir, which the control plane's and the
// gateways' command lines hold; redis-server rewrites its own), and how
// many the run started.
func (s *started) leftOver(t *testing.T, dir string) (string, int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var left []string
	for pid, name := range s.pids {
		if syscall.Kill(pid, 0) == nil {
			left = append(left, fmt.Sprintf("%d %s", pid, name))
		}
	}
	out, err := exec.Command("pgrep", "-af", dir).Output()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 1: // none matched
	case err != nil:
		t.Fatalf("pgrep: %v", err)
	default:
		left = append(left, string(out))
	}
	return strings.Join(left, "\n"), len(s.pids)
}

// TestConfigOnlyAndStaticSplit runs 2 data planes, Q = 200 per 3 s,
// 600 offered per period split 70/30 (420 and 180), 2 periods, 400 ms
// quiet at each boundary (a request later than that on a loaded machine
// could cross into the next quota period). Nothing
// but the quota limits, so per period and data plane: config_only admits
// min(offered, Q) = 200 and 180; static_split min(offered, ⌊Q × share⌋)
// = min(420, 140) and min(180, 60). Every other request is a 429, no
// request waits on the stopped control plane, and no process is left.
func TestConfigOnlyAndStaticSplit(t *testing.T) {
	dir := t.TempDir()
	var st started
	o := Options{OnStart: st.add, DataPlanes: 2, Quota: 200, Period: 3 * time.Second, Offered: 600, Split: []float64{70, 30}, Periods: 2,
		Modes: []Mode{ModeConfigOnly, ModeStaticSplit}, CPStop: time.Second, Guard: 400 * time.Millisecond,
		ControlPlaneBin: bins.controlPlane, GatewayBin: bins.gateway, Dir: dir, Log: logWriter{t}}
	rs, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 {
		t.Fatalf("%d results, want 2", len(rs))
	}
	want := map[Mode][]int64{ModeConfigOnly: {200, 180}, ModeStaticSplit: {140, 60}}
	offered := []int64{420, 180}
	for _, r := range rs {
		t.Log(r.Line())
		for k := range o.Periods {
			if !reflect.DeepEqual(r.Offered[k], offered) {
				t.Errorf("%s period %d: offered %v, want %v", r.Mode, k, r.Offered[k], offered)
			}
			if !reflect.DeepEqual(r.Admitted[k], want[r.Mode]) {
				t.Errorf("%s period %d: admitted %v, want %v", r.Mode, k, r.Admitted[k], want[r.Mode])
			}
			for i := range offered {
				if r.Refused[k][i] != offered[i]-want[r.Mode][i] || r.Errors[k][i] != 0 {
					t.Errorf("%s period %d %s: refused %d, errors %d; want %d, 0", r.Mode, k, group(i), r.Refused[k][i], r.Errors[k][i], offered[i]-want[r.Mode][i])
				}
			}
		}
		if r.CPCallsOnPath != 0 || r.CPProbe.Sent == 0 {
			t.Errorf("%s: cp_calls_on_path %d of %d requests sent while the control plane was stopped, want 0 of more than 0", r.Mode, r.CPCallsOnPath, r.CPProbe.Sent)
		}
	}
	if r := rs[1]; !reflect.DeepEqual(r.StaticShares, []int64{140, 60}) || r.MaxOverQ() != 0 {
		t.Errorf("static_split: shares %v, max over Q %d; want [140 60], 0", r.StaticShares, r.MaxOverQ())
	}
	if got := rs[0].MaxOverQ(); got != 180 {
		t.Errorf("config_only: max over Q %d, want 180", got)
	}
	// A control plane and per data plane a redis-server and a gateway, per
	// mode; more when a free port was taken before a process bound it
	// (the harness starts that one again: startRedis, startGateway).
	if left, n := st.leftOver(t, dir); left != "" || n < 2*(1+2+2) {
		t.Errorf("%d processes started (want at least 10); left after the run:\n%s", n, left)
	}
}

// TestCancel cancels a run during its load (as Ctrl-C does) and checks
// that Run returns the cancellation and leaves no process.
func TestCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var st started
	o := Options{OnStart: st.add, DataPlanes: 2, Gateways: 2, Quota: 100, Period: 30 * time.Second, Offered: 300, Periods: 1,
		Modes: []Mode{ModeLeaseStrict}, ControlPlaneBin: bins.controlPlane, GatewayBin: bins.gateway, Dir: dir,
		Log: &cancelOn{t: t, line: "load started", cancel: cancel}}
	start := time.Now()
	_, err := Run(ctx, o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 25*time.Second {
		t.Errorf("Run took %v after a cancel during a 30 s load", d)
	}
	if left, n := st.leftOver(t, dir); left != "" || n < 1+2+4 { // more after a port race, as above
		t.Errorf("%d processes started (want at least 7); left after the cancel:\n%s", n, left)
	}
}

// cancelOn is a log that cancels once a line holding line is written.
type cancelOn struct {
	t      *testing.T
	line   string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	c.t.Log(strings.TrimRight(string(p), "\n"))
	if strings.Contains(string(p), c.line) {
		c.cancel()
	}
	return len(p), nil
}

// TestStartFailure runs a gateway binary that exits at once: Run fails
// with an error naming the gateway and leaves no process.
func TestStartFailure(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad-gateway")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho no such gateway >&2\nexit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var st started
	o := Options{OnStart: st.add, DataPlanes: 2, Quota: 100, Period: 3 * time.Second, Periods: 1, Modes: []Mode{ModeConfigOnly},
		ControlPlaneBin: bins.controlPlane, GatewayBin: bad, Dir: dir, Log: logWriter{t}}
	_, err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "gateway dp1-gw1 did not start") || !strings.Contains(err.Error(), "no such gateway") {
		t.Fatalf("Run with a failing gateway: %v", err)
	}
	// The control plane, a redis-server each, and dp1's or dp2's three
	// tries of its gateway at least.
	if left, n := st.leftOver(t, dir); left != "" || n < 1+2+3 {
		t.Errorf("%d processes started (want at least 6); left after the failure:\n%s", n, left)
	}
}

// TestOptions checks the refusals and the schedule's arithmetic.
func TestOptions(t *testing.T) {
	if got := Counts(30000, []float64{70, 20, 10}); !reflect.DeepEqual(got, []int{21000, 6000, 3000}) {
		t.Errorf("Counts 70/20/10 = %v", got)
	}
	if got := Counts(10, []float64{1, 1, 1}); !reflect.DeepEqual(got, []int{4, 3, 3}) {
		t.Errorf("Counts thirds = %v", got)
	}
	if got := Rotated([]float64{70, 20, 10}, 1); !reflect.DeepEqual(got, []float64{10, 70, 20}) {
		t.Errorf("Rotated by 1 = %v", got)
	}
	if got := Rotated([]float64{70, 20, 10}, 5); !reflect.DeepEqual(got, []float64{20, 10, 70}) {
		t.Errorf("Rotated by 5 = %v", got)
	}
	sc := schedule{period: 3 * time.Second, guard: 400 * time.Millisecond}
	if a, b, c := sc.at(0, 0, 10), sc.at(0, 9, 10), sc.at(1, 0, 10); a != 130*time.Millisecond || b != 2470*time.Millisecond || c != 3510*time.Millisecond {
		t.Errorf("schedule at = %v, %v, %v; want 130ms, 2.47s, 3.51s", a, b, c)
	}
	o := Options{Quota: 10000, Split: []float64{70, 20, 10}}
	if got := o.StaticShares(); !reflect.DeepEqual(got, []int64{7000, 2000, 1000}) {
		t.Errorf("StaticShares = %v", got)
	}
	for _, bad := range []Options{
		{Split: []float64{1, 1}},
		{Cuts: []Cut{{DP: 3, From: 0, To: time.Second}}},
		{Modes: []Mode{"lease_sloppy"}},
		{KillCP: time.Hour},
		{Floor: 20000},
	} {
		if _, err := Run(context.Background(), bad); !errors.Is(err, ErrOptions) {
			t.Errorf("Run(%+v) = %v, want ErrOptions", bad, err)
		}
	}
	// The cut-off set and the optimistic bound's count.
	o = Options{DataPlanes: 3, Cuts: []Cut{{DP: 1, From: 0, To: 1}}}
	if got := o.cutOff(); !reflect.DeepEqual(got, []int{1}) {
		t.Errorf("cutOff = %v", got)
	}
	o.KillCP = time.Second
	if got := o.cutOff(); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Errorf("cutOff with KillCP = %v", got)
	}
	if got := admittedByDataPlane([]byte(`{"periods":[{"data_planes":[{"data_plane":"dp1","admitted":5},{"data_plane":"dp2","admitted":2}]},{"data_planes":[{"data_plane":"dp1","admitted":1}]}]}`)); !reflect.DeepEqual(got, map[string]int64{"dp1": 6, "dp2": 2}) {
		t.Errorf("admittedByDataPlane = %v", got)
	}
}
