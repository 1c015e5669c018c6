package yamlfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

type inner struct {
	N uint8   `json:"n"`
	F float64 `json:"f"`
}

type doc struct {
	Name   string         `json:"name"`
	Wait   *time.Duration `json:"wait"`
	At     time.Time      `json:"at"`
	Inner  inner          `json:"inner"`
	List   []inner        `json:"list"`
	Tags   []string       `json:"tags"`
	Secret string         `json:"secret"`
}

// newFile returns a File over doc: wait is a duration, secret is omitted.
func newFile() *File {
	return &File{Name: "f.yaml", Empty: "empty",
		Omit: map[reflect.Type][]string{reflect.TypeFor[doc](): {"secret"}},
		Scalars: map[reflect.Type]Scalar{reflect.TypeFor[time.Duration](): {Parse: func(path, s string) (any, string) {
			d, err := time.ParseDuration(s)
			if err != nil {
				return nil, "not a duration"
			}
			return d, ""
		}}}}
}

// Every problem of shape is reported at its line and column with its
// field path; an anchor's problems are reported once however often
// merges and aliases bring them.
func TestDecode(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"name: a\nwait: 2s\n", ""},
		{"", "f.yaml: empty"},
		{"name: [a\n", "f.yaml:1:8: YAML syntax: did not find expected ',' or ']'"},
		{"- a\n", "f.yaml:1:1: want a mapping, got a list"},
		{"nme: a\nsecret: x\n", "f.yaml:1:1: nme: unknown field (known here: name, wait, at, inner, list, tags)\n" +
			"f.yaml:2:1: secret: unknown field (known here: name, wait, at, inner, list, tags)"},
		{"name: a\nname: b\n", "f.yaml:2:1: name: given twice (first at line 1)"},
		{"wait: soon\nat: today\n", "f.yaml:1:7: wait: not a duration\nf.yaml:2:5: at: \"today\" is not an RFC 3339 time (like 2027-01-31T00:00:00Z)"},
		{"inner: {n: 256, f: .nan}\n", "f.yaml:1:12: inner.n: 256 is too large (above 255)\nf.yaml:1:20: inner.f: want a finite number, got .nan"},
		{"inner: {n: -1}\nlist: [{n: 1.5}]\ntags: x\n", "f.yaml:1:12: inner.n: want an integer ≥ 0, got -1\n" +
			"f.yaml:2:12: list[0].n: want an integer, got 1.5\nf.yaml:3:7: tags: want a list of strings, got \"x\""},
		{"base: &b {n: x}\n", "f.yaml:1:1: base: unknown field (known here: name, wait, at, inner, list, tags)"},
		{"list: [&b {n: 1}, {<<: *b, f: x}]\n", "f.yaml:1:31: list[1].f: want a number, got \"x\""},
		{"list: [&b {n: 1, f: x}, {<<: *b}, {<<: *b, n: 2}]\n", "f.yaml:1:21: list[0].f: want a number, got \"x\""}, // once, at the anchor
		// An empty entry is refused where it is, and the entries after
		// it keep their index.
		{"list:\n  -\n  - {n: x}\ntags: [~, a]\n", "f.yaml:2:4: list[0]: an empty entry (a lone \"-\" or ~): remove it or give it a value\n" +
			"f.yaml:3:9: list[1].n: want an integer, got \"x\"\nf.yaml:4:8: tags[0]: an empty entry (a lone \"-\" or ~): remove it or give it a value"},
		// Integers as they read: no octal, hexadecimal or underscores.
		{"inner: {n: 017}\n", "f.yaml:1:12: inner.n: want a decimal integer without leading zeros, got 017"},
		{"inner: {n: 0x10, f: 1_000}\n", "f.yaml:1:12: inner.n: want a decimal integer without leading zeros, got 0x10\n" +
			"f.yaml:1:21: inner.f: want a decimal integer without leading zeros, got 1_000"},
		{"inner: {n: 0, f: -10}\n", ""},
		{"inner: {n: +7}\n", ""},
		// One document: a second is refused, a leading or trailing
		// "---" is fine.
		{"name: a\n---\nname: b\n", "f.yaml:3:1: a second YAML document (after ---): a file holds one"},
		{"---\nname: a\n", ""},
		{"name: a\n---\n", ""},
		{"name: a\n...\n", ""},
	} {
		f := newFile()
		var d doc
		f.Decode([]byte(c.yaml), &d)
		got := ""
		if err := f.Err(); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.yaml, got, c.want)
		}
	}
}

// Decode fills the target; Report places a check's problem at its field,
// a missing one at its nearest ancestor, and says nothing of a refused
// value or of a missing field beside one.
func TestReport(t *testing.T) {
	f := newFile()
	d := doc{Name: "default"}
	if !f.Decode([]byte("wait: 1m\nlist:\n  - {n: 3}\n  - {n: x}\n"), &d) {
		t.Fatal(f.Errs)
	}
	if d.Name != "default" || *d.Wait != time.Minute || len(d.List) != 2 || d.List[0].N != 3 {
		t.Fatalf("decoded %+v", d)
	}
	f.Report("list[0].n", "too few", false, "")
	f.Report("list[0].f", "required", true, "")
	f.Report("list[1].n", "echo", false, "")
	f.Report("list[1].f", "echo", true, "")
	f.Report("list[0].n", "too few", false, "") // once
	want := "f.yaml:3:5: list[0].f: required\nf.yaml:3:9: list[0].n: too few\nf.yaml:4:9: list[1].n: want an integer, got \"x\""
	var errs Errors
	if err := f.Err(); !errors.As(err, &errs) || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	if !f.Refused("list[1].n") || f.Refused("list[0].n") || !strings.Contains(errs[0].Error(), ":3:5:") {
		t.Fatal("Refused")
	}
}
