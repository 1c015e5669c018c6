// Package yamlfile decodes a YAML file strictly into Go types and reports
// every problem at its file:line:col: the gateway's configuration file
// and the control plane's -dataplanes file.
//
// A file is decoded by walking its YAML nodes against the target type (a
// struct's fields are its json names), reporting every problem of shape
// at its node: a value of the wrong type, an unknown or repeated field, a
// fraction where an integer goes, an integer the field cannot hold. What
// decoded is built into JSON and read into the target, so that checks can
// judge it, and the File keeps where each field is (by path, such as
// policies[1].rate.per) to place their problems too (Report). A value
// that did not decode is left out, and what checks say about it or its
// object is not reported twice (see Report).
package yamlfile

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a file.
type Error struct {
	// File is the file's name (File.Name).
	File string
	// Line and Column locate the problem, 1-based; 0 when unknown.
	Line, Column int
	// Field is the path of the offending field, like
	// "policies[1].rate.per"; "" for the file as a whole.
	Field string
	// Problem says what is wrong.
	Problem string
}

// Error formats the problem as "file:line:column: field: problem".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// Errors is every problem found in a file, in file order as far as
// possible. It is never empty when returned as an error.
type Errors []*Error

// Error returns the problems one per line.
func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Scalar decodes one type from a scalar's text (see File.Scalars).
type Scalar struct {
	// Parse returns what the JSON holds for the text at path, or a
	// problem ("" for none).
	Parse func(path, text string) (any, string)
	// Alone says that a value Parse refuses leaves the other fields of its
	// object certain: a check saying one of them is missing is no echo.
	Alone bool
}

// File decodes one file and collects its problems. Set Name (and the
// options) and call Decode first; the checks then report with Report.
type File struct {
	// Name is the file's name in messages.
	Name string
	// Omit lists, by struct type, the json names of its fields that a
	// file may not give.
	Omit map[reflect.Type][]string
	// Scalars decode the types they name from a scalar's text (durations,
	// say); a time.Time is an RFC 3339 time without one.
	Scalars map[reflect.Type]Scalar
	// Empty is the problem reported for a file with no document; "" lets
	// it decode to the target as it is.
	Empty string
	// Errs are the problems found so far (see Err).
	Errs Errors

	seen   map[reported]bool
	active map[*yaml.Node]bool // aliases being followed
	outer  *yaml.Node          // the outermost of them
	nodes  int                 // decoded through aliases
	// places maps a field's path to where it is in the file.
	places map[string]Place
	// refusals are the paths of values that did not decode, left out of
	// the JSON: what the checks say about them or below them is an
	// echo. uncertain are the objects (by path) with a refused value or
	// an unknown field among their own: a required field missing there
	// may well be the one refused or misspelled.
	refusals  []string
	uncertain map[string]bool
}

// Place is where a field is in the file: the node its problems are placed
// at (its value or, for a field that came through an alias or a merge,
// the alias) and the node its text decoded from.
type Place struct{ At, Text *yaml.Node }

// reported is a problem at a node: an anchor's text is decoded at every
// alias to it, and its problems are reported once.
type reported struct {
	n       *yaml.Node
	problem string
}

// Field is one field of a file's schema.
type Field struct {
	// Name is its json name.
	Name string
	// Type is its Go type.
	Type reflect.Type
}

// Fields lists the file's fields of the struct type t, in order: their
// json names, embedded structs' fields in their place, those Omit names
// left out.
func (f *File) Fields(t reflect.Type) []Field {
	var out []Field
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name := strings.Split(sf.Tag.Get("json"), ",")[0]
		switch {
		case sf.Anonymous:
			out = append(out, f.Fields(sf.Type)...)
		case !sf.IsExported() || name == "-" || slices.Contains(f.Omit[t], name):
		default:
			out = append(out, Field{name, sf.Type})
		}
	}
	return out
}

// maxNodes bounds the nodes a file decodes through aliases: an alias bomb
// would otherwise decode to more than memory holds.
const maxNodes = 1 << 16

// Decode parses data and decodes it into into (a pointer; what the file
// leaves out keeps its value), reporting every problem of shape. It
// returns false when into holds nothing of the file: data is not YAML at
// all, or is empty and Empty is set.
func (f *File) Decode(data []byte, into any) bool {
	f.seen, f.active, f.places, f.uncertain = map[reported]bool{}, map[*yaml.Node]bool{}, map[string]Place{}, map[string]bool{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil && err != io.EOF {
		f.Errs = append(f.Errs, syntaxError(f.Name, data, err))
		return false
	}
	if extra := secondDocument(dec); extra != nil {
		// Only the first document is decoded: what follows "---" would
		// be left out without a word.
		f.Errs = append(f.Errs, &Error{File: f.Name, Line: extra.Line, Column: extra.Column,
			Problem: "a second YAML document (after ---): a file holds one"})
	}
	if len(root.Content) == 0 {
		if f.Empty != "" {
			f.Errs = append(f.Errs, &Error{File: f.Name, Problem: f.Empty})
		}
		return f.Empty == ""
	}
	x, _ := f.value(root.Content[0], reflect.TypeOf(into).Elem(), "")
	if x != nil {
		b, err := json.Marshal(x)
		if err == nil {
			err = json.Unmarshal(b, into)
		}
		if err != nil { // the decoder let through what the types refuse
			f.Errs = append(f.Errs, &Error{File: f.Name, Problem: err.Error()})
			return false
		}
	}
	return true
}

// secondDocument returns the node of the next document dec holds, past
// the first, or nil when there is none, it is empty or it does not parse.
func secondDocument(dec *yaml.Decoder) *yaml.Node {
	var doc yaml.Node
	if dec.Decode(&doc) != nil {
		return nil
	}
	if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		return nil // a "---" with nothing after it
	}
	return doc.Content[0]
}

// Err returns the problems, in file order, or nil when there are none.
func (f *File) Err() error {
	if len(f.Errs) == 0 {
		return nil
	}
	slices.SortStableFunc(f.Errs, func(a, b *Error) int { return cmp.Or(a.Line-b.Line, a.Column-b.Column) })
	return f.Errs
}

// failAt reports a problem of decoding at n.
func (f *File) failAt(n *yaml.Node, path, format string, args ...any) {
	k := reported{n, fmt.Sprintf(format, args...)}
	if !f.seen[k] {
		f.seen[k] = true
		f.Errs = append(f.Errs, &Error{File: f.Name, Line: n.Line, Column: n.Column, Field: path, Problem: k.problem})
	}
}

// refuse reports a value that did not decode.
func (f *File) refuse(n *yaml.Node, path, format string, args ...any) {
	f.failAt(n, path, format, args...)
	f.refusals = append(f.refusals, path)
	f.uncertain[parent(path)] = true
}

// value decodes n, the value at path, as a t; ok is false when it is null
// (left out) or refused.
func (f *File) value(n *yaml.Node, t reflect.Type, path string) (x any, ok bool) {
	at := n // where a problem of the value as a whole is reported: the alias
	if f.outer == nil && n.Kind == yaml.AliasNode {
		f.outer = n
		defer func() { f.outer = nil }()
	}
	for n.Kind == yaml.AliasNode {
		if f.active[n] {
			f.refuse(at, path, "an alias inside its own anchor")
			return nil, false
		}
		f.active[n] = true
		defer delete(f.active, n)
		n = n.Alias
	}
	if _, seen := f.places[path]; !seen {
		f.places[path] = Place{cmp.Or(f.outer, at), n}
	}
	if f.outer != nil {
		if f.nodes++; f.nodes > maxNodes {
			f.refuse(at, path, "more than %d values through aliases", maxNodes)
			return nil, false
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tag := n.ShortTag()
	if tag == "!!null" {
		return nil, false
	}
	wrong := func(want string) (any, bool) {
		f.refuse(at, path, "want %s, got %s", want, describe(n))
		return nil, false
	}
	switch {
	case t == reflect.TypeFor[time.Time]():
		if n.Kind != yaml.ScalarNode {
			return wrong("a string")
		}
		if _, err := time.Parse(time.RFC3339, n.Value); err != nil {
			f.refuse(at, path, "%q is not an RFC 3339 time (like 2027-01-31T00:00:00Z)", n.Value)
			return nil, false
		}
		return n.Value, true
	case f.Scalars[t].Parse != nil:
		if n.Kind != yaml.ScalarNode {
			return wrong("a string")
		}
		sc := f.Scalars[t]
		x, problem := sc.Parse(path, n.Value)
		switch {
		case problem != "" && sc.Alone:
			f.failAt(at, path, "%s", problem)
			return nil, false
		case problem != "":
			f.refuse(at, path, "%s", problem)
			return nil, false
		}
		return x, true
	case t.Kind() == reflect.Struct || t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return wrong("a mapping")
		}
		return f.mapping(n, t, path), true
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if t.Elem().Kind() == reflect.String {
				return wrong("a list of strings")
			}
			return wrong("a list")
		}
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			at := path + "[" + strconv.Itoa(i) + "]"
			x, ok := f.value(c, t.Elem(), at)
			if !ok && resolve(c).ShortTag() == "!!null" {
				f.refuse(c, at, "an empty entry (a lone \"-\" or ~): remove it or give it a value")
			}
			// A refused entry stays, empty, so that the entries after it
			// keep their index: the checks of the decoded value name
			// them by it (and say nothing of the refused one).
			out = append(out, x)
		}
		return out, true
	case t.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			return wrong("a string")
		}
		return n.Value, true
	}
	want, tags := "true or false", []string{"!!bool", "!!str"} // yaml's YAML 1.1 words: yes, off...
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want, tags = "an integer", []string{"!!int"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want, tags = "an integer", []string{"!!int"}
		if tag == "!!int" && strings.HasPrefix(n.Value, "-") {
			want = "an integer ≥ 0"
		}
	case reflect.Float32, reflect.Float64:
		want, tags = "a number", []string{"!!int", "!!float"}
	}
	if tag == "!!int" && !plainDecimal(n.Value) {
		// yaml reads 017 as octal (15), 0x10 as 16 and 1_000 as 1000;
		// a limit must mean what it looks like.
		f.refuse(at, path, "want a decimal integer without leading zeros, got %s", n.Value)
		return nil, false
	}
	p := reflect.New(t)
	if n.Kind == yaml.ScalarNode && want == "an integer" && (tag == "!!float" && decimalDigits(n.Value) || tag == "!!int" && n.Decode(p.Interface()) != nil) {
		// An integer the field cannot hold (yaml tags one past 64 bits
		// a float): say so, not that it is no integer.
		if strings.HasPrefix(n.Value, "-") {
			f.refuse(at, path, "%s is too small (below %s)", n.Value, intBound(t, true))
		} else {
			f.refuse(at, path, "%s is too large (above %s)", n.Value, intBound(t, false))
		}
		return nil, false
	}
	if n.Kind != yaml.ScalarNode || !slices.Contains(tags, tag) || n.Decode(p.Interface()) != nil {
		return wrong(want)
	}
	if f, ok := p.Elem().Interface().(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return wrong("a finite number")
	}
	return p.Elem().Interface(), true
}

// plainDecimal reports whether s is an integer written as it reads: an
// optional sign and decimal digits, with no leading zero but for 0
// itself.
func plainDecimal(s string) bool {
	d := strings.TrimLeft(s, "+-")
	return decimalDigits(s) && len(s)-len(d) <= 1 && (d == "0" || d[0] != '0')
}

// decimalDigits reports whether s is a decimal integer: an optional
// sign and digits.
func decimalDigits(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// intBound returns the least value an integer type holds (least) or
// the greatest: what an out-of-range value is past.
func intBound(t reflect.Type, least bool) string {
	bits := t.Bits()
	switch {
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr && least:
		return "0"
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr:
		return strconv.FormatUint(math.MaxUint64>>(64-bits), 10)
	case least:
		return strconv.FormatInt(-1<<(bits-1), 10)
	}
	return strconv.FormatInt(1<<(bits-1)-1, 10)
}

// mapping decodes a mapping as the struct or map type t.
func (f *File) mapping(n *yaml.Node, t reflect.Type, path string) map[string]any {
	var schema []Field
	if t.Kind() == reflect.Struct {
		schema = f.Fields(t)
	}
	out := map[string]any{}
	first := map[string]*yaml.Node{}
	own, merged := f.entries(n, path, 0, nil)
	for i, all := 0, append(own, merged...); i+2 < len(all); i += 3 {
		k, val := all[i], all[i+1]
		p := k.Value
		if path != "" {
			p = path + "." + p
		}
		if fk := first[k.Value]; fk != nil {
			if i < len(own) {
				// The first is kept; what its object lacks may be the second.
				f.refuse(k, p, "given twice (first at line %d)", fk.Line)
				f.uncertain[path] = true
			}
			continue
		}
		first[k.Value] = k
		ft := t
		if t.Kind() == reflect.Map {
			ft = t.Elem()
		} else if j := slices.IndexFunc(schema, func(sf Field) bool { return sf.Name == k.Value }); j >= 0 {
			ft = schema[j].Type
		} else {
			names := make([]string, len(schema))
			for j, sf := range schema {
				names[j] = sf.Name
			}
			f.failAt(k, p, "unknown field (known here: %s)", strings.Join(names, ", "))
			f.uncertain[path] = true
			continue
		}
		if k.Kind != yaml.ScalarNode {
			f.refuse(k, p, "want a name, got %s", describe(k))
			continue
		}
		placed := false
		if src := all[i+2]; src != nil && f.outer == nil {
			f.outer, placed = src, true // a merged field is placed where the merge names it
		}
		if x, ok := f.value(val, ft, p); ok {
			out[k.Value] = x
		}
		if placed {
			f.outer = nil
		}
	}
	return out
}

// entries returns a mapping's keys and values, each with the merge that
// brought it (src, nil for the mapping's own), one after the other: its
// own, and then those its merge keys (<<) bring, which it may override.
func (f *File) entries(n *yaml.Node, path string, depth int, src *yaml.Node) (own, merged []*yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() != "!!merge" {
			own = append(own, k, val, src)
			continue
		}
		srcs := []*yaml.Node{val}
		if r := resolve(val); r.Kind == yaml.SequenceNode {
			srcs = r.Content
		}
		for _, from := range srcs {
			m := resolve(from)
			if f.nodes += len(m.Content); m.Kind != yaml.MappingNode || depth > 16 || f.nodes > maxNodes {
				f.refuse(from, path, "want a mapping (or a list of them) to merge, got %s", describe(m))
				continue
			}
			o, mm := f.entries(m, path, depth+1, cmp.Or(src, from))
			merged = append(append(merged, o...), mm...)
		}
	}
	return own, merged
}

// resolve follows n's alias, if it is one.
func resolve(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode {
		return n.Alias
	}
	return n
}

// describe names what the file holds at n.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	if n.ShortTag() == "!!str" {
		return strconv.Quote(n.Value)
	}
	return n.Value
}

// Report records a problem with the field at path, placed where the
// field is or, when it is missing, its nearest ancestor; a problem reached
// again through an alias is reported once. It says nothing when the
// problem echoes one of decoding: path is a refused value or inside one,
// or missing (it says something required is missing) in an object with a
// refused or unknown field of its own, or unknown is the path of a list
// of ids (the problem calls an id unknown) and an id in it was refused.
func (f *File) Report(path, problem string, missing bool, unknown string) {
	pl, rest := f.Place(path)
	k := reported{pl.Text, rest + ": " + problem}
	if f.echo(path, missing, unknown) || f.seen[k] {
		return
	}
	f.seen[k] = true
	f.Errs = append(f.Errs, &Error{File: f.Name, Line: pl.At.Line, Column: pl.At.Column, Field: path, Problem: problem})
}

// echo reports whether a check's problem is an echo of decoding's (see
// Report).
func (f *File) echo(path string, missing bool, unknown string) bool {
	if f.Refused(path) || missing && (f.uncertain[path] || f.uncertain[parent(path)]) {
		return true
	}
	for _, r := range f.refusals {
		if rest, ok := strings.CutPrefix(r, unknown); unknown != "" && ok && strings.HasPrefix(rest, "[") &&
			(strings.HasSuffix(rest, "]") || strings.HasSuffix(rest, "].id")) && strings.Count(rest, "[") == 1 {
			return true
		}
	}
	return false
}

// Refused reports whether path is a refused value or inside one.
func (f *File) Refused(path string) bool {
	for _, b := range f.refusals {
		if path == b || b == "" || strings.HasPrefix(path, b) && (path[len(b)] == '.' || path[len(b)] == '[') {
			return true
		}
	}
	return false
}

// Place returns where the field at path is in the file and the rest of
// the path below it: for a field that is missing, its nearest ancestor's
// place (zero when not even the file has one). Two paths through aliases
// to one text give the same text.
func (f *File) Place(path string) (Place, string) {
	for p := path; ; p = parent(p) {
		if pl, ok := f.places[p]; ok || p == "" {
			return pl, path[len(p):]
		}
	}
}

// parent strips the last ".name" or "[i]" from a path.
func parent(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

// syntaxError reports a file that is not YAML. yaml (go.yaml.in/yaml/v3)
// has no typed syntax error: its text is "yaml: line N: problem" or
// "yaml: problem", and N may be where the enclosing construct starts. So
// the place is found by locate, and the problem is the text after yaml's
// prefixes.
func syntaxError(file string, data []byte, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: file, Problem: msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, problem, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				e.Line, e.Problem = n, problem
			}
		}
	}
	e.Problem = "YAML syntax: " + e.Problem
	if line, col, off, ok := locate(data, err.Error()); ok && line >= e.Line {
		e.Line, e.Column = line, col
		if data[off] == '\t' && strings.HasSuffix(e.Problem, "found character that cannot start any token") {
			e.Problem += " (a tab: YAML indents with spaces)"
		}
	}
	return e
}

// maxLocate bounds the files locate searches: each step parses the file
// again.
const maxLocate = 1 << 20

// locate returns the line and column (1-based, in characters) and the
// byte offset of the character at which yaml found the syntax error it
// reported as msg, and whether it could tell: the last character of the
// shortest prefix of data that yaml refuses with the very same message.
// The prefix is found by bisection (yaml reads its input in one pass, so
// longer prefixes fail alike) and then checked; when the check fails, or
// only the whole file fails so (yaml noticed at the end), ok is false.
func locate(data []byte, msg string) (line, col, off int, ok bool) {
	if len(data) > maxLocate {
		return 0, 0, 0, false
	}
	fails := func(n int) bool {
		var node yaml.Node
		err := yaml.Unmarshal(data[:n], &node)
		return err != nil && err.Error() == msg
	}
	var ends []int // the end offset of each character
	for i := 0; i < len(data); {
		_, w := utf8.DecodeRune(data[i:])
		i += w
		ends = append(ends, i)
	}
	k := sort.Search(len(ends), func(k int) bool { return fails(ends[k]) })
	if k >= len(ends)-1 || !fails(ends[k]) || k > 0 && fails(ends[k-1]) {
		return 0, 0, 0, false
	}
	if k > 0 {
		off = ends[k-1]
	}
	lineStart := bytes.LastIndexByte(data[:off], '\n') + 1
	return 1 + bytes.Count(data[:off], []byte{'\n'}), 1 + utf8.RuneCount(data[lineStart:off]), off, true
}
