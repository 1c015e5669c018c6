// Command gatewayrss measures the resident memory a gateway process holds
// per live key of its in-process store: it starts a built gateway binary
// (cmd/limitplane-gateway; built from this checkout when -gateway is not
// given) with a keyless API whose consumers are client IPs
// taken from X-Forwarded-For (the measuring client is a trusted proxy),
// sends one request from each of -keys distinct IPv4 addresses, and
// reports the growth of the process's VmRSS (/proc/PID/status) over its
// RSS before the first of them, divided by the number of keys. The policy
// allows 10 requests an hour, so one request keeps its key limited (and
// unsweepable) for 6 minutes (T = 360 s): longer than the run.
//
//	(cd benchmarks && go run ./cmd/gatewayrss [-gateway /tmp/gateway])
//
// Linux only (it reads /proc).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/procs"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gatewayrss:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("gateway", "", "built gateway `binary` (default: build cmd/limitplane-gateway of this checkout)")
	keys := flag.Int("keys", 1_000_000, "distinct client IPs, one request each")
	conc := flag.Int("c", 8, "concurrent connections")
	env := flag.String("env", "", "extra environment for the gateway, comma-separated K=V (e.g. GOGC=50)")
	flag.Parse()
	listen, err := procs.FreeAddr()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gatewayrss")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		if *bin, err = procs.BuildGateway(context.Background(), dir); err != nil {
			return err
		}
	}
	cfg := filepath.Join(dir, "gateway.yaml")
	// One keyless API; each client IP may make 10 requests an hour, so
	// every key stays limited (and unsweepable) for 6 minutes.
	yaml := fmt.Sprintf(`listen: %s
store: memory
client_ip:
  trusted_proxies: [127.0.0.1/32]
policies:
  - id: anon
    rate: {requests: 10, per: 1h}
apis:
  - id: open
    listen_path: /open/
    target: builtin:echo
    auth: keyless
    policies: [anon]
`, listen)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(*bin, "-config", cfg)
	cmd.Env = os.Environ()
	if *env != "" {
		cmd.Env = append(cmd.Env, strings.Split(*env, ",")...)
	}
	gw, err := procs.Start("gateway", cmd, filepath.Join(dir, "gateway.log"))
	if err != nil {
		return err
	}
	defer gw.Stop()
	url := "http://" + listen + "/open/"
	tr := &http.Transport{MaxIdleConnsPerHost: *conc, MaxConnsPerHost: *conc}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	send := func(ip string) error {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Forwarded-For", ip)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: status %d", ip, resp.StatusCode)
		}
		return nil
	}
	// Wait until the gateway answers, then warm it up on one address.
	deadline := time.Now().Add(20 * time.Second)
	for send("192.0.2.1") != nil {
		if time.Now().After(deadline) {
			return errors.New("the gateway did not answer within 20s: " + gw.Tail(2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 9 {
		if err := send("192.0.2.1"); err != nil {
			return err
		}
	}
	time.Sleep(time.Second)
	rss0, _, err := rss(cmd.Process.Pid)
	if err != nil {
		return err
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, *conc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(*keys) {
					return
				}
				// 10.0.0.0/8 holds 2^24 addresses.
				ip := fmt.Sprintf("10.%d.%d.%d", byte(i>>16), byte(i>>8), byte(i))
				if err := send(ip); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	elapsed := time.Since(start)
	if elapsed > 5*time.Minute {
		return fmt.Errorf("the run took %v: the first keys may have been swept", elapsed)
	}
	time.Sleep(2 * time.Second)
	rss1, hwm, err := rss(cmd.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Printf("keys %d in %v (%.0f req/s)\n", *keys, elapsed.Round(time.Millisecond), float64(*keys)/elapsed.Seconds())
	fmt.Printf("VmRSS before %d KiB, after %d KiB, peak (VmHWM) %d KiB\n", rss0, rss1, hwm)
	fmt.Printf("RSS per key: %.1f B (after), %.1f B (peak)\n",
		float64(rss1-rss0)*1024/float64(*keys), float64(hwm-rss0)*1024/float64(*keys))
	return nil
}

// rss returns VmRSS and VmHWM of process pid in KiB.
func rss(pid int) (cur, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			cur, err = strconv.ParseInt(f[1], 10, 64)
		case "VmHWM:":
			peak, err = strconv.ParseInt(f[1], 10, 64)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return cur, peak, nil
}
