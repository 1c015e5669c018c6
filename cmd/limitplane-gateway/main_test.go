package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/gateway/config"
)

// TestDemo runs the gateway as `go run ./cmd/limitplane-gateway` does, with no
// -config (only the port changed, so the test never collides with a real
// 8080), checks the banner, and runs its three curl lines.
func TestDemo(t *testing.T) {
	gw := start(t, frozen())
	b := gw.base
	want := "limitplane gateway listening on " + b + " (config: built-in demo, store: memory)\n" +
		"  /echo/ -> builtin:echo (api_key)\n" +
		"  /open/ -> builtin:echo (keyless, policies [anon] per client IP)\n" +
		"\n" +
		"Try it:\n" +
		"  curl -i -H 'X-API-Key: demo-key-1' " + b + "/echo/hello  # run it 6 times: 5 a minute pass, the 6th gets 429\n" +
		"  curl -i " + b + "/echo/hello                             # no API key: 401\n" +
		"  curl -i " + b + "/open/hello                             # keyless API, limited per client IP\n"
	if got := gw.stdout.String(); got != want {
		t.Fatalf("banner:\n%s\nwant:\n%s", got, want)
	}

	// Run the printed curl lines: -H 'Name: value' and the URL.
	curlRE := regexp.MustCompile(`^  curl -i (?:-H '([^:]+): ([^']+)' )?(\S+)`)
	var lines [][]string
	for _, l := range strings.Split(want, "\n") {
		if m := curlRE.FindStringSubmatch(l); m != nil {
			lines = append(lines, m[1:])
		}
	}
	if len(lines) != 3 {
		t.Fatalf("found %d curl lines, want 3", len(lines))
	}
	do := func(m []string) reply {
		if m[0] == "" {
			return get(t, nil, m[2])
		}
		return get(t, nil, m[2], m[0], m[1])
	}

	// 1: 5 a minute (T = 12s, burst 5): the 6th waits one interval.
	for i := 1; i <= 5; i++ {
		if r := do(lines[0]); r.status != 200 {
			t.Fatalf("line 1, run %d: status %d %s", i, r.status, r.body)
		}
	}
	r := do(lines[0])
	if r.status != 429 {
		t.Fatalf("line 1, run 6: status %d, want 429", r.status)
	}
	checkHeaders(t, "6th", r.header, map[string]string{
		"Retry-After":           "12",
		"RateLimit-Policy":      `"default";q=5;w=60, "default/quota";q=100;w=86400`,
		"RateLimit":             `"default";r=0;t=12, "default/quota";r=95;t=86400`,
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "1700000060",
	})
	if want := `{"error":"rate limit exceeded","retry_after_ms":12000}` + "\n"; r.body != want {
		t.Errorf("429 body %q, want %q", r.body, want)
	}

	// 2: no key.
	if r := do(lines[1]); r.status != 401 || r.body != `{"error":"no API key"}`+"\n" {
		t.Errorf("line 2: %d %q, want 401", r.status, r.body)
	}
	// 3: keyless.
	r = do(lines[2])
	if r.status != 200 {
		t.Fatalf("line 3: status %d", r.status)
	}
	checkHeaders(t, "keyless", r.header, map[string]string{"RateLimit": `"anon";r=9;t=6`})

	// demo-key-2 is in the demo only as a hash; its gold policy has no
	// rate limit and a daily quota.
	r = get(t, nil, b+"/echo/", "Authorization", "Bearer demo-key-2")
	checkHeaders(t, "gold", r.header, map[string]string{"RateLimit": `"gold/quota";r=9999;t=86400`})
}

// TestRunRefuses checks run's errors for bad flags and configurations.
func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := writeConfig(t, "store: redis://localhost:6379/x\npolicies:\n  - id: p\n    rate: {requests: -3, per: 1s}\n")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	missing := filepath.Join(dir, "missing.yaml")
	tab := writeConfig(t, "\tlisten: 127.0.0.1:8080\n")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", bad}, "invalid configuration, not starting:\n" +
			bad + ":1:1: apis: at least one API is required\n" +
			bad + ":1:8: store: invalid database number: \"x\"\n" +
			bad + ":4:22: policies[0].rate.requests: -3 must be > 0 (or -1 for unlimited)"},
		{[]string{"-config", missing}, "config: open " + missing + ": no such file or directory"},
		{[]string{"-config", tab}, "invalid configuration, not starting:\n" +
			tab + ":1:1: YAML syntax: found character that cannot start any token (a tab: YAML indents with spaces)"},
		{[]string{"-listen", "8080"}, `invalid value "8080" for flag -listen: "8080" is not host:port (like 127.0.0.1:8080 or :8080)`},
		{[]string{"-listen", ""}, `invalid value "" for flag -listen: "" is not host:port (like 127.0.0.1:8080 or :8080)`},
		{[]string{"-listen", busy.Addr().String()}, "listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{[]string{"-port", "1"}, "flag provided but not defined: -port"},
		{[]string{"demo.yaml"}, `unexpected argument "demo.yaml"`},
	} {
		out, errOut := newOutput(), newOutput()
		err := run(context.Background(), tc.args, env{stdout: out, stderr: errOut})
		if err == nil || err.Error() != tc.want {
			t.Errorf("run %q:\n got %v\nwant %s", tc.args, err, tc.want)
		}
		if out.String() != "" {
			t.Errorf("run %q printed %q", tc.args, out)
		}
	}
}

// TestExitStatus runs the gateway as a process: a command-line mistake (an
// unknown flag, a bad -listen, a stray argument, an empty -config that must
// not start the demo) is printed once, with the usage, and exits 2 (the flag package's convention), -h exits 0, a
// configuration error exits 1, and SIGTERM shuts a running gateway down
// with status 0.
func TestExitStatus(t *testing.T) {
	usage := "Usage: limitplane-gateway [-config FILE] [-listen ADDR]\n" +
		"  -config file\n" +
		"    \tYAML configuration file (default: the built-in demo config)\n" +
		"  -listen address\n" +
		"    \taddress to listen on, host:port (overrides the config's listen)\n"
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, tc := range []struct {
		args   []string
		status int
		stderr string
	}{
		{[]string{"-port", "1"}, 2, "flag provided but not defined: -port\n" + usage},
		{[]string{"-listen"}, 2, "flag needs an argument: -listen\n" + usage},
		{[]string{"demo.yaml"}, 2, `unexpected argument "demo.yaml"` + "\n" + usage},
		{[]string{"-listen", "8080", "-config", missing}, 2, `invalid value "8080" for flag -listen: "8080" is not host:port (like 127.0.0.1:8080 or :8080)` + "\n" + usage},
		{[]string{"-config", missing, "-listen", "8080"}, 2, `invalid value "8080" for flag -listen: "8080" is not host:port (like 127.0.0.1:8080 or :8080)` + "\n" + usage},
		{[]string{"-config", ""}, 2, `invalid value "" for flag -config: empty file name (leave -config out for the built-in demo)` + "\n" + usage},
		{[]string{"-h"}, 0, usage},
		{[]string{"-config", missing}, 1, "gateway: config: open " + missing + ": no such file or directory\n"},
	} {
		cmd := command(t, tc.args...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		status := 0
		if ee, ok := err.(*exec.ExitError); ok {
			status = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if status != tc.status || stderr.String() != tc.stderr || stdout.String() != "" {
			t.Errorf("gateway %q: status %d, stderr:\n%s\nstdout: %q\nwant status %d, stderr:\n%s", tc.args, status, stderr.String(), stdout.String(), tc.status, tc.stderr)
		}
	}

	// A running gateway: SIGTERM, status 0.
	cmd := command(t, "-listen", "127.0.0.1:0")
	out := newOutput()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case base := <-out.addr:
		if r := get(t, nil, base+"/open/x"); r.status != 200 {
			t.Errorf("GET /open/x: %d", r.status)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("no banner within 30s; stderr: %s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || !strings.HasSuffix(out.String(), "shutting down\n") {
		t.Errorf("after SIGTERM: %v, stdout ends %q, stderr %q", err, out.String()[max(0, len(out.String())-40):], stderr.String())
	}
}

// TestRunHelp: -h prints the usage and returns flag.ErrHelp (main exits 0).
func TestRunHelp(t *testing.T) {
	out, errOut := newOutput(), newOutput()
	err := run(context.Background(), []string{"-h"}, env{stdout: out, stderr: errOut})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	want := "Usage: limitplane-gateway [-config FILE] [-listen ADDR]\n" +
		"  -config file\n" +
		"    \tYAML configuration file (default: the built-in demo config)\n" +
		"  -listen address\n" +
		"    \taddress to listen on, host:port (overrides the config's listen)\n"
	if errOut.String() != want {
		t.Errorf("usage:\n%q\nwant\n%q", errOut, want)
	}
}

// TestListenFlagOverrides: -listen wins over the file's listen.
func TestListenFlagOverrides(t *testing.T) {
	gw := start(t, frozen(), "-config", writeConfig(t, "listen: 127.0.0.1:1\n"+
		"policies: [{id: p, rate: {requests: 1, per: 1s}}]\n"+
		"apis: [{id: a, listen_path: /, target: \"builtin:echo\", auth: keyless, policies: [p]}]\n"),
		"-listen", "127.0.0.1:0")
	if strings.HasSuffix(gw.base, ":1") {
		t.Fatalf("listening on %s, the file's address", gw.base)
	}
	if r := get(t, nil, gw.base+"/"); r.status != http.StatusOK {
		t.Errorf("status %d", r.status)
	}
	if !strings.Contains(gw.stdout.String(), "(config: ") {
		t.Errorf("banner: %s", gw.stdout)
	}
}

// TestREADMEShowsBanner: the README's walk-through starts with the banner
// `go run ./cmd/limitplane-gateway` prints on the default address.
func TestREADMEShowsBanner(t *testing.T) {
	cfg, err := config.Parse(demoName, demoYAML)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	printBanner(&b, "http://127.0.0.1:8080", "", cfg, "", "")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```\n"+b.String()+"```\n") {
		t.Errorf("README.md does not show the banner:\n%s", b.String())
	}
}
