// Command proxybench measures the gateway's requests/s and p99 latency
// against peers in one run. Each row below is its own process on loopback
// in front of the same upstream (1 KiB answers), driven by wrk --latency in
// interleaved rounds: every round measures every row at every connection
// count of -c.
//
//   - upstream-direct: wrk straight at the upstream, no proxy.
//   - bare-httputil: a bare net/http/httputil.ReverseProxy.
//   - bare-fasthttp: a bare fasthttp.Server in front of a fasthttp.HostClient,
//     the fasthttp engine's floor.
//   - gateway-nethttp-memory, gateway-fasthttp-memory: cmd/limitplane-gateway
//     built from this checkout, on each server.engine, with the memory store.
//   - gateway-nethttp-redis, gateway-fasthttp-redis: the same on the Redis
//     store, a redis-server from PATH that proxybench starts on a free
//     loopback port without persistence, with failure_policy: closed (a
//     request Redis did not decide is a 503, which fails the run).
//     -redis=false leaves these rows out.
//   - gateway-before, gateway-before-2, ...: each -gateway-before binary (an
//     older build, on net/http with the memory store), so a change is
//     measured against its baseline under the same load.
//   - nginx, nginx+limit_req: when nginx is on PATH, one nginx with two
//     listeners, plain and with limit_req keyed on the API key at a rate
//     nobody reaches.
//
// Every gateway has limiting on: one API key whose policy (10^9 requests a
// second and a quota of 10^15 a day) is checked on every request and never
// denies.
//
//	go run ./cmd/proxybench -rounds 6 -duration 10s -c 64,256
//
// It prints one line per round, connection count and row, then for each
// connection count each row's median requests/s with its ratio to the bare
// proxy, to nginx+limit_req and to nginx, and its median p99 latency with
// its ratio to nginx+limit_req's. Every process it starts is stopped at the
// end, also on an error, an interrupt or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

const benchKey = "proxybench-key"

// options are proxybench's flags.
type options struct {
	rounds   int
	duration time.Duration
	conns    []int
	threads  int
	gateway  string   // a built gateway, or "" to build one
	before   []string // older gateway builds
	redis    bool     // also the rows on the Redis store
}

func main() {
	switch os.Getenv("PROXYBENCH_ROLE") {
	case "upstream":
		serveUpstream(os.Getenv("PROXYBENCH_ADDR"))
		return
	case "bare":
		serveBare(os.Getenv("PROXYBENCH_ADDR"), os.Getenv("PROXYBENCH_TARGET"))
		return
	case "bare-fasthttp":
		serveBareFast(os.Getenv("PROXYBENCH_ADDR"), os.Getenv("PROXYBENCH_TARGET"))
		return
	}
	var o options
	flag.IntVar(&o.rounds, "rounds", 6, "interleaved rounds")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "wrk duration of each measurement")
	conns := flag.String("c", "64,256", "wrk connections: a comma-separated list, each measured in every round")
	flag.IntVar(&o.threads, "t", 2, "wrk threads")
	flag.StringVar(&o.gateway, "gateway", "", "a built cmd/limitplane-gateway binary (default: built from ../cmd/limitplane-gateway)")
	flag.Func("gateway-before", "another cmd/limitplane-gateway `binary` (an older build) measured in the same rounds, as \"gateway-before\"; repeat it for more (\"gateway-before-2\", ...)", func(s string) error {
		o.before = append(o.before, s)
		return nil
	})
	flag.BoolVar(&o.redis, "redis", true, "also measure the gateway on the Redis store (needs redis-server on PATH)")
	flag.Parse()
	var err error
	if o.conns, err = parseConns(*conns); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, o)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// parseConns parses -c: connection counts separated by commas.
func parseConns(s string) ([]int, error) {
	var cs []int
	for f := range strings.SplitSeq(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return nil, fmt.Errorf("-c: %q is not a connection count", f)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// serveUpstream answers every request with the same 1 KiB body.
func serveUpstream(addr string) {
	body := []byte(strings.Repeat("x", 1023) + "\n")
	log.Fatal(http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	})))
}

// serveBare is the peer: httputil.ReverseProxy with the transport settings
// the gateway uses, nothing else.
func serveBare(addr, target string) {
	u, err := url.Parse(target)
	if err != nil {
		log.Fatal(err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 256
	p := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport: t,
		// wrk closes its connections mid-request when a run ends.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	log.Fatal(http.ListenAndServe(addr, p))
}

// serveBareFast is the fasthttp engine's floor: a fasthttp.Server handing
// each request to a fasthttp.HostClient with the gateway's client and
// server settings, and only what every proxy must do (the Connection field
// dropped both ways, X-Forwarded-For set); no routing, no limiting, no
// framing checks.
func serveBareFast(addr, target string) {
	c := &fasthttp.HostClient{
		Addr:                     target,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxConns:                 1 << 20,
		MaxIdleConnDuration:      90 * time.Second,
		ReadBufferSize:           64 << 10,
	}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			req := &ctx.Request
			req.Header.Del("Connection")
			req.Header.Set("X-Forwarded-For", ctx.RemoteIP().String())
			if err := c.Do(req, &ctx.Response); err != nil {
				ctx.Error("upstream unavailable", fasthttp.StatusBadGateway)
				return
			}
			ctx.Response.Header.Del("Connection")
		},
		ReadBufferSize:        68 << 10,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
	}
	log.Fatal(s.ListenAndServe(addr))
}

// A proc is a process proxybench started, in a process group of its own.
type proc struct{ cmd *exec.Cmd }

// freeAddr returns a loopback address whose port nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start starts cmd and waits until something listens on addr; a process
// that does not within 15s is stopped.
func start(name string, cmd *exec.Cmd, addr string) (*proc, error) {
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{cmd}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("%s: not listening on %s after 15s", name, addr)
}

// stop ends p's process group: SIGTERM, then SIGKILL after 5s.
func (p *proc) stop() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// A row is what one wrk run measures: a URL, reported under a name.
type row struct{ name, url string }

// gatewayFile is the gateways' file after their store (and engine): %[1]s
// is the API key, %[2]s the upstream's address.
const gatewayFile = `policies:
  - id: bench
    rate: {requests: 1000000000, per: 1s}
    quota: {max: 1000000000000000, renewal: 24h}
keys:
  - key: %[1]s
    policies: [bench]
apis:
  - id: bench
    listen_path: /bench/
    target: http://%[2]s
    auth: api_key
`

// nginxConf is nginx's file: %[1]s is its directory, %[2]s the upstream's
// address, %[3]s the plain listener's and %[4]s the limit_req listener's.
const nginxConf = `daemon off;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream up { server %[2]s; keepalive 256; }
  limit_req_zone $http_x_api_key zone=bykey:10m rate=1000000000r/s;
  server {
    listen %[3]s;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $remote_addr;
    }
  }
  server {
    listen %[4]s;
    location / {
      limit_req zone=bykey burst=1000000 nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $remote_addr;
    }
  }
}
`

func run(ctx context.Context, o options) error {
	if _, err := exec.LookPath("wrk"); err != nil {
		return errors.New("wrk not found on PATH (Debian: apt-get install wrk)")
	}
	var redisServer string
	if o.redis {
		var err error
		if redisServer, err = exec.LookPath("redis-server"); err != nil {
			return errors.New("redis-server not found on PATH (Debian: apt-get install redis-server); -redis=false leaves the Redis rows out")
		}
	}
	dir, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if o.gateway == "" {
		o.gateway = filepath.Join(dir, "gateway")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.gateway, "./cmd/limitplane-gateway")
		build.Dir, build.Stderr = "..", os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build gateway: %w", err)
		}
	}

	// Stopped in the reverse order of their start: the gateways before
	// Redis, every proxy before the upstream.
	var procs []*proc
	defer func() {
		for _, p := range slices.Backward(procs) {
			p.stop()
		}
	}()
	// launch starts the process command gives for a free loopback address
	// and returns that address once the process listens on it.
	launch := func(name string, command func(addr string) (*exec.Cmd, error)) (string, error) {
		addr, err := freeAddr()
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		cmd, err := command(addr)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		p, err := start(name, cmd, addr)
		if err != nil {
			return "", err
		}
		procs = append(procs, p)
		return addr, nil
	}
	// role is the command that runs this program as the upstream or the
	// bare proxy.
	role := func(env ...string) func(string) (*exec.Cmd, error) {
		return func(addr string) (*exec.Cmd, error) {
			cmd := exec.Command(self)
			cmd.Env = append(append(os.Environ(), env...), "PROXYBENCH_ADDR="+addr)
			return cmd, nil
		}
	}

	upAddr, err := launch("upstream", role("PROXYBENCH_ROLE=upstream"))
	if err != nil {
		return err
	}
	rows := []row{{"upstream-direct", "http://" + upAddr + "/bench"}}
	bareAddr, err := launch("bare-httputil", role("PROXYBENCH_ROLE=bare", "PROXYBENCH_TARGET=http://"+upAddr))
	if err != nil {
		return err
	}
	rows = append(rows, row{"bare-httputil", "http://" + bareAddr + "/bench"})
	bareFastAddr, err := launch("bare-fasthttp", role("PROXYBENCH_ROLE=bare-fasthttp", "PROXYBENCH_TARGET="+upAddr))
	if err != nil {
		return err
	}
	rows = append(rows, row{"bare-fasthttp", "http://" + bareFastAddr + "/bench"})

	// This checkout's gateway on each engine and store; the older builds on
	// net/http and memory (they may not know server.engine).
	stores := [][2]string{{"memory", "store: memory\n"}}
	if o.redis {
		redisAddr, err := launch("redis-server", func(addr string) (*exec.Cmd, error) {
			host, port, _ := net.SplitHostPort(addr)
			return exec.Command(redisServer, "--bind", host, "--port", port, "--save", "", "--appendonly", "no", "--dir", dir), nil
		})
		if err != nil {
			return err
		}
		stores = append(stores, [2]string{"redis", "store: redis://" + redisAddr + "/0\nfailure_policy: closed\n"})
	}
	file := fmt.Sprintf(gatewayFile, benchKey, upAddr)
	type gateway struct{ name, bin, file string }
	var gateways []gateway
	for _, engine := range []string{"nethttp", "fasthttp"} {
		for _, st := range stores {
			f := st[1] + file
			if engine == "fasthttp" {
				f += "server: {engine: fasthttp}\n"
			}
			gateways = append(gateways, gateway{"gateway-" + engine + "-" + st[0], o.gateway, f})
		}
	}
	for i, bin := range o.before {
		name := "gateway-before"
		if i > 0 {
			name += fmt.Sprintf("-%d", i+1)
		}
		gateways = append(gateways, gateway{name, bin, "store: memory\n" + file})
	}
	for _, g := range gateways {
		addr, err := launch(g.name, func(addr string) (*exec.Cmd, error) {
			f := filepath.Join(dir, g.name+".yaml")
			if err := os.WriteFile(f, []byte(g.file), 0o600); err != nil {
				return nil, err
			}
			return exec.Command(g.bin, "-config", f, "-listen", addr), nil
		})
		if err != nil {
			return err
		}
		rows = append(rows, row{g.name, "http://" + addr + "/bench/"})
	}

	if ng, err := exec.LookPath("nginx"); err != nil {
		log.Print("nginx not found on PATH (Debian: apt-get install nginx): no nginx rows")
	} else {
		limAddr, err := freeAddr()
		if err != nil {
			return err
		}
		ngAddr, err := launch("nginx", func(addr string) (*exec.Cmd, error) {
			conf := filepath.Join(dir, "nginx.conf")
			if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, upAddr, addr, limAddr), 0o600); err != nil {
				return nil, err
			}
			return exec.Command(ng, "-c", conf, "-p", dir), nil
		})
		if err != nil {
			return err
		}
		rows = append(rows, row{"nginx", "http://" + ngAddr + "/bench"}, row{"nginx+limit_req", "http://" + limAddr + "/bench"})
	}

	for _, t := range rows {
		req, err := http.NewRequestWithContext(ctx, "GET", t.url, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		req.Header.Set("X-API-Key", benchKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s answered %d", t.name, resp.StatusCode)
		}
	}

	// For each connection count and row, one sample a round.
	type series struct {
		c    int
		name string
	}
	rps, p99 := map[series][]float64{}, map[series][]float64{}
	for r := 1; r <= o.rounds; r++ {
		for _, c := range o.conns {
			for _, t := range rows {
				m, err := wrk(ctx, t.url, o.duration, c, o.threads)
				if err != nil {
					return fmt.Errorf("%s at %d connections: %w", t.name, c, err)
				}
				k := series{c, t.name}
				rps[k] = append(rps[k], m.rps)
				p99[k] = append(p99[k], ms(m.p99))
				fmt.Printf("round=%d c=%d proxy=%s req_per_s=%.0f p99_ms=%.3f\n", r, c, t.name, m.rps, ms(m.p99))
			}
		}
	}
	for _, c := range o.conns {
		fmt.Printf("\nconnections=%d\n", c)
		lim, ng, bare := series{c, "nginx+limit_req"}, series{c, "nginx"}, series{c, "bare-httputil"}
		_, hasLim := rps[lim]
		_, hasNg := rps[ng]
		for _, t := range rows {
			k := series{c, t.name}
			line := fmt.Sprintf("c=%d proxy=%s median_req_per_s=%.0f vs_bare=%.2f", c, t.name, median(rps[k]), median(rps[k])/median(rps[bare]))
			if hasLim {
				line += fmt.Sprintf(" vs_nginx_limit_req=%.2f", median(rps[k])/median(rps[lim]))
			}
			if hasNg {
				line += fmt.Sprintf(" vs_nginx=%.2f", median(rps[k])/median(rps[ng]))
			}
			line += fmt.Sprintf(" median_p99_ms=%.3f", median(p99[k]))
			if hasLim {
				line += fmt.Sprintf(" p99_vs_nginx_limit_req=%.2f", median(p99[k])/median(p99[lim]))
			}
			fmt.Println(line)
		}
	}
	return nil
}

// median returns the median of v, sorting v.
func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var (
	rpsRe  = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	p99Re  = regexp.MustCompile(`(?m)^\s+99%\s+([0-9.]+(?:us|ms|s|m|h))\s*$`)
	non2xx = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
)

// A measurement is what one wrk run reports.
type measurement struct {
	rps float64       // requests/s
	p99 time.Duration // 99th percentile latency
}

// wrk runs wrk against url with the bench key and returns what it measured.
// Any non-2xx answer or socket error is an error: a proxy that answers 429
// or 502, or drops connections, is not being measured.
func wrk(ctx context.Context, u string, d time.Duration, conns, threads int) (measurement, error) {
	cmd := exec.CommandContext(ctx, "wrk", "--latency", "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns), "-d"+d.String(),
		"-H", "X-API-Key: "+benchKey, u)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		// An interrupt: wrk was killed, or stopped early on its own SIGINT.
		return measurement{}, ctx.Err()
	}
	if err != nil {
		return measurement{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	return parseWrk(out)
}

// parseWrk reads a measurement from the output of wrk --latency.
func parseWrk(out []byte) (measurement, error) {
	if m := non2xx.FindSubmatch(out); m != nil {
		return measurement{}, fmt.Errorf("wrk saw %s non-2xx answers:\n%s", m[1], out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "Socket errors") {
			return measurement{}, fmt.Errorf("wrk: %s", strings.TrimSpace(line))
		}
	}
	r, p := rpsRe.FindSubmatch(out), p99Re.FindSubmatch(out)
	if r == nil || p == nil {
		return measurement{}, fmt.Errorf("no Requests/sec or 99%% latency in wrk output:\n%s", out)
	}
	var m measurement
	var err error
	if m.rps, err = strconv.ParseFloat(string(r[1]), 64); err != nil {
		return measurement{}, fmt.Errorf("wrk requests/s: %w", err)
	}
	// wrk writes latencies as Go does durations: 812.00us, 1.20ms, 2.01s.
	if m.p99, err = time.ParseDuration(string(p[1])); err != nil {
		return measurement{}, fmt.Errorf("wrk p99: %w", err)
	}
	return m, nil
}
