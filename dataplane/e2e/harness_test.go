package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// binaries are the programs TestMain built.
type binaries struct {
	controlPlane, gateway, service string
}

// bin is set once by TestMain, before any test runs, and only read after.
var bin binaries

// TestMain builds the control plane, the gateway and the service once into a temporary
// directory, runs the tests and removes the directory.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "limitplane-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		bin = binaries{controlPlane: filepath.Join(dir, "controlplane"), gateway: filepath.Join(dir, "gateway"), service: filepath.Join(dir, "service")}
		for out, pkg := range map[string]string{
			bin.controlPlane: "github.com/limitplane/limitplane/cmd/limitplane-controlplane",
			bin.gateway:      "github.com/limitplane/limitplane/cmd/limitplane-gateway",
			bin.service:      "github.com/limitplane/limitplane/examples/service",
		} {
			args := []string{"build", "-o", out}
			if os.Getenv("LP_E2E_RACE") == "1" {
				args = append(args, "-race")
			}
			cmd := exec.Command(goTool(), append(args, pkg)...)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: go build %s: %v\n", pkg, err)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// goTool returns the go command of the toolchain running the tests.
func goTool() string {
	if p := filepath.Join(os.Getenv("GOROOT"), "bin", "go"); os.Getenv("GOROOT") != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// stopTimeout bounds how long a process may take to exit after SIGTERM
// before it is killed.
const stopTimeout = 15 * time.Second

// syncTimeout bounds waiting for a change to reach gateways and the like.
const syncTimeout = 30 * time.Second

// output is a goroutine-safe buffer of what a process writes.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// proc is one process a test started.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *output
	done           chan struct{} // closed once the process was waited for
	err            error         // Wait's error, after done
}

// startProc starts bin with args and env added to the test's environment,
// and registers its stop (SIGTERM, then SIGKILL after stopTimeout) and, if
// the test failed, a dump of its output, with t.Cleanup.
func startProc(t testing.TB, name, path string, args, env []string) *proc {
	t.Helper()
	p := &proc{name: name, stdout: &output{}, stderr: &output{}, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// The process dies with the test binary even if the test is killed.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	dump := os.Getenv("LP_E2E_DUMP") == "1"
	if dump {
		// Go programs write every goroutine's stack on SIGQUIT. t.Context
		// ends before any cleanup runs, so every process of a failed test
		// dumps at the same moment, each while the others still run.
		context.AfterFunc(t.Context(), func() {
			if t.Failed() {
				p.signal(syscall.SIGCONT)
				p.signal(syscall.SIGQUIT)
			}
		})
	}
	t.Cleanup(func() {
		logTail := 8 << 10
		if dump && t.Failed() {
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			logTail = 256 << 10
		}
		p.stop()
		if t.Failed() {
			t.Logf("%s (pid %d) stdout:\n%s\n%s stderr (last %d KiB):\n%s", name, p.cmd.Process.Pid, tail(p.stdout.String(), 4<<10), name, logTail>>10, tail(p.stderr.String(), logTail))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
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

// signal sends sig to the process (nothing once it ended).
func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		p.cmd.Process.Signal(sig)
	}
}

// stop sends SIGTERM (and SIGCONT, in case it is stopped) and waits for
// the process, killing it after stopTimeout. It returns the exit error.
func (p *proc) stop() error {
	p.signal(syscall.SIGTERM)
	p.signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// waitOutput waits until the process's stdout (or stderr, with fromStderr)
// matches re and returns the submatches, failing the test after timeout
// or if the process exits first.
func (p *proc) waitOutput(t testing.TB, re *regexp.Regexp, fromStderr bool, timeout time.Duration) []string {
	t.Helper()
	o := p.stdout
	if fromStderr {
		o = p.stderr
	}
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(o.String()); m != nil {
			return m
		}
		if p.exited() {
			t.Fatalf("%s exited (%v) before writing %q; stdout:\n%s\nstderr:\n%s", p.name, p.err, re, p.stdout, tail(p.stderr.String(), 8<<10))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q within %v; stdout:\n%s\nstderr:\n%s", p.name, re, timeout, p.stdout, tail(p.stderr.String(), 8<<10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a loopback address that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	return freePortOn(t, "")
}

// freePortOn returns an address of host ("" is 127.0.0.1) that was free
// a moment ago.
func freePortOn(t testing.TB, host string) string {
	t.Helper()
	if host == "" {
		host = "127.0.0.1"
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// adminToken is every test control plane's admin bearer token.
const adminToken = "e2e-admin-token-0123456789abcdef"

// dpToken is one entry of the control plane's -dataplanes file.
type dpToken struct {
	group string
	tags  []string
	token string // plaintext; the file holds its hash
}

// cpOptions configure a control plane.
type cpOptions struct {
	// keepalive is the -keepalive flag ("" leaves it out).
	keepalive string
	// syncHost is the address the sync port listens on; "" is
	// 127.0.0.1.
	syncHost string
	// args are more flags.
	args []string
}

// controlPlane is the control plane program run by a test. Restarts keep
// its admin and sync addresses and its data file.
type controlPlane struct {
	data      string // bbolt file
	dpFile    string
	adminAddr string // 127.0.0.1:port
	syncAddr  string // 127.0.0.1:port
	opts      cpOptions
	proc      *proc
	client    *http.Client
}

// startControlPlane writes the -dataplanes file of tokens and starts the
// control plane on free loopback ports with its data in t.TempDir().
func startControlPlane(t testing.TB, tokens []dpToken, o cpOptions) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	for _, tk := range tokens {
		fmt.Fprintf(&b, "- group: %s\n  tags: [%s]\n  token_hash: %q\n", tk.group, strings.Join(tk.tags, ", "), controlplane.HashToken(tk.token))
	}
	c := &controlPlane{
		data:      filepath.Join(dir, "cp.db"),
		dpFile:    filepath.Join(dir, "dataplanes.yaml"),
		adminAddr: freePort(t),
		syncAddr:  freePortOn(t, o.syncHost),
		opts:      o,
		client:    &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}},
	}
	t.Cleanup(c.client.CloseIdleConnections)
	if err := os.WriteFile(c.dpFile, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c.start(t)
	return c
}

var cpSyncRE = regexp.MustCompile(`sync listening on (\S+) `)

// start (re)starts the control plane process and waits for its banner.
// A port that lingers after a kill is retried for a few seconds.
func (c *controlPlane) start(t testing.TB) {
	t.Helper()
	args := []string{"-admin-listen", c.adminAddr, "-sync-listen", c.syncAddr, "-data", c.data, "-dataplanes", c.dpFile}
	if c.opts.keepalive != "" {
		args = append(args, "-keepalive", c.opts.keepalive)
	}
	args = append(args, c.opts.args...)
	for attempt := 0; ; attempt++ {
		p := startProc(t, "controlplane", bin.controlPlane, args, []string{"LP_CP_ADMIN_TOKEN=" + adminToken})
		deadline := time.Now().Add(syncTimeout)
		for !cpSyncRE.MatchString(p.stdout.String()) && !p.exited() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if m := cpSyncRE.FindStringSubmatch(p.stdout.String()); m != nil {
			if m[1] != c.syncAddr {
				t.Fatalf("control plane syncs on %s, asked for %s", m[1], c.syncAddr)
			}
			c.proc = p
			return
		}
		if p.exited() && strings.Contains(p.stderr.String(), "address already in use") && attempt < 50 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		p.kill()
		t.Fatalf("control plane did not start: %v\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout, p.stderr)
	}
}

// kill ends the control plane with SIGKILL.
func (c *controlPlane) kill() { c.proc.kill() }

// admin calls the admin API: method, path (with query) and body (nil, or
// a value encoded as JSON). It returns the status and the body.
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
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// mustAdmin is admin that fails the test unless the answer has status
// want; it returns the body.
func (c *controlPlane) mustAdmin(t testing.TB, method, path string, body any, want int) []byte {
	t.Helper()
	status, b, err := c.admin(context.Background(), method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if status != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, b)
	}
	return b
}

// written is the admin API's answer to a write.
type written struct {
	KeyHash  string `json:"key_hash"`
	Revision uint64 `json:"revision"`
}

func decodeWritten(t testing.TB, b []byte) written {
	t.Helper()
	var w written
	if err := json.Unmarshal(b, &w); err != nil || w.Revision == 0 {
		t.Fatalf("write answered %s (%v)", b, err)
	}
	return w
}

// putPolicy stores p and returns the revision of the write.
func (c *controlPlane) putPolicy(t testing.TB, p spec.Policy) uint64 {
	t.Helper()
	return decodeWritten(t, c.mustAdmin(t, "PUT", "/api/policies/"+p.ID, p, 200)).Revision
}

// putAPI stores a and returns the revision of the write.
func (c *controlPlane) putAPI(t testing.TB, a spec.API) uint64 {
	t.Helper()
	return decodeWritten(t, c.mustAdmin(t, "PUT", "/api/apis/"+a.ID, a, 200)).Revision
}

// postKey creates the key plain with k's policies and limits (POST
// /api/keys) and returns its hash and the revision.
func (c *controlPlane) postKey(t testing.TB, plain string, k spec.Key) (string, uint64) {
	t.Helper()
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	delete(body, "key_hash")
	body["key"] = plain
	w := decodeWritten(t, c.mustAdmin(t, "POST", "/api/keys", body, 201))
	if want := identity.HashKey(plain).String(); w.KeyHash != want {
		t.Fatalf("POST /api/keys answered key_hash %s, want %s", w.KeyHash, want)
	}
	return w.KeyHash, w.Revision
}

// putKey replaces key hash with k (PUT /api/keys/{hash}, with
// ?suppress_reset=1 when suppress) and returns the revision.
func (c *controlPlane) putKey(t testing.TB, hash string, k spec.Key, suppress bool) uint64 {
	t.Helper()
	path := "/api/keys/" + hash
	if suppress {
		path += "?suppress_reset=1"
	}
	k.KeyHash = hash
	return decodeWritten(t, c.mustAdmin(t, "PUT", path, k, 200)).Revision
}

// getKey returns key hash as the control plane holds it.
func (c *controlPlane) getKey(t testing.TB, hash string) spec.Key {
	t.Helper()
	var k spec.Key
	if err := json.Unmarshal(c.mustAdmin(t, "GET", "/api/keys/"+hash, nil, 200), &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// resetQuota resets key hash's quotas (POST .../reset-quota, ?api= when
// api is not "") and returns the revision.
func (c *controlPlane) resetQuota(t testing.TB, hash, api string) uint64 {
	t.Helper()
	path := "/api/keys/" + hash + "/reset-quota"
	if api != "" {
		path += "?api=" + api
	}
	return decodeWritten(t, c.mustAdmin(t, "POST", path, nil, 200)).Revision
}

// revision returns GET /api/revision.
func (c *controlPlane) revision(t testing.TB) uint64 {
	t.Helper()
	var w written
	if err := json.Unmarshal(c.mustAdmin(t, "GET", "/api/revision", nil, 200), &w); err != nil {
		t.Fatal(err)
	}
	return w.Revision
}

// dataPlanes returns GET /api/dataplanes.
func (c *controlPlane) dataPlanes(t testing.TB) []controlplane.DataPlane {
	t.Helper()
	var out struct {
		DataPlanes []controlplane.DataPlane `json:"dataplanes"`
	}
	if err := json.Unmarshal(c.mustAdmin(t, "GET", "/api/dataplanes", nil, 200), &out); err != nil {
		t.Fatal(err)
	}
	return out.DataPlanes
}

// dataPlane is a group of gateways sharing one redis-server.
type dataPlane struct {
	group string
	tags  []string
	token string
	redis *redistest.Server // nil when redisAddr is a server of the test's own
	// redisAddr is the address of the data plane's redis-server as its
	// gateways reach it; "" when they count in their own process
	// (store: memory; see startMemoryDataPlane).
	redisAddr string
	gws       []*gateway
}

// gwOptions override what a gateway's file says.
type gwOptions struct {
	// token replaces the data plane's token.
	token string
	// tags replace the data plane's tags when not nil.
	tags []string
	// address replaces the control plane's sync address.
	address string
	// controlPlaneYAML is added to the control_plane section, indented.
	controlPlaneYAML string
	// listenHost is the host the gateway and its operations endpoint
	// listen on; "" is 127.0.0.1.
	listenHost string
	// command runs the gateway under another program (ip netns exec ...):
	// its path and arguments before the gateway's own.
	command []string
}

// gateway is one gateway process of a data plane.
type gateway struct {
	id      string
	dp      *dataPlane
	file    string
	env     []string
	command []string
	proc    *proc
	base    string // http://127.0.0.1:port
	admin   string // http://127.0.0.1:port of the operations endpoint
}

// gatewayYAML is a data-plane gateway's file: counters in its data
// plane's Redis (or in each gateway's process), closed when Redis fails (every count in these tests is
// Redis's), X-RateLimit fields, the operations endpoint on a free port,
// and the control_plane section.
const gatewayYAML = `listen: %[1]s:0
store: %[2]s
failure_policy: closed
response:
  x_ratelimit: true
admin:
  listen: %[1]s:0
  token_env: LP_GW_ADMIN_TOKEN
control_plane:
  address: %[3]s
  token_env: LP_DP_TOKEN
  group: %[4]s
  tags: [%[5]s]
  gateway_id: %[6]s
%[7]s`

// engine is the server.engine of every gateway these tests start: ""
// leaves it out (net/http). go test ./dataplane/e2e -engine fasthttp runs
// them on the fasthttp engine.
var engine = flag.String("engine", "", "server.engine of every gateway the tests start (net/http or fasthttp; empty: the default)")

// gwAdminToken is every test gateway's operations endpoint token.
const gwAdminToken = "e2e-gateway-admin-token"

// startGateway writes gateway id's file for data plane dp against the
// control plane at cpAddr and starts it (see gateway.start).
func startGateway(t testing.TB, dp *dataPlane, cpAddr, id string, o gwOptions) *gateway {
	t.Helper()
	token, tags, addr := dp.token, dp.tags, cpAddr
	if o.token != "" {
		token = o.token
	}
	if o.tags != nil {
		tags = o.tags
	}
	if o.address != "" {
		addr = o.address
	}
	extra := ""
	for _, l := range strings.Split(strings.TrimSpace(o.controlPlaneYAML), "\n") {
		if l != "" {
			extra += "  " + l + "\n"
		}
	}
	host := o.listenHost
	if host == "" {
		host = "127.0.0.1"
	}
	g := &gateway{id: id, dp: dp, file: filepath.Join(t.TempDir(), id+".yaml"), command: o.command,
		env: []string{"LP_DP_TOKEN=" + token, "LP_GW_ADMIN_TOKEN=" + gwAdminToken}}
	store := "memory"
	if dp.redisAddr != "" {
		store = "redis://" + dp.redisAddr + "/0"
	}
	yaml := fmt.Sprintf(gatewayYAML, host, store, addr, dp.group, strings.Join(tags, ", "), id, extra)
	if *engine != "" {
		yaml += "server: {engine: " + *engine + "}\n"
	}
	if err := os.WriteFile(g.file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start(t)
	return g
}

var (
	gwListenRE = regexp.MustCompile(`limitplane gateway listening on (http://\S+) `)
	gwAdminRE  = regexp.MustCompile(`admin endpoint at (http://\S+) `)
)

// start (re)starts the gateway process and waits for its banner (its
// listen and admin addresses). It does not wait for a configuration.
func (g *gateway) start(t testing.TB) {
	t.Helper()
	path, args := bin.gateway, []string{"-config", g.file}
	if len(g.command) > 0 {
		path, args = g.command[0], append(append(g.command[1:len(g.command):len(g.command)], path), args...)
	}
	g.proc = startProc(t, "gateway "+g.id, path, args, g.env)
	g.proc.waitOutput(t, gwAdminRE, false, syncTimeout)
	out := g.proc.stdout.String()
	g.base = gwListenRE.FindStringSubmatch(out)[1]
	g.admin = gwAdminRE.FindStringSubmatch(out)[1]
}

// startDataPlane starts a redis-server (unless shared is given) and n
// gateways named group-gw1... against the control plane.
func startDataPlane(t testing.TB, cp *controlPlane, tk dpToken, n int, shared *redistest.Server) *dataPlane {
	t.Helper()
	dp := &dataPlane{group: tk.group, tags: tk.tags, token: tk.token, redis: shared}
	if dp.redis == nil {
		dp.redis = redistest.Start(t)
	}
	dp.redisAddr = dp.redis.Addr
	dp.startGateways(t, cp, n)
	return dp
}

// startMemoryDataPlane starts n gateways named group-gw1... against the
// control plane that count in their own process (store: memory, which
// enforces GCRA only), without a redis-server.
func startMemoryDataPlane(t testing.TB, cp *controlPlane, tk dpToken, n int) *dataPlane {
	t.Helper()
	dp := &dataPlane{group: tk.group, tags: tk.tags, token: tk.token}
	dp.startGateways(t, cp, n)
	return dp
}

func (dp *dataPlane) startGateways(t testing.TB, cp *controlPlane, n int) {
	t.Helper()
	for i := range n {
		dp.gws = append(dp.gws, startGateway(t, dp, cp.syncAddr, fmt.Sprintf("%s-gw%d", dp.group, i+1), gwOptions{}))
	}
}

// cpStatus is the control_plane part of a gateway's /readyz.
type cpStatus struct {
	State            string  `json:"state"`
	AppliedRevision  uint64  `json:"applied_revision"`
	Digest           string  `json:"digest"`
	History          string  `json:"history"`
	StalenessSeconds float64 `json:"staleness_seconds"`
	Source           string  `json:"source"`
	LastError        string  `json:"last_error"`
	Reconnects       uint64  `json:"reconnects"`
	// PersistedRevision is the revision the gateway last persisted.
	PersistedRevision uint64 `json:"persisted_revision"`
	Deliveries        struct {
		SnapshotsApplied  uint64 `json:"snapshots_applied"`
		SnapshotsRejected uint64 `json:"snapshots_rejected"`
		ChangesApplied    uint64 `json:"changes_applied"`
		ChangesRejected   uint64 `json:"changes_rejected"`
	} `json:"deliveries"`
}

// readiness is a gateway's GET /readyz answer.
type readiness struct {
	Ready        bool       `json:"ready"`
	Revision     uint64     `json:"revision"`
	Error        string     `json:"error"`
	Degraded     bool       `json:"degraded"`
	NotBuilt     []notBuilt `json:"not_built"`
	ControlPlane *cpStatus  `json:"control_plane"`
}

// notBuilt is an API or policy a gateway runs without, as its /readyz
// (gateway.NotBuilt) and /api/dataplanes (controlplane.NotBuilt) list it.
type notBuilt struct {
	API     string `json:"api"`
	Policy  string `json:"policy"`
	Problem string `json:"problem"`
}

// quick is the client of the tests' single calls to gateways.
var quick = &http.Client{Timeout: 10 * time.Second}

// adminGet sends GET path to the gateway's operations endpoint with its
// token.
func (g *gateway) adminGet(path string) (*http.Response, error) {
	req, err := http.NewRequest("GET", g.admin+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+gwAdminToken)
	return quick.Do(req)
}

// readyz reads the gateway's /readyz (any status).
func (g *gateway) readyz() (readiness, error) {
	var r readiness
	resp, err := g.adminGet("/readyz")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("readyz %s: %w", b, err)
	}
	if r.ControlPlane == nil {
		return r, fmt.Errorf("readyz has no control_plane section: %s", b)
	}
	return r, nil
}

// waitReadyz polls gateway g's /readyz until ok accepts it, failing the
// test after timeout with the last answer.
func waitReadyz(t testing.TB, g *gateway, what string, timeout time.Duration, ok func(readiness) bool) readiness {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r, err := g.readyz()
		if err == nil && ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway %s: %s not seen within %v; last /readyz %+v %+v (%v)", g.id, what, timeout, r, r.ControlPlane, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitApplied waits until every gateway's /readyz reports an applied
// revision of at least rev.
func waitApplied(t testing.TB, rev uint64, gws ...*gateway) {
	t.Helper()
	for _, g := range gws {
		waitReadyz(t, g, fmt.Sprintf("applied revision ≥ %d", rev), syncTimeout, func(r readiness) bool {
			return r.ControlPlane.AppliedRevision >= rev && r.Revision >= rev
		})
	}
}

// waitSynced waits until every gateway has applied the control plane's
// current revision.
func waitSynced(t testing.TB, cp *controlPlane, gws ...*gateway) uint64 {
	t.Helper()
	rev := cp.revision(t)
	waitApplied(t, rev, gws...)
	return rev
}

// all returns the gateways of the data planes.
func all(dps ...*dataPlane) []*gateway {
	var out []*gateway
	for _, dp := range dps {
		out = append(out, dp.gws...)
	}
	return out
}

// counts are the answers to a burst of requests.
type counts struct {
	admitted, denied int
	// byGateway counts admitted requests per gateway base URL.
	byGateway map[string]int
}

// send sends n GETs of path with API key key, spread round-robin over the
// gateways by workers goroutines per gateway, and counts 200 (admitted)
// and 429 (denied); any other answer fails the test.
func send(t testing.TB, gws []*gateway, path, key string, n, workers int) counts {
	t.Helper()
	c, err := trySend(gws, path, key, n, workers)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sendBoth runs send on two sets of gateways at the same time, with path
// pathA on a and pathB on b.
func sendBoth(t testing.TB, a []*gateway, pathA string, b []*gateway, pathB, key string, n, workers int) (counts, counts) {
	t.Helper()
	var ca, cb counts
	var ea, eb error
	var wg sync.WaitGroup
	wg.Go(func() { ca, ea = trySend(a, pathA, key, n, workers) })
	wg.Go(func() { cb, eb = trySend(b, pathB, key, n, workers) })
	wg.Wait()
	if err := cmpErr(ea, eb); err != nil {
		t.Fatal(err)
	}
	return ca, cb
}

// trySend is send returning the first unexpected answer as an error.
func trySend(gws []*gateway, path, key string, n, workers int) (counts, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	jobs := make([]chan struct{}, len(gws))
	for i := range gws {
		jobs[i] = make(chan struct{}, n)
	}
	for i := range n {
		jobs[i%len(gws)] <- struct{}{}
	}
	var mu sync.Mutex
	out := counts{byGateway: map[string]int{}}
	var firstErr error
	var wg sync.WaitGroup
	for i, g := range gws {
		close(jobs[i])
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs[i] {
					status, body, err := get(c, g.base+path, key)
					mu.Lock()
					switch {
					case err != nil:
						firstErr = cmpErr(firstErr, fmt.Errorf("gateway %s: %w", g.id, err))
					case status == http.StatusOK:
						out.admitted++
						out.byGateway[g.id]++
					case status == http.StatusTooManyRequests:
						out.denied++
					default:
						firstErr = cmpErr(firstErr, fmt.Errorf("gateway %s: GET %s: status %d: %s", g.id, path, status, body))
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return out, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// get sends one GET with X-API-Key key (none when "") and returns the
// status and body.
func get(c *http.Client, url, key string) (int, string, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sendOne sends one request and returns its status, failing the test on
// a transport error.
func sendOne(t testing.TB, g *gateway, path, key string) (int, string) {
	t.Helper()
	status, body, err := get(quick, g.base+path, key)
	if err != nil {
		t.Fatalf("gateway %s: GET %s: %v", g.id, path, err)
	}
	return status, body
}

// quotaState is the quota part of a gateway's GET /consumers/{id}.
type quotaState struct {
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
}

// quotaRemaining reads key hash's quota state for api from the gateway's
// operations endpoint (a cost-0 decision: it spends nothing).
func quotaRemaining(t testing.TB, g *gateway, hash, api string) quotaState {
	t.Helper()
	resp, err := g.adminGet("/consumers/" + hash + "?api=" + api)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Quota *quotaState `json:"quota"`
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 || out.Quota == nil {
		t.Fatalf("gateway %s: GET /consumers/%s?api=%s: %d %s (%v)", g.id, hash, api, resp.StatusCode, b, err)
	}
	return *out.Quota
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not within %v; last: %s", what, timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// waitConnected waits until GET /api/dataplanes lists the gateways as
// connected, in their groups, with applied revision ≥ rev.
func waitConnected(t testing.TB, cp *controlPlane, rev uint64, gws ...*gateway) {
	t.Helper()
	waitConnectedSince(t, cp, rev, time.Time{}, gws...)
}

// waitConnectedSince is waitConnected that also wants each gateway last
// seen after since: it has sent something on a stream since then.
func waitConnectedSince(t testing.TB, cp *controlPlane, rev uint64, since time.Time, gws ...*gateway) {
	t.Helper()
	waitFor(t, "every gateway connected in /api/dataplanes", syncTimeout, func() (bool, string) {
		list := cp.dataPlanes(t)
		for _, g := range gws {
			i := slices.IndexFunc(list, func(d controlplane.DataPlane) bool { return d.GatewayID == g.id })
			if i < 0 || !list[i].Connected || list[i].AppliedRevision < rev || list[i].Group != g.dp.group || !list[i].LastSeen.After(since) {
				return false, fmt.Sprintf("%+v", list)
			}
		}
		return true, ""
	})
}

// Common objects.

// quotaPolicy is a policy of max requests a day and no rate limit.
func quotaPolicy(id string, max int64) spec.Policy {
	return spec.Policy{ID: id, Quota: &spec.Quota{Max: max, Renewal: spec.Duration(24 * time.Hour)}}
}

// echoAPI is an api_key API on the built-in echo upstream.
func echoAPI(id, listenPath string, tags ...string) spec.API {
	return spec.API{ID: id, ListenPath: listenPath, Target: spec.BuiltinEcho, Tags: tags}
}

// twoDataPlanes starts a control plane with tokens for dp1 (tags [dp1])
// and dp2 (tags [dp2]) and the two data planes, each with its own
// redis-server and two gateways.
func twoDataPlanes(t testing.TB, o cpOptions) (*controlPlane, *dataPlane, *dataPlane) {
	t.Helper()
	cp, tk1, tk2 := twoTokens(t, o)
	return cp, startDataPlane(t, cp, tk1, 2, nil), startDataPlane(t, cp, tk2, 2, nil)
}

// twoTokens starts a control plane with the tokens of twoDataPlanes's
// dp1 and dp2 and returns them, for the data planes to be started.
func twoTokens(t testing.TB, o cpOptions) (*controlPlane, dpToken, dpToken) {
	t.Helper()
	tk1 := dpToken{group: "dp1", tags: []string{"dp1"}, token: "token-of-dp1-" + t.Name()}
	tk2 := dpToken{group: "dp2", tags: []string{"dp2"}, token: "token-of-dp2-" + t.Name()}
	return startControlPlane(t, []dpToken{tk1, tk2}, o), tk1, tk2
}
