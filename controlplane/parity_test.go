package controlplane_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/gateway/config"
)

// parityCase is one object written as the gateway's YAML file and as the
// admin API's JSON.
type parityCase struct{ name, yaml, json string }

// sameProblems checks that the gateway's file refuses each case's file
// (the YAML object placed at filePrefix in a file) with the problems the
// admin API gives for a PUT of its JSON to url, field for field (paths
// after fileAt and adminAt, the object's own path in each) and word for
// word.
func sameProblems(t *testing.T, url, file, fileAt, adminAt string, cases []parityCase) {
	t.Helper()
	for _, c := range cases {
		_, err := config.Parse("t.yaml", []byte(strings.Replace(file, "OBJECT", c.yaml, 1)))
		var fileErrs config.Errors
		if !errors.As(err, &fileErrs) {
			t.Fatalf("%s: the file: %v", c.name, err)
		}
		var want []string
		for _, e := range fileErrs {
			want = append(want, strings.TrimPrefix(e.Field, fileAt)+": "+e.Problem)
		}
		a := call(t, "PUT", url, c.json)
		var body struct {
			Problems []struct{ Path, Problem string }
		}
		if err := json.Unmarshal([]byte(a.body), &body); err != nil || a.status != 422 {
			t.Fatalf("%s: the admin API: %d %s", c.name, a.status, a.body)
		}
		var got []string
		for _, p := range body.Problems {
			got = append(got, strings.TrimPrefix(p.Path, adminAt)+": "+p.Problem)
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:\nadmin API %q\nthe file  %q", c.name, got, want)
		}
	}
}

// TestAdminRefusesWhatTheFileRefuses: one rule set. Each policy and API
// below is written once as the gateway's YAML file and once as the admin
// API's JSON; the file's problems and the admin API's are the same, field
// for field and word for word, and nothing is written. (A duration in a
// problem is written as the file has it there and as time.Duration
// formats it here: "-1m" and "-1m0s"; the cases use the canonical form.)
func TestAdminRefusesWhatTheFileRefuses(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	sameProblems(t, base+"/api/policies/p", "policies:\n  - id: p\n    OBJECT\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n",
		"policies[0]", `policies["p"]`, []parityCase{
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
			{"unlimited with per 0s", `rate: {requests: -1, per: 0s}`, `{"rate":{"requests":-1,"per":"0s"}}`},
			{"unlimited with negative per", `rate: {requests: -1, per: -1m0s}`, `{"rate":{"requests":-1,"per":"-1m0s"}}`},
			{"unlimited with negative renewal", `quota: {max: -1, renewal: -2s}`, `{"quota":{"max":-1,"renewal":"-2s"}}`},
			{"rate finer than 1ns", `rate: {requests: 2000000000, per: 1s}`, `{"rate":{"requests":2000000000,"per":"1s"}}`},
		})
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":0}`)

	// APIs, against a store holding the policy the file holds.
	expect(t, call(t, "PUT", base+"/api/policies/p", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":1}`)
	const jwks = `jwks: {url: "https://idp.example/jwks"}, default_policies: [p]`
	const jwksJSON = `"jwks":{"url":"https://idp.example/jwks"},"default_policies":["p"]`
	sameProblems(t, base+"/api/apis/a", "policies:\n  - {id: p, rate: {requests: 5, per: 1m}}\napis:\n  - OBJECT\n",
		"apis[0]", `apis["a"]`, []parityCase{
			{"listen path without /", `{id: a, listen_path: orders, target: "builtin:echo"}`, `{"listen_path":"orders","target":"builtin:echo"}`},
			{"listen path not clean", `{id: a, listen_path: /a/../b/, target: "builtin:echo"}`, `{"listen_path":"/a/../b/","target":"builtin:echo"}`},
			{"target", `{id: a, listen_path: /a/, target: "ftp://x"}`, `{"listen_path":"/a/","target":"ftp://x"}`},
			{"target with credentials", `{id: a, listen_path: /a/, target: "https://u:p@x"}`, `{"listen_path":"/a/","target":"https://u:p@x"}`},
			{"auth", `{id: a, listen_path: /a/, target: "builtin:echo", auth: basic}`, `{"listen_path":"/a/","target":"builtin:echo","auth":"basic"}`},
			{"keyless without policies", `{id: a, listen_path: /a/, target: "builtin:echo", auth: keyless}`, `{"listen_path":"/a/","target":"builtin:echo","auth":"keyless"}`},
			{"api_key with policies", `{id: a, listen_path: /a/, target: "builtin:echo", policies: [p]}`, `{"listen_path":"/a/","target":"builtin:echo","policies":["p"]}`},
			{"jwt without jwt", `{id: a, listen_path: /a/, target: "builtin:echo", auth: jwt}`, `{"listen_path":"/a/","target":"builtin:echo","auth":"jwt"}`},
			{"keyless strips", `{id: a, listen_path: /a/, target: "builtin:echo", auth: keyless, policies: [p], strip_auth_data: true}`,
				`{"listen_path":"/a/","target":"builtin:echo","auth":"keyless","policies":["p"],"strip_auth_data":true}`},
			{"failure limit unknown policy", `{id: a, listen_path: /a/, target: "builtin:echo", failure_limit: {policy: q}}`,
				`{"listen_path":"/a/","target":"builtin:echo","failure_limit":{"policy":"q"}}`},
			{"jwks refresh 0s", `{id: a, listen_path: /a/, target: "builtin:echo", auth: jwt, jwt: {algorithms: [RS256], jwks: {url: "https://idp.example/jwks", refresh_interval: 0s}, default_policies: [p]}}`,
				`{"listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["RS256"],"jwks":{"url":"https://idp.example/jwks","refresh_interval":"0s"},"default_policies":["p"]}}`},
			{"jwt none", `{id: a, listen_path: /a/, target: "builtin:echo", auth: jwt, jwt: {algorithms: [none], ` + jwks + `}}`,
				`{"listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["none"],` + jwksJSON + `}}`},
			{"jwks over http", `{id: a, listen_path: /a/, target: "builtin:echo", auth: jwt, jwt: {algorithms: [RS256], jwks: {url: "http://idp.example/jwks"}, default_policies: [p]}}`,
				`{"listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["RS256"],"jwks":{"url":"http://idp.example/jwks"},"default_policies":["p"]}}`},
			{"negative leeway", `{id: a, listen_path: /a/, target: "builtin:echo", auth: jwt, jwt: {algorithms: [RS256], ` + jwks + `, leeway: -1s}}`,
				`{"listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["RS256"],` + jwksJSON + `,"leeway":"-1s"}}`},
			{"tags", `{id: a, listen_path: /a/, target: "builtin:echo", tags: ["", eu, eu]}`, `{"listen_path":"/a/","target":"builtin:echo","tags":["","eu","eu"]}`},
		})
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":1}`)
}
