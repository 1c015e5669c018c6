package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logWatch is a goroutine-safe writer that lets a test wait for text to
// appear in what was written.
type logWatch struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func newLogWatch() *logWatch { return &logWatch{changed: make(chan struct{})} }

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	close(w.changed)
	w.changed = make(chan struct{})
	return len(p), nil
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitFor waits until text has been written n times in all, and fails
// the test after 30 s.
func (w *logWatch) waitFor(t *testing.T, text string, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		w.mu.Lock()
		got, changed := strings.Count(w.buf.String(), text), w.changed
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%q not written %d times within 30s; output:\n%s", text, n, w)
		}
	}
}

// buildGateway builds this command into a temporary directory and returns
// the binary's path.
func buildGateway(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "gateway")
	out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// sighupConfig is the file of TestSIGHUP: key k1 and key k2 with policy
// p's quota of max an hour, listening on listen.
func sighupConfig(listen string, max int, extra string) string {
	return withEngine(fmt.Sprintf(`listen: %s
store: memory
policies:
  - id: p
    quota: {max: %d, renewal: 1h}
keys:
  - key: k1
    policies: [p]
  - key: k2
    policies: [p]
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
%s`, listen, max, extra))
}

// TestSIGHUP runs the built command and changes its file under it. A key
// that spent its quota of 5 an hour gets exactly 5 more when the file
// raises it to 10 and SIGHUP reloads it: the count is kept. A file with
// two problems is refused, each problem logged with file:line:column, and
// the running limits stay. A good file applies again, with the changed
// listen address reported as taking effect only at a restart. SIGTERM
// ends the process with status 0.
func TestSIGHUP(t *testing.T) {
	g := startReloadable(t, sighupConfig("127.0.0.1:0", 5, ""))
	cmd, file, stdout, stderr, exited, base, write := g.cmd, g.file, g.stdout, g.stderr, g.exited, g.base, g.write
	spend := func(what, key string, want []int) {
		t.Helper()
		var got []int
		for range want {
			got = append(got, get(t, nil, base+"/echo/x", "X-API-Key", key).status)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %s got %v, want %v", what, key, got, want)
		}
	}
	ok := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = 200
		}
		return s
	}
	hup := func() {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	spend("5 an hour", "k1", append(ok(5), 429))

	write(sighupConfig("127.0.0.1:0", 10, ""))
	hup()
	stderr.waitFor(t, "msg=reloaded", 1)
	spend("raised to 10 an hour", "k1", append(ok(5), 429))

	// Two problems: a duration that is not one (line 5, column 30) and a
	// key naming an unknown policy (line 10, column 16).
	broken := strings.Replace(sighupConfig("127.0.0.1:0", 1, ""), "renewal: 1h", "renewal: 1 hour", 1)
	broken = strings.Replace(broken, "  - key: k2\n    policies: [p]", "  - key: k2\n    policies: [gold]", 1)
	write(broken)
	hup()
	stderr.waitFor(t, "reload refused; the running configuration stays", 1)
	for _, want := range []string{
		"reload refused: " + file + `:5:30: policies[0].quota.renewal: \"1 hour\" is not a duration`,
		"reload refused: " + file + `:10:16: keys[1].policies[0]: unknown policy \"gold\"`,
		"problems=2",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, stderr)
		}
	}
	// Still 10 an hour: k2 gets 10, not the broken file's 1.
	spend("after the broken file", "k2", append(ok(10), 429))

	write(sighupConfig("127.0.0.1:1", 20, ""))
	hup()
	stderr.waitFor(t, "msg=reloaded", 2)
	if want := `msg="reload: listen changed in the file; it takes effect only when the gateway restarts"`; !strings.Contains(stderr.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, stderr)
	}
	spend("raised to 20 an hour, still on the old address", "k1", append(ok(10), 429))

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) || err != nil {
			t.Errorf("after SIGTERM: %v\nstderr: %s", err, stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	if !strings.HasSuffix(stdout.String(), "shutting down\n") {
		t.Errorf("stdout does not end with \"shutting down\": %q", stdout.String())
	}
}

// reloadable is a gateway process the test started on a file it rewrites
// (write) and reloads with SIGHUP.
type reloadable struct {
	t      *testing.T
	cmd    *exec.Cmd
	file   string
	stdout *output
	stderr *logWatch
	exited chan error // cmd.Wait's result, once
	base   string     // the proxy's URL from the banner
}

// startReloadable builds the command, writes config to a file of its own,
// starts the gateway on it and waits for its banner. The process is killed
// at the end of the test unless it has exited.
func startReloadable(t *testing.T, config string) *reloadable {
	t.Helper()
	bin := buildGateway(t)
	g := &reloadable{t: t, file: filepath.Join(t.TempDir(), "gateway.yaml"), stdout: newOutput(), stderr: newLogWatch(), exited: make(chan error, 1)}
	g.write(config)
	g.cmd = exec.Command(bin, "-config", g.file)
	g.cmd.Stdout, g.cmd.Stderr = g.stdout, g.stderr
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { g.exited <- g.cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		select {
		case <-waited:
		default:
			g.cmd.Process.Kill()
			<-waited
		}
	})
	select {
	case g.base = <-g.stdout.addr:
	case err := <-g.exited:
		t.Fatalf("exited before listening: %v\nstderr: %s", err, g.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("no banner within 30s; stderr: %s", g.stderr)
	}
	return g
}

// write replaces the gateway's file with s, whole and renamed, so a
// reload never reads half a file. Call it from the test's goroutine.
func (g *reloadable) write(s string) {
	g.t.Helper()
	if err := os.WriteFile(g.file+".tmp", []byte(s), 0o600); err != nil {
		g.t.Fatal(err)
	}
	if err := os.Rename(g.file+".tmp", g.file); err != nil {
		g.t.Fatal(err)
	}
}
