package config_test

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/gateway/config"
)

var update = flag.Bool("update", false, "rewrite testdata/corpus.golden from what Parse answers now")

// TestCorpus parses every file of testdata/corpus.json (the files of this
// package's other tests and one for each of the loader's messages) and
// compares what Parse answers, every message with its line and column or
// every value of an accepted file, with testdata/corpus.golden byte for
// byte. It pins the messages while the loader's code changes. A change
// that is meant to alter them (a new field changes the "known here" lists
// and the values of accepted files) rewrites the golden file with
// go test ./gateway/config -run TestCorpus -update; review its diff.
func TestCorpus(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	var corpus []string
	if err := json.Unmarshal(data, &corpus); err != nil {
		t.Fatal(err)
	}
	golden, err := filepath.Abs(filepath.Join("testdata", "corpus.golden"))
	if err != nil {
		t.Fatal(err)
	}
	// The files the corpus names, relative to the file t.yaml.
	dir := keyFiles(t)
	writeCert(t, dir)
	for name, data := range map[string]string{"empty.secret": "\n", "big.secret": strings.Repeat("x", 1<<20+1), "pw.secret": "file-pw\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for name, val := range map[string]string{
		"LP_TEST_DP_TOKEN": "dp-token", "LP_TEST_ADMIN_TOKEN": "admin-token", "LP_ADMIN_TOKEN": "admin-token-2",
		"LP_TEST_DRL_TOKEN": "drl-token", "LP_REDIS_PW": "p@ss/w:rd", "REDIS_PASSWORD": "redis-pw",
		"LP_GOOD": strings.Repeat("g", 32), "LP_SECRET": strings.Repeat("s", 40), "LP_JWT_SECRET": strings.Repeat("j", 32),
		"JWT_SECRET": strings.Repeat("k", 32), "LP_SHORT": "short", "LP_EMPTY": "", "LP_TEST_EMPTY": "",
	} {
		t.Setenv(name, val)
	}
	var b strings.Builder
	for i, doc := range corpus {
		fmt.Fprintf(&b, "=== %d\n", i)
		cfg, err := config.Parse("t.yaml", []byte(doc))
		if err != nil {
			b.WriteString(err.Error())
		} else {
			b.WriteString(dump(reflect.ValueOf(cfg)))
		}
		b.WriteString("\n")
	}
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.SplitAfter(b.String(), "\n")
	wantLines := strings.SplitAfter(string(want), "\n")
	for i := range max(len(got), len(wantLines)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if g != w {
			t.Errorf("corpus.golden line %d:\n got %q\nwant %q", i+1, g, w)
		}
	}
}

// dump renders v with every exported field by name, maps in key order,
// pointers followed and a TLS configuration as what the file set of it.
func dump(v reflect.Value) string {
	if !v.IsValid() {
		return "<nil>"
	}
	switch x := v.Interface().(type) {
	case *tls.Config:
		if x == nil {
			return "nil"
		}
		return fmt.Sprintf("tls{min:%d server_name:%q certificates:%d roots:%v}", x.MinVersion, x.ServerName, len(x.Certificates), x.RootCAs != nil)
	case *slog.Logger:
		return fmt.Sprintf("logger(nil:%v)", x == nil)
	}
	switch v.Kind() {
	case reflect.Func:
		return fmt.Sprintf("func(nil:%v)", v.IsNil())
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "nil"
		}
		return "&" + dump(v.Elem())
	case reflect.Slice:
		if v.IsNil() {
			return "nil"
		}
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = dump(v.Index(i))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case reflect.Map:
		if v.IsNil() {
			return "nil"
		}
		var parts []string
		for _, k := range v.MapKeys() {
			parts = append(parts, dump(k)+":"+dump(v.MapIndex(k)))
		}
		sort.Strings(parts)
		return "map[" + strings.Join(parts, " ") + "]"
	case reflect.Struct:
		var parts []string
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				parts = append(parts, f.Name+":"+dump(v.Field(i)))
			}
		}
		if parts == nil {
			return fmt.Sprint(v.Interface())
		}
		return "{" + strings.Join(parts, " ") + "}"
	}
	return fmt.Sprintf("%#v", v.Interface())
}
