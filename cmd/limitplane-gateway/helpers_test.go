package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestMain runs main instead of the tests when runMainEnv is set: tests
// start the test binary that way to check the command's exit status and
// output as a process (see command).
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// runMainEnv makes the test binary run main.
const runMainEnv = "LP_GATEWAY_TEST_RUN_MAIN"

// command returns the gateway command with args: the test binary, running
// main (see TestMain).
func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	return cmd
}

// epoch is the frozen wall clock of tests: X-RateLimit-Reset values are
// epoch plus whole seconds.
const epoch = 1_700_000_000

// frozen returns an env whose store clock and wall clock never move, so
// every count and header is exact however slowly the test runs.
func frozen() env {
	return env{clock: core.NewManualClock(int64(time.Hour)), now: func() time.Time { return time.Unix(epoch, 0) }}
}

// output is a goroutine-safe writer that reports the address in run's
// "listening on" line.
type output struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	addr  chan string
	found bool
	// changed gets a value after writes (at most one waits), for
	// waitFor.
	changed chan struct{}
}

var listeningRE = regexp.MustCompile(`listening on (http://\S+)`)

func newOutput() *output {
	return &output{addr: make(chan string, 1), changed: make(chan struct{}, 1)}
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if m := listeningRE.FindStringSubmatch(o.buf.String()); m != nil && !o.found {
		o.found = true
		o.addr <- m[1]
	}
	select {
	case o.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

// waitFor waits until the output contains s, and fails the test if it
// does not within 30 s.
func (o *output) waitFor(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for !strings.Contains(o.String(), s) {
		select {
		case <-o.changed:
		case <-timeout:
			t.Fatalf("no %q in the output within 30s:\n%s", s, o)
		}
	}
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// running is a gateway started by run in the background.
type running struct {
	base   string // http://127.0.0.1:PORT
	stdout *output
	stderr *output
	stop   func() error // cancels run's context and returns run's error
}

// start runs the gateway with args (plus -listen 127.0.0.1:0 unless args
// set -listen) and waits until it listens. The gateway is stopped at the
// end of the test, which fails if run did not return nil.
func start(t *testing.T, e env, args ...string) *running {
	t.Helper()
	if !strings.Contains(strings.Join(args, " "), "-listen") {
		args = append(args, "-listen", "127.0.0.1:0")
	}
	e.stdout, e.stderr = newOutput(), newOutput()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, e) }()
	r := &running{stdout: e.stdout.(*output), stderr: e.stderr.(*output)}
	select {
	case r.base = <-r.stdout.addr:
	case err := <-done:
		cancel()
		t.Fatalf("run returned before listening: %v\nstderr: %s", err, r.stderr)
	}
	var once sync.Once
	var err error
	r.stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return r
}

// engine is the server.engine of every file these tests write (through
// writeConfig and sighupConfig): "" leaves the field out (net/http).
// go test ./cmd/limitplane-gateway -engine fasthttp runs them all on the
// fasthttp engine.
var engine = flag.String("engine", "", "server.engine of every gateway file the tests write (net/http or fasthttp; empty: the default)")

// withEngine returns the gateway file yaml with server.engine set to
// -engine, in its server section if it has one.
func withEngine(yaml string) string {
	e := *engine
	switch {
	case e == "":
		return yaml
	case strings.Contains(yaml, "\nserver: {"):
		return strings.Replace(yaml, "\nserver: {", "\nserver: {engine: "+e+", ", 1)
	case strings.Contains(yaml, "\nserver:\n"):
		return strings.Replace(yaml, "\nserver:\n", "\nserver:\n  engine: "+e+"\n", 1)
	}
	return yaml + "\nserver: {engine: " + e + "}\n"
}

// engineNote is what the start banner says of -engine after the store:
// nothing for the default engine.
func engineNote() string {
	if *engine == "" || *engine == "net/http" {
		return ""
	}
	return ", engine: " + *engine
}

// writeConfig writes a config file, with -engine, into a temporary
// directory.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(withEngine(yaml)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// reply is one response, read completely.
type reply struct {
	status int
	header http.Header
	body   string
}

// get sends a GET with the given header fields (name, value pairs); it
// must be called from the test's goroutine.
func get(t *testing.T, c *http.Client, url string, hdr ...string) reply {
	t.Helper()
	r, err := fetch(c, url, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fetch is get for any goroutine.
func fetch(c *http.Client, url string, hdr ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

// clientFrom returns a client whose connections come from the loopback
// address ip (any of 127.0.0.0/8 works on Linux), to act as distinct
// client IPs.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// checkHeaders compares the named fields of h with want exactly; "" in want
// means the field must be absent.
func checkHeaders(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for name, w := range want {
		got := strings.Join(h.Values(name), "|")
		if got != w {
			t.Errorf("%s: %s = %q, want %q", what, name, got, w)
		}
	}
}
