package main

import (
	"bytes"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestMain lets the test binary act as a worker process when the parent
// (run, inside a test) re-runs it.
func TestMain(m *testing.M) {
	if os.Getenv("LIMITPLANE_WORKER_CHILD") == "1" {
		os.Exit(exitCode(os.Args[1:], os.Getenv, os.Stdout, os.Stderr, ""))
	}
	os.Exit(m.Run())
}

// Four processes sharing 50 jobs/s through one redis-server for 10 s
// complete 500 ± 10 jobs; the limit's bound is 1 + 50×10 = 501.
func TestFourProcessesShareOneRate(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	err := run([]string{"-processes", "4", "-rate", "50", "-duration", "10s", "-redis", "redis://" + srv.Addr + "/0"}, noEnv, &out, os.Stderr, os.Args[0])
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	total, atMost := totals(t, out.String())
	if total < 490 || total > 501 || atMost != 501 {
		t.Fatalf("4 workers at 50/s for 10s did %d jobs (at most %d), want 490..501 (at most 501)\n%s", total, atMost, out.String())
	}
	if n := len(regexp.MustCompile(`(?m)^worker done: [1-9]\d* jobs$`).FindAllString(out.String(), -1)); n != 4 {
		t.Fatalf("%d workers reported jobs, want 4\n%s", n, out.String())
	}
	t.Log(out.String())
}

// totals reads the jobs done and the bound from run's last line, and
// checks that the output is what README.md shows: the header, one line
// per worker and the total.
func totals(t *testing.T, out string) (total, atMost int) {
	t.Helper()
	re := regexp.MustCompile(`^\d+ workers share \d+ jobs/s via redis://\S+ for \S+\n(?:worker done: \d+ jobs\n)+` +
		`total: (\d+) jobs in \S+ = [\d.]+ jobs/s \(limit \d+/s, at most (\d+)\)\n$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output is not header, workers, total:\n%s", out)
	}
	total, _ = strconv.Atoi(m[1])
	atMost, _ = strconv.Atoi(m[2])
	return total, atMost
}

// TestREADMEOutput: README.md's sample run has the lines run prints, and
// the bound maxJobs gives for it.
func TestREADMEOutput(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)go run ./examples/worker -processes 4 -rate 50 -duration 10s\n```\n\n```\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: the worker's sample run not found")
	}
	if _, atMost := totals(t, string(m[1])); int64(atMost) != maxJobs(jobLimit(50), 10*time.Second) {
		t.Errorf("README.md says at most %d", atMost)
	}
}

// A run whose duration is not whole seconds: 2 workers at 10/s for 1.5 s
// may do 1 + 10×1.5 = 16 jobs (the bound once truncated 1.5 s to 1 s and
// printed 11 under a total of 15), and do about that many.
func TestFractionalDuration(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	err := run([]string{"-processes", "2", "-rate", "10", "-duration", "1500ms", "-redis", "redis://" + srv.Addr + "/0"}, noEnv, &out, os.Stderr, os.Args[0])
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	total, atMost := totals(t, out.String())
	if atMost != 16 || total > atMost || total < 14 {
		t.Fatalf("2 workers at 10/s for 1.5s did %d jobs (at most %d), want 14..16 (at most 16)\n%s", total, atMost, out.String())
	}
	t.Log(out.String())
}

// A Redis that stalls for a second mid-run (SIGSTOP: calls time out, then
// the store's circuit breaker opens) does not end the workers: each failed
// Take is retried with backoff and reported on stderr, the run completes,
// and the limit still holds. Before retries, the first "i/o timeout" ended
// the worker process and the run.
func TestWorkersRideOutRedisStall(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	var errOut lockedBuffer
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		time.Sleep(2500 * time.Millisecond) // 1 s start-up + 1.5 s of work
		srv.Pause()
		time.Sleep(time.Second)
		srv.Resume()
	}()
	err := run([]string{"-processes", "2", "-rate", "20", "-duration", "4s", "-redis", "redis://" + srv.Addr + "/0"}, noEnv, &out, &errOut, os.Args[0])
	<-stalled
	if err != nil {
		t.Fatalf("%v\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	total, atMost := totals(t, out.String())
	// Jobs lost to the stall: at most its second, the store's timeout
	// (250 ms) and one backoff (1 s) at 20/s, so at least 81 - 45 remain.
	if atMost != 81 || total > atMost || total < 36 {
		t.Fatalf("2 workers at 20/s for 4s with a 1 s Redis stall did %d jobs (at most %d), want 36..81 (at most 81)\n%s", total, atMost, out.String())
	}
	stderr := errOut.String()
	if n := strings.Count(stderr, "failed takes retried\n"); n != 2 {
		t.Fatalf("%d workers reported retries, want 2; stderr:\n%s", n, stderr)
	}
	if !regexp.MustCompile(`worker: take failed after \d+ jobs: .+; retrying in \d+ms`).MatchString(stderr) {
		t.Fatalf("no retry line on stderr:\n%s", stderr)
	}
	t.Log(out.String(), stderr)
}

// lockedBuffer is a bytes.Buffer that several worker processes' stderr
// copiers may write to at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMaxJobs: the bound is the burst plus one job per emission interval
// T, with T rounded down to a nanosecond as the stores compute it.
func TestMaxJobs(t *testing.T) {
	for _, tc := range []struct {
		rate int64
		d    time.Duration
		want int64
	}{
		{50, 10 * time.Second, 501},
		{10, 1500 * time.Millisecond, 16},
		{10, 1499 * time.Millisecond, 15},
		{1, 999 * time.Millisecond, 1},
		{3, time.Second, 4},           // T = 333333333ns: 3 intervals fit, not 3.000000003
		{3, 1000 * time.Second, 3001}, // 3000.000009 intervals
		{7, 10 * time.Second, 71},
		{1_000_000_000, time.Second, 1_000_000_001},
	} {
		if got := maxJobs(jobLimit(tc.rate), tc.d); got != tc.want {
			t.Errorf("maxJobs(%d/s, %v) = %d, want %d", tc.rate, tc.d, got, tc.want)
		}
	}
}

// A worker whose Redis is unreachable fails loudly instead of reporting 0
// jobs.
func TestUnreachableRedisFails(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-processes", "1", "-duration", "2s", "-redis", "redis://127.0.0.1:1/0"}, noEnv, &out, os.Stderr, os.Args[0])
	if err == nil || !strings.Contains(err.Error(), "worker process: exit status 1") {
		t.Fatalf("err %v, want the worker process to fail\n%s", err, out.String())
	}
}

// noEnv is the environment of the parent process: no worker variables.
func noEnv(string) string { return "" }

// -h prints only the flags a user sets and exits 0; the worker processes
// learn their role from the environment, not from flags.
func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := exitCode([]string{"-h"}, noEnv, &out, &errOut, ""); code != 0 {
		t.Fatalf("-h exited %d, want 0", code)
	}
	const want = `Usage of worker:
  -duration duration
    	how long the workers run (default 10s)
  -key string
    	name of the shared limit (default: a fresh one per run)
  -processes int
    	worker processes to start (default 4)
  -rate int
    	global jobs per second shared by all workers (default 50)
  -redis string
    	Redis URL (redis://host:port/db); empty starts a private redis-server
`
	if out.String() != "" || errOut.String() != want {
		t.Fatalf("-h printed %q to stdout and %q to stderr, want nothing and %q", out.String(), errOut.String(), want)
	}
	if code := exitCode([]string{"-child"}, noEnv, &out, &errOut, ""); code != 1 {
		t.Fatalf("-child exited %d, want 1 (no such flag)", code)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-processes", "0"}, {"-rate", "-1"}, {"-rate", "2000000000"}, {"-duration", "0s"}, {"-nope"}} {
		if err := run(args, noEnv, &bytes.Buffer{}, io.Discard, ""); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
