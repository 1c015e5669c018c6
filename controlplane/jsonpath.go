package controlplane

// Token passes over a request body's JSON, for what encoding/json does
// not report: members named twice, and the exact path of a value it
// refused.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// maxNesting bounds the objects and arrays duplicateMember follows into:
// spec's documents nest a few levels, and each level's path repeats its
// parent's, so a hostile 100,000-deep body of 200 KB would build paths of
// 15 GB together.
const maxNesting = 64

// errTooDeep is duplicateMember's error for a document nested more than
// maxNesting deep.
var errTooDeep = fmt.Errorf("JSON nested more than %d deep", maxNesting)

// duplicateMember returns the path of the first member an object of the
// JSON document names twice ("rate", "policies[2].rate.per",
// "api_limits.\"orders\""), or "" when there is none. It reads tokens only
// (no values are built); a syntax error is returned for the decoder to
// report, and errTooDeep for a document nested more than maxNesting deep
// (the caller refuses it).
func duplicateMember(doc []byte) (string, error) {
	type frame struct {
		object bool
		seen   map[string]struct{}
		path   string
		index  int
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var stack []frame
	// next is the path of the value the next token starts.
	next := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := &stack[len(stack)-1]
		if !f.object {
			p := f.path + "[" + strconv.Itoa(f.index) + "]"
			f.index++
			return p
		}
		return "" // set by the member name
	}
	member := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF && (len(stack) > 0 || member != "") {
			return "", io.ErrUnexpectedEOF
		}
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		top := len(stack) - 1
		if top >= 0 && stack[top].object && member == "" {
			// In an object, a token is a member name or its closing brace.
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:top]
				continue
			}
			name, _ := tok.(string)
			f := &stack[top]
			member = memberPath(f.path, name)
			// encoding/json matches member names to fields without
			// regard to case, so "Rate" after "rate" also replaces it.
			folded := strings.ToLower(strings.ToUpper(name))
			if _, dup := f.seen[folded]; dup {
				return member, nil
			}
			f.seen[folded] = struct{}{}
			continue
		}
		at := member
		if at == "" {
			at = next()
		}
		member = ""
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= maxNesting {
				return "", errTooDeep
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true, seen: map[string]struct{}{}, path: at})
		case json.Delim('['):
			stack = append(stack, frame{path: at})
		case json.Delim(']'):
			stack = stack[:top]
		}
	}
}

// memberPath appends an object member's name to path: plain when it is a
// spec name (lower case letters, digits, '_'), quoted otherwise (a map
// key such as an API ID).
func memberPath(path, name string) string {
	plain := name != ""
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			plain = false
			break
		}
	}
	if !plain {
		name = strconv.Quote(name)
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

// valuePath returns the path of the first value in the JSON document doc
// that is not a string and whose path holds the member names of field,
// in order, ending with its last ("policies[2].rate.per",
// "api_limits.orders.rate.per" for field "api_limits.rate.per"), or field
// itself when there is none. encoding/json names a field of a failed
// value without array indexes and map keys; the first failure is the
// error it returns, so the first such value is the one it names.
func valuePath(doc []byte, field string) string {
	return valuePathWhere(doc, field, func(tok json.Token) bool {
		_, isString := tok.(string)
		return !isString
	})
}

// durationPath is valuePath for spec.DurationTypeProblem's error err: for
// a string that is not a duration (spec.RefusedDurationString), the path
// of the first such string.
func durationPath(doc []byte, field string, err error) string {
	if !spec.RefusedDurationString(err) {
		return valuePath(doc, field)
	}
	return valuePathWhere(doc, field, func(tok json.Token) bool {
		s, isString := tok.(string)
		if !isString {
			return false
		}
		_, err := spec.ParseDuration(s)
		return err != nil
	})
}

// timeProblem returns, for err when it is time.Time's refusal of a
// string (found with errors.As), the path in doc of the first "expires"
// (spec.Key's one time) that is no RFC 3339 time, and the problem; ok is
// false for any other error.
func timeProblem(doc []byte, err error) (path, problem string, ok bool) {
	var pe *time.ParseError
	if !errors.As(err, &pe) {
		return "", "", false
	}
	var bad string
	path = valuePathWhere(doc, "expires", func(tok json.Token) bool {
		s, isString := tok.(string)
		if !isString {
			return false
		}
		if _, err := time.Parse(time.RFC3339, s); err != nil {
			bad = s
			return true
		}
		return false
	})
	return path, fmt.Sprintf("%q is not a time: want RFC 3339, like \"2027-01-31T00:00:00Z\"", bad), true
}

// valuePathWhere is valuePath for the first value (a scalar token, or
// the '{' or '[' that opens an object or array) that match reports.
func valuePathWhere(doc []byte, field string, match func(json.Token) bool) string {
	want := strings.Split(field, ".")
	type frame struct {
		object bool
		index  int
	}
	var stack []frame
	var segs []string // the path: member names, and "[i]" for array elements
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	expectName := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return field
		}
		if expectName {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(segs) > 0 {
					segs = segs[:len(segs)-1] // the object's own segment
				}
				expectName = len(stack) > 0 && stack[len(stack)-1].object
				continue
			}
			name, _ := tok.(string)
			segs = append(segs, name)
			expectName = false
			continue
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			stack = stack[:len(stack)-1]
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			expectName = len(stack) > 0 && stack[len(stack)-1].object
			continue
		}
		if n := len(stack); n > 0 && !stack[n-1].object {
			segs = append(segs, "["+strconv.Itoa(stack[n-1].index)+"]")
			stack[n-1].index++
		}
		if len(segs) > 0 && segs[len(segs)-1] == want[len(want)-1] && holds(segs, want) && match(tok) {
			return displayPath(segs)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= maxNesting {
				return "" // beyond any path spec names
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true})
			expectName = true
		case json.Delim('['):
			stack = append(stack, frame{})
		default: // a scalar: its segment ends here
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			expectName = len(stack) > 0 && stack[len(stack)-1].object
		}
	}
}

// holds reports whether the member names want appear in segs in order.
func holds(segs, want []string) bool {
	i := 0
	for _, s := range segs {
		if i < len(want) && s == want[i] {
			i++
		}
	}
	return i == len(want)
}

// displayPath writes path segments as error paths do: policies[2].rate,
// api_limits.orders, api_limits."Orders".
func displayPath(segs []string) string {
	p := ""
	for _, s := range segs {
		if strings.HasPrefix(s, "[") {
			p += s
			continue
		}
		p = memberPath(p, s)
	}
	return p
}
