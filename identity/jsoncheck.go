package identity

// The fast path of checkJSON: one pass over the decoded header or claims
// with no allocation (but for an exp, nbf or iat number), for the JSON
// that tokens hold. It answers only for input it has parsed completely
// and knows to read as encoding/json reads it; for anything else (not
// JSON, a member name with an escape, more than jsonMaxNames names open at
// once, nesting deeper than jsonMaxDepth) it declines, and scanJSON, the
// encoding/json token stream, decides. FuzzCheckJSONFast holds the two to
// the same answers.

const (
	jsonMaxDepth = 32 // objects and arrays open at once
	jsonMaxNames = 64 // member names held for the duplicate check, over all open objects
)

// jsonScan is the state of one fastJSON pass.
type jsonScan struct {
	b      []byte
	i      int
	claims bool
	depth  int
	// names are the member names of the open objects, as [start, end)
	// offsets into b (names hold no escapes), innermost object last.
	names [jsonMaxNames][2]int
	n     int
	// reason is the failure found, "" for none yet.
	reason string
	// lone is set when a string holds a \u escape of a lone surrogate
	// (see loneSurrogate): it outranks reason.
	lone bool
}

// fastJSON checks the JSON text b as scanJSON does; ok false: it declines
// (see above) and scanJSON must decide.
func fastJSON(b []byte, claims bool) (reason string, ok bool) {
	s := jsonScan{b: b, claims: claims}
	s.ws()
	if !s.value("") {
		return "", false
	}
	s.ws()
	after := s.i < len(s.b) // data after the first value
	// A lone surrogate anywhere outranks every other failure, as in
	// scanJSON.
	if s.lone || after && loneSurrogate(s.b[s.i:]) {
		return reasonNotUTF8, true
	}
	if s.reason != "" {
		return s.reason, true
	}
	if after {
		return reasonInvalid, true
	}
	return "", true
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads one JSON value; member names the date claim (exp, nbf, iat)
// it is the value of, "" for any other value. false: declined.
func (s *jsonScan) value(member string) bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		_, _, ok := s.str()
		return ok
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		if !s.number() {
			return false
		}
		if member != "" && s.reason == "" {
			s.reason = dateReason(member, s.b[start:s.i])
		}
		return true
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	}
	return false
}

func (s *jsonScan) lit(w string) bool {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return false
	}
	s.i += len(w)
	return true
}

// object reads an object, checking its member names for repeats.
func (s *jsonScan) object() bool {
	first := s.n
	empty, ok := s.open('}')
	if !ok || empty {
		return ok
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		start, end, ok := s.str()
		if !ok || end < 0 {
			return false // malformed, or an escape in the name
		}
		name := s.b[start:end]
		for _, nm := range s.names[first:s.n] {
			if string(s.b[nm[0]:nm[1]]) == string(name) && s.reason == "" {
				s.reason = dupReason(s.claims)
			}
		}
		if s.n == len(s.names) {
			return false
		}
		s.names[s.n] = [2]int{start, end}
		s.n++
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		member := ""
		if s.claims && s.depth == 1 {
			member = dateClaim(name)
		}
		if !s.value(member) {
			return false
		}
		if more, ok := s.next('}'); !more {
			s.n = first
			return ok
		}
	}
}

func (s *jsonScan) array() bool {
	empty, ok := s.open(']')
	if !ok || empty {
		return ok
	}
	for {
		if !s.value("") {
			return false
		}
		if more, ok := s.next(']'); !more {
			return ok
		}
	}
}

// open enters the object or array at s.i; empty: it closed at once with
// end. false: declined (too deep).
func (s *jsonScan) open(end byte) (empty, ok bool) {
	if s.depth++; s.depth > jsonMaxDepth {
		return false, false
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == end {
		s.i++
		s.depth--
		return true, true
	}
	return false, true
}

// next reads what follows a member or an element: a comma (more) or end,
// which leaves the object or array. ok false: neither (declined).
func (s *jsonScan) next(end byte) (more, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		s.ws()
		return true, true
	case end:
		s.i++
		s.depth--
		return false, true
	}
	return false, false
}

// str reads a string at s.i (at its opening quote). It returns the
// offsets of its content, end -1 when it holds an escape (valid ones
// only), and false when it is malformed (a control character, a bad
// escape, no closing quote). The input is valid UTF-8 (checkJSON checked).
func (s *jsonScan) str() (start, end int, ok bool) {
	s.i++
	start, escaped := s.i, false
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			end = s.i
			s.i++
			if escaped {
				end = -1
			}
			return start, end, true
		case c < 0x20:
			return 0, 0, false
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return 0, 0, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				n, lone, ok := uEscape(s.b[s.i:])
				if !ok {
					return 0, 0, false
				}
				s.lone = s.lone || lone
				s.i += n
			default:
				return 0, 0, false
			}
		default:
			s.i++
		}
	}
	return 0, 0, false
}

// hex4 reads the four hex digits a \u escape starts b with; false when b
// does not start with four.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, h := range b[:4] {
		switch {
		case h >= '0' && h <= '9':
			r = r<<4 | rune(h-'0')
		case h >= 'a' && h <= 'f':
			r = r<<4 | rune(h-'a'+10)
		case h >= 'A' && h <= 'F':
			r = r<<4 | rune(h-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// uEscape reads the \u escape b starts with (b[0] is '\\', b[1] 'u'): n,
// the bytes it takes (12 for a high and low surrogate escaped one after
// the other, else 6), and lone, whether it escapes a surrogate that is not
// half of such a pair; ok false when four hex digits do not follow.
func uEscape(b []byte) (n int, lone, ok bool) {
	r, ok := hex4(b[2:])
	switch {
	case !ok:
		return 0, false, false
	case r >= 0xdc00 && r <= 0xdfff:
		return 6, true, true // a low surrogate first
	case r >= 0xd800 && r <= 0xdbff:
		// A high surrogate stands for a character only with the low one
		// escaped right after it.
		if len(b) >= 8 && b[6] == '\\' && b[7] == 'u' {
			if lo, ok := hex4(b[8:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
				return 12, false, true
			}
		}
		return 6, true, true
	}
	return 6, false, true
}

// loneSurrogate reports whether the JSON text b escapes a lone UTF-16
// surrogate (\ud800 to \udfff not as a high and low pair, RFC 8259
// section 7): a code point UTF-8 cannot encode, which encoding/json
// decodes as U+FFFD, so that "\ud800" and "\ufffd" would be one subject.
// It reads every backslash as an escape's start, as it is in the strings
// of valid JSON (outside them, the text is not JSON).
func loneSurrogate(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+1 < len(b) && b[i+1] == 'u' {
			n, lone, ok := uEscape(b[i:])
			if lone {
				return true
			}
			if !ok {
				n = 6 // not JSON: read on past it
			}
			i += n - 1
			continue
		}
		i++ // the escaped character
	}
	return false
}

// number reads a number as RFC 8259 writes it:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScan) number() bool {
	b := s.b
	if b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i >= len(b):
		return false
	case b[s.i] == '0':
		s.i++
	case b[s.i] >= '1' && b[s.i] <= '9':
		s.digits()
	default:
		return false
	}
	if s.i < len(b) && b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if s.i < len(b) && (b[s.i] == 'e' || b[s.i] == 'E') {
		s.i++
		if s.i < len(b) && (b[s.i] == '+' || b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits reads one or more digits; false when there is none.
func (s *jsonScan) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
