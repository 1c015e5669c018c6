// Command multidataplane starts a whole limitplane deployment on the
// loopback with one command: a control plane and three data planes, each
// with its own redis-server, all as child processes. Two data planes are
// two gateways each; the third, "services", is two replicas of a Gin
// service and two of a gRPC service (examples/service), each following
// the control plane through dataplane.Follow. It loads a demo policy, key
// and API, and the services' API (service-side: no listen path, no
// target), policy and keys, through the control plane's admin API, waits
// until the four gateways and the four services run them, and prints
// what to try: a request through each gateway and each HTTP service, the
// quota that each data plane counts on its own, a quota shared by the
// replicas of one service, a quota reset that reaches every gateway, and
// the list of connected data planes.
//
//	go run ./examples/multidataplane
//
// It builds ./cmd/limitplane-controlplane, ./cmd/limitplane-gateway and
// ./examples/service with the go command into a temporary directory (so
// run it from inside the repository), and needs redis-server on PATH (or
// named by REDIS_SERVER). Every port is a free loopback port. The
// children's logs go to stderr, each line prefixed with the child's name.
//
// A child that exits after start-up (a gateway killed with kill -9, a
// redis-server stopped, the control plane crashed) is reported on stdout
// ("dp1-gw1 exited (signal: killed); 10 others keep running") and the
// others keep running, so the deployment's resilience can be tried by
// hand; once every child has exited the program exits 1.
//
// Ctrl-C (SIGINT) or SIGTERM stops everything: the services and the
// gateways first, then the control plane, then the redis-servers (each
// with SIGTERM, killed if it has not exited within 10 s), removes the
// temporary directory and exits 0. The children run in their own process
// group, so a terminal's Ctrl-C reaches only this program, which stops
// them in that order; and each child is killed by the kernel if this
// program dies without stopping it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/identity"
)

// stopTimeout bounds how long a child may take to exit after SIGTERM.
const stopTimeout = 10 * time.Second

// startTimeout bounds how long a child may take to start (print its
// banner, answer PING) and the gateways to apply the demo.
const startTimeout = 30 * time.Second

// The demo configuration.
const (
	demoKey    = "demo-key"
	demoPolicy = "demo"
	demoQuota  = 20
)

// The services data plane's configuration: the service-side API its
// services enforce (no listen path, no target: gateways do not route
// it), a policy with a small quota on it, and one key for each service,
// so that each service's quota is counted apart.
const (
	servicesGroup = "services"
	ordersAPI     = "orders"
	ordersPolicy  = "orders"
	ordersQuota   = 10
	ginKey        = "orders-gin-key"
	grpcKey       = "orders-grpc-key"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Stderr)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil // Ctrl-C during start-up: everything started is stopped
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "multidataplane:", err)
		os.Exit(1)
	}
}

// child is one process started by run.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *banner
	done chan struct{}
	err  error
}

// banner collects a child's stdout, to find the lines it announces.
type banner struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *banner) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *banner) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// prefixWriter writes each line to w with a prefix.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	rest   []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rest = append(p.rest, b...)
	for {
		i := bytes.IndexByte(p.rest, '\n')
		if i < 0 {
			return len(b), nil
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.rest[:i])
		p.rest = p.rest[i+1:]
	}
}

// deployment is everything run started, in start order.
type deployment struct {
	children []*child
	logMu    sync.Mutex
	stderr   io.Writer
}

// start runs path with args and env, its stdout collected and its stderr
// copied to d.stderr with the name as prefix.
func (d *deployment) start(name, path string, args, env []string) (*child, error) {
	c := &child{name: name, out: &banner{}, done: make(chan struct{})}
	c.cmd = exec.Command(path, args...)
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout = c.out
	c.cmd.Stderr = &prefixWriter{mu: &d.logMu, w: d.stderr, prefix: fmt.Sprintf("[%s] ", name)}
	// Its own process group: a terminal's Ctrl-C reaches this program
	// only, which stops the children in order. Pdeathsig: the kernel
	// kills the child if this program dies first.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	d.children = append(d.children, c)
	return c, nil
}

// wait waits until the child's stdout matches re and returns the
// submatches, or until ctx is done.
func (c *child) wait(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	deadline := time.Now().Add(startTimeout)
	for {
		if m := re.FindStringSubmatch(c.out.String()); m != nil {
			return m, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("%s exited (%v) during start-up", c.name, c.err)
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not start within %v", c.name, startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops the children in reverse start order (services, gateways,
// control plane, redis-servers): SIGTERM, then SIGKILL after stopTimeout.
func (d *deployment) stop() {
	for i := len(d.children) - 1; i >= 0; i-- {
		c := d.children[i]
		select {
		case <-c.done:
			continue
		default:
		}
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(stopTimeout):
			c.cmd.Process.Kill()
			<-c.done
		}
	}
}

// exited returns a channel that receives each child as it exits.
func (d *deployment) exited() <-chan *child {
	ch := make(chan *child, len(d.children))
	for _, c := range d.children {
		go func() { <-c.done; ch <- c }()
	}
	return ch
}

// gatewayInfo is one running gateway.
type gatewayInfo struct {
	id, group   string
	base, admin string
}

// serviceInfo is one running service replica (examples/service): addr
// is its HTTP base URL or its gRPC address, ops the base URL of its
// /readyz and /metrics.
type serviceInfo struct {
	id, framework string
	addr, ops     string
}

// dataPlaneInfo is one data plane: gateways, or services.
type dataPlaneInfo struct {
	group, redis string
	gateways     []*gatewayInfo
	services     []*serviceInfo
}

var (
	cpListenRE  = regexp.MustCompile(`admin API listening on (http://\S+)`)
	cpSyncRE    = regexp.MustCompile(`sync listening on (\S+) `)
	gwListenRE  = regexp.MustCompile(`limitplane gateway listening on (http://\S+) `)
	gwAdminRE   = regexp.MustCompile(`admin endpoint at (http://\S+) `)
	svcListenRE = regexp.MustCompile(`(?m)^listening on (\S+)`)
	svcOpsRE    = regexp.MustCompile(`(?m)^ops on (\S+)`)
)

// gatewayYAML is a data-plane gateway's file: its counters in its data
// plane's Redis, the operations endpoint on a free port, and its
// policies, keys and APIs from the control plane.
const gatewayYAML = `# written by examples/multidataplane
listen: 127.0.0.1:0
store: redis://%s/0
response:
  x_ratelimit: true
admin:
  listen: 127.0.0.1:0
control_plane:
  address: %s
  token_env: LP_DP_TOKEN
  group: %s
  tags: [%s]
  gateway_id: %s
`

// tempPrefix names a run's temporary directory in os.TempDir().
const tempPrefix = "limitplane-multidataplane-"

// sweepStale removes the temporary directories under tmp of earlier runs
// whose process is gone (killed with SIGKILL: nothing ran their cleanup),
// as their pid file tells; a directory without one, or whose process
// still runs, is left alone.
func sweepStale(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// run starts the deployment, prints what to try and waits for ctx.
func run(ctx context.Context, stdout, stderr io.Writer) error {
	redisServer := os.Getenv("REDIS_SERVER")
	if redisServer == "" {
		p, err := exec.LookPath("redis-server")
		if err != nil {
			return errors.New("redis-server not found on PATH: install Redis (apt install redis-server, brew install redis) or set REDIS_SERVER to its path")
		}
		redisServer = p
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return errors.New("the go command is not on PATH: it builds the control plane and the gateway")
	}
	sweepStale(os.TempDir())
	dir, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The owner's pid, for sweepStale: a run killed with SIGKILL leaves
	// its directory (the binaries and databases, about 120 MB) behind.
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	d := &deployment{stderr: stderr}
	defer d.stop()

	fmt.Fprintln(stdout, "building the control plane, the gateway and the service ...")
	bins := map[string]string{}
	for prog, pkg := range map[string]string{
		"controlplane": "cmd/limitplane-controlplane",
		"gateway":      "cmd/limitplane-gateway",
		"service":      "examples/service",
	} {
		bins[prog] = filepath.Join(dir, prog)
		cmd := exec.CommandContext(ctx, goCmd, "build", "-o", bins[prog], "github.com/limitplane/limitplane/"+pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("go build ./%s (run this from inside the limitplane repository): %v\n%s", pkg, err, out)
		}
	}

	adminToken, err := secret()
	if err != nil {
		return err
	}
	planes := []*dataPlaneInfo{{group: "dp1"}, {group: "dp2"}}
	services := &dataPlaneInfo{group: servicesGroup}
	all := append(append([]*dataPlaneInfo(nil), planes...), services)
	tokens := map[string]string{}
	var dpFile strings.Builder
	for _, dp := range all {
		if tokens[dp.group], err = secret(); err != nil {
			return err
		}
		fmt.Fprintf(&dpFile, "- group: %s\n  tags: [%s]\n  token_hash: %q\n", dp.group, dp.group, controlplane.HashToken(tokens[dp.group]))
	}
	dpPath := filepath.Join(dir, "dataplanes.yaml")
	if err := os.WriteFile(dpPath, []byte(dpFile.String()), 0o600); err != nil {
		return err
	}

	// One redis-server per data plane.
	for _, dp := range all {
		rdir := filepath.Join(dir, "redis-"+dp.group)
		if err := os.Mkdir(rdir, 0o700); err != nil {
			return err
		}
		// A port found free can be taken by another program's
		// redis-server before this one binds it: then this one exits,
		// the other answers, and the demo would share it. So the
		// server that answers must be this one; if not, another port.
		for attempt := 1; ; attempt++ {
			addr, err := freeAddr()
			if err != nil {
				return err
			}
			_, port, _ := net.SplitHostPort(addr)
			c, err := d.start("redis-"+dp.group, redisServer, []string{"--port", port, "--bind", "127.0.0.1", "--dir", rdir,
				"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"}, nil)
			if err != nil {
				return err
			}
			err = waitRedis(ctx, addr, c)
			if errors.Is(err, errOtherRedis) && attempt < 3 {
				continue
			}
			if err != nil {
				return err
			}
			dp.redis = addr
			break
		}
	}

	// The control plane.
	adminAddr, err := freeAddr()
	if err != nil {
		return err
	}
	syncAddr, err := freeAddr()
	if err != nil {
		return err
	}
	cp, err := d.start("controlplane", bins["controlplane"], []string{"-admin-listen", adminAddr, "-sync-listen", syncAddr,
		"-data", filepath.Join(dir, "controlplane.db"), "-dataplanes", dpPath}, []string{"LP_CP_ADMIN_TOKEN=" + adminToken})
	if err != nil {
		return err
	}
	m, err := cp.wait(ctx, cpListenRE)
	if err != nil {
		return err
	}
	cpBase := m[1]
	if _, err := cp.wait(ctx, cpSyncRE); err != nil {
		return err
	}

	// Two gateways per data plane.
	for _, dp := range planes {
		for i := 1; i <= 2; i++ {
			gw := &gatewayInfo{id: fmt.Sprintf("%s-gw%d", dp.group, i), group: dp.group}
			file := filepath.Join(dir, gw.id+".yaml")
			yaml := fmt.Sprintf(gatewayYAML, dp.redis, syncAddr, dp.group, dp.group, gw.id)
			if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
				return err
			}
			c, err := d.start(gw.id, bins["gateway"], []string{"-config", file}, []string{"LP_DP_TOKEN=" + tokens[dp.group]})
			if err != nil {
				return err
			}
			if _, err := c.wait(ctx, gwAdminRE); err != nil {
				return err
			}
			gw.base = gwListenRE.FindStringSubmatch(c.out.String())[1]
			gw.admin = gwAdminRE.FindStringSubmatch(c.out.String())[1]
			dp.gateways = append(dp.gateways, gw)
		}
	}

	// Two replicas of a Gin service and two of a gRPC service, the third
	// data plane: each follows the control plane (dataplane.Follow) and
	// counts in the services' redis-server.
	for _, fw := range []string{"gin", "grpc"} {
		for i := 1; i <= 2; i++ {
			svc := &serviceInfo{id: fmt.Sprintf("%s-%s%d", servicesGroup, fw, i), framework: fw}
			args := []string{"-framework", fw, "-listen", "127.0.0.1:0", "-api", ordersAPI,
				"-control-plane", syncAddr, "-group", servicesGroup, "-id", svc.id, "-redis", "redis://" + services.redis + "/0"}
			if fw == "grpc" {
				args = append(args, "-ops", "127.0.0.1:0")
			}
			c, err := d.start(svc.id, bins["service"], args, []string{"LIMITPLANE_TOKEN=" + tokens[servicesGroup]})
			if err != nil {
				return err
			}
			re := svcListenRE
			if fw == "grpc" {
				re = svcOpsRE
			}
			if _, err := c.wait(ctx, re); err != nil {
				return err
			}
			svc.addr = svcListenRE.FindStringSubmatch(c.out.String())[1]
			if fw == "grpc" {
				svc.ops = "http://" + strings.TrimPrefix(svcOpsRE.FindStringSubmatch(c.out.String())[1], "http://")
			} else {
				svc.addr = "http://" + strings.TrimPrefix(svc.addr, "http://")
				svc.ops = svc.addr
			}
			services.services = append(services.services, svc)
		}
	}

	// The demo configuration, through the admin API.
	admin := &adminClient{base: cpBase, token: adminToken}
	hash := identity.HashKey(demoKey).String()
	rev, err := loadDemo(ctx, admin)
	if err != nil {
		return err
	}
	for _, dp := range planes {
		for _, gw := range dp.gateways {
			if err := waitApplied(ctx, gw.id, gw.admin, rev); err != nil {
				return err
			}
		}
	}
	for _, svc := range services.services {
		if err := waitApplied(ctx, svc.id, svc.ops, rev); err != nil {
			return err
		}
	}
	printTry(stdout, cpBase, adminToken, hash, planes, services)

	// A child that exits (crashed, or killed to try the resilience the
	// README describes) is reported; the others keep running until Ctrl-C.
	exited, running := d.exited(), len(d.children)
	for running > 0 {
		select {
		case <-ctx.Done():
			running = -1
			continue
		case c := <-exited:
			running--
			fmt.Fprintf(stdout, "%s exited (%v); %d others keep running (Ctrl-C stops them)\n", c.name, c.err, running)
		}
	}
	if running == 0 {
		return errors.New("every child process has exited")
	}
	fmt.Fprintln(stdout, "stopping the services, the gateways, the control plane and the redis-servers ...")
	d.stop()
	fmt.Fprintln(stdout, "stopped")
	return nil
}

// secret returns 16 random bytes in hex.
func secret() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// errOtherRedis reports a redis-server other than the child answering at
// the child's address.
var errOtherRedis = errors.New("another redis-server answers at this address")

// waitRedis waits until the redis-server at addr answers, and checks
// that it is c (INFO's process_id): errOtherRedis if another is.
func waitRedis(ctx context.Context, addr string, c *child) error {
	deadline := time.Now().Add(startTimeout)
	for {
		if pid, err := redisPID(addr); err == nil {
			if pid != c.cmd.Process.Pid {
				return fmt.Errorf("%s at %s: %w (pid %d)", c.name, addr, errOtherRedis, pid)
			}
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited (%v) during start-up", c.name, c.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer at %s", c.name, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisPID returns the process_id INFO server reports at addr.
func redisPID(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO server answered %q", head) // loading, say
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

// adminClient calls the control plane's admin API.
type adminClient struct {
	base, token string
}

// call sends method path with body as JSON and returns the answer's
// revision; a status other than 200 or 201 is an error.
func (a *adminClient) call(ctx context.Context, method, path string, body any) (uint64, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("admin API %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("admin API %s %s: %s: %s", method, path, resp.Status, out)
	}
	var w struct {
		Revision uint64 `json:"revision"`
	}
	if err := json.Unmarshal(out, &w); err != nil {
		return 0, fmt.Errorf("admin API %s %s: %w", method, path, err)
	}
	return w.Revision, nil
}

// loadDemo writes the demo policy, API and key, and the services' API,
// policy and keys, and returns the revision.
func loadDemo(ctx context.Context, a *adminClient) (uint64, error) {
	if _, err := a.call(ctx, "PUT", "/api/policies/"+demoPolicy, map[string]any{
		"rate":  map[string]any{"requests": 10, "per": "1s"},
		"quota": map[string]any{"max": demoQuota, "renewal": "24h"},
	}); err != nil {
		return 0, err
	}
	if _, err := a.call(ctx, "PUT", "/api/apis/echo", map[string]any{"listen_path": "/echo/", "target": "builtin:echo"}); err != nil {
		return 0, err
	}
	// A service-side API: neither listen_path nor target. It goes to
	// every data plane, as echo does; gateways do not route it.
	if _, err := a.call(ctx, "PUT", "/api/apis/"+ordersAPI, map[string]any{}); err != nil {
		return 0, err
	}
	if _, err := a.call(ctx, "PUT", "/api/policies/"+ordersPolicy, map[string]any{
		"rate":  map[string]any{"requests": 100, "per": "1s"},
		"quota": map[string]any{"max": ordersQuota, "renewal": "24h"},
		"apis":  []string{ordersAPI},
	}); err != nil {
		return 0, err
	}
	for _, k := range []string{ginKey, grpcKey} {
		if _, err := a.call(ctx, "POST", "/api/keys", map[string]any{"key": k, "policies": []string{ordersPolicy}}); err != nil {
			return 0, err
		}
	}
	return a.call(ctx, "POST", "/api/keys", map[string]any{"key": demoKey, "policies": []string{demoPolicy}})
}

// waitApplied waits until the /readyz under base (a gateway's operations
// endpoint, a service's) reports revision rev applied, whatever its
// status.
func waitApplied(ctx context.Context, name, base string, rev uint64) error {
	deadline := time.Now().Add(startTimeout)
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			var r struct {
				ControlPlane struct {
					AppliedRevision uint64 `json:"applied_revision"`
				} `json:"control_plane"`
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			if json.Unmarshal(b, &r) == nil && r.ControlPlane.AppliedRevision >= rev {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not apply revision %d within %v; /readyz: %s", name, rev, startTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// printTry prints the deployment and what to try, in one write.
func printTry(out io.Writer, cpBase, token, hash string, planes []*dataPlaneInfo, services *dataPlaneInfo) {
	w := new(strings.Builder)
	defer func() { io.WriteString(out, w.String()) }()
	fmt.Fprintf(w, "limitplane multi-data-plane demo running\n")
	fmt.Fprintf(w, "  control plane: admin API %s (token %s)\n", cpBase, token)
	for _, dp := range planes {
		fmt.Fprintf(w, "  data plane %s: redis-server %s\n", dp.group, dp.redis)
		for _, gw := range dp.gateways {
			fmt.Fprintf(w, "    gateway %s: %s (operations endpoint %s)\n", gw.id, gw.base, gw.admin)
		}
	}
	fmt.Fprintf(w, "  data plane %s: redis-server %s\n", services.group, services.redis)
	for _, svc := range services.services {
		if svc.framework == "grpc" {
			fmt.Fprintf(w, "    service %s: grpc %s (/readyz and /metrics on %s)\n", svc.id, svc.addr, svc.ops)
		} else {
			fmt.Fprintf(w, "    service %s: %s %s (/readyz and /metrics there)\n", svc.id, svc.framework, svc.addr)
		}
	}
	auth := "-H 'Authorization: Bearer " + token + "'"
	fmt.Fprintf(w, "\nDemo: key %q with policy %q (10 requests a second, a quota of %d a day) on API echo (/echo/).\n", demoKey, demoPolicy, demoQuota)
	fmt.Fprintf(w, "\nTry it:\n")
	fmt.Fprintf(w, "  # one request through each gateway:\n")
	for _, dp := range planes {
		for _, gw := range dp.gateways {
			fmt.Fprintf(w, "  curl -i -H 'X-API-Key: %s' %s/echo/hello\n", demoKey, gw.base)
		}
	}
	g1, g2 := planes[0].gateways, planes[1].gateways
	fmt.Fprintf(w, "\n  # each data plane counts the quota in its own Redis: spend it on %s (its two gateways share it) ...\n", planes[0].group)
	fmt.Fprintf(w, "  for i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code} ' -H 'X-API-Key: %s' %s/echo/; sleep 0.1; done; echo\n", demoQuota+2, demoKey, g1[0].base)
	fmt.Fprintf(w, "  curl -s -o /dev/null -w '%%{http_code}\\n' -H 'X-API-Key: %s' %s/echo/   # 429: %s's quota is spent\n", demoKey, g1[1].base, planes[0].group)
	fmt.Fprintf(w, "  curl -s -o /dev/null -w '%%{http_code}\\n' -H 'X-API-Key: %s' %s/echo/   # 200: %s counts on its own\n", demoKey, g2[0].base, planes[1].group)
	fmt.Fprintf(w, "\n  # reset the key's quota on the control plane, and watch it reach all four gateways:\n")
	fmt.Fprintf(w, "  curl -s -X POST %s %s/api/keys/%s/reset-quota\n", auth, cpBase, hash)
	for _, dp := range planes {
		for _, gw := range dp.gateways {
			fmt.Fprintf(w, "  curl -s %s/readyz          # control_plane.applied_revision\n", gw.admin)
		}
	}
	fmt.Fprintf(w, "  curl -s %s/consumers/%s?api=echo   # quota.remaining is %d again\n", g1[1].admin, hash, demoQuota)
	var gins, grpcs []*serviceInfo
	for _, svc := range services.services {
		if svc.framework == "grpc" {
			grpcs = append(grpcs, svc)
		} else {
			gins = append(gins, svc)
		}
	}
	fmt.Fprintf(w, "\n  # the services data plane: Gin and gRPC services following the control plane (API %q,\n", ordersAPI)
	fmt.Fprintf(w, "  # service-side: no listen path). The demo key passes there too; key %q has policy %q,\n", ginKey, ordersPolicy)
	fmt.Fprintf(w, "  # a quota of %d a day, counted in the services' Redis and shared by both Gin replicas:\n", ordersQuota)
	for _, svc := range gins {
		fmt.Fprintf(w, "  curl -i -H 'X-API-Key: %s' %s/orders\n", demoKey, svc.addr)
	}
	fmt.Fprintf(w, "  for i in $(seq %d); do for s in %s %s; do curl -s -o /dev/null -w '%%{http_code} ' -H 'X-API-Key: %s' $s/orders; done; done; echo   # 10 x 200, then 429\n", ordersQuota/2+1, gins[0].addr, gins[1].addr, ginKey)
	fmt.Fprintf(w, "  # the gRPC replicas serve the gRPC health service under the same API; key %q has a quota of %d\n", grpcKey, ordersQuota)
	fmt.Fprintf(w, "  # of its own, shared by both (examples/grpc's client sends the key as x-api-key metadata):\n")
	fmt.Fprintf(w, "  go run ./examples/grpc -client -addr %s -key %s -n 6   # 6 x OK\n", grpcs[0].addr, grpcKey)
	fmt.Fprintf(w, "  go run ./examples/grpc -client -addr %s -key %s -n 6   # 4 x OK, then ResourceExhausted\n", grpcs[1].addr, grpcKey)
	fmt.Fprintf(w, "\n  # the connected gateways and services, their applied revisions and any rejection:\n")
	fmt.Fprintf(w, "  curl -s %s %s/api/dataplanes\n", auth, cpBase)
	fmt.Fprintf(w, "\nCtrl-C stops everything.\n")
}
