package config_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/gateway/config"
)

// TestDRLSection: every field of the drl section, the defaults, the group
// taken from control_plane, and distributed on a policy, in the Config and
// in the snapshot that travels.
func TestDRLSection(t *testing.T) {
	const doc = "store: redis://r:6379/0\n" +
		"drl:\n  group: dp7\n  interval: 250ms\n  max_gateways: 8\n  join_reserve: 2\n  headroom: 0.1\n" +
		"policies:\n  - id: shared\n    rate: {requests: 1000, per: 1s, burst: 100}\n    distributed: true\n  - id: plain\n    rate: {requests: 5, per: 1s}\n" + api
	cfg, err := config.Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.DRL{Group: "dp7", Interval: 250 * time.Millisecond, MaxGateways: 8, JoinReserve: 2, Headroom: 0.1}
	if !reflect.DeepEqual(cfg.DRL, want) {
		t.Errorf("DRL = %+v, want %+v", cfg.DRL, want)
	}
	wantPolicies := []core.Policy{
		{ID: "shared", Rate: core.Limit{Rate: 1000, Period: time.Second, Burst: 100}, Distributed: true},
		{ID: "plain", Rate: core.Limit{Rate: 5, Period: time.Second}},
	}
	b, err := json.Marshal(cfg.Snapshot.Policies)
	if err != nil {
		t.Fatal(err)
	}
	if w := `[{"id":"shared","rate":{"requests":1000,"per":"1s","burst":100},"distributed":true},{"id":"plain","rate":{"requests":5,"per":"1s"}}]`; string(b) != w {
		t.Errorf("snapshot policies:\n got %s\nwant %s", b, w)
	}
	if got := cfg.Snapshot.CorePolicies(); !reflect.DeepEqual(got, wantPolicies) {
		t.Errorf("snapshot's core policies = %+v, want %+v", got, wantPolicies)
	}

	cfg, err = config.Parse("t.yaml", []byte("store: redis://r\ndrl: {}\n"+api))
	if err != nil {
		t.Fatal(err)
	}
	def := &config.DRL{Group: "default", Interval: time.Second, MaxGateways: 32, JoinReserve: 1, Headroom: 0.02}
	if !reflect.DeepEqual(cfg.DRL, def) {
		t.Errorf("drl: {} = %+v, want the defaults %+v", cfg.DRL, def)
	}
	cfg, err = config.Parse("t.yaml", []byte("store: redis://r\n"+api))
	if err != nil || cfg.DRL != nil {
		t.Errorf("no drl section: DRL = %+v, %v; want nil", cfg.DRL, err)
	}

	t.Setenv("LP_TEST_DRL_TOKEN", "tok")
	cp := "store: redis://r\ncontrol_plane: {address: 127.0.0.1:7071, token_env: LP_TEST_DRL_TOKEN, group: dp1}\n"
	cfg, err = config.Parse("t.yaml", []byte(cp+"drl: {interval: 2s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DRL == nil || cfg.DRL.Group != "dp1" || cfg.DRL.Interval != 2*time.Second {
		t.Errorf("drl under control_plane: %+v, want group dp1 (the control plane's), interval 2s", cfg.DRL)
	}
	cfg, err = config.Parse("t.yaml", []byte(cp+"drl: {group: own}\n"))
	if err != nil || cfg.DRL.Group != "own" {
		t.Errorf("drl.group beside control_plane.group: %+v, %v; want own", cfg.DRL, err)
	}
}

// TestDRLRefusals: the exact message, line and column of every problem of
// a drl section or a distributed flag.
func TestDRLRefusals(t *testing.T) {
	const redis = "store: redis://r\n"
	cases := []struct{ name, yaml, want string }{
		{"memory store", "drl: {}\n" + api, `t.yaml:1:6: drl: needs a redis store (store: redis://host:port/db): the gateways of a data plane share their demand and shares through it`},
		{"explicit memory store", "store: memory\ndrl:\n  interval: 1s\n" + api, `t.yaml:3:3: drl: needs a redis store (store: redis://host:port/db): the gateways of a data plane share their demand and shares through it`},
		{"group with a brace", redis + "drl: {group: \"a{b}\"}\n" + api, `t.yaml:2:14: drl.group: "a{b}": want 1 to 128 characters without spaces, control characters, "{" or "}" (it names a Cluster hash tag)`},
		{"group with a space", redis + "drl: {group: \"a b\"}\n" + api, `t.yaml:2:14: drl.group: "a b": want 1 to 128 characters without spaces, control characters, "{" or "}" (it names a Cluster hash tag)`},
		{"interval not a duration", redis + "drl: {interval: soon}\n" + api, `t.yaml:2:17: drl.interval: "soon" is not a duration (like 500ms, 1s or 2s)`},
		{"interval too short", redis + "drl: {interval: 1ms}\n" + api, `t.yaml:2:17: drl.interval: 1ms: want 10ms to 1m0s`},
		{"interval too long", redis + "drl: {interval: 2m}\n" + api, `t.yaml:2:17: drl.interval: 2m: want 10ms to 1m0s`},
		{"zero max_gateways", redis + "drl: {max_gateways: 0}\n" + api, `t.yaml:2:21: drl.max_gateways: 0: want 1 to 1024`},
		{"too many gateways", redis + "drl: {max_gateways: 5000}\n" + api, `t.yaml:2:21: drl.max_gateways: 5000: want 1 to 1024`},
		{"max_gateways a fraction", redis + "drl: {max_gateways: 2.5}\n" + api, `t.yaml:2:21: drl.max_gateways: want an integer, got 2.5`},
		{"negative join_reserve", redis + "drl: {join_reserve: -1}\n" + api, `t.yaml:2:21: drl.join_reserve: -1 must be >= 0`},
		{"join_reserve as large as max_gateways", redis + "drl: {max_gateways: 4, join_reserve: 4}\n" + api,
			`t.yaml:2:38: drl.join_reserve: 4 must be below max_gateways (4): the reserved floors would leave nothing to share`},
		{"negative headroom", redis + "drl: {headroom: -0.1}\n" + api, `t.yaml:2:17: drl.headroom: -0.1: want 0 to 10 (a fraction of demand: 0.02 is 2%)`},
		{"headroom not a number", redis + "drl: {headroom: lots}\n" + api, `t.yaml:2:17: drl.headroom: want a number, got "lots"`},
		// The test switch that breaks the bound is no field of the file.
		{"the unsafe test switch", redis + "drl: {unsafe_grows_before_shrinks: true}\n" + api,
			`t.yaml:2:7: drl.unsafe_grows_before_shrinks: unknown field (known here: group, interval, max_gateways, join_reserve, headroom)`},
		{"unknown drl field", redis + "drl: {intervall: 1s}\n" + api,
			`t.yaml:2:7: drl.intervall: unknown field (known here: group, interval, max_gateways, join_reserve, headroom)`},
		{"drl is a list", redis + "drl: [1s]\n" + api, `t.yaml:2:6: drl: want a mapping, got a list`},
		{"distributed not a bool", "policies:\n  - {id: p, rate: {requests: 5, per: 1s}, distributed: yes please}\n" + api,
			`t.yaml:2:56: policies[0].distributed: want true or false, got "yes please"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("t.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error:\n got: %s\nwant: %s", got, tc.want)
			}
			if n := strings.Count(err.Error(), "\n"); n != 0 {
				t.Errorf("%d extra problems reported", n)
			}
		})
	}
}

// TestDRLNone: a join_reserve or headroom of 0 in the file is none, which
// drl.Options (config.DRL) says with -1.
func TestDRLNone(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte("store: redis://r\ndrl: {join_reserve: 0, headroom: 0}\n"+api))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.DRL{Group: "default", Interval: time.Second, MaxGateways: 32, JoinReserve: -1, Headroom: -1}
	if !reflect.DeepEqual(cfg.DRL, want) {
		t.Errorf("DRL = %+v, want %+v", cfg.DRL, want)
	}
}
