package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestMain runs main instead of the tests when runMainEnv is set, so the
// test can run the command as a real process.
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

const runMainEnv = "LP_MULTIDATAPLANE_TEST_RUN_MAIN"

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// children returns the PIDs of pid's child processes (from /proc).
func children(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces; split after ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			c, _ := strconv.Atoi(strings.Fields(s)[0])
			out = append(out, c)
		}
	}
	return out
}

var (
	gatewayLineRE = regexp.MustCompile(`gateway (dp\d-gw\d): (http://\S+) `)
	serviceLineRE = regexp.MustCompile(`service (services-(gin|grpc)\d): (?:gin|grpc) (\S+) `)
)

// TestRunAndInterrupt runs the command as a process: it prints its
// banner with four gateways and four services (two Gin, two gRPC
// replicas), a request with the demo key passes through each, its
// children are the three redis-servers, the control plane, the four
// gateways and the four services (12 processes); the services' quota of
// 10 admits exactly 10 of 16 concurrent requests spread over both Gin
// replicas, and the same over both gRPC replicas (another key); a
// gateway killed with SIGKILL is reported while the other eleven keep
// running and serving, and SIGINT makes it exit 0 within 30 s with every
// child gone.
func TestRunAndInterrupt(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var kids []int
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		for _, pid := range kids { // never leave a child behind, even when failing
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
		}
	})

	deadline := time.Now().Add(3 * time.Minute) // includes go build
	for !strings.Contains(stdout.String(), "Ctrl-C stops everything.") {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("exited before its banner: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no banner within 3 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	gws := gatewayLineRE.FindAllStringSubmatch(stdout.String(), -1)
	if len(gws) != 4 {
		t.Fatalf("the banner lists %d gateways, want 4", len(gws))
	}
	for _, g := range gws {
		req, _ := http.NewRequest("GET", g[2]+"/echo/hello", nil)
		req.Header.Set("X-API-Key", demoKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("gateway %s: %v", g[1], err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway %s: %d %s", g[1], resp.StatusCode, body)
		}
	}
	svcs := serviceLineRE.FindAllStringSubmatch(stdout.String(), -1)
	if len(svcs) != 4 {
		t.Fatalf("the banner lists %d services, want 4", len(svcs))
	}
	for _, s := range svcs {
		if err := callService(s[2], s[3], demoKey); err != nil {
			t.Fatalf("service %s with the demo key: %v", s[1], err)
		}
	}
	kids = children(t, cmd.Process.Pid)
	if len(kids) != 12 {
		t.Fatalf("%d child processes %v, want 12 (3 redis-servers, the control plane, 4 gateways, 4 services)", len(kids), kids)
	}
	// Each service's replicas share its key's quota in the services'
	// Redis: exactly ordersQuota of 16 concurrent requests over both.
	for _, c := range []struct{ framework, key string }{{"gin", ginKey}, {"grpc", grpcKey}} {
		var addrs []string
		for _, s := range svcs {
			if s[2] == c.framework {
				addrs = append(addrs, s[3])
			}
		}
		admitted, denied, other := spend(c.framework, addrs, c.key, 16)
		if admitted != ordersQuota || denied != 16-ordersQuota || len(other) != 0 {
			t.Fatalf("%s replicas %v, 16 requests with key %s: %d admitted, %d denied, other answers %v; want exactly %d and %d",
				c.framework, addrs, c.key, admitted, denied, other, ordersQuota, 16-ordersQuota)
		}
	}

	// A gateway killed with SIGKILL is reported, and the rest keep running
	// and serving.
	victim := gatewayPID(t, kids, gws[0][1])
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	want := gws[0][1] + " exited (signal: killed); 11 others keep running (Ctrl-C stops them)\n"
	for !strings.Contains(stdout.String(), want) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("exited after one gateway was killed (%v); want %q and the rest running", err, want)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line %q", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, g := range gws[1:] {
		req, _ := http.NewRequest("GET", g[2]+"/echo/hello", nil)
		req.Header.Set("X-API-Key", demoKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("gateway %s after %s was killed: %v", g[1], gws[0][1], err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway %s after %s was killed: %d", g[1], gws[0][1], resp.StatusCode)
		}
	}
	for _, s := range svcs {
		if err := callService(s[2], s[3], demoKey); err != nil {
			t.Fatalf("service %s after %s was killed: %v", s[1], gws[0][1], err)
		}
	}
	if n := len(children(t, cmd.Process.Pid)); n != 11 {
		t.Fatalf("%d child processes after one gateway was killed, want 11", n)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) || err != nil {
			t.Fatalf("exit after SIGINT: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGINT")
	}
	for _, pid := range kids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("child %d still exists after the command exited (kill 0: %v)", pid, err)
		}
	}
	if !strings.Contains(stdout.String(), "stopped\n") {
		t.Errorf("no \"stopped\" line:\n%s", stdout)
	}
}

// gatewayPID returns the PID among pids whose command line runs the
// gateway with the file named after id.
func gatewayPID(t *testing.T, pids []int, id string) int {
	t.Helper()
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(b), id+".yaml") {
			return pid
		}
	}
	t.Fatalf("no child process runs gateway %s", id)
	return 0
}

// callService makes one request with key to the service at addr: GET
// /orders for an HTTP framework (200 wanted), a gRPC health Check with
// the key in x-api-key for grpc (SERVING wanted).
func callService(framework, addr, key string) error {
	if framework != "grpc" {
		req, _ := http.NewRequest("GET", addr+"/orders", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%d %s", resp.StatusCode, body)
		}
		return nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if r.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %v", r.Status)
	}
	return nil
}

// spend sends n requests with key, concurrently, spread evenly over the
// replicas at addrs, and counts the answers: admitted (200, OK), denied
// (429, ResourceExhausted) and any other.
func spend(framework string, addrs []string, key string, n int) (admitted, denied int, other []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var conns []*grpc.ClientConn
	if framework == "grpc" {
		for _, a := range addrs {
			c, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return 0, 0, []string{err.Error()}
			}
			defer c.Close()
			conns = append(conns, c)
		}
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var code int
			var errText string
			if framework == "grpc" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
				_, err := healthpb.NewHealthClient(conns[i%len(conns)]).Check(ctx, &healthpb.HealthCheckRequest{})
				switch status.Code(err) {
				case codes.OK:
					code = 200
				case codes.ResourceExhausted:
					code = 429
				default:
					errText = err.Error()
				}
			} else {
				req, _ := http.NewRequest("GET", addrs[i%len(addrs)]+"/orders", nil)
				req.Header.Set("X-API-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errText = err.Error()
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
					if code != 200 && code != 429 {
						errText = resp.Status
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errText != "":
				other = append(other, errText)
			case code == 200:
				admitted++
			default:
				denied++
			}
		}()
	}
	wg.Wait()
	return admitted, denied, other
}

// TestWaitRedisChecksTheServer: waitRedis accepts the redis-server that
// answers only when it is the child it started: another one answering at
// the child's address (a port taken between freeAddr and the child's
// bind) is errOtherRedis, which run answers with another port.
func TestWaitRedisChecksTheServer(t *testing.T) {
	redisServer, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not on PATH:", err)
	}
	d := &deployment{stderr: io.Discard}
	defer d.stop()
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(addr, ":")
	srv, err := d.start("redis-squatter", redisServer, []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := waitRedis(ctx, addr, srv); err != nil {
		t.Fatalf("the server's own child: %v", err)
	}
	other, err := d.start("not-redis", "sleep", []string{"30"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitRedis(ctx, addr, other); !errors.Is(err, errOtherRedis) {
		t.Fatalf("another child at the server's address: %v, want errOtherRedis", err)
	}
}

// TestSweepStale: the directory of a run whose process is gone is
// removed; those of a live process, of this one, and without a pid file
// are kept.
func TestSweepStale(t *testing.T) {
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live := exec.Command("sleep", "30")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	dirs := map[string]string{ // name → pid file ("" none)
		"gone": strconv.Itoa(dead.Process.Pid), "live": strconv.Itoa(live.Process.Pid),
		"self": strconv.Itoa(os.Getpid()), "nopid": "", "garbage": "x",
	}
	for name, pid := range dirs {
		d := filepath.Join(tmp, tempPrefix+name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if pid != "" {
			if err := os.WriteFile(filepath.Join(d, "pid"), []byte(pid), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	sweepStale(tmp)
	for name := range dirs {
		_, err := os.Stat(filepath.Join(tmp, tempPrefix+name))
		if kept := err == nil; kept != (name != "gone") {
			t.Errorf("%s: kept %v (%v)", name, kept, err)
		}
	}
}
