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
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/procs"
)

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
func startRedis(ctx context.Context, dir string, ps *procs.Set) (*procs.Proc, string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := procs.FreeAddr()
		if err != nil {
			return nil, "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(redisServer(),
			"--port", port, "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
			"--slowlog-log-slower-than", "0", "--slowlog-max-len", strconv.Itoa(slowlogMaxLen))
		p, err := procs.Start("redis-server", cmd, filepath.Join(dir, "redis.log"))
		if err != nil {
			return nil, "", err
		}
		ps.Add(p)
		if lastErr = waitPing(ctx, addr, p); lastErr == nil {
			return p, addr, nil
		}
		p.Stop()
	}
	return nil, "", fmt.Errorf("drlharness: redis-server did not start: %w", lastErr)
}

// waitPing polls addr with PING until it answers, p exits or 10 s pass.
func waitPing(ctx context.Context, addr string, p *procs.Proc) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("redis-server exited: %s", p.Tail(2000))
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
	proc  *procs.Proc
	url   string // the hot key's URL
	admin string // base URL of its admin endpoint
}

// startGateway writes yaml (with the admin address filled in) to a file
// of its own and starts bin on it, then waits until the admin endpoint's
// /readyz answers 200.
func startGateway(ctx context.Context, bin, dir string, slot, gen int, yaml func(admin string) string, unsafe bool, ps *procs.Set) (*gateway, error) {
	name := fmt.Sprintf("gateway-%d.%d", slot, gen)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before the gateway binds it
		listen, err := procs.FreeAddr()
		if err != nil {
			return nil, err
		}
		admin, err := procs.FreeAddr()
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(cfg, []byte(yaml(admin)), 0o600); err != nil {
			return nil, fmt.Errorf("drlharness: %w", err)
		}
		cmd := exec.Command(bin, "-config", cfg, "-listen", listen)
		if unsafe {
			cmd.Env = append(os.Environ(), "LP_GATEWAY_TEST_UNSAFE_GROWS_BEFORE_SHRINKS=1")
		}
		p, err := procs.Start(name, cmd, filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		ps.Add(p)
		g := &gateway{slot: slot, gen: gen, proc: p, url: "http://" + listen + "/h/x", admin: "http://" + admin}
		if lastErr = g.waitReady(ctx); lastErr == nil {
			return g, nil
		}
		p.Stop()
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
		if g.proc.Exited() {
			return errors.New("exited: " + g.proc.Tail(4000))
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
	return errors.New("not ready after 30s: " + g.proc.Tail(4000))
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
