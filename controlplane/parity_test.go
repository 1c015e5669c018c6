package controlplane_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/gateway/config"
)

// TestAdminRefusesWhatTheFileRefuses: one rule set. Each policy below is
// written once as the gateway's YAML file and once as the admin API's
// JSON; the file's problems and the admin API's are the same, field for
// field and word for word.
func TestAdminRefusesWhatTheFileRefuses(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	for _, c := range []struct{ name, yaml, json string }{
		{"burst 0", `rate: {requests: 5, per: 1m, burst: 0}`, `{"rate":{"requests":5,"per":"1m","burst":0}}`},
		{"negative burst", `rate: {requests: 5, per: 1m, burst: -1}`, `{"rate":{"requests":5,"per":"1m","burst":-1}}`},
		{"requests missing", `rate: {per: 1m}`, `{"rate":{"per":"1m"}}`},
		{"requests 0", `rate: {requests: 0, per: 1m}`, `{"rate":{"requests":0,"per":"1m"}}`},
		{"per missing", `rate: {requests: 5}`, `{"rate":{"requests":5}}`},
		{"per 0s", `rate: {requests: 5, per: 0s}`, `{"rate":{"requests":5,"per":"0s"}}`},
		{"per negative", `rate: {requests: 5, per: -1s}`, `{"rate":{"requests":5,"per":"-1s"}}`},
		{"unknown algorithm", `rate: {requests: 5, per: 1m, algorithm: leaky}`, `{"rate":{"requests":5,"per":"1m","algorithm":"leaky"}}`},
		{"max missing", `quota: {renewal: 1h}`, `{"quota":{"renewal":"1h"}}`},
		{"max 0", `quota: {max: 0, renewal: 1h}`, `{"quota":{"max":0,"renewal":"1h"}}`},
		{"renewal missing", `quota: {max: 5}`, `{"quota":{"max":5}}`},
		{"renewal 0s", `quota: {max: 5, renewal: 0s}`, `{"quota":{"max":5,"renewal":"0s"}}`},
		{"rate finer than 1ns", `rate: {requests: 2000000000, per: 1s}`, `{"rate":{"requests":2000000000,"per":"1s"}}`},
	} {
		file := "policies:\n  - id: p\n    " + c.yaml + "\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n"
		_, err := config.Parse("t.yaml", []byte(file))
		var fileErrs config.Errors
		if !errors.As(err, &fileErrs) {
			t.Fatalf("%s: the file: %v", c.name, err)
		}
		var want []string
		for _, e := range fileErrs {
			want = append(want, strings.TrimPrefix(e.Field, "policies[0]")+": "+e.Problem)
		}
		a := call(t, "PUT", base+"/api/policies/p", c.json)
		var body struct {
			Problems []struct{ Path, Problem string }
		}
		if err := json.Unmarshal([]byte(a.body), &body); err != nil || a.status != 422 {
			t.Fatalf("%s: the admin API: %d %s", c.name, a.status, a.body)
		}
		var got []string
		for _, p := range body.Problems {
			got = append(got, strings.TrimPrefix(p.Path, `policies["p"]`)+": "+p.Problem)
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:\nadmin API %q\nthe file  %q", c.name, got, want)
		}
	}
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)
}
