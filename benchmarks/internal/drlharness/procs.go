package drlharness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process the harness started. Each runs in its own
// process group (so a terminal's Ctrl-C reaches only the harness, which
// then stops it) and gets SIGKILL if the harness dies.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been waited for
	log  string        // file holding its stdout and stderr
}

// startProc starts cmd with its output in logPath.
func startProc(name string, cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("drlharness: %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("drlharness: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's group.
func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// stop asks the process to end (SIGCONT first, in case it was stopped,
// then SIGTERM) and kills it after 5 s. Safe to call more than once.
func (p *proc) stop() {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill()
	}
}

// tail returns the last n bytes of the process's log, for error messages.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// procSet holds every process of a run so that all of them are stopped,
// whatever path the run ends by.
type procSet struct {
	mu    sync.Mutex
	procs []*proc
}

func (s *procSet) add(p *proc) {
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
}

// stopAll stops every process, in parallel.
func (s *procSet) stopAll() {
	s.mu.Lock()
	ps := s.procs
	s.procs = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// freeAddr returns a loopback address with a port that was free a moment
// ago. Never 6379: that is a Redis the harness did not start.
func freeAddr() (string, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("drlharness: find a free port: %w", err)
		}
		addr := l.Addr().String()
		l.Close()
		if !strings.HasSuffix(addr, ":6379") {
			return addr, nil
		}
	}
}

// BuildGateway builds examples/gateway of the main module (found with
// `go list -m`, so through the benchmarks module's replace directive) into
// dir and returns the binary's path.
func BuildGateway(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/limitplane/limitplane").Output()
	if err != nil {
		return "", fmt.Errorf("drlharness: find the limitplane module (run from the benchmarks module): %w", err)
	}
	root := strings.TrimSpace(string(out))
	bin := filepath.Join(dir, "gateway")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/gateway")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("drlharness: build examples/gateway: %w\n%s", err, b)
	}
	return bin, nil
}

// redisServer finds the redis-server binary: $REDIS_SERVER, PATH,
// /usr/bin.
func redisServer() string {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

// slowlogMaxLen bounds the server's slow log, which logs every command
// (slowlog-log-slower-than 0) so that the harness can tell the store's
// script calls from the DRL's; it is drained every 200 ms.
const slowlogMaxLen = 100000

// startRedis runs a redis-server on a free loopback port in dir, with
// persistence off and every command in the slow log, and waits for PING.
func startRedis(ctx context.Context, dir string, ps *procSet) (*proc, string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(redisServer(),
			"--port", port, "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
			"--slowlog-log-slower-than", "0", "--slowlog-max-len", strconv.Itoa(slowlogMaxLen))
		p, err := startProc("redis-server", cmd, filepath.Join(dir, "redis.log"))
		if err != nil {
			return nil, "", err
		}
		ps.add(p)
		if lastErr = waitPing(ctx, addr, p); lastErr == nil {
			return p, addr, nil
		}
		p.stop()
	}
	return nil, "", fmt.Errorf("drlharness: redis-server did not start: %w", lastErr)
}

// waitPing polls addr with PING until it answers, p exits or 10 s pass.
func waitPing(ctx context.Context, addr string, p *proc) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("redis-server exited: %s", p.tail(2000))
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			io.WriteString(c, "PING\r\n")
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.TrimSpace(line) == "+PONG" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("redis-server at %s not ready after 10s", addr)
}

// gateway is one running gateway process.
type gateway struct {
	slot  int
	gen   int // how many processes this slot had before this one
	proc  *proc
	url   string // the hot key's URL
	admin string // base URL of its admin endpoint
}

// startGateway writes yaml (with the admin address filled in) to a file
// of its own and starts bin on it, then waits until the admin endpoint's
// /readyz answers 200.
func startGateway(ctx context.Context, bin, dir string, slot, gen int, yaml func(admin string) string, ps *procSet) (*gateway, error) {
	name := fmt.Sprintf("gateway-%d.%d", slot, gen)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before the gateway binds it
		listen, err := freeAddr()
		if err != nil {
			return nil, err
		}
		admin, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(yaml(admin)), 0o600); err != nil {
			return nil, fmt.Errorf("drlharness: %w", err)
		}
		p, err := startProc(name, exec.Command(bin, "-config", cfg, "-listen", listen), filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		ps.add(p)
		g := &gateway{slot: slot, gen: gen, proc: p, url: "http://" + listen + "/h/x", admin: "http://" + admin}
		if lastErr = g.waitReady(ctx); lastErr == nil {
			return g, nil
		}
		p.stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("drlharness: %s did not start: %w", name, lastErr)
}

// waitReady polls /readyz until it answers 200, the process exits, or
// 30 s pass (builds and starts are slow on a loaded machine).
func (g *gateway) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	c := &http.Client{Timeout: 5 * time.Second} // /readyz PINGs the store for up to 2 s
	for time.Now().Before(deadline) {
		if g.proc.exited() {
			return errors.New("exited: " + g.proc.tail(4000))
		}
		if resp, err := c.Get(g.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	return errors.New("not ready after 30s: " + g.proc.tail(4000))
}

// metrics reads the named gauges from the gateway's /metrics (unlabelled
// samples only). A name it does not find is absent from the map.
func (g *gateway) metrics(ctx context.Context, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", g.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		for _, n := range names {
			if name == n {
				if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					m[n] = v
				}
			}
		}
	}
	return m, sc.Err()
}
