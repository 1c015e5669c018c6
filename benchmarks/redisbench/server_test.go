package redisbench

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The benchmarks module cannot import the main module's internal/redistest,
// so this is a small copy of what it does: one throwaway redis-server on a
// free loopback port, in a temporary directory, persistence off, stopped
// when the test binary ends. It never talks to a Redis it did not start
// (in particular not 127.0.0.1:6379).

// poolSize is every client's connection pool: one connection per
// concurrent caller at concurrency 64.
const poolSize = 64

// server is the redis-server all tests and benchmarks of one `go test` run
// share (TestMain starts it).
var server *redisServer

type redisServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

func TestMain(m *testing.M) {
	s, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "redisbench:", err)
		os.Exit(1)
	}
	server = s
	code := m.Run()
	s.stop()
	os.Exit(code)
}

// redisServerPath is $REDIS_SERVER, then redis-server on PATH, then
// /usr/bin/redis-server.
func redisServerPath() string {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

// startServer runs redis-server on a free loopback port and waits until it
// answers PING. A port freed by the probe can be taken again before Redis
// binds it, so it tries a few ports.
func startServer() (*redisServer, error) {
	dir, err := os.MkdirTemp("", "redisbench-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
		if lastErr = s.launch(port); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("start redis-server: %w", lastErr)
}

func (s *redisServer) launch(port int) error {
	cmd := exec.Command(redisServerPath(),
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", "redis.log",
	)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(s.done)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited during start-up; log:\n%s", s.log())
		default:
		}
		if ping(s.addr) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill(syscall.SIGKILL)
	return fmt.Errorf("redis-server at %s not ready after 10s; log:\n%s", s.addr, s.log())
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
		return errors.New("PING answered " + strconv.Quote(line))
	}
	return nil
}

func (s *redisServer) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// kill signals the process and waits for it (SIGKILL after 5 s).
func (s *redisServer) kill(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// stop shuts the server down and removes its directory.
func (s *redisServer) stop() {
	s.kill(syscall.SIGTERM)
	os.RemoveAll(s.dir)
}

// client returns a new client of the shared server with poolSize
// connections, closed by tb.Cleanup.
func client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: server.addr, PoolSize: poolSize})
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestServer checks the helper: the server answers on a loopback port that
// is not the default Redis port, and has persistence off.
func TestServer(t *testing.T) {
	host, port, err := net.SplitHostPort(server.addr)
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" || port == "6379" {
		t.Fatalf("server address %s: want 127.0.0.1 and a port other than 6379", server.addr)
	}
	c := client(t)
	ctx := t.Context()
	if got, err := c.Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING = %q, %v; want PONG", got, err)
	}
	for param, want := range map[string]string{"save": "", "appendonly": "no", "dir": server.dir} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[param] != want {
			t.Errorf("CONFIG GET %s = %q, want %q", param, got[param], want)
		}
	}
}
