package controlplane

import (
	"strings"
	"testing"
)

func TestDuplicateMember(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"a":1,"b":2}`, ""},
		{`{"a":1,"a":2}`, "a"},
		{`{"a":{"b":1},"c":{"b":1}}`, ""},
		{`{"a":{"b":1,"b":{}}}`, "a.b"},
		{`{"keys":[{"key":"x"},{"key":"y","policies":[],"key":"z"}]}`, "keys[1].key"},
		{`{"keys":[[{"a":1}],[{"a":1,"a":1}]]}`, "keys[1][0].a"},
		{`{"api_limits":{"Orders":{},"Orders":{}}}`, `api_limits."Orders"`},
		{`[{"a":[]},{"a":[1,{"b":1,"b":2}]}]`, "[1].a[1].b"},
		{`{"a":"{\"b\":1,\"b\":1}"}`, ""},
		// encoding/json matches names without regard to case: "Requests"
		// after "requests" would replace it, last wins.
		{`{"rate":{"requests":5,"per":"1m","Requests":99}}`, `rate."Requests"`},
		{`{"policies":[{"id":"a"}],"Policies":[{"id":"b"}]}`, `"Policies"`},
		{`{"s":1,"ſ":2}`, `"ſ"`}, // ſ folds to s, as encoding/json folds it
	} {
		got, err := duplicateMember([]byte(c.doc))
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.doc, got, err, c.want)
		}
	}
	if _, err := duplicateMember([]byte(`{"a":`)); err == nil {
		t.Error("truncated document: no error")
	}
}

func TestValuePath(t *testing.T) {
	for _, c := range []struct{ doc, field, want string }{
		{`{"rate":{"requests":1,"per":3}}`, "rate.per", "rate.per"},
		{`{"policies":[{"rate":{"per":"1s"}},{"rate":{"per":3}}]}`, "policies.rate.per", "policies[1].rate.per"},
		{`{"api_limits":{"a":{"rate":{"per":"1s"}},"B c":{"rate":{"per":{}}}}}`, "api_limits.rate.per", `api_limits."B c".rate.per`},
		{`{"keys":[{"api_limits":{"eu":{"quota":{"renewal":[1]}}}}]}`, "keys.api_limits.quota.renewal", "keys[0].api_limits.eu.quota.renewal"},
		{`{"rate":{"per":"1s"}}`, "rate.per", "rate.per"}, // none found: the field as given
	} {
		if got := valuePath([]byte(c.doc), c.field); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.doc, c.field, got, c.want)
		}
	}
}

// TestDuplicateMemberTooDeep: a body nested 100,000 deep (200 KB) once
// built paths of some 15 GB; past maxNesting it is refused at once, and at
// maxNesting it is still read.
func TestDuplicateMemberTooDeep(t *testing.T) {
	deep := `{"rate":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	if _, err := duplicateMember([]byte(deep)); err != errTooDeep {
		t.Fatalf("100,000 deep: %v, want errTooDeep", err)
	}
	ok := strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting)
	if dup, err := duplicateMember([]byte(ok)); err != nil || dup != "" {
		t.Fatalf("%d deep: %q, %v, want no duplicate and no error", maxNesting, dup, err)
	}
	if got := valuePath([]byte(deep), "rate.x"); got != "" {
		t.Fatalf("valuePath of a 100,000-deep body: %q, want \"\"", got)
	}
}
