package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/spec"
)

// TestSpecNamesAreTheFileNames checks that the file's travelling part is
// spec's types with spec's JSON names, so a file, an admin API and a
// control plane speak one vocabulary. The differences are deliberate: a
// file may give a key in plaintext (hashed at load, never in a snapshot),
// a snapshot has a revision, and a snapshot may carry an inline PEM public
// key or an inline HMAC secret that the file does not offer.
func TestSpecNamesAreTheFileNames(t *testing.T) {
	for _, tc := range []struct {
		file, spec any
		onlyFile   []string
		onlySpec   []string
	}{
		{file: rawConfig{}, spec: spec.Snapshot{}, onlySpec: []string{"revision"},
			onlyFile: []string{"listen", "store", "failure_policy", "store_timeout", "redis", "memory", "shadow", "client_ip", "server", "response", "admin", "control_plane", "drl", "threshold_webhook"}},
		{file: spec.Policy{}, spec: spec.Policy{}},
		{file: spec.Rate{}, spec: spec.Rate{}},
		{file: rawKey{}, spec: spec.Key{}, onlyFile: []string{"key"}},
		{file: spec.API{}, spec: spec.API{}},
		{file: spec.JWT{}, spec: spec.JWT{}},
		{file: spec.JWTKey{}, spec: spec.JWTKey{}, onlySpec: []string{"pem", "secret"}},
		{file: spec.JWKS{}, spec: spec.JWKS{}},
	} {
		var fileNames []string
		for _, f := range newLoader("").Fields(reflect.TypeOf(tc.file)) {
			fileNames = append(fileNames, f.Name)
		}
		specNames := tagNames(reflect.TypeOf(tc.spec), "json")
		var onlyFile, onlySpec []string
		for _, n := range fileNames {
			if !slices.Contains(specNames, n) {
				onlyFile = append(onlyFile, n)
			}
		}
		for _, n := range specNames {
			if !slices.Contains(fileNames, n) {
				onlySpec = append(onlySpec, n)
			}
		}
		if !slices.Equal(onlyFile, tc.onlyFile) || !slices.Equal(onlySpec, tc.onlySpec) {
			t.Errorf("%T / %T: only in the file %q (want %q), only in spec %q (want %q)",
				tc.file, tc.spec, onlyFile, tc.onlyFile, onlySpec, tc.onlySpec)
		}
	}
}

func tagNames(t reflect.Type, key string) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if !t.Field(i).IsExported() {
			continue // not part of the JSON (spec.Rate's record of an explicit zero burst)
		}
		names = append(names, strings.Split(t.Field(i).Tag.Get(key), ",")[0])
	}
	return names
}

// TestSpecValidateRunsOnFiles checks that a file is also checked by
// spec.Validate, with spec's problems placed at their line and column:
// repeated tags are refused by spec only.
func TestSpecValidateRunsOnFiles(t *testing.T) {
	doc := `policies:
  - id: p
    rate: {requests: 1, per: 1s}
keys:
  - key: k
    policies: [p]
apis:
  - id: a
    listen_path: /a/
    target: builtin:echo
    tags: [eu, eu]
`
	_, err := Parse("t.yaml", []byte(doc))
	if err == nil || err.Error() != `t.yaml:11:16: apis[0].tags[1]: tag "eu" is listed twice` {
		t.Fatalf("err = %v", err)
	}
	cfg, err := Parse("t.yaml", []byte(strings.Replace(doc, "[eu, eu]", "[eu, edge]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Snapshot.Validate(); err != nil || !slices.Equal(cfg.Snapshot.APIs[0].Tags, []string{"eu", "edge"}) {
		t.Fatalf("snapshot: %v, tags %q", err, cfg.Snapshot.APIs[0].Tags)
	}
}
