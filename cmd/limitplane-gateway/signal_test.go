package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startProcess starts the gateway as a process (see command) with args
// and -listen 127.0.0.1:0, and returns it with its stdout and stderr once
// it listens, and its base URL. The process is killed at the end of the
// test if it is still running.
func startProcess(t *testing.T, args ...string) (cmd *exec.Cmd, stdout, stderr *output, base string) {
	t.Helper()
	cmd = command(t, append(args, "-listen", "127.0.0.1:0")...)
	stdout, stderr = newOutput(), newOutput()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // the test did not wait for it
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	select {
	case base = <-stdout.addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("no banner within 30s; stderr: %s", stderr)
	}
	return cmd, stdout, stderr, base
}

// exitStatus waits for cmd and returns its exit status.
func exitStatus(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		if ee.ExitCode() < 0 {
			t.Fatalf("gateway ended by %v", err)
		}
		return ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0
}

// TestSIGHUPKeepsServing sends SIGHUP to a running gateway process whose
// file did not change: it reloads the file (one line) and keeps serving
// with its counters: a key that spent 3 of its 5 gets exactly 2 more.
// SIGTERM then ends it with status 0. (TestSIGHUP covers a changed file.)
func TestSIGHUPKeepsServing(t *testing.T) {
	cmd, stdout, stderr, base := startProcess(t, "-config", writeConfig(t, `
policies: [{id: p, rate: {requests: 5, per: 1h}}]
keys: [{key: k, policies: [p]}]
apis: [{id: echo, listen_path: /echo/, target: "builtin:echo"}]
`))
	send := func(n int) (allowed int) {
		for range n {
			switch r := get(t, nil, base+"/echo/", "X-API-Key", "k"); r.status {
			case 200:
				allowed++
			case 429:
			default:
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
		return allowed
	}
	if n := send(3); n != 3 {
		t.Fatalf("%d of the first 3 allowed", n)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	stderr.waitFor(t, `level=INFO msg=reloaded file=`)
	if n := send(3); n != 2 {
		t.Errorf("after SIGHUP %d of 3 allowed, want exactly 2 (5 minus the 3 spent)", n)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if status := exitStatus(t, cmd); status != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0; stderr:\n%s", status, stderr)
	}
	if got := strings.Count(stderr.String(), "\n"); got != 1 {
		t.Errorf("stderr has %d lines, want just the reload line:\n%s", got, stderr)
	}
	if !strings.HasSuffix(stdout.String(), "shutting down\n") {
		t.Errorf("stdout does not end with the shutdown notice:\n%s", stdout)
	}
}

// TestShutdownTimeoutCutsRequests: a request still waiting on a slow
// upstream when server.shutdown_timeout has passed after SIGTERM is cut:
// its client sees the connection closed without a response, the upstream
// call is cancelled, the gateway logs that it cut 1 request, and exits 0,
// since the shutdown it was asked for completed.
func TestShutdownTimeoutCutsRequests(t *testing.T) {
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-release:
		}
	}))
	defer up.Close()
	cmd, stdout, stderr, base := startProcess(t, "-config", writeConfig(t, fmt.Sprintf(`
server: {shutdown_timeout: 200ms}
policies: [{id: p, rate: {requests: 10, per: 1s}}]
apis: [{id: slow, listen_path: /, target: %q, auth: keyless, policies: [p]}]
`, up.URL)))

	result := make(chan error, 1)
	go func() {
		r, err := fetch(nil, base+"/work")
		if err == nil {
			err = fmt.Errorf("got a response: %d %q", r.status, r.body)
		}
		result <- err
	}()
	<-arrived
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if status := exitStatus(t, cmd); status != 0 {
		t.Errorf("exit status %d, want 0; stderr:\n%s", status, stderr)
	}
	if err := <-result; !strings.HasSuffix(err.Error(), ": EOF") {
		t.Errorf("client: %v, want the connection closed without a response (EOF)", err)
	}
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Errorf("the upstream call was not cancelled")
	}
	const line = `level=WARN msg="shutdown_timeout passed; closed the connections of requests still in flight" shutdown_timeout=200ms requests_cut=1` + "\n"
	if got := stderr.String(); !strings.HasSuffix(got, line) || strings.Count(got, "\n") != 1 {
		t.Errorf("stderr:\n%s\nwant one line ending %q", got, line)
	}
	if !strings.HasSuffix(stdout.String(), "shutting down\n") {
		t.Errorf("stdout does not end with the shutdown notice:\n%s", stdout)
	}
}
