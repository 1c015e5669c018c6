package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/limitplane/limitplane/identity"
)

// TestMain runs main instead of the tests when runMainEnv is set, so the
// tests can run the command as a real process (see start).
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

const runMainEnv = "LP_CONTROLPLANE_TEST_RUN_MAIN"

const token = "admin-token-for-tests-0123456789"

var (
	listeningRE = regexp.MustCompile(`listening on (https?://\S+)`)
	syncLineRE  = regexp.MustCompile(`(?m)^  sync listening on (\S+) \(tls: (off|on|mutual); data-plane tokens: (\d+)\)$`)
)

// lockedBuilder collects a process's stderr; safe to read while the
// process writes.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// process is the control plane running as a process.
type process struct {
	cmd    *exec.Cmd
	base   string
	banner string // the first line
	whole  string // the whole banner
	sync   string // the sync address, when served
	stderr *lockedBuilder
}

// start runs the command with args and the admin token in its
// environment, on a free loopback port, and waits for its banner.
func start(t *testing.T, args ...string) *process {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv is start with more environment variables. The admin API
// listens on a free loopback port unless args give -admin-listen.
func startEnv(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	if !slices.Contains(args, "-admin-listen") {
		args = append(args, "-admin-listen", "127.0.0.1:0")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1", "LP_CP_ADMIN_TOKEN="+token), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, stderr: &lockedBuilder{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	r := bufio.NewReader(out)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("no banner (so far %q): %v; stderr: %s", p.whole, err, p.stderr)
		}
		if p.whole == "" {
			p.banner = line
		}
		p.whole += line
		if strings.HasPrefix(line, "  GET /api/revision") {
			break
		}
	}
	m := listeningRE.FindStringSubmatch(p.banner)
	if m == nil {
		t.Fatalf("banner %q", p.banner)
	}
	p.base = m[1]
	if m := syncLineRE.FindStringSubmatch(p.whole); m != nil {
		p.sync = m[1]
	}
	go io.Copy(io.Discard, r)
	return p
}

// do makes an admin call with the token, as JSON when it has a body.
func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	ctype := ""
	if body != "" {
		ctype = "application/json"
	}
	return doAs(t, method, url, ctype, body)
}

// doAs makes an admin call with the token and the Content-Type ctype
// (none when ""), following redirects as http.DefaultClient does.
func doAs(t *testing.T, method, url, ctype, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestKill9KeepsAcknowledgedWrites writes 200 keys from 8 concurrent
// clients, kills the process with SIGKILL right after the last 200 OK,
// starts it again on the same file: every key is there, at the same
// revision.
func TestKill9KeepsAcknowledgedWrites(t *testing.T) {
	data := filepath.Join(t.TempDir(), "cp.db")
	p := start(t, "-data", data)
	if !strings.Contains(p.banner, "revision 0") {
		t.Fatalf("banner %q, want revision 0", p.banner)
	}
	if st, b := do(t, "PUT", p.base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); st != 200 {
		t.Fatal(st, b)
	}
	const n, clients = 200, 8
	var mu sync.Mutex
	var last uint64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := c; i < n; i += clients {
				st, b := do(t, "POST", p.base+"/api/keys", fmt.Sprintf(`{"key":"key-%d","policies":["gold"]}`, i))
				var w struct{ Revision uint64 }
				if st != 201 || json.Unmarshal([]byte(b), &w) != nil {
					t.Errorf("key %d: %d %s", i, st, b)
					return
				}
				mu.Lock()
				last = max(last, w.Revision)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	if t.Failed() {
		return
	}
	if last != n+1 {
		t.Fatalf("last revision %d, want %d", last, n+1)
	}

	p = start(t, "-data", data)
	if want := fmt.Sprintf("revision %d;", n+1); !strings.Contains(p.banner, want) {
		t.Fatalf("banner %q, want %q", p.banner, want)
	}
	if st, b := do(t, "GET", p.base+"/api/revision", ""); st != 200 || b != fmt.Sprintf(`{"revision":%d}`, n+1) {
		t.Fatalf("revision after restart: %d %s", st, b)
	}
	for i := range n {
		h := identity.HashKey(fmt.Sprintf("key-%d", i)).String()
		if st, b := do(t, "GET", p.base+"/api/keys/"+h, ""); st != 200 || !strings.HasPrefix(b, `{"key_hash":"`+h+`","policies":["gold"],"quota_epoch":`) {
			t.Fatalf("key %d after restart: %d %s", i, st, b)
		}
	}
}

// TestSIGTERMExitsZero: SIGTERM stops the control plane with status 0,
// and what it stored is there at the next start.
func TestSIGTERMExitsZero(t *testing.T) {
	data := filepath.Join(t.TempDir(), "cp.db")
	p := start(t, "-data", data)
	if st, b := do(t, "PUT", p.base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); st != 200 || b != `{"revision":1}` {
		t.Fatal(st, b)
	}
	if st, _ := do(t, "GET", p.base+"/api/revision", ""); st != 200 {
		t.Fatal(st)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v; stderr: %s", err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	p = start(t, "-data", data)
	if !strings.Contains(p.banner, "revision 1;") {
		t.Fatalf("banner %q", p.banner)
	}
	if !strings.Contains(p.whole, "\n  sync: not served (no -dataplanes file)\n") {
		t.Fatalf("banner without -dataplanes:\n%s", p.whole)
	}
}

// TestNoTokenRefusesToStart: without a token the command exits 2.
func TestNoTokenRefusesToStart(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-data", filepath.Join(t.TempDir(), "cp.db"))
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "LP_CP_ADMIN_TOKEN=", "LP_CP_ADMIN_TOKEN_FILE=")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2; output %s", err, out)
	}
	if want := "controlplane: no admin token: set LP_CP_ADMIN_TOKEN or -admin-token-file\n"; string(out) != want {
		t.Fatalf("output %q, want %q", out, want)
	}
}

// TestSecondOnSameFileRefused: a second control plane on a -data file
// another one holds exits 1 within the short lock wait (1s, not 5s), saying
// the file is in use. (bbolt gives up up to 50ms before its timeout, hence
// 900ms.)
func TestSecondOnSameFileRefused(t *testing.T) {
	data := filepath.Join(t.TempDir(), "cp.db")
	p := start(t, "-data", data)
	began := time.Now()
	code, out := runExit(t, nil, "-data", data, "-admin-listen", "127.0.0.1:0")
	took := time.Since(began)
	if want := "controlplane: open " + data + ": the file is in use by another process (another control plane?)\n"; code != 1 || out != want {
		t.Fatalf("exit %d, output %q; want 1, %q", code, out, want)
	}
	if took < 900*time.Millisecond || took >= 5*time.Second {
		t.Fatalf("refused after %v; want the 1s lock wait (at least 900ms, under 5s)", took)
	}
	// The first is unharmed.
	if st, b := do(t, "GET", p.base+"/api/revision", ""); st != 200 || b != `{"revision":0}` {
		t.Fatal(st, b)
	}
}

// TestWritesTakeJSONAtCleanPaths, on the running program: a write as a
// form or text/plain is 415, and a PUT or DELETE to a path with ".."
// is 400 rather than a redirect the client follows to another object
// (GET /api/policies/x still 404 afterwards; the revision stays 1).
func TestWritesTakeJSONAtCleanPaths(t *testing.T) {
	p := start(t, "-data", filepath.Join(t.TempDir(), "cp.db"))
	if st, b := do(t, "PUT", p.base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); st != 200 || b != `{"revision":1}` {
		t.Fatal(st, b)
	}
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain"} {
		if st, b := doAs(t, "PUT", p.base+"/api/policies/x", ct, `{"rate":{"requests":5,"per":"1m"}}`); st != 415 || b != `{"error":"Content-Type \"`+ct+`\": writes take application/json"}` {
			t.Fatal(ct, st, b)
		}
	}
	for _, r := range [][2]string{{"PUT", "/api/keys/../policies/x"}, {"DELETE", "/api/apis/../policies/gold"}} {
		if st, b := do(t, r[0], p.base+r[1], `{"rate":{"requests":5,"per":"1m"}}`); st != 400 || b != `{"error":"path \"`+r[1]+`\" is not clean (no \".\" or \"..\" segments, no \"//\")"}` {
			t.Fatal(r, st, b)
		}
	}
	if st, b := do(t, "GET", p.base+"/api/policies/x", ""); st != 404 {
		t.Fatal(st, b)
	}
	if st, b := do(t, "GET", p.base+"/api/revision", ""); st != 200 || b != `{"revision":1}` {
		t.Fatal(st, b)
	}
}

// TestExportImportBetweenPrograms: a backup moved between two running
// control planes, each on its own file: export A, import into B, export
// B gives A's document but for its revision; B answers the keys A holds.
func TestExportImportBetweenPrograms(t *testing.T) {
	a := start(t, "-data", filepath.Join(t.TempDir(), "a.db"))
	for _, c := range [][3]string{
		{"PUT", "/api/policies/gold", `{"rate":{"requests":5,"per":"1m"},"quota":{"max":100,"renewal":"24h"}}`},
		{"PUT", "/api/apis/echo", `{"listen_path":"/echo/","target":"builtin:echo","tags":["dp1"]}`},
		{"POST", "/api/keys:batch", `{"keys":[{"key":"k1","policies":["gold"]},{"key":"k2","api_limits":{"echo":{"quota":{"max":5,"renewal":"1h"}}}}]}`},
		{"POST", "/api/keys/" + identity.HashKey("k1").String() + "/reset-quota", ""},
	} {
		if st, b := do(t, c[0], a.base+c[1], c[2]); st != 200 {
			t.Fatal(c, st, b)
		}
	}
	st, exportA := do(t, "GET", a.base+"/api/export", "")
	if st != 200 || !strings.HasPrefix(exportA, `{"format_version":1,"revision":4,"policies":[{"id":"gold",`) {
		t.Fatal(st, exportA)
	}
	b := start(t, "-data", filepath.Join(t.TempDir(), "b.db"))
	if st, body := do(t, "POST", b.base+"/api/import", exportA); st != 200 || body != `{"revision":1}` {
		t.Fatal(st, body)
	}
	st, exportB := do(t, "GET", b.base+"/api/export", "")
	if want := strings.Replace(exportA, `"revision":4,`, `"revision":1,`, 1); st != 200 || exportB != want {
		t.Fatalf("export B:\n%s\nwant\n%s", exportB, want)
	}
	h := identity.HashKey("k1").String()
	if st, body := do(t, "GET", b.base+"/api/keys/"+h, ""); st != 200 || body != `{"key_hash":"`+h+`","policies":["gold"],"quota_epoch":4}` {
		t.Fatal(st, body)
	}
}

// The admin token must have at least 32 bytes, the admin API serves
// plaintext only on loopback unless -admin-insecure says so (exit status
// 2 otherwise, with the reason), and its certificate and key go together.
func TestAdminStartRefusals(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "cp.db")
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"LP_CP_ADMIN_TOKEN=x"}, []string{"-admin-listen", "127.0.0.1:0"},
			"controlplane: the admin token is 1 bytes, want at least 32 (e.g. openssl rand -hex 32)\n"},
		{[]string{"LP_CP_ADMIN_TOKEN=" + token[:31]}, []string{"-admin-listen", "127.0.0.1:0"},
			"controlplane: the admin token is 31 bytes, want at least 32 (e.g. openssl rand -hex 32)\n"},
		{[]string{"LP_CP_ADMIN_TOKEN=" + strings.Repeat(" ", 40)}, []string{"-admin-listen", "127.0.0.1:0"},
			"controlplane: the admin token holds white space or the control character ' ' at byte 0; no Authorization header carries it as sent\n"},
		{nil, []string{"-admin-listen", "0.0.0.0:0"},
			"controlplane: -admin-listen 0.0.0.0:0 is not a loopback address and the admin API has no TLS: the admin token would cross the network in plaintext; give -admin-tls-cert and -admin-tls-key, or -admin-insecure to accept that\n"},
		{[]string{"LP_CP_ADMIN_LISTEN=10.1.2.3:7070"}, nil,
			"controlplane: -admin-listen 10.1.2.3:7070 is not a loopback address and the admin API has no TLS: the admin token would cross the network in plaintext; give -admin-tls-cert and -admin-tls-key, or -admin-insecure to accept that\n"},
		{nil, []string{"-admin-listen", "127.0.0.1:0", "-admin-tls-cert", "cp.pem"},
			"controlplane: -admin-tls-cert and -admin-tls-key go together\n"},
		{[]string{"LP_CP_ADMIN_INSECURE=maybe"}, nil, "controlplane: LP_CP_ADMIN_INSECURE=\"maybe\": want true or false\n"},
	} {
		code, out := runExit(t, c.env, append([]string{"-data", db}, c.args...)...)
		if code != 2 || out != c.want {
			t.Errorf("env %q args %q: exit %d, output %q; want 2 and %q", c.env, c.args, code, out, c.want)
		}
	}
	p := start(t, "-data", db, "-admin-listen", "0.0.0.0:0", "-admin-insecure")
	if !strings.HasPrefix(p.base, "http://[::]:") && !strings.HasPrefix(p.base, "http://0.0.0.0:") {
		t.Fatalf("with -admin-insecure: %s", p.banner)
	}
}

// With -admin-tls-cert and -admin-tls-key the admin API serves HTTPS (on
// any address): a client trusting the CA gets its answer, a plaintext
// request is answered 400 by the TLS server.
func TestAdminTLS(t *testing.T) {
	ca := newPKI(t)
	p := start(t, "-data", filepath.Join(t.TempDir(), "cp.db"), "-admin-tls-cert", ca.certFile, "-admin-tls-key", ca.keyFile)
	if !strings.HasPrefix(p.base, "https://127.0.0.1:") {
		t.Fatalf("banner %q, want https", p.banner)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.roots}}}
	t.Cleanup(client.CloseIdleConnections)
	req, err := http.NewRequest("GET", p.base+"/api/revision", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"revision":0}`+"\n" {
		t.Fatalf("over TLS: %d %s", resp.StatusCode, b)
	}
	resp, err = http.Get("http://" + strings.TrimPrefix(p.base, "https://") + "/api/revision")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("plaintext to the TLS admin API: %d, want 400", resp.StatusCode)
	}
}

// TestDataIsADirectory: -data naming a directory exits 1 saying so, the
// path once.
func TestDataIsADirectory(t *testing.T) {
	dir := t.TempDir()
	code, out := runExit(t, nil, "-data", dir, "-admin-listen", "127.0.0.1:0")
	if want := "controlplane: open " + dir + ": is a directory\n"; code != 1 || out != want {
		t.Fatalf("exit %d, output %q; want 1, %q", code, out, want)
	}
}
