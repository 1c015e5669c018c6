// Command proxybench measures the gateway's HTTP throughput against peers in
// the same run: a bare net/http/httputil.ReverseProxy and, when installed,
// nginx (plain, and with limit_req keyed on the API key), each in its own
// process in front of the same upstream, driven by wrk in interleaved rounds.
//
//	go run ./cmd/proxybench -rounds 6 -duration 10s
//
// The gateway is cmd/limitplane-gateway built from this checkout, run on
// each engine (net/http, and fasthttp as "limitplane-gateway-fasthttp") with a
// memory store and one API key whose policy (10^9 requests a second and a
// quota of 10^15 a day) is checked on every request and never denies, so
// the numbers are those of a gateway with limiting on. Each -gateway-before
// adds another gateway binary (an older build) to the same rounds, so a change
// is measured against its baseline under the same load. Every process is
// started on loopback and stopped at the end. It prints one line per round
// and proxy, then the median requests/s of each and its ratio to the bare
// Go proxy and to nginx.
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
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const benchKey = "proxybench-key"

func main() {
	role := os.Getenv("PROXYBENCH_ROLE")
	switch role {
	case "upstream":
		serveUpstream(os.Getenv("PROXYBENCH_ADDR"))
		return
	case "bare":
		serveBare(os.Getenv("PROXYBENCH_ADDR"), os.Getenv("PROXYBENCH_TARGET"))
		return
	}
	rounds := flag.Int("rounds", 6, "interleaved rounds")
	duration := flag.Duration("duration", 10*time.Second, "wrk duration of each measurement")
	conns := flag.String("c", "64,256", "wrk connections: a comma-separated list, each measured in every round")
	threads := flag.Int("t", 2, "wrk threads")
	gatewayBin := flag.String("gateway", "", "a built cmd/limitplane-gateway binary (default: built from ../cmd/limitplane-gateway)")
	var before []string
	flag.Func("gateway-before", "another cmd/limitplane-gateway `binary` (an older build) measured in the same rounds, as \"gateway-before\"; repeat it for more (\"gateway-before-2\", ...)", func(s string) error {
		before = append(before, s)
		return nil
	})
	flag.Parse()
	cs, err := parseConns(*conns)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(*rounds, *duration, cs, *threads, *gatewayBin, before); err != nil {
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

type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func start(name string, cmd *exec.Cmd, addr, path string) (*proc, error) {
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, url: "http://" + addr + path}
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

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
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

func run(rounds int, duration time.Duration, conns []int, threads int, gatewayBin string, before []string) error {
	if _, err := exec.LookPath("wrk"); err != nil {
		return errors.New("wrk not found on PATH (Debian: apt-get install wrk)")
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
	if gatewayBin == "" {
		gatewayBin = filepath.Join(dir, "gateway")
		build := exec.Command("go", "build", "-o", gatewayBin, "./cmd/limitplane-gateway")
		build.Dir, build.Stderr = "..", os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build gateway: %w", err)
		}
	}

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "PROXYBENCH_ROLE=upstream", "PROXYBENCH_ADDR="+upAddr)
	up, err := start("upstream", cmd, upAddr, "/")
	if err != nil {
		return err
	}
	procs = append(procs, up)

	var targets []*proc
	bareAddr, _ := freeAddr()
	cmd = exec.Command(self)
	cmd.Env = append(os.Environ(), "PROXYBENCH_ROLE=bare", "PROXYBENCH_ADDR="+bareAddr, "PROXYBENCH_TARGET=http://"+upAddr)
	bare, err := start("bare-httputil", cmd, bareAddr, "/bench")
	if err != nil {
		return err
	}
	procs, targets = append(procs, bare), append(targets, bare)

	// Both gateways get the same file; -listen gives each its address.
	cfg := filepath.Join(dir, "gateway.yaml")
	yaml := fmt.Sprintf(`store: memory
policies:
  - id: bench
    rate: {requests: 1000000000, per: 1s}
    quota: {max: 1000000000000000, renewal: 24h}
keys:
  - key: %s
    policies: [bench]
apis:
  - id: bench
    listen_path: /bench/
    target: http://%s
    auth: api_key
`, benchKey, upAddr)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return err
	}
	gateways := [][2]string{{"limitplane-gateway", gatewayBin}}
	for i, b := range before {
		name := "gateway-before"
		if i > 0 {
			name += fmt.Sprintf("-%d", i+1)
		}
		gateways = append(gateways, [2]string{name, b})
	}
	// The same file on the fasthttp engine, for this checkout's gateway
	// (older builds may not know server.engine).
	cfgFast := filepath.Join(dir, "gateway-fasthttp.yaml")
	if err := os.WriteFile(cfgFast, []byte(yaml+"server: {engine: fasthttp}\n"), 0o600); err != nil {
		return err
	}
	type gatewayRun struct{ name, bin, cfg string }
	runs := []gatewayRun{{gateways[0][0], gateways[0][1], cfg}, {"limitplane-gateway-fasthttp", gatewayBin, cfgFast}}
	for _, g := range gateways[1:] {
		runs = append(runs, gatewayRun{g[0], g[1], cfg})
	}
	for _, g := range runs {
		gwAddr, _ := freeAddr()
		gw, err := start(g.name, exec.Command(g.bin, "-config", g.cfg, "-listen", gwAddr), gwAddr, "/bench/")
		if err != nil {
			return err
		}
		procs, targets = append(procs, gw), append(targets, gw)
	}

	if ng, err := exec.LookPath("nginx"); err == nil {
		// One nginx serves two listeners: plain, and with limit_req keyed
		// on the API key at a rate nobody reaches (the peer the gateway,
		// which checks a limit on every request, is measured against).
		ngAddr, _ := freeAddr()
		ngLimAddr, _ := freeAddr()
		conf := filepath.Join(dir, "nginx.conf")
		os.WriteFile(conf, []byte(fmt.Sprintf(`daemon off;
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
`, dir, upAddr, ngAddr, ngLimAddr)), 0o600)
		n, err := start("nginx", exec.Command(ng, "-c", conf, "-p", dir), ngAddr, "/bench")
		if err != nil {
			return err
		}
		// The second listener is the same process: stopped with it.
		lim := &proc{name: "nginx+limit_req", cmd: &exec.Cmd{}, url: "http://" + ngLimAddr + "/bench"}
		procs, targets = append(procs, n), append(targets, n, lim)
	}

	for _, t := range targets {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", t.url, nil)
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
	for r := 1; r <= rounds; r++ {
		for _, c := range conns {
			for _, t := range targets {
				m, err := wrk(t.url, duration, c, threads)
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
	for _, c := range conns {
		fmt.Printf("\nconnections=%d\n", c)
		lim, hasLim := series{c, "nginx+limit_req"}, rps[series{c, "nginx+limit_req"}] != nil
		ng, hasNg := series{c, "nginx"}, rps[series{c, "nginx"}] != nil
		bare := series{c, "bare-httputil"}
		for _, t := range targets {
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
func wrk(u string, d time.Duration, conns, threads int) (measurement, error) {
	cmd := exec.Command("wrk", "--latency", "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns), "-d"+d.String(),
		"-H", "X-API-Key: "+benchKey, u)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return measurement{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
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
	if m.rps, err = strconv.ParseFloat(string(r[1]), 64); err != nil {
		return measurement{}, fmt.Errorf("wrk requests/s: %w", err)
	}
	// wrk writes latencies as Go does durations: 812.00us, 1.20ms, 2.01s.
	if m.p99, err = time.ParseDuration(string(p[1])); err != nil {
		return measurement{}, fmt.Errorf("wrk p99: %w", err)
	}
	return m, nil
}
