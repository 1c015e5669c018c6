package gqharness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// adminToken is the control plane's admin bearer token in every run (at
// least controlplane.MinTokenBytes long). The harness's processes listen
// on loopback only.
const adminToken = "globalquota-harness-admin-token-0123456789"

// gwAdminToken is every gateway's operations endpoint token.
const gwAdminToken = "globalquota-harness-gateway-token"

// dpToken is data plane group's data-plane token (plaintext; the
// control plane's -dataplanes file holds its hash).
func dpToken(group string) string { return "globalquota-harness-dp-token-" + group }

// set is the processes of one mode's run (procs.Set), telling
// Options.OnStart of each one added.
type set struct {
	procs.Set
	onStart func(name string, pid int)
}

// Add puts p in the set and tells onStart.
func (s *set) Add(p *procs.Proc) {
	s.Set.Add(p)
	if s.onStart != nil {
		s.onStart(p.Name, p.Cmd.Process.Pid)
	}
}

// hashToken is the form of a data-plane token the control plane's
// -dataplanes file holds (controlplane.HashToken, not imported: the
// controlplane package would bring its stores' modules into this one):
// "sha256:" and the 64 lower-case hex digits of its SHA-256.
func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// startTimeout bounds each process's start (builds and starts are slow on
// a loaded machine).
const startTimeout = 30 * time.Second

// Build builds cmd/limitplane-controlplane and cmd/limitplane-gateway of
// the main module (found with `go list -m`, through the benchmarks
// module's replace directive) into dir and returns their paths.
func Build(ctx context.Context, dir string) (controlPlane, gateway string, err error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/limitplane/limitplane").Output()
	if err != nil {
		return "", "", fmt.Errorf("gqharness: find the limitplane module (run from the benchmarks module): %w", err)
	}
	root := strings.TrimSpace(string(out))
	controlPlane = filepath.Join(dir, "limitplane-controlplane")
	gateway = filepath.Join(dir, "limitplane-gateway")
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/limitplane-controlplane", "./cmd/limitplane-gateway")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("gqharness: build cmd/limitplane-controlplane and cmd/limitplane-gateway: %w\n%s", err, b)
	}
	return controlPlane, gateway, nil
}

// BuildUndebited builds cmd/limitplane-controlplane into dir with the
// test-only tag limitplane_lease_unsafe (controlplane/quotaledger): its
// ledger grants leases without debiting them, the negative control the
// harness must catch.
func BuildUndebited(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/limitplane/limitplane").Output()
	if err != nil {
		return "", fmt.Errorf("gqharness: find the limitplane module (run from the benchmarks module): %w", err)
	}
	bin := filepath.Join(dir, "limitplane-controlplane-undebited")
	build := exec.CommandContext(ctx, "go", "build", "-tags", "limitplane_lease_unsafe", "-o", bin, "./cmd/limitplane-controlplane")
	build.Dir = strings.TrimSpace(string(out))
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("gqharness: build cmd/limitplane-controlplane -tags limitplane_lease_unsafe: %w\n%s", err, b)
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

// startRedis runs a redis-server on a free loopback port (never 6379) in
// dir, with persistence off, and waits for PING.
func startRedis(ctx context.Context, name, dir string, ps *set) (string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := procs.FreeAddr()
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(redisServer(), "--port", port, "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no")
		p, err := procs.Start(name, cmd, filepath.Join(dir, name+".log"))
		if err != nil {
			return "", err
		}
		ps.Add(p)
		if lastErr = waitPing(ctx, addr, p); lastErr == nil {
			return addr, nil
		}
		p.Stop()
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	return "", fmt.Errorf("gqharness: %s did not start: %w", name, lastErr)
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

// controlPlane is the control plane process of one mode's run. Restarts
// (Restart) keep its ports and its bbolt file.
type controlPlane struct {
	bin, dir        string
	data, dpFile    string
	adminAddr, sync string
	ps              *set
	proc            *procs.Proc
	gen             int
	client          *http.Client
}

// startControlPlane writes the -dataplanes file with one token per group
// (tag = group) and starts the control plane on free loopback ports with
// its bbolt file in dir.
func startControlPlane(ctx context.Context, bin, dir string, groups []string, ps *set) (*controlPlane, error) {
	var b strings.Builder
	for _, g := range groups {
		fmt.Fprintf(&b, "- group: %s\n  tags: [%s]\n  token_hash: %q\n", g, g, hashToken(dpToken(g)))
	}
	c := &controlPlane{bin: bin, dir: dir, data: filepath.Join(dir, "cp.db"), dpFile: filepath.Join(dir, "dataplanes.yaml"), ps: ps,
		client: &http.Client{Timeout: 10 * time.Second}}
	if err := os.WriteFile(c.dpFile, []byte(b.String()), 0o600); err != nil {
		return nil, fmt.Errorf("gqharness: %w", err)
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if c.adminAddr, err = procs.FreeAddr(); err != nil {
			return nil, err
		}
		if c.sync, err = procs.FreeAddr(); err != nil {
			return nil, err
		}
		if err = c.start(ctx, 1); err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, err
}

// start starts the process on c's ports and waits for GET /readyz to
// answer 200. A port still held after a kill is retried for up to tries
// × 100 ms.
func (c *controlPlane) start(ctx context.Context, tries int) error {
	var lastErr error
	for attempt := 0; attempt < tries; attempt++ {
		name := fmt.Sprintf("controlplane.%d", c.gen)
		c.gen++
		cmd := exec.Command(c.bin, "-admin-listen", c.adminAddr, "-sync-listen", c.sync, "-data", c.data, "-dataplanes", c.dpFile)
		cmd.Env = append(os.Environ(), "LP_CP_ADMIN_TOKEN="+adminToken)
		p, err := procs.Start(name, cmd, filepath.Join(c.dir, name+".log"))
		if err != nil {
			return err
		}
		c.ps.Add(p)
		if lastErr = waitHTTP(ctx, p, "http://"+c.adminAddr+"/readyz", ""); lastErr == nil {
			c.proc = p
			return nil
		}
		p.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("gqharness: the control plane did not start: %w", lastErr)
}

// Restart SIGKILLs the control plane and starts it again on the same
// ports and bbolt file.
func (c *controlPlane) Restart(ctx context.Context) error {
	c.proc.Kill()
	return c.start(ctx, 100)
}

// waitHTTP polls url (with the bearer token, when not "") until it
// answers 200, p exits, or startTimeout passes.
func waitHTTP(ctx context.Context, p *procs.Proc, url, token string) error {
	deadline := time.Now().Add(startTimeout)
	c := &http.Client{Timeout: 5 * time.Second}
	last := ""
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited: %s", p.Name, p.Tail(4000))
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if resp, err := c.Do(req); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not 200 after %v (last: %s): %s", p.Name, url, startTimeout, last, p.Tail(4000))
}

// admin calls the control plane's admin API: method, path and body (nil,
// or a value encoded as JSON). It returns the status and the body.
func (c *controlPlane) admin(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.adminAddr+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("gqharness: admin %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// mustAdmin is admin that fails unless the status is want; it returns
// the answer's revision.
func (c *controlPlane) mustAdmin(ctx context.Context, method, path string, body any, want int) (uint64, error) {
	status, b, err := c.admin(ctx, method, path, body)
	if err != nil {
		return 0, err
	}
	if status != want {
		return 0, fmt.Errorf("gqharness: admin %s %s: status %d, want %d: %s", method, path, status, want, b)
	}
	var w struct {
		Revision uint64 `json:"revision"`
	}
	json.Unmarshal(b, &w)
	return w.Revision, nil
}

// gateway is one gateway process of a data plane.
type gateway struct {
	id    string
	proc  *procs.Proc
	base  string // http://127.0.0.1:port
	admin string // http://127.0.0.1:port of the operations endpoint
}

// gatewayYAML is a data-plane gateway's file: counters in its data
// plane's Redis (closed when Redis fails: every count is Redis's), the
// operations endpoint, and the control_plane section pointing at the
// harness's proxy for the data plane.
const gatewayYAML = `listen: %[1]s
store: redis://%[2]s/0
redis: {timeout: 2s}
failure_policy: closed
admin:
  listen: %[3]s
  token_env: LP_GW_ADMIN_TOKEN
control_plane:
  address: %[4]s
  token_env: LP_DP_TOKEN
  group: %[5]s
  tags: [%[5]s]
  gateway_id: %[6]s
`

// startGateway writes gateway id's file and starts it with env added,
// then waits until its /readyz answers 200 (a configuration applied).
func startGateway(ctx context.Context, bin, dir, id, group, redisAddr, cpAddr string, env []string, ps *set) (*gateway, error) {
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
		cfg := filepath.Join(dir, id+".yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(gatewayYAML, listen, redisAddr, admin, cpAddr, group, id)), 0o600); err != nil {
			return nil, fmt.Errorf("gqharness: %w", err)
		}
		cmd := exec.Command(bin, "-config", cfg)
		cmd.Env = append(append(os.Environ(), "LP_DP_TOKEN="+dpToken(group), "LP_GW_ADMIN_TOKEN="+gwAdminToken), env...)
		name := fmt.Sprintf("gateway-%s.%d", id, attempt)
		p, err := procs.Start(name, cmd, filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		ps.Add(p)
		g := &gateway{id: id, proc: p, base: "http://" + listen, admin: "http://" + admin}
		if lastErr = waitHTTP(ctx, p, g.admin+"/readyz", gwAdminToken); lastErr == nil {
			return g, nil
		}
		p.Stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("gqharness: gateway %s did not start: %w", id, lastErr)
}

// appliedRevision reads the control_plane.applied_revision of the
// gateway's /readyz (0 when it has none).
func (g *gateway) appliedRevision(ctx context.Context) (uint64, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", g.admin+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+gwAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Revision     uint64 `json:"revision"`
		ControlPlane *struct {
			AppliedRevision uint64 `json:"applied_revision"`
		} `json:"control_plane"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, fmt.Errorf("gqharness: %s /readyz: %w", g.id, err)
	}
	if r.ControlPlane == nil {
		return 0, errors.New("gqharness: " + g.id + " /readyz has no control_plane section")
	}
	return min(r.Revision, r.ControlPlane.AppliedRevision), nil
}

// waitApplied waits until the gateway has applied revision rev, for up to
// startTimeout.
func (g *gateway) waitApplied(ctx context.Context, rev uint64) error {
	deadline := time.Now().Add(startTimeout)
	var got uint64
	var err error
	for time.Now().Before(deadline) {
		if g.proc.Exited() {
			return fmt.Errorf("gqharness: gateway %s exited: %s", g.id, g.proc.Tail(4000))
		}
		if got, err = g.appliedRevision(ctx); err == nil && got >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	return fmt.Errorf("gqharness: gateway %s: revision %d not applied after %v (at %d, %v)", g.id, rev, startTimeout, got, err)
}

// metricSum sums the samples of the gateway's /metrics whose metric name
// contains one of substrs; found is false when none does.
func (g *gateway) metricSum(ctx context.Context, substrs ...string) (sum float64, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", g.admin+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+gwAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name, val := line[:strings.IndexAny(line, "{ ")], line[i+1:]
		for _, s := range substrs {
			if strings.Contains(name, s) {
				if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					sum += v
					found = true
				}
				break
			}
		}
	}
	return sum, found, sc.Err()
}
