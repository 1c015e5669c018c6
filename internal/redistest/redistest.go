// Package redistest starts throwaway redis-server processes for tests: a
// standalone server on a free loopback port, or a Cluster of masters. Each
// server runs in its own temporary directory with persistence off
// (--save "" --appendonly no) and is stopped by t.Cleanup. Nothing here ever
// talks to a Redis the test did not start (in particular not 127.0.0.1:6379).
//
// The binaries are found as "redis-server" and "redis-cli" on PATH, falling
// back to /usr/bin; override with the REDIS_SERVER and REDIS_CLI environment
// variables. Tests that use this package fail (they never skip) when the
// binaries are missing: .ci/run installs Debian's redis-server package.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// binary returns the path of a Redis executable: $env, then PATH, then
// /usr/bin/name.
func binary(env, name string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/bin/" + name
}

// Server is one redis-server process started by Start.
type Server struct {
	// Addr is "127.0.0.1:<port>".
	Addr string
	// Port is the TCP port the server listens on; Restart keeps it.
	Port int
	// Dir is the server's temporary working directory; its log is
	// Dir/redis.log.
	Dir string

	t     testing.TB
	extra []string
	// conf, when set, is a Sentinel's configuration file: the server runs
	// in sentinel mode (StartSentinel).
	conf string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start runs a redis-server on a free loopback port with persistence off and
// the extra arguments given (e.g. "--cluster-enabled", "yes"), waits until
// it answers PING, and registers its shutdown with t.Cleanup. It calls
// t.Fatal if the server does not come up within 10 s.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, Dir: t.TempDir(), extra: extra}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a freed port can be taken again before redis binds it
		s.Port = freePort(t, strings.Contains(strings.Join(extra, " "), "--cluster-enabled"))
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago. For a
// Cluster node the bus port (port+10000) must exist and be free too.
func freePort(t testing.TB, cluster bool) int {
	t.Helper()
	for i := 0; i < 100; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !cluster {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		if bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000))); err == nil {
			bus.Close()
			return port
		}
	}
	t.Fatalf("redistest: no free port pair found")
	return 0
}

// launch starts the process on s.Port and waits for PING.
func (s *Server) launch() error {
	args := []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", "redis.log",
	}
	if s.conf != "" {
		args = append([]string{s.conf, "--sentinel"}, args[:6]...)
		args = append(args, "--daemonize", "no", "--protected-mode", "no", "--logfile", "redis.log")
	}
	args = append(args, s.extra...)
	cmd := exec.Command(binary("REDIS_SERVER", "redis-server"), args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := waitReady(s.Addr, cmd.Process.Pid, done); err != nil {
		s.kill(syscall.SIGKILL)
		return fmt.Errorf("%w; log:\n%s", err, s.Log())
	}
	return nil
}

// waitReady polls addr with PING until it answers PONG, the process exits
// (exited is closed), or startTimeout passes. The server that answers must
// be process pid: a port found free can be taken by another test
// process's redis-server before this one binds it (this one then exits,
// and the other would answer the PING), which would make two tests share
// one server until the other stops it.
func waitReady(addr string, pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("redis-server exited during start-up")
		default:
		}
		if ping(addr) == nil {
			switch got, err := serverPID(addr); {
			case err != nil:
				return err
			case got != pid:
				return fmt.Errorf("%s is served by another redis-server (pid %d, not %d)", addr, got, pid)
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("redis-server at %s not ready after %v", addr, startTimeout)
}

// serverPID returns the process_id INFO server reports at addr.
func serverPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO server answered %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// ping sends an inline PING over a fresh connection.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Log returns the server's log file so far (for failure messages).
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

func (s *Server) kill(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	cmd.Process.Signal(syscall.SIGCONT) // a paused server must run to act on sig
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// Kill ends the server abruptly with SIGKILL, as a crash would, and waits
// for the process to exit. Its data is lost (persistence is off).
func (s *Server) Kill() { s.kill(syscall.SIGKILL) }

// Stop shuts the server down with SIGTERM and waits for it (SIGKILL after
// 5 s). It is safe to call more than once and after Kill.
func (s *Server) Stop() { s.kill(syscall.SIGTERM) }

// Pause stops the server with SIGSTOP: it keeps its connections and data
// but answers nothing (calls time out, as with a hung or partitioned
// Redis) until Resume. Stop and Kill work on a paused server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT); it answers again at once,
// with the data it had.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: signal %v: the server is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// Restart starts a stopped or killed server again on the same port with
// the same arguments, waits until it answers PING, and calls t.Fatal if it
// cannot (for instance when the port was taken meanwhile).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly after the kill
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart redis-server on %s: %v", s.Addr, err)
}

// Client returns a go-redis client for the server, closed by t.Cleanup.
// opts may be nil; its Addr is overwritten.
func (s *Server) Client(t testing.TB, opts *redis.Options) *redis.Client {
	t.Helper()
	o := redis.Options{}
	if opts != nil {
		o = *opts
	}
	o.Addr = s.Addr
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	return c
}

// StartSentinel runs a Redis Sentinel on a free loopback port that
// monitors primary under the name master with a quorum of 1, declares it
// down after downAfter without an answer and fails over to one of its
// replicas, waits until it answers PING, and registers its shutdown with
// t.Cleanup. Address a store at it with
// "redis+sentinel://<master>@<sentinel Addr>".
func StartSentinel(t testing.TB, master string, primary *Server, downAfter time.Duration) *Server {
	t.Helper()
	s := &Server{t: t, Dir: t.TempDir()}
	s.conf = filepath.Join(s.Dir, "sentinel.conf")
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s.Port = freePort(t, false)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		// Sentinel rewrites its file: write it afresh for each attempt.
		conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 5000\n"+
			"sentinel parallel-syncs %s 1\n",
			master, primary.Port, master, downAfter.Milliseconds(), master, master)
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatalf("redistest: write sentinel.conf: %v", err)
		}
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server --sentinel: %v", lastErr)
	return nil
}

// Cluster is a Redis Cluster of master-only nodes started by StartCluster.
type Cluster struct {
	// Nodes are the masters, in the order they were given to
	// redis-cli --cluster create.
	Nodes []*Server
}

// StartCluster starts n ≥ 3 redis-server processes with cluster mode on,
// joins them with `redis-cli --cluster create ... --cluster-replicas 0`,
// and waits until every node reports cluster_state:ok and the 16384 slots
// are covered. All processes stop at t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", n)
	}
	c := &Cluster{}
	args := []string{"create"}
	for i := 0; i < n; i++ {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	args = append([]string{"--cluster"}, append(args, "--cluster-replicas", "0", "--cluster-yes")...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary("REDIS_CLI", "redis-cli"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		for {
			info, err := clusterInfo(s.Addr)
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_assigned:16384") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ok: %v\n%s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func clusterInfo(addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.ClusterInfo(ctx).Result()
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a[i] = s.Addr
	}
	return a
}

// Client returns a go-redis Cluster client seeded with every node, closed
// by t.Cleanup. opts may be nil; its Addrs is overwritten.
func (c *Cluster) Client(t testing.TB, opts *redis.ClusterOptions) *redis.ClusterClient {
	t.Helper()
	o := redis.ClusterOptions{}
	if opts != nil {
		o = *opts
	}
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	t.Cleanup(func() { cc.Close() })
	return cc
}
