package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readme returns the repository's README.md.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// schemaPaths lists every field of the file format as the README's
// reference names it: policies[].rate.per, keys[].api_limits.<api id>.rate.
// The rate and quota blocks are listed in full once, under policies.
func schemaPaths(t reflect.Type, prefix string, seen map[reflect.Type]bool) []string {
	var out []string
	for _, f := range newLoader("").Fields(t) {
		p := prefix + f.Name
		out = append(out, p)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, schemaPaths(ft.Elem(), p+"[].", seen)...)
		case ft.Kind() == reflect.Map:
			out = append(out, schemaPaths(ft.Elem(), p+".<api id>.", seen)...)
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]() && !seen[ft]:
			seen[ft] = true
			out = append(out, schemaPaths(ft, p+".", seen)...)
		}
	}
	return out
}

// TestREADMEDocumentsEveryField fails when a config field is missing from
// the README's reference.
func TestREADMEDocumentsEveryField(t *testing.T) {
	doc := readme(t)
	paths := schemaPaths(reflect.TypeOf(rawConfig{}), "", map[reflect.Type]bool{})
	if len(paths) < 40 {
		t.Fatalf("only %d paths: %v", len(paths), paths)
	}
	for _, p := range paths {
		if !strings.Contains(doc, "| `"+p+"` |") {
			t.Errorf("README.md has no reference row for `%s`", p)
		}
	}
}

// TestREADMEExamples parses the README's complete example file, and checks
// that its example of a refused file shows the errors Parse really gives.
func TestREADMEExamples(t *testing.T) {
	doc := readme(t)
	full := regexp.MustCompile("(?s)A complete file[^\n]*\n\n```yaml\n(.*?)```").FindStringSubmatch(doc)
	if full == nil {
		t.Fatal("README.md: complete example file not found")
	}
	t.Setenv("REDIS_PASSWORD", "example") // the example's redis.password_env
	t.Setenv("LP_ADMIN_TOKEN", "example") // and its admin.token_env
	if _, err := Parse("README.md", []byte(full[1])); err != nil {
		t.Errorf("the README's complete example is refused:\n%v", err)
	}
	bad := regexp.MustCompile("(?s)this `gateway.yaml`:\n\n```yaml\n(.*?)```\n\n```\n\\$ go run ./cmd/limitplane-gateway -config gateway.yaml\n" +
		"gateway: invalid configuration, not starting:\n(.*?)\nexit status 1\n```").FindStringSubmatch(doc)
	if bad == nil {
		t.Fatal("README.md: refused example not found")
	}
	_, err := Parse("gateway.yaml", []byte(bad[1]))
	if err == nil || err.Error() != bad[2] {
		t.Errorf("README shows:\n%s\nParse gives:\n%v", bad[2], err)
	}
}
