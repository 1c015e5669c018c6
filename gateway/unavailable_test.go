package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/spec"
)

// TestKeyReadsTheRunningRegistry: Key returns the applied version of a
// key in any case of its hash, then the version UpdateKeys put, and nil
// for a deleted key, an unknown or malformed hash, and before Apply.
func TestKeyReadsTheRunningRegistry(t *testing.T) {
	g := newTestGateway(t)
	if k := g.gw.Key(keyHash("k1")); k != nil {
		t.Fatalf("before Apply: %+v", k)
	}
	g.apply(t, basic(1, spec.BuiltinEcho, nil, perHour(3)))
	k := g.gw.Key("sha256:" + strings.ToUpper(keyHash("k1")[len("sha256:"):]))
	if k == nil || k.KeyHash != keyHash("k1") || len(k.Policies) != 1 || k.Policies[0] != "p" || k.Inactive {
		t.Fatalf("applied k1: %+v", k)
	}
	g.updateKeys(t, 2, []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"p"}, Inactive: true}, {KeyHash: keyHash("k2"), Policies: []string{"p"}}}, nil)
	if k := g.gw.Key(keyHash("k1")); k == nil || !k.Inactive {
		t.Fatalf("k1 after UpdateKeys: %+v, want inactive", k)
	}
	if k := g.gw.Key(keyHash("k2")); k == nil || k.KeyHash != keyHash("k2") {
		t.Fatalf("k2 after UpdateKeys: %+v", k)
	}
	g.updateKeys(t, 3, nil, []string{keyHash("k1")})
	for _, h := range []string{keyHash("k1"), keyHash("never"), "sha256:xyz", ""} {
		if k := g.gw.Key(h); k != nil {
			t.Errorf("Key(%q) = %+v, want nil", h, k)
		}
	}
}

// TestSetUnavailable: while set, every API request (with a valid key or
// none, on a route or not) is 503 with the reason in JSON and spends no
// quota; /readyz is 503 with the reason and the control-plane hook's
// value; lifting it serves again with the counters as they were.
func TestSetUnavailable(t *testing.T) {
	rig := newRig(t, rigOptions{admin: gateway.AdminOptions{ReadsWithoutToken: true,
		ControlPlane: func() any { return map[string]any{"state": "disconnected"} }}})
	if err := rig.gw.Apply(context.Background(), adminSnapshot(t, 4)); err != nil {
		t.Fatal(err)
	}
	checkStatuses(t, "before", statuses(t, 2, rig.base+"/echo/x", "X-API-Key", "k-quota"), []int{200, 200})
	const reason = "dataplane: no contact with the control plane for 1m0s; failing closed (on_stale: fail_closed)"
	rig.gw.SetUnavailable(reason)
	if got := rig.gw.Unavailable(); got != reason {
		t.Fatalf("Unavailable() = %q", got)
	}
	for _, path := range []string{"/echo/x", "/nowhere"} {
		a := call(t, "GET", rig.base+path, "X-API-Key", "k-quota")
		want(t, "unavailable "+path, a, 503, `{"error":"`+reason+`"}`)
	}
	want(t, "readyz unavailable", call(t, "GET", rig.admin+"/readyz"), 503,
		`{"ready":false,"revision":4,"failure_policy":"open","error":"`+reason+`","control_plane":{"state":"disconnected"}}`)
	rig.gw.SetUnavailable("")
	if got := rig.gw.Unavailable(); got != "" {
		t.Fatalf("Unavailable() after lifting = %q", got)
	}
	want(t, "readyz lifted", call(t, "GET", rig.admin+"/readyz"), 200,
		`{"ready":true,"revision":4,"store":"in-process","failure_policy":"open","control_plane":{"state":"disconnected"}}`)
	// k-quota has a quota of 3 a day: 2 spent before, none while
	// unavailable, so exactly 1 more passes.
	checkStatuses(t, "after", statuses(t, 2, rig.base+"/echo/x", "X-API-Key", "k-quota"), []int{200, 429})
}
