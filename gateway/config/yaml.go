package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/limitplane/limitplane/spec"
	"go.yaml.in/yaml/v3"
)

// The file's shape. Its travelling part (policies, keys, apis) is spec's
// own types; the local part is below. Local enumerations are strings,
// parsed by the validator so that its messages explain them; pointers
// tell "left out" from zero. Field names are the json tags: a
// file is decoded by walking its YAML nodes against these types (decoder)
// into JSON, which spec's types read as a control plane's snapshot.

type rawConfig struct {
	Listen        string               `json:"listen"`
	Store         string               `json:"store"`
	FailurePolicy string               `json:"failure_policy"`
	StoreTimeout  *time.Duration       `json:"store_timeout"`
	Redis         *rawRedis            `json:"redis"`
	Memory        *rawMemory           `json:"memory"`
	Shadow        bool                 `json:"shadow"`
	ClientIP      rawClientIP          `json:"client_ip"`
	Server        Server               `json:"server"`
	Response      rawResponse          `json:"response"`
	Admin         *fileAdmin           `json:"admin"`
	ControlPlane  *rawControlPlane     `json:"control_plane"`
	DRL           *rawDRL              `json:"drl"`
	Webhook       *rawThresholdWebhook `json:"threshold_webhook"`
	Policies      []spec.Policy        `json:"policies"`
	Keys          []rawKey             `json:"keys"`
	APIs          []spec.API           `json:"apis"`
}

type rawRedis struct {
	Timeout         *time.Duration `json:"timeout"`
	KeyPrefix       string         `json:"key_prefix"`
	Pipeline        *int           `json:"pipeline"`
	BreakerFailures *int           `json:"breaker_failures"`
	BreakerCooldown *time.Duration `json:"breaker_cooldown"`
	InFlightLease   *time.Duration `json:"in_flight_lease"`
	SyncSettle      bool           `json:"sync_settle"`
	PasswordEnv     string         `json:"password_env"`
	PasswordFile    string         `json:"password_file"`
}

type rawMemory struct {
	MaxKeys *int `json:"max_keys"`
}

// fileAdmin is the admin section: Admin, and its token's sources.
type fileAdmin struct {
	Admin
	TokenEnv  string `json:"token_env"`
	TokenFile string `json:"token_file"`
}

type rawControlPlane struct {
	Address   string              `json:"address"`
	TokenEnv  string              `json:"token_env"`
	TokenFile string              `json:"token_file"`
	Group     string              `json:"group"`
	Tags      []string            `json:"tags"`
	GatewayID string              `json:"gateway_id"`
	TLS       *rawControlPlaneTLS `json:"tls"`
	MaxStale  *time.Duration      `json:"max_stale"`
	OnStale   string              `json:"on_stale"`
	StateFile string              `json:"state_file"`
}

type rawControlPlaneTLS struct {
	CAFile     string `json:"ca_file"`
	CertFile   string `json:"cert_file"`
	KeyFile    string `json:"key_file"`
	ServerName string `json:"server_name"`
}

type rawDRL struct {
	Group       string         `json:"group"`
	Interval    *time.Duration `json:"interval"`
	MaxGateways *int           `json:"max_gateways"`
	JoinReserve *int           `json:"join_reserve"`
	Headroom    *float64       `json:"headroom"`
}

type rawClientIP struct {
	TrustedProxies []string `json:"trusted_proxies"`
	Header         string   `json:"header"`
	IPv4PrefixLen  *int     `json:"ipv4_prefix_len"`
	IPv6PrefixLen  *int     `json:"ipv6_prefix_len"`
}

type rawResponse struct {
	RateLimitHeaders   *bool  `json:"ratelimit_headers"`
	XRateLimit         bool   `json:"x_ratelimit"`
	XRateLimitReset    string `json:"x_ratelimit_reset"`
	QuotaStatus        *int   `json:"quota_status"`
	StoreFailureStatus *int   `json:"store_failure_status"`
}

// rawKey is a key as a file gives it: spec's, or in plaintext (key),
// hashed while loading.
type rawKey struct {
	Plain string `json:"key"`
	spec.Key
}

// notInFile are the fields of spec's types that a file does not offer.
var notInFile = map[reflect.Type][]string{reflect.TypeFor[spec.JWTKey](): {"pem", "secret"}}

// field is one field of the file's schema.
type field struct {
	name string
	t    reflect.Type
}

// fields lists the file's fields of the struct type t, in order: their
// json names, embedded structs' fields in their place.
func fields(t reflect.Type) []field {
	var out []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		switch {
		case f.Anonymous:
			out = append(out, fields(f.Type)...)
		case !f.IsExported() || name == "-" || slices.Contains(notInFile[t], name):
		default:
			out = append(out, field{name, f.Type})
		}
	}
	return out
}

var (
	durationType = reflect.TypeFor[spec.Duration]()
	localType    = reflect.TypeFor[time.Duration]() // a local setting's
	timeType     = reflect.TypeFor[time.Time]()
)

// maxNodes bounds the nodes a file decodes through aliases: an alias bomb
// would otherwise decode to more than memory holds.
const maxNodes = 1 << 16

// loader decodes a file and checks what decoded, collecting every
// problem but those that echo another. Decoding walks the file's YAML
// nodes against the schema, reporting every problem of shape (a value of
// the wrong type, an unknown or repeated field, a fraction where an
// integer goes) at its node, and builds the JSON of what decoded; the
// checks then place their problems by field path (see place).
type loader struct {
	file   string
	errs   Errors
	seen   map[reported]bool
	active map[*yaml.Node]bool // aliases being followed
	outer  *yaml.Node          // the outermost of them
	nodes  int                 // decoded through aliases
	// places maps a field's path to where it is in the file.
	places map[string]place
	// refusals are the paths of values that did not decode, left out of
	// the JSON: what the checks say about them or below them is an
	// echo. uncertain are the objects (by path) with a refused value or
	// an unknown field among their own: a required field missing there
	// may well be the one refused or misspelled.
	refusals  []string
	uncertain map[string]bool
	memory    bool // the store is the in-process one (GCRA only), for sure
}

// place is where a field is in the file: the node its problems are placed
// at (its value or, for a field that came through an alias or a merge,
// the alias) and the node its text decoded from.
type place struct{ at, text *yaml.Node }

// reported is a problem at a node: an anchor's text is decoded at every
// alias to it, and its problems are reported once.
type reported struct {
	n       *yaml.Node
	problem string
}

// failAt reports a problem of decoding at n.
func (v *loader) failAt(n *yaml.Node, path, format string, args ...any) {
	k := reported{n, fmt.Sprintf(format, args...)}
	if !v.seen[k] {
		v.seen[k] = true
		v.errs = append(v.errs, &Error{File: v.file, Line: n.Line, Column: n.Column, Field: path, Problem: k.problem})
	}
}

// refuse reports a value that did not decode.
func (v *loader) refuse(n *yaml.Node, path, format string, args ...any) {
	v.failAt(n, path, format, args...)
	v.refusals = append(v.refusals, path)
	v.uncertain[parent(path)] = true
}

// value decodes n, the value at path, as a t; ok is false when it is null
// (left out) or refused.
func (v *loader) value(n *yaml.Node, t reflect.Type, path string) (x any, ok bool) {
	at := n // where a problem of the value as a whole is reported: the alias
	if v.outer == nil && n.Kind == yaml.AliasNode {
		v.outer = n
		defer func() { v.outer = nil }()
	}
	for n.Kind == yaml.AliasNode {
		if v.active[n] {
			v.refuse(at, path, "an alias inside its own anchor")
			return nil, false
		}
		v.active[n] = true
		defer delete(v.active, n)
		n = n.Alias
	}
	if _, seen := v.places[path]; !seen {
		v.places[path] = place{cmp.Or(v.outer, at), n}
	}
	if v.outer != nil {
		if v.nodes++; v.nodes > maxNodes {
			v.refuse(at, path, "more than %d values through aliases", maxNodes)
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
		v.refuse(at, path, "want %s, got %s", want, describe(n))
		return nil, false
	}
	switch {
	case t == durationType || t == timeType || t == localType:
		if n.Kind != yaml.ScalarNode {
			return wrong("a string")
		}
		if t == timeType {
			if _, err := time.Parse(time.RFC3339, n.Value); err != nil {
				v.refuse(at, path, "%q is not an RFC 3339 time (like 2027-01-31T00:00:00Z)", n.Value)
				return nil, false
			}
			return n.Value, true
		}
		d, problem := parseDuration(n.Value, durationExamples(path))
		switch {
		case problem != "" && t == localType:
			// A local setting's: it leaves no field uncertain.
			v.failAt(at, path, "%s", problem)
			return nil, false
		case problem != "":
			v.refuse(at, path, "%s", problem)
			return nil, false
		case t == localType:
			return d, true
		}
		return n.Value, true
	case t.Kind() == reflect.Struct || t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return wrong("a mapping")
		}
		return v.mapping(n, t, path), true
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if t.Elem().Kind() == reflect.String {
				return wrong("a list of strings")
			}
			return wrong("a list")
		}
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			if x, ok := v.value(c, t.Elem(), path+"["+strconv.Itoa(i)+"]"); ok {
				out = append(out, x)
			}
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
	p := reflect.New(t)
	if n.Kind == yaml.ScalarNode && want == "an integer" && (tag == "!!float" && decimalDigits(n.Value) || tag == "!!int" && n.Decode(p.Interface()) != nil) {
		// An integer the field cannot hold (yaml tags one past 64 bits
		// a float): say so, not that it is no integer.
		if strings.HasPrefix(n.Value, "-") {
			v.refuse(at, path, "%s is too small (below %s)", n.Value, intBound(t, true))
		} else {
			v.refuse(at, path, "%s is too large (above %s)", n.Value, intBound(t, false))
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
func (v *loader) mapping(n *yaml.Node, t reflect.Type, path string) map[string]any {
	var schema []field
	if t.Kind() == reflect.Struct {
		schema = fields(t)
	}
	out := map[string]any{}
	first := map[string]*yaml.Node{}
	own, merged := v.entries(n, path, 0, nil)
	for i, all := 0, append(own, merged...); i+2 < len(all); i += 3 {
		k, val := all[i], all[i+1]
		p := k.Value
		if path != "" {
			p = path + "." + p
		}
		if f := first[k.Value]; f != nil {
			if i < len(own) {
				// The first is kept; what its object lacks may be the second.
				v.refuse(k, p, "given twice (first at line %d)", f.Line)
				v.uncertain[path] = true
			}
			continue
		}
		first[k.Value] = k
		ft := t
		if t.Kind() == reflect.Map {
			ft = t.Elem()
		} else if j := slices.IndexFunc(schema, func(f field) bool { return f.name == k.Value }); j >= 0 {
			ft = schema[j].t
		} else {
			names := make([]string, len(schema))
			for j, f := range schema {
				names[j] = f.name
			}
			v.failAt(k, p, "unknown field (known here: %s)", strings.Join(names, ", "))
			v.uncertain[path] = true
			continue
		}
		if k.Kind != yaml.ScalarNode {
			v.refuse(k, p, "want a name, got %s", describe(k))
			continue
		}
		placed := false
		if src := all[i+2]; src != nil && v.outer == nil {
			v.outer, placed = src, true // a merged field is placed where the merge names it
		}
		if x, ok := v.value(val, ft, p); ok {
			out[k.Value] = x
		}
		if placed {
			v.outer = nil
		}
	}
	return out
}

// entries returns a mapping's keys and values, each with the merge that
// brought it (src, nil for the mapping's own), one after the other: its
// own, and then those its merge keys (<<) bring, which it may override.
func (v *loader) entries(n *yaml.Node, path string, depth int, src *yaml.Node) (own, merged []*yaml.Node) {
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
			if v.nodes += len(m.Content); m.Kind != yaml.MappingNode || depth > 16 || v.nodes > maxNodes {
				v.refuse(from, path, "want a mapping (or a list of them) to merge, got %s", describe(m))
				continue
			}
			o, mm := v.entries(m, path, depth+1, cmp.Or(src, from))
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

// durationExamples are the examples a "not a duration" problem at path
// gives.
func durationExamples(path string) string {
	switch {
	case strings.HasSuffix(path, ".leeway"):
		return "30s or 1m"
	case path == "control_plane.max_stale":
		return "30m, 1h or 24h"
	case path == "drl.interval":
		return "500ms, 1s or 2s"
	}
	return "500ms, 10s, 1m or 24h"
}

// decode parses data and decodes it into a rawConfig, reporting every
// problem of shape; raw holds what decoded, for the checks. raw is nil
// when data is not YAML at all.
func (v *loader) decode(data []byte) (raw *rawConfig) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		v.errs = Errors{syntaxError(v.file, data, err)}
		return nil
	}
	if len(root.Content) == 0 {
		v.errs = Errors{{File: v.file, Problem: "empty configuration"}}
		return nil
	}
	x, _ := v.value(root.Content[0], reflect.TypeFor[rawConfig](), "")
	raw = &rawConfig{Server: Server{Engine: EngineNetHTTP, ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
		WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout, ShutdownTimeout: DefaultShutdownTimeout,
		MaxHeaderBytes: DefaultMaxHeaderBytes}}
	if x != nil {
		b, err := json.Marshal(x)
		if err == nil {
			err = json.Unmarshal(b, raw)
		}
		if err != nil { // the decoder let through what spec's types refuse
			v.errs = append(v.errs, &Error{File: v.file, Problem: err.Error()})
			return nil
		}
	}
	return raw
}

// echo reports whether a validator's problem is an echo of one the
// decoder reported: it is about a refused value or something under one, or
// it says something required is missing in an uncertain object or of one,
// or it calls an id unknown when an id in that list was refused.
func (v *loader) echo(path string, missing bool, unknown string) bool {
	if v.refused(path) || missing && (v.uncertain[path] || v.uncertain[parent(path)]) {
		return true
	}
	for _, r := range v.refusals {
		if rest, ok := strings.CutPrefix(r, unknown); unknown != "" && ok && strings.HasPrefix(rest, "[") &&
			(strings.HasSuffix(rest, "]") || strings.HasSuffix(rest, "].id")) && strings.Count(rest, "[") == 1 {
			return true
		}
	}
	return false
}

// refused reports whether path is a refused value or inside one.
func (v *loader) refused(path string) bool {
	for _, b := range v.refusals {
		if path == b || b == "" || strings.HasPrefix(path, b) && (path[len(b)] == '.' || path[len(b)] == '[') {
			return true
		}
	}
	return false
}

// place returns where the field at path is in the file and the rest of
// the path below it: for a field that is missing, its nearest ancestor's
// place (zero when not even the file has one). Two paths through aliases
// to one text give the same text.
func (v *loader) place(path string) (place, string) {
	for p := path; ; p = parent(p) {
		if pl, ok := v.places[p]; ok || p == "" {
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
