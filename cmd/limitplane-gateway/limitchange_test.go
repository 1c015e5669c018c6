package main

import (
	"context"
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// rateChangeConfig is the file of TestSIGHUPRateChangeKeepsSpent: key k1
// on policy p of perMinute requests a minute (burst perMinute).
func rateChangeConfig(perMinute int) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
store: memory
policies:
  - id: p
    rate: {requests: %d, per: 1m}
keys:
  - key: k1
    policies: [p]
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
`, perMinute)
}

// statuses sends n requests with key to url and returns their statuses.
func statuses(t *testing.T, url, key string, n int) string {
	t.Helper()
	var got []int
	for range n {
		got = append(got, get(t, nil, url, "X-API-Key", key).status)
	}
	return fmt.Sprint(got)
}

// TestSIGHUPRateChangeKeepsSpent: a key that spent 3 of 3 a minute gets
// exactly 3 more at once when the file raises the policy to 6 a minute and
// SIGHUP reloads it (the tokens spent carry over, not the time: GCRA's TAT
// alone would keep it throttled for the old minute); lowered back to 3 a
// minute with 6 of 6 spent, it gets none.
func TestSIGHUPRateChangeKeepsSpent(t *testing.T) {
	g := startReloadable(t, rateChangeConfig(3))
	cmd, stderr, base, write := g.cmd, g.stderr, g.base, g.write
	url := base + "/echo/x"
	if got := statuses(t, url, "k1", 4); got != "[200 200 200 429]" {
		t.Fatalf("3 a minute: %s, want 3 of 4", got)
	}
	write(rateChangeConfig(6))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	stderr.waitFor(t, "msg=reloaded", 1)
	if got := statuses(t, url, "k1", 4); got != "[200 200 200 429]" {
		t.Fatalf("raised to 6 a minute with 3 spent: %s, want exactly 3 more", got)
	}
	write(rateChangeConfig(3))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	stderr.waitFor(t, "msg=reloaded", 2)
	if got := statuses(t, url, "k1", 2); got != "[429 429]" {
		t.Fatalf("lowered to 3 a minute with 6 of 6 spent: %s, want none", got)
	}
}

// TestControlPlaneRateChangeKeepsSpent is TestSIGHUPRateChangeKeepsSpent
// through the control plane: the gateway process follows a real sync
// server, and a policy raised there from 3 to 6 a minute gives a key that
// spent 3 of 3 exactly 3 more.
func TestControlPlaneRateChangeKeepsSpent(t *testing.T) {
	store, cpAddr, _ := startControlPlane(t)
	putRate := func(perMinute int64) uint64 {
		t.Helper()
		rev, err := store.Update(context.Background(), func(tx controlplane.Tx) error {
			return tx.PutPolicy(spec.Policy{ID: "p", Rate: &spec.Rate{Requests: perMinute, Per: spec.Duration(time.Minute)}})
		})
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	rev := putRate(3)
	t.Setenv("LP_TEST_DP_TOKEN", "dp-token")
	file := writeConfig(t, fmt.Sprintf(`
admin: {listen: "127.0.0.1:0"}
control_plane:
  address: %q
  token_env: LP_TEST_DP_TOKEN
  group: dp1
  tags: [dp1]
`, cpAddr))
	_, stdout, stderr, base := startProcess(t, "-config", file)
	admin := regexp.MustCompile(`admin endpoint at (http://\S+)`).FindStringSubmatch(stdout.String())
	if admin == nil {
		t.Fatalf("no admin endpoint in banner:\n%s", stdout)
	}
	applied := regexp.MustCompile(`"applied_revision":(\d+)`)
	waitRevision := func(want uint64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			m := applied.FindStringSubmatch(get(t, nil, admin[1]+"/readyz").body)
			if m != nil && m[1] == fmt.Sprint(want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("revision %d not applied within 20s; stderr: %s", want, stderr)
			}
		}
	}
	waitRevision(rev)
	url := base + "/echo/x"
	if got := statuses(t, url, "k", 4); got != "[200 200 200 429]" {
		t.Fatalf("3 a minute: %s, want 3 of 4", got)
	}
	waitRevision(putRate(6))
	if got := statuses(t, url, "k", 4); got != "[200 200 200 429]" {
		t.Fatalf("raised to 6 a minute at the control plane with 3 spent: %s, want exactly 3 more", got)
	}
}
