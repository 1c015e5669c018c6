package config

import (
	"bytes"
	"errors"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// The raw file shape. Durations, times and enumerations are strings, parsed
// by the validator so that its messages (not yaml's) explain them; pointers
// tell "left out" from zero.

type rawConfig struct {
	Listen        string           `yaml:"listen"`
	Store         string           `yaml:"store"`
	FailurePolicy string           `yaml:"failure_policy"`
	StoreTimeout  string           `yaml:"store_timeout"`
	Redis         *rawRedis        `yaml:"redis"`
	Memory        *rawMemory       `yaml:"memory"`
	Shadow        bool             `yaml:"shadow"`
	ClientIP      rawClientIP      `yaml:"client_ip"`
	Server        rawServer        `yaml:"server"`
	Response      rawResponse      `yaml:"response"`
	Admin         *rawAdmin        `yaml:"admin"`
	ControlPlane  *rawControlPlane `yaml:"control_plane"`
	DRL           *rawDRL          `yaml:"drl"`
	Policies      []rawPolicy      `yaml:"policies"`
	Keys          []rawKey         `yaml:"keys"`
	APIs          []rawAPI         `yaml:"apis"`
}

type rawRedis struct {
	Timeout         string `yaml:"timeout"`
	KeyPrefix       string `yaml:"key_prefix"`
	Pipeline        *int   `yaml:"pipeline"`
	BreakerFailures *int   `yaml:"breaker_failures"`
	BreakerCooldown string `yaml:"breaker_cooldown"`
	PasswordEnv     string `yaml:"password_env"`
	PasswordFile    string `yaml:"password_file"`
}

type rawMemory struct {
	MaxKeys *int `yaml:"max_keys"`
}

type rawAdmin struct {
	Listen    string `yaml:"listen"`
	TokenEnv  string `yaml:"token_env"`
	TokenFile string `yaml:"token_file"`
}

type rawControlPlane struct {
	Address   string              `yaml:"address"`
	TokenEnv  string              `yaml:"token_env"`
	TokenFile string              `yaml:"token_file"`
	Group     string              `yaml:"group"`
	Tags      []string            `yaml:"tags"`
	GatewayID string              `yaml:"gateway_id"`
	TLS       *rawControlPlaneTLS `yaml:"tls"`
	MaxStale  string              `yaml:"max_stale"`
	OnStale   string              `yaml:"on_stale"`
	StateFile string              `yaml:"state_file"`
}

type rawControlPlaneTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

type rawDRL struct {
	Group                    string   `yaml:"group"`
	Interval                 string   `yaml:"interval"`
	MaxGateways              *int     `yaml:"max_gateways"`
	JoinReserve              *int     `yaml:"join_reserve"`
	Headroom                 *float64 `yaml:"headroom"`
	UnsafeGrowsBeforeShrinks bool     `yaml:"unsafe_grows_before_shrinks"`
}

type rawClientIP struct {
	TrustedProxies []string `yaml:"trusted_proxies"`
	Header         string   `yaml:"header"`
	IPv4PrefixLen  *int     `yaml:"ipv4_prefix_len"`
	IPv6PrefixLen  *int     `yaml:"ipv6_prefix_len"`
}

type rawServer struct {
	ReadHeaderTimeout string `yaml:"read_header_timeout"`
	ReadTimeout       string `yaml:"read_timeout"`
	WriteTimeout      string `yaml:"write_timeout"`
	IdleTimeout       string `yaml:"idle_timeout"`
	ShutdownTimeout   string `yaml:"shutdown_timeout"`
	MaxHeaderBytes    *int   `yaml:"max_header_bytes"`
}

type rawResponse struct {
	RateLimitHeaders   *bool  `yaml:"ratelimit_headers"`
	XRateLimit         bool   `yaml:"x_ratelimit"`
	XRateLimitReset    string `yaml:"x_ratelimit_reset"`
	QuotaStatus        *int   `yaml:"quota_status"`
	StoreFailureStatus *int   `yaml:"store_failure_status"`
}

type rawPolicy struct {
	ID          string    `yaml:"id"`
	Rate        *rawRate  `yaml:"rate"`
	Quota       *rawQuota `yaml:"quota"`
	APIs        []string  `yaml:"apis"`
	Shadow      bool      `yaml:"shadow"`
	Distributed bool      `yaml:"distributed"`
}

type rawRate struct {
	Requests  *int64 `yaml:"requests"`
	Per       string `yaml:"per"`
	Burst     *int64 `yaml:"burst"`
	Algorithm string `yaml:"algorithm"`
}

type rawQuota struct {
	Max     *int64 `yaml:"max"`
	Renewal string `yaml:"renewal"`
}

type rawKey struct {
	Key        string               `yaml:"key"`
	KeyHash    string               `yaml:"key_hash"`
	Policies   []string             `yaml:"policies"`
	Expires    string               `yaml:"expires"`
	Inactive   bool                 `yaml:"inactive"`
	APILimits  map[string]rawLimits `yaml:"api_limits"`
	QuotaEpoch uint64               `yaml:"quota_epoch"`
}

type rawLimits struct {
	Rate       *rawRate  `yaml:"rate"`
	Quota      *rawQuota `yaml:"quota"`
	QuotaEpoch uint64    `yaml:"quota_epoch"`
}

type rawAPI struct {
	ID              string           `yaml:"id"`
	ListenPath      string           `yaml:"listen_path"`
	Target          string           `yaml:"target"`
	Auth            string           `yaml:"auth"`
	Policies        []string         `yaml:"policies"`
	JWT             *rawJWT          `yaml:"jwt"`
	FailureLimit    *rawFailureLimit `yaml:"failure_limit"`
	StripListenPath *bool            `yaml:"strip_listen_path"`
	StripAuthData   *bool            `yaml:"strip_auth_data"`
	Tags            []string         `yaml:"tags"`
}

type rawJWT struct {
	Algorithms      []string    `yaml:"algorithms"`
	Keys            []rawJWTKey `yaml:"keys"`
	JWKS            *rawJWKS    `yaml:"jwks"`
	Issuer          string      `yaml:"issuer"`
	Audience        []string    `yaml:"audience"`
	Leeway          string      `yaml:"leeway"`
	ConsumerClaim   string      `yaml:"consumer_claim"`
	PolicyClaim     string      `yaml:"policy_claim"`
	DefaultPolicies []string    `yaml:"default_policies"`
}

type rawJWTKey struct {
	ID         string `yaml:"id"`
	PEMFile    string `yaml:"pem_file"`
	SecretEnv  string `yaml:"secret_env"`
	SecretFile string `yaml:"secret_file"`
}

type rawJWKS struct {
	URL             string `yaml:"url"`
	RefreshInterval string `yaml:"refresh_interval"`
}

type rawFailureLimit struct {
	Policy string `yaml:"policy"`
}

// knownFields maps a raw type's name as yaml's errors print it
// ("config.rawRate") to its field names, for "unknown field" messages.
var knownFields = func() map[string][]string {
	m := map[string][]string{}
	for _, v := range []any{rawConfig{}, rawRedis{}, rawMemory{}, rawClientIP{}, rawServer{}, rawResponse{}, rawAdmin{}, rawControlPlane{}, rawControlPlaneTLS{}, rawDRL{}, rawPolicy{}, rawRate{}, rawQuota{}, rawKey{}, rawLimits{}, rawAPI{},
		rawJWT{}, rawJWTKey{}, rawJWKS{}, rawFailureLimit{}} {
		t := reflect.TypeOf(v)
		var names []string
		for i := 0; i < t.NumField(); i++ {
			names = append(names, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
		}
		m[t.String()] = names
	}
	return m
}()

// index locates the nodes of a parsed file by field path, for messages.
//
// Paths are as the file is written: an alias is indexed where it stands
// (its path maps to the alias node) but not followed, so the nodes under an
// anchor have the paths of the anchor's own place. The same text is decoded
// once per place an alias brings it to, so problems inside an anchor come
// back from yaml once per use, and the validator's once per path; canon
// and expand relate the two kinds of path so that each is reported once.
type index struct {
	vals map[string]*yaml.Node // path → value node (the first, if repeated)
	keys []keyRef              // every mapping key, in file order
	// anchored maps an anchored node to its path; aliases maps an alias's
	// path to its anchor's path, and aliasedAs the other way round (in
	// file order).
	anchored  map[*yaml.Node]string
	aliases   map[string]string
	aliasedAs map[string][]string
}

func newIndex() *index {
	return &index{vals: map[string]*yaml.Node{}, anchored: map[*yaml.Node]string{},
		aliases: map[string]string{}, aliasedAs: map[string][]string{}}
}

type keyRef struct {
	path string
	node *yaml.Node
}

func (ix *index) walk(n *yaml.Node, path string) {
	if n.Anchor != "" {
		ix.anchored[n] = path
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			ix.walk(c, path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			ix.keys = append(ix.keys, keyRef{p, k})
			if _, seen := ix.vals[p]; !seen {
				ix.vals[p] = v
			}
			ix.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			ix.vals[p] = c
			ix.walk(c, p)
		}
	case yaml.AliasNode:
		// Not followed: the anchor is indexed where it is defined, and
		// following aliases could multiply work on alias bombs. yaml
		// refuses an alias before its anchor, so the anchor's path is
		// known.
		if a, ok := ix.anchored[n.Alias]; ok && path != "" {
			ix.aliases[path] = a
			ix.aliasedAs[a] = append(ix.aliasedAs[a], path)
		}
	}
}

// canon returns the path as the file writes it: a path that leads through
// an alias (strictly: not the alias itself) continues from its anchor's
// place, policies[1].rate.per for policies: [{rate: &r {...}}, {rate: *r}]
// being policies[0].rate.per. Two paths with one canonical path hold the
// same text.
func (ix *index) canon(path string) string {
	if ix == nil || len(ix.aliases) == 0 {
		return path
	}
	// Each step moves to an anchor written earlier in the file, so this
	// ends; the bound only guards against surprises.
	for step := 0; step < 100; step++ {
		moved := false
		for i := 1; i < len(path); i++ {
			if path[i] != '.' && path[i] != '[' {
				continue
			}
			if a, ok := ix.aliases[path[:i]]; ok {
				path, moved = a+path[i:], true
				break
			}
		}
		if !moved {
			return path
		}
	}
	return path
}

// maxExpansions bounds expand: an alias bomb brings one text to more paths
// than anyone needs named.
const maxExpansions = 64

// expand returns the paths through aliases that lead to the text at path
// (a path as written, see canon), without path itself, nearest first and
// each step in file order of the aliases: for policies: [{rate: &r {per: x}}, {rate: *r}],
// expand("policies[0].rate.per") is [policies[1].rate.per], and
// expand("policies[0].rate") [policies[1].rate].
func (ix *index) expand(path string) []string {
	if len(ix.aliases) == 0 {
		return nil
	}
	var out []string
	seen := map[string]bool{path: true}
	for queue := []string{path}; len(queue) > 0 && len(out) < maxExpansions; queue = queue[1:] {
		p := queue[0]
		for i := len(p); i > 0; i-- {
			if i < len(p) && p[i] != '.' && p[i] != '[' {
				continue
			}
			for _, alias := range ix.aliasedAs[p[:i]] {
				if q := alias + p[i:]; !seen[q] && len(out) < maxExpansions {
					seen[q] = true
					out = append(out, q)
					queue = append(queue, q)
				}
			}
		}
	}
	return out
}

// pos returns the position of path's value node, or of its nearest
// ancestor that is in the file (for fields that are missing).
func (ix *index) pos(path string) (line, col int) {
	for p := path; ; p = parent(p) {
		if n := ix.vals[p]; n != nil {
			return n.Line, n.Column
		}
		if p == "" {
			return 0, 0
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

// decoding is what decode learned about the problems it reported, so that
// the validator's complaints that merely echo them can be dropped.
type decoding struct {
	// canon is the index's canon, or the identity.
	canon func(string) string
	// refused are the paths of values that did not decode (wrong type,
	// repeated, a fraction for an integer): yaml left them zero, so what
	// the validator says about them or below them is an echo ("missing").
	refused []string
	// uncertain are the objects (by path) with a refused value or an
	// unknown field among their own fields: a required field missing
	// there may well be the one refused or misspelled.
	uncertain map[string]bool
}

// echo reports whether a validator error is an echo of a decoding problem:
// it is about a refused value or something under one, or it says something
// required is missing (Error.requires) in an uncertain object or of one.
func (d *decoding) echo(e *Error) bool {
	if d.covers(e.Field) {
		return true
	}
	for _, f := range [...]string{e.Field, d.canon(e.Field)} {
		if e.requires && (d.uncertain[f] || d.uncertain[parent(f)]) {
			return true
		}
	}
	return false
}

// covers reports whether path is a refused value or inside one, as
// written or as the text it leads to (see index.canon).
func (d *decoding) covers(path string) bool {
	return d.coversPath(path) || d.coversPath(d.canon(path))
}

func (d *decoding) coversPath(path string) bool {
	for _, b := range d.refused {
		if path == b || b == "" || strings.HasPrefix(path, b) && (path[len(b)] == '.' || path[len(b)] == '[') {
			return true
		}
	}
	return false
}

// refuse records a value that did not decode.
func (d *decoding) refuse(path string) {
	d.refused = append(d.refused, path)
	d.uncertain[parent(path)] = true
}

// decode parses data strictly into a rawConfig and indexes it. It reports
// every decoding problem of the file: yaml's type errors (a value of the
// wrong type, an unknown or repeated field) and fractions where an integer
// is wanted. yaml decodes all it can, so raw is returned with the errors
// for the validator to check what did decode. raw is nil when data is not
// YAML at all, or when a problem could not be located (then the decoding
// problems are all that is reported).
func decode(file string, data []byte) (raw *rawConfig, ix *index, errs Errors, d *decoding) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		e := syntaxError(file, err)
		if line, col, off, ok := locateSyntaxError(data, err.Error()); ok && line >= e.Line {
			e.Line, e.Column = line, col
			if data[off] == '\t' && strings.HasSuffix(e.Problem, "found character that cannot start any token") {
				e.Problem += " (a tab: YAML indents with spaces)"
			}
		}
		return nil, nil, Errors{e}, nil
	}
	if len(root.Content) == 0 {
		return nil, nil, Errors{{File: file, Problem: "empty configuration"}}, nil
	}
	ix = newIndex()
	ix.walk(&root, "")
	ix.vals[""] = root.Content[0]

	raw, d = new(rawConfig), &decoding{canon: ix.canon, uncertain: map[string]bool{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(raw); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, nil, Errors{syntaxError(file, err)}, nil
		}
		// yaml repeats a message for each time it decoded the text, once
		// per alias to it (and for each of two values on one line that
		// fail alike): the nth repetition is the nth place it fits.
		seen := map[string]int{}
		for _, msg := range te.Errors {
			e, kind := ix.explain(file, msg, seen[msg])
			seen[msg]++
			if kind == repeated {
				continue
			}
			errs = append(errs, e)
			switch kind {
			case unlocated:
				raw = nil
			case unknownField:
				d.uncertain[parent(e.Field)] = true
			case badValue:
				d.refuse(e.Field)
			case badMapping:
				// yaml drops a whole mapping that repeats a key.
				d.refuse(parent(e.Field))
			}
		}
	}
	for _, e := range ix.checkIntegers(file, d) {
		errs = append(errs, e)
		d.refuse(e.Field)
	}
	sortErrors(errs)
	return raw, ix, errs, d
}

// dedup drops the errors that repeat an earlier one: the same problem with
// the same text, reached by another path through an alias (see
// index.canon). errs must be sorted; the first, usually the text's own
// place, is kept.
func dedup(errs Errors, ix *index) Errors {
	type key struct{ file, field, problem string }
	seen := map[key]bool{}
	out := errs[:0]
	for _, e := range errs {
		k := key{e.File, ix.canon(e.Field), e.Problem}
		if e.Field == "" {
			k.field = strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Column)
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	return out
}

// sortErrors orders errs by line and column, keeping the order of errors
// at one position.
func sortErrors(errs Errors) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
}

var syntaxRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func syntaxError(file string, err error) *Error {
	msg := err.Error()
	if m := syntaxRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: file, Line: line, Problem: "YAML syntax: " + m[2]}
	}
	return &Error{File: file, Problem: "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")}
}

// maxLocate bounds the files locateSyntaxError searches: each step parses
// the file again.
const maxLocate = 1 << 20

// locateSyntaxError returns the line and column (1-based, in characters)
// and the byte offset of the character at which yaml found the syntax
// error it reported as msg, and whether it could tell. yaml (go.yaml.in
// /yaml/v3) exposes no column: its message gives at most a line, which may
// be where the enclosing construct starts, and none on the first line. So
// this finds the shortest prefix of data that yaml refuses with the very
// same message: its last character is the one that made yaml fail. The
// prefix is found by bisection (yaml reads its input in one pass, so
// longer prefixes fail alike) and then checked; when the check fails, or
// only the whole file fails so (yaml noticed at the end, its message
// naming another line), ok is false.
func locateSyntaxError(data []byte, msg string) (line, col, off int, ok bool) {
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

// checkIntegers refuses fractions where the schema wants an integer: yaml
// would silently truncate "requests: 2.5" to 2. A value that an alias
// brings to such a field is refused there. Values d has refused already
// have an error from yaml.
func (ix *index) checkIntegers(file string, d *decoding) Errors {
	var errs Errors
	for p, n := range ix.vals {
		if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!int" || n.ShortTag() == "!!null" {
			continue
		}
		for _, q := range append([]string{p}, ix.expand(p)...) {
			t := schemaType(q)
			if t == nil || d.coversPath(q) {
				continue
			}
			switch t.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
				reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				errs = append(errs, &Error{File: file, Line: n.Line, Column: n.Column, Field: q,
					Problem: "want an integer, got " + describeValue(n.ShortTag(), n.Value)})
			}
		}
	}
	return errs
}

// yaml.v3's unmarshal error texts, as of v3.0.x.
var (
	unknownFieldRE = regexp.MustCompile(`^line (\d+): field (\S+) not found in type (\S+)$`)
	repeatFieldRE  = regexp.MustCompile(`^line (\d+): field (\S+) already set in type \S+$`)
	repeatKeyRE    = regexp.MustCompile(`^line (\d+): mapping key "(.*)" already defined at line (\d+)$`)
	wrongTypeRE    = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")
	otherRE        = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// problemKind says what explain found.
type problemKind uint8

const (
	unlocated    problemKind = iota // not tied to a field
	unknownField                    // Error.Field is not in the schema
	badValue                        // Error.Field's value did not decode
	badMapping                      // Error.Field is a repeated map key: its mapping did not decode
	repeated                        // a repetition of a message with no place left for it: drop it
)

// explain turns one of yaml's unmarshal error strings into an Error that
// names the field, and says what kind of problem it is. nth counts the
// earlier times yaml gave the same message.
func (ix *index) explain(file, msg string, nth int) (*Error, problemKind) {
	located := func(e *Error, ok bool, k problemKind) (*Error, problemKind) {
		if !ok {
			return e, unlocated
		}
		return e, k
	}
	if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		e, ok := ix.atKey(file, line, m[2], m[3], nth)
		if e == nil {
			return nil, repeated
		}
		e.Problem = "unknown field"
		if names := knownFields[m[3]]; len(names) > 0 {
			e.Problem += " (known here: " + strings.Join(names, ", ") + ")"
		}
		return located(e, ok, unknownField)
	}
	if m := repeatFieldRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		e, ok := ix.repeated(file, line, m[2])
		return located(e, ok, badValue)
	}
	if m := repeatKeyRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		name, err := strconv.Unquote(`"` + m[2] + `"`)
		if err != nil {
			name = m[2]
		}
		e, ok := ix.repeated(file, line, name)
		return located(e, ok, badMapping)
	}
	if m := wrongTypeRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		tag, val, want := m[2], m[3], m[4]
		e := &Error{File: file, Line: line}
		places := ix.atValue(line, tag, val, want)
		if nth > 0 && nth >= len(places) {
			return e, repeated
		}
		if nth < len(places) {
			pl := places[nth]
			e.Field, e.Line, e.Column = pl.path, pl.node.Line, pl.node.Column
		}
		e.Problem = "want " + describeGoType(want) + ", got " + describeValue(tag, val)
		return located(e, len(places) > 0, badValue)
	}
	e := &Error{File: file, Problem: msg}
	if m := otherRE.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Problem = m[2]
	}
	return e, unlocated
}

// atKey returns an Error located at the nth place of a key named name on
// line in a mapping that decodes into typ (as yaml names a type,
// "config.rawRate"), and whether there is one; nil when yaml repeats
// itself (see atValue). A key an alias brings to a mapping of another
// type is reported by the path through the alias, at the key.
func (ix *index) atKey(file string, line int, name, typ string, nth int) (*Error, bool) {
	var places, fitting []place
	for _, k := range ix.keys {
		if k.node.Line != line || k.node.Value != name {
			continue
		}
		for _, q := range append([]string{k.path}, ix.expand(k.path)...) {
			places = append(places, place{q, k.node})
			if t := schemaType(parent(q)); t != nil && t.String() == typ {
				fitting = append(fitting, place{q, k.node})
			}
		}
	}
	if len(fitting) > 0 {
		places = fitting
	}
	// ix.keys is in file order, and expand's results are too.
	slices.SortStableFunc(places, func(a, b place) int { return a.node.Column - b.node.Column })
	switch {
	case nth < len(places):
		pl := places[nth]
		return &Error{File: file, Line: line, Column: pl.node.Column, Field: pl.path}, true
	case nth > 0:
		return nil, false
	}
	return &Error{File: file, Line: line, Field: name}, false
}

// repeated reports a key given twice in one mapping; line is the second's.
// It also reports whether it found the key.
func (ix *index) repeated(file string, line int, name string) (*Error, bool) {
	first := map[string]*yaml.Node{}
	for _, k := range ix.keys {
		if k.node.Value != name {
			continue
		}
		if f := first[k.path]; f != nil && k.node.Line == line {
			return &Error{File: file, Line: line, Column: k.node.Column, Field: k.path,
				Problem: "given twice (first at line " + strconv.Itoa(f.Line) + ")"}, true
		}
		if first[k.path] == nil {
			first[k.path] = k.node
		}
	}
	return &Error{File: file, Line: line, Field: name, Problem: "given twice"}, false
}

// place is where a problem is reported: a field path and the node whose
// position is given.
type place struct {
	path string
	node *yaml.Node
}

// atValue finds the places of the value yaml complained about: a node on
// line with the tag and value it printed, at a path (as written, or
// through aliases) where the schema expects want. yaml names the line of
// the text it decoded, so an alias's value is found at its anchor's line;
// the alias itself is then the place, since the text is wrong only where
// the alias brings it. When no path expects want, every match is a place.
// Places come leftmost first, a text's own path before the paths aliases
// bring it to; map order is random, so ties go to the shorter path.
func (ix *index) atValue(line int, tag, val, want string) []place {
	truncated := strings.HasSuffix(val, "...")
	prefix := strings.TrimSuffix(val, "...")
	type candidate struct {
		place
		fits  bool
		alias int // 0 for the text's own path, 1 + the expansion's index otherwise
	}
	var cands []candidate
	anyFits := false
	for p, n := range ix.vals {
		if n.Line != line || n.ShortTag() != tag || n.Kind == yaml.AliasNode {
			continue
		}
		if tag != "!!map" && tag != "!!seq" {
			if truncated && !strings.HasPrefix(n.Value, prefix) || !truncated && n.Value != val {
				continue
			}
		}
		for i, q := range append([]string{p}, ix.expand(p)...) {
			t := schemaType(q)
			c := candidate{place{q, n}, t != nil && t.String() == want, i}
			if alias := ix.vals[q]; alias != nil && alias.Kind == yaml.AliasNode {
				c.node = alias
			}
			anyFits = anyFits || c.fits
			cands = append(cands, c)
		}
	}
	if anyFits {
		cands = slices.DeleteFunc(cands, func(c candidate) bool { return !c.fits })
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.node.Line != b.node.Line {
			return a.node.Line - b.node.Line
		}
		if a.node.Column != b.node.Column {
			return a.node.Column - b.node.Column
		}
		if a.alias != b.alias {
			return a.alias - b.alias
		}
		if len(a.path) != len(b.path) {
			return len(a.path) - len(b.path)
		}
		return strings.Compare(a.path, b.path)
	})
	places := make([]place, len(cands))
	for i, c := range cands {
		places[i] = c.place
	}
	return places
}

// schemaType returns the Go type the raw schema decodes path into, with
// pointers removed, or nil when path is not in the schema.
func schemaType(path string) reflect.Type {
	t := reflect.TypeOf(rawConfig{})
	for {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if path == "" {
			return t
		}
		if path[0] == '[' {
			j := strings.IndexByte(path, ']')
			if j < 0 || t.Kind() != reflect.Slice {
				return nil
			}
			t, path = t.Elem(), path[j+1:]
			continue
		}
		path = strings.TrimPrefix(path, ".")
		j := strings.IndexAny(path, ".[")
		if j < 0 {
			j = len(path)
		}
		name := path[:j]
		path = path[j:]
		switch t.Kind() {
		case reflect.Map:
			t = t.Elem()
		case reflect.Struct:
			f, ok := fieldByTag(t, name)
			if !ok {
				return nil
			}
			t = f.Type
		default:
			return nil
		}
	}
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); strings.Split(f.Tag.Get("yaml"), ",")[0] == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// describeGoType names a decoding target in the file's terms.
func describeGoType(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		if t == "[]string" {
			return "a list of strings"
		}
		return "a list"
	case strings.HasPrefix(t, "map["), strings.Contains(t, "config.raw"):
		return "a mapping"
	case strings.Contains(t, "float"):
		return "a number"
	case strings.Contains(t, "uint"):
		return "an integer ≥ 0"
	case strings.Contains(t, "int"):
		return "an integer"
	case t == "bool" || t == "*bool":
		return "true or false"
	case t == "string":
		return "a string"
	}
	return t
}

// describeValue names what the file holds.
func describeValue(tag, val string) string {
	switch tag {
	case "!!map":
		return "a mapping"
	case "!!seq":
		return "a list"
	case "!!str":
		return strconv.Quote(val)
	}
	return val
}
