// Command worker shows job throttling across processes: N worker processes
// share one global rate through the Redis store, with no engineer dividing
// the limit by the worker count.
//
//	go run ./examples/worker                      # 4 workers, 50 jobs/s, 10 s
//	go run ./examples/worker -processes 8 -rate 100 -duration 5s
//	go run ./examples/worker -redis redis://127.0.0.1:6379/0
//
// Without -redis it starts a private redis-server (from PATH) on a free
// loopback port and stops it at the end. The parent starts the worker
// processes (re-running its own binary with LIMITPLANE_WORKER_CHILD=1 and
// LIMITPLANE_WORKER_START_AT in the environment, so -h lists only the
// flags a user sets), each calls core.Wait
// before every job (a failed Take is retried with backoff and reported on
// stderr), and the parent prints what each achieved and the total rate.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/redis/go-redis/v9"
)

// The parent tells a worker process what it is through its environment,
// not through flags, so that -h shows only the flags a user sets.
const (
	childEnv   = "LIMITPLANE_WORKER_CHILD"    // "1" in a worker process
	startAtEnv = "LIMITPLANE_WORKER_START_AT" // Unix ns at which workers start
)

func main() {
	// go-redis logs every failed dial of its pool (several per Take while
	// Redis is down); a worker reports each failed Take and its retry
	// itself, so the program (not a library: the logger is process-wide)
	// silences go-redis's own lines.
	redis.SetLogger(quietRedis{})
	os.Exit(exitCode(os.Args[1:], os.Getenv, os.Stdout, os.Stderr, os.Args[0]))
}

// quietRedis is a go-redis logger that drops what it is given.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// exitCode runs the command and returns its exit status: 0 on success and
// after -h (which prints the usage), 1 on any error.
func exitCode(args []string, getenv func(string) string, stdout, stderr io.Writer, exe string) int {
	err := run(args, getenv, stdout, stderr, exe)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, "worker:", err)
	return 1
}

type config struct {
	processes int
	rate      int64
	duration  time.Duration
	redisURL  string
	key       string
	child     bool
	startAt   int64 // Unix ns when children start working
}

// parse reads the user's flags, and, in a worker process, the parent's
// environment variables; usage and flag errors go to stderr.
func parse(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.processes, "processes", 4, "worker processes to start")
	fs.Int64Var(&c.rate, "rate", 50, "global jobs per second shared by all workers")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long the workers run")
	fs.StringVar(&c.redisURL, "redis", "", "Redis URL (redis://host:port/db); empty starts a private redis-server")
	fs.StringVar(&c.key, "key", "", "name of the shared limit (default: a fresh one per run)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if getenv(childEnv) == "1" {
		c.child = true
		at, err := strconv.ParseInt(getenv(startAtEnv), 10, 64)
		if err != nil {
			return c, fmt.Errorf("worker process: %s: %w", startAtEnv, err)
		}
		c.startAt = at
	}
	if c.processes < 1 || c.rate < 1 || c.duration <= 0 {
		return c, errors.New("-processes, -rate and -duration must be positive")
	}
	if err := jobLimit(c.rate).Validate(); err != nil {
		return c, fmt.Errorf("-rate %d: %w", c.rate, err)
	}
	return c, nil
}

// run is the parent: it starts the workers and prints the total. exe is
// the binary to re-run as a worker.
func run(args []string, getenv func(string) string, out, stderr io.Writer, exe string) error {
	c, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	if c.child {
		return work(c, out, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.redisURL == "" {
		url, shutdown, err := startRedis()
		if err != nil {
			return err
		}
		defer shutdown()
		c.redisURL = url
	}
	if c.key == "" {
		c.key = fmt.Sprintf("jobs-%d", time.Now().UnixNano())
	}
	if self, err := os.Executable(); err == nil && exe == os.Args[0] {
		exe = self
	}
	startAt := time.Now().Add(time.Second) // time for every process to start
	fmt.Fprintf(out, "%d workers share %d jobs/s via %s for %v\n", c.processes, c.rate, c.redisURL, c.duration)
	type result struct {
		n   int64
		err error
	}
	results := make(chan result, c.processes)
	for i := 0; i < c.processes; i++ {
		cmd := exec.CommandContext(ctx, exe, "-redis", c.redisURL, "-key", c.key,
			"-rate", strconv.FormatInt(c.rate, 10), "-duration", c.duration.String())
		cmd.Env = append(os.Environ(), childEnv+"=1", startAtEnv+"="+strconv.FormatInt(startAt.UnixNano(), 10))
		cmd.Stderr = stderr
		go func() {
			b, err := cmd.Output()
			if err != nil {
				results <- result{err: fmt.Errorf("worker process: %w", err)}
				return
			}
			n, err := strconv.ParseInt(strings.TrimSpace(lastLine(string(b))), 10, 64)
			results <- result{n, err}
		}()
	}
	var total int64
	for i := 0; i < c.processes; i++ {
		r := <-results
		if r.err != nil {
			return r.err
		}
		fmt.Fprintf(out, "worker done: %d jobs\n", r.n)
		total += r.n
	}
	fmt.Fprintf(out, "total: %d jobs in %v = %.1f jobs/s (limit %d/s, at most %d)\n",
		total, c.duration, float64(total)/c.duration.Seconds(), c.rate, maxJobs(jobLimit(c.rate), c.duration))
	return nil
}

// jobLimit is the limit the workers share: rate jobs a second, in bursts
// of 1, so that their jobs are spread evenly over each second.
func jobLimit(rate int64) core.Limit {
	return core.Limit{Rate: rate, Period: time.Second, Burst: 1}
}

// maxJobs is the most jobs l lets through in a run of d: its burst at
// once, then one every emission interval T (Period/Rate, rounded down to
// a nanosecond as the stores compute it) until the end of the run.
func maxJobs(l core.Limit, d time.Duration) int64 {
	return l.EffectiveBurst() + int64(d/l.EmissionInterval())
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// work is one worker process: Wait, do a job, repeat until the deadline.
// A failed Take (Redis down, slow or restarting; the store's circuit
// breaker open) is retried with exponential backoff until the run's
// deadline, and each retry is reported on stderr: one Redis timeout must
// not end a job runner. A worker that could do no job at all, because every
// Take failed, reports the last error and exits 1.
func work(c config, out, stderr io.Writer) error {
	client, err := redisstore.NewClientFromURL(c.redisURL)
	if err != nil {
		return err
	}
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		return err
	}
	rule, err := store.Prepare(core.LimitSet{Rate: jobLimit(c.rate)})
	if err != nil {
		return err
	}
	start := time.Unix(0, c.startAt)
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(c.duration))
	defer cancel()
	job := core.Request{Consumer: c.key, Rule: rule, Cost: 1}
	retry := newRetryBackOff()
	var n, retries int64
	var lastErr error
	for {
		_, err := core.Wait(ctx, store, job)
		if err == nil {
			n++ // the job itself would run here
			retry.Reset()
			continue
		}
		// The run is over when our own deadline passed or the next slot
		// lies beyond it; anything else is a store failure to retry.
		if ctx.Err() != nil || errors.Is(err, core.ErrWaitExceedsDeadline) {
			break
		}
		lastErr = err
		retries++
		d := retry.NextBackOff()
		fmt.Fprintf(stderr, "worker: take failed after %d jobs: %v; retrying in %v\n", n, err, d.Round(time.Millisecond))
		if !sleepCtx(ctx, d) {
			break
		}
	}
	if n == 0 && lastErr != nil {
		return fmt.Errorf("no job done in %v: %d takes failed, the last with: %w", c.duration, retries, lastErr)
	}
	if retries > 0 {
		fmt.Fprintf(stderr, "worker: %d jobs, %d failed takes retried\n", n, retries)
	}
	_, err = fmt.Fprintln(out, n)
	return err
}

// newRetryBackOff is the backoff between retries of a failed Take: from
// 50 ms, doubling up to 1 s, each wait jittered by ±50 %, for as long as
// the run lasts.
func newRetryBackOff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = time.Second
	return b
}

// sleepCtx sleeps for d, or until ctx ends; it reports whether it slept
// the whole d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// startRedis starts a private redis-server on a free loopback port.
func startRedis() (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("no -redis given and redis-server is not on PATH (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "limitplane-worker-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	shutdown := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		os.RemoveAll(filepath.Clean(dir))
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Ready to accept connections") {
				ready <- true
				io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			shutdown()
			return "", nil, errors.New("redis-server exited before it was ready")
		}
	case <-time.After(10 * time.Second):
		shutdown()
		return "", nil, errors.New("redis-server did not start within 10s")
	}
	return fmt.Sprintf("redis://127.0.0.1:%d/0", port), shutdown, nil
}
