package identity

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/core"
)

// JWT defaults.
const (
	// DefaultMaxTokenSize bounds a presented token, in bytes; longer ones
	// are refused before any decoding.
	DefaultMaxTokenSize = 8 << 10
	// DefaultConsumerClaim is the claim naming the consumer (RFC 7519
	// §4.1.2 "sub").
	DefaultConsumerClaim = "sub"
	// DefaultJWTIDPrefix starts the consumer IDs of JWT consumers.
	DefaultJWTIDPrefix = "jwt:"
	// MinHMACKeySize is the shortest accepted HMAC secret, in bytes (RFC
	// 7518 §3.2 asks for at least the hash size; 32 bytes for HS256).
	MinHMACKeySize = 32
	// MinRSAKeyBits is the smallest accepted RSA modulus (RFC 7518 §3.3).
	MinRSAKeyBits = 2048
	// maxLiteralID bounds a claim value used verbatim in a consumer ID;
	// longer values are hashed.
	maxLiteralID = 128
	// maxPolicies and maxPolicyID bound the policy claim.
	maxPolicies, maxPolicyID = 32, 128
)

// jwtAlgorithms are the JWS algorithms (RFC 7518 §3.1, RFC 8037 §3.1) a JWT
// authenticator can be pinned to. "none" is not among them.
var jwtAlgorithms = map[string]bool{
	"HS256": true, "HS384": true, "HS512": true,
	"RS256": true, "RS384": true, "RS512": true,
	"PS256": true, "PS384": true, "PS512": true,
	"ES256": true, "ES384": true, "ES512": true,
	"EdDSA": true,
}

// JWTKey is one key that verifies token signatures.
type JWTKey struct {
	// ID is the key ID ("kid", RFC 7515 §4.1.4) a token must name to be
	// checked with this key. Required when several keys are configured;
	// a lone key without an ID checks every token, whatever its kid.
	ID string
	// Key is the verification key: a []byte shared secret for HS*
	// (at least MinHMACKeySize bytes), an *rsa.PublicKey for RS* and PS*
	// (at least MinRSAKeyBits), an *ecdsa.PublicKey for ES256 (P-256),
	// ES384 (P-384) or ES512 (P-521), or an ed25519.PublicKey for EdDSA.
	// A token is checked only with a key of its algorithm's type, so an
	// HS256 token is never checked against a public key.
	Key any
}

// SecretKey returns a JWTKey for an HMAC shared secret.
func SecretKey(id string, secret []byte) JWTKey {
	return JWTKey{ID: id, Key: append([]byte(nil), secret...)}
}

// ParseJWTKeyPEM returns a JWTKey for the first PEM block of data: a
// "PUBLIC KEY" (PKIX, RSA, ECDSA or Ed25519), an "RSA PUBLIC KEY" (PKCS #1)
// or a "CERTIFICATE", whose public key is used (the certificate's validity
// and chain are not checked: the key is pinned). Private keys are refused:
// a gateway needs only the public half.
func ParseJWTKeyPEM(id string, data []byte) (JWTKey, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return JWTKey{}, errors.New("identity: no PEM block found")
	}
	var key any
	var err error
	switch b.Type {
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(b.Bytes)
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(b.Bytes)
	case "CERTIFICATE":
		var c *x509.Certificate
		if c, err = x509.ParseCertificate(b.Bytes); err == nil {
			key = c.PublicKey
		}
	default:
		return JWTKey{}, fmt.Errorf("identity: PEM block %q: want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", b.Type)
	}
	if err != nil {
		return JWTKey{}, fmt.Errorf("identity: PEM block %q: %w", b.Type, err)
	}
	k := JWTKey{ID: id, Key: key}
	if err := k.check(); err != nil {
		return JWTKey{}, err
	}
	return k, nil
}

// LoadJWTKeyPEM reads the PEM file at path with ParseJWTKeyPEM.
func LoadJWTKeyPEM(id, path string) (JWTKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return JWTKey{}, fmt.Errorf("identity: JWT key: %w", err)
	}
	k, err := ParseJWTKeyPEM(id, data)
	if err != nil {
		return JWTKey{}, fmt.Errorf("%w (%s)", err, path)
	}
	return k, nil
}

// check validates the key's type and strength.
func (k *JWTKey) check() error {
	switch key := k.Key.(type) {
	case []byte:
		if len(key) < MinHMACKeySize {
			return fmt.Errorf("identity: JWT key %q: HMAC secret of %d bytes, want at least %d", k.ID, len(key), MinHMACKeySize)
		}
	case *rsa.PublicKey:
		if key.N == nil || key.N.BitLen() < MinRSAKeyBits {
			return fmt.Errorf("identity: JWT key %q: RSA key under %d bits", k.ID, MinRSAKeyBits)
		}
	case *ecdsa.PublicKey:
		if key.Curve != elliptic.P256() && key.Curve != elliptic.P384() && key.Curve != elliptic.P521() {
			return fmt.Errorf("identity: JWT key %q: ECDSA curve must be P-256, P-384 or P-521", k.ID)
		}
	case ed25519.PublicKey:
		if len(key) != ed25519.PublicKeySize {
			return fmt.Errorf("identity: JWT key %q: bad Ed25519 key size", k.ID)
		}
	default:
		return fmt.Errorf("identity: JWT key %q: unsupported key type %T", k.ID, k.Key)
	}
	return nil
}

// keyFits reports whether key may verify a token signed with alg: the key
// type must be the algorithm's, and for ECDSA the curve too.
func keyFits(key any, alg string) bool {
	switch key := key.(type) {
	case []byte:
		return strings.HasPrefix(alg, "HS")
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return key.Curve == elliptic.P256()
		case "ES384":
			return key.Curve == elliptic.P384()
		case "ES512":
			return key.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// JWTOptions configure a JWT authenticator. Algorithms and exactly one of
// Keys or JWKS are required; every other zero value has a safe default.
type JWTOptions struct {
	// Algorithms are the accepted JWS "alg" values, e.g. {"RS256"}. A token
	// with any other alg (including "none") is refused before its key is
	// looked up; the alg a token names never widens this list.
	Algorithms []string
	// Keys are static verification keys (SecretKey, ParseJWTKeyPEM,
	// LoadJWTKeyPEM). With more than one, each needs a unique ID and a
	// token must name one in its kid header.
	Keys []JWTKey
	// JWKS is a remote JSON Web Key Set (RFC 7517) to take keys from
	// instead. HMAC algorithms cannot be used with it.
	JWKS *JWKS
	// Issuer, when set, must equal the token's "iss" (RFC 7519 §4.1.1).
	Issuer string
	// Audience, when not empty, must share a value with the token's "aud"
	// (RFC 7519 §4.1.3).
	Audience []string
	// Leeway is the clock skew allowed when checking exp, nbf and iat;
	// default 0.
	Leeway time.Duration
	// AllowNoExpiry accepts tokens without "exp". By default exp is
	// required: a token without one would work forever.
	AllowNoExpiry bool
	// ConsumerClaim names the claim whose value is the consumer; default
	// "sub". A dotted path ("user.id") reaches into nested objects; a
	// top-level claim whose name contains dots is found first. The value
	// must be a non-empty string or a number; a number is taken as its
	// JSON text exactly as the token writes it (1 is the consumer "1",
	// 1.0 the consumer "1.0").
	ConsumerClaim string
	// PolicyClaim, when set, names the claim (dotted paths as above)
	// listing the consumer's policies: a string (one policy ID) or an
	// array of strings. When it is absent or empty, DefaultPolicies apply,
	// as Tyk's JWT auth falls back to its default policy. A policy the
	// engine does not know fails the request with core.ErrUnknownPolicy.
	PolicyClaim string
	// DefaultPolicies apply when the token names no policy. With neither
	// PolicyClaim nor DefaultPolicies, consumers carry no policy: a
	// core.Engine refuses each of them (core.ErrNoPolicy, answered 403);
	// that suits only a decider of your own that ignores policies.
	DefaultPolicies []string
	// IDPrefix starts every consumer ID; default "jwt:". Give each JWT
	// authenticator sharing an engine its own prefix (e.g. per issuer).
	IDPrefix string
	// MaxTokenSize bounds a token's length in bytes; default
	// DefaultMaxTokenSize (8 KiB).
	MaxTokenSize int
	// Sources are where the token may be presented; default
	// DefaultJWTSources, the Authorization header. There the token must
	// follow the Bearer scheme ("Authorization: Bearer <token>", RFC 6750
	// §2.1; the scheme name is case-insensitive): any other Authorization
	// value is refused. Other header sources, query parameters and cookies
	// carry the bare token. As for API keys, a repeated header or query
	// parameter source or two sources with different tokens are refused
	// as ambiguous.
	Sources []Source
	// Now is the clock for exp, nbf and iat; default time.Now.
	Now func() time.Time
}

// JWT authenticates requests by a signed JSON Web Token (RFC 7519, JWS
// compact serialisation, RFC 7515) using github.com/golang-jwt/jwt/v5.
//
// A token passes when it is at most MaxTokenSize bytes, its alg is one of
// Algorithms, its kid names a configured key whose type fits that alg (a
// kid may be left out only when there is exactly one key), its signature
// verifies, it has no "crit" header (no extensions are understood, RFC 7515
// §4.1.11), exp is present (unless AllowNoExpiry) and not past, nbf and
// iat are not in the future (each with Leeway), iss and aud match when
// configured, and the consumer claim is present. Its header and claims
// must be JSON objects in which no member name repeats, at any depth (RFC
// 7515 §4 and RFC 7519 §4 allow refusing them; readers that keep the first
// duplicate and readers that keep the last would see different claims),
// with nothing after the claims object, and exp, nbf and iat must be
// numbers of at most MaxNumericDate in magnitude. Header parameters that
// point at keys (jku, jwk, x5u, x5c) are ignored: keys come only from the
// configuration.
//
// The consumer ID is IDPrefix followed by the claim value when that is
// 1..128 printable ASCII characters, no spaces, not starting with '~';
// otherwise by '~' and the hex of the first 16 bytes of its SHA-256, so IDs
// stay short and printable and the two forms never collide. The claim
// value is a string's characters or a number's JSON text as written, not
// converted: "sub":1 and "sub":"1" name one consumer, 1.0 and 1e0 two
// others. Tokens with the same consumer claim share their limits, whatever
// else differs.
//
// Every failure is a 401 *Error: ErrMissingCredentials when no token is
// presented, ErrInvalidCredentials otherwise, with a short client-safe
// reason ("invalid token", "token expired", ...). A JWT is safe for
// concurrent use.
type JWT struct {
	parser   *jwt.Parser
	keys     []JWTKey
	byID     map[string]*JWTKey
	jwks     *JWKS
	claim    []string // ConsumerClaim, whole and split on dots
	policy   []string
	defaults []string
	prefix   string
	maxSize  int
	sources  []Source
	lookup   []string // lookupNames(sources)
	required []string // the registered claims the parser requires, in the order they are named when missing
}

// NewJWT returns a JWT authenticator for o. It fails on a missing or
// unknown algorithm, on none or both of Keys and JWKS, on a key that fits
// none of the algorithms or is too weak, on duplicate or missing key IDs,
// on HMAC algorithms with a JWKS, or on a negative Leeway.
func NewJWT(o JWTOptions) (*JWT, error) {
	if len(o.Algorithms) == 0 {
		return nil, errors.New("identity: JWT: no algorithms configured")
	}
	for _, a := range o.Algorithms {
		if !jwtAlgorithms[a] {
			return nil, fmt.Errorf("identity: JWT: unsupported algorithm %q", a)
		}
		if o.JWKS != nil && strings.HasPrefix(a, "HS") {
			return nil, fmt.Errorf("identity: JWT: %s needs a shared secret, not a JWKS", a)
		}
	}
	if (len(o.Keys) == 0) == (o.JWKS == nil) {
		return nil, errors.New("identity: JWT: configure exactly one of Keys and JWKS")
	}
	if o.Leeway < 0 {
		return nil, errors.New("identity: JWT: negative leeway")
	}
	j := &JWT{
		jwks:     o.JWKS,
		defaults: append([]string(nil), o.DefaultPolicies...),
		prefix:   o.IDPrefix,
		maxSize:  o.MaxTokenSize,
		sources:  o.Sources,
	}
	for i := range o.Keys {
		k := o.Keys[i]
		if b, ok := k.Key.([]byte); ok {
			k.Key = append([]byte(nil), b...)
		}
		if err := k.check(); err != nil {
			return nil, err
		}
		fits := false
		for _, a := range o.Algorithms {
			fits = fits || keyFits(k.Key, a)
		}
		if !fits {
			return nil, fmt.Errorf("identity: JWT key %q (%T) fits none of the algorithms %v", k.ID, k.Key, o.Algorithms)
		}
		j.keys = append(j.keys, k)
	}
	if len(j.keys) > 1 {
		j.byID = make(map[string]*JWTKey, len(j.keys))
		for i := range j.keys {
			k := &j.keys[i]
			if k.ID == "" {
				return nil, errors.New("identity: JWT: with several keys every key needs an ID")
			}
			if j.byID[k.ID] != nil {
				return nil, fmt.Errorf("identity: JWT: duplicate key ID %q", k.ID)
			}
			j.byID[k.ID] = k
		}
	}
	claim := o.ConsumerClaim
	if claim == "" {
		claim = DefaultConsumerClaim
	}
	j.claim = claimPath(claim)
	if o.PolicyClaim != "" {
		j.policy = claimPath(o.PolicyClaim)
	}
	if j.prefix == "" {
		j.prefix = DefaultJWTIDPrefix
	}
	if j.maxSize <= 0 {
		j.maxSize = DefaultMaxTokenSize
	}
	if len(j.sources) == 0 {
		j.sources = DefaultJWTSources()
	}
	j.lookup = lookupNames(j.sources)
	popts := []jwt.ParserOption{
		jwt.WithValidMethods(append([]string(nil), o.Algorithms...)),
		jwt.WithLeeway(o.Leeway),
		jwt.WithIssuedAt(),
		jwt.WithJSONNumber(),
		jwt.WithStrictDecoding(),
	}
	if !o.AllowNoExpiry {
		popts = append(popts, jwt.WithExpirationRequired())
		j.required = append(j.required, "exp")
	}
	if o.Issuer != "" {
		popts = append(popts, jwt.WithIssuer(o.Issuer))
		j.required = append(j.required, "iss")
	}
	if len(o.Audience) > 0 {
		popts = append(popts, jwt.WithAudience(o.Audience...))
		j.required = append(j.required, "aud")
	}
	if o.Now != nil {
		popts = append(popts, jwt.WithTimeFunc(o.Now))
	}
	j.parser = jwt.NewParser(popts...)
	return j, nil
}

// claimPath returns {path} followed by its dot-separated parts when it has
// dots.
func claimPath(path string) []string {
	if !strings.Contains(path, ".") {
		return []string{path}
	}
	return append([]string{path}, strings.Split(path, ".")...)
}

// lookup finds a claim by path (see claimPath): the whole name at the top
// level first, then the nested path.
func lookup(m map[string]any, path []string) (any, bool) {
	if v, ok := m[path[0]]; ok || len(path) == 1 {
		return v, ok
	}
	var cur any = m
	for _, p := range path[1:] {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = obj[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// Extract returns the presented token, or "" when there is none. It fails
// with a 401 *Error when the request is ambiguous (see APIKey.Extract) or
// its Authorization header does not use the Bearer scheme.
func (j *JWT) Extract(r Request) (string, error) {
	return owned(extract(r, j.sources, j.lookup, true))
}

// Sources returns the sources the token is read from.
func (j *JWT) Sources() []Source { return append([]Source(nil), j.sources...) }

// Authenticate implements Authenticator; see JWT for what is checked.
func (j *JWT) Authenticate(ctx context.Context, r Request) (*core.Consumer, error) {
	raw, err := j.Extract(r)
	if err != nil {
		return nil, err
	}
	if raw == "" {
		return nil, missing("no token")
	}
	return j.authenticate(ctx, raw)
}

// Client-safe failure reasons.
const (
	reasonInvalid   = "invalid token"
	reasonTooLarge  = "token too large"
	reasonExpired   = "token expired"
	reasonNotYet    = "token not valid yet"
	reasonIssuer    = "invalid token issuer"
	reasonAudience  = "invalid token audience"
	reasonMissing   = "token lacks a required claim"
	reasonNoSubject = "token names no consumer"
	reasonPolicies  = "invalid policy claim"
	reasonDupClaim  = "token repeats a claim"
	reasonNotUTF8   = "token is not UTF-8"
)

func (j *JWT) authenticate(ctx context.Context, raw string) (*core.Consumer, error) {
	if len(raw) > j.maxSize {
		return nil, invalid(401, reasonTooLarge)
	}
	if reason := checkJSON(raw); reason != "" {
		return nil, invalid(401, reason)
	}
	claims := jwt.MapClaims{}
	if _, err := j.parser.ParseWithClaims(raw, claims, func(t *jwt.Token) (any, error) { return j.key(ctx, t) }); err != nil {
		if errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			// Validation runs after the signature is verified and the
			// claims decoded: name the claim the token lacks.
			for _, name := range j.required {
				if v, ok := claims[name]; !ok || absent(v) {
					return nil, invalid(401, reasonMissing+": "+name)
				}
			}
		}
		return nil, invalid(401, tokenReason(err))
	}
	v, _ := lookup(claims, j.claim)
	var sub string
	switch v := v.(type) {
	case string:
		sub = v
	case json.Number:
		sub = v.String()
	}
	if sub == "" {
		return nil, invalid(401, reasonNoSubject)
	}
	c := &core.Consumer{ID: consumerID(j.prefix, sub), Policies: j.defaults}
	if j.policy != nil {
		pols, ok := policies(claims, j.policy)
		if !ok {
			return nil, invalid(401, reasonPolicies)
		}
		if len(pols) > 0 {
			c.Policies = pols
		}
	}
	return c, nil
}

// absent reports whether a decoded claim's value counts as missing, as
// golang-jwt's validator counts it: null, "" or an empty list.
func absent(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case string:
		return v == ""
	case []any:
		return len(v) == 0
	}
	return false
}

// tokenReason maps a jwt error to a client-safe reason.
func tokenReason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed), errors.Is(err, jwt.ErrTokenUnverifiable), errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return reasonInvalid
	case errors.Is(err, jwt.ErrTokenExpired):
		return reasonExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return reasonNotYet
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return reasonIssuer
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return reasonAudience
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return reasonMissing
	}
	return reasonInvalid
}

// MaxNumericDate is the largest exp, nbf or iat accepted, in magnitude:
// 9999-12-31T23:59:59Z in seconds since the epoch. golang-jwt converts a
// NumericDate to time.Time through int64, so a bigger one such as 1e300
// would wrap around to a date in the distant past.
const MaxNumericDate = 253402300799

// checkJSON checks what golang-jwt lets through in a compact token's header
// and claims: a member name that repeats in one object, at any depth
// (encoding/json keeps the last value; claim-confusion attacks rely on a
// reader that keeps the first), data after the claims object (the parser
// decodes the first JSON value and ignores the rest), exp, nbf or iat
// out of range (see MaxNumericDate), and a header or claims that are not
// UTF-8 (RFC 7519 section 7.2; encoding/json reads each bad byte, and
// each escaped lone surrogate such as \ud800, as U+FFFD, so two subjects
// that differ in such bytes would be one consumer). It returns a failure
// reason, or "" when it finds none of these. Segments that are not
// base64url or not JSON are left for the parser to refuse. Each segment is
// read once, without allocating, by fastJSON; what it declines goes
// through encoding/json's token stream (scanJSON), which gives the same
// answers (a fuzz test holds them to it).
func checkJSON(raw string) string {
	hdr, rest, ok := strings.Cut(raw, ".")
	payload, _, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return ""
	}
	enc := base64.RawURLEncoding.Strict()
	if b, err := enc.DecodeString(hdr); err == nil {
		if !utf8.Valid(b) {
			return reasonNotUTF8
		}
		if r := checkSegment(b, false); r == reasonNotUTF8 {
			return r
		} else if r != "" {
			return reasonInvalid
		}
	}
	if b, err := enc.DecodeString(payload); err == nil {
		if !utf8.Valid(b) {
			return reasonNotUTF8
		}
		return checkSegment(b, true)
	}
	return ""
}

// checkSegment checks a decoded header (claims false) or claim set: the
// fast path (fastJSON) where it answers, else scanJSON.
func checkSegment(b []byte, claims bool) string {
	if r, ok := fastJSON(b, claims); ok {
		return r
	}
	return scanJSON(b, claims)
}

// dupReason is the failure reason of a repeated member name: in a claim
// set, or in a header.
func dupReason(claims bool) string {
	if claims {
		return reasonDupClaim
	}
	return reasonInvalid
}

// dateClaim returns name when it is a date claim checked for range (exp,
// nbf, iat), else "".
func dateClaim[T string | []byte](name T) string {
	switch string(name) {
	case "exp":
		return "exp"
	case "nbf":
		return "nbf"
	case "iat":
		return "iat"
	}
	return ""
}

// dateReason returns the failure reason of the date claim member whose
// value is the JSON number text n, "" when it is within MaxNumericDate.
func dateReason[T ~string | []byte](member string, n T) string {
	if f, err := strconv.ParseFloat(string(n), 64); err != nil || math.Abs(f) > MaxNumericDate {
		return "token " + member + " out of range"
	}
	return ""
}

// scanJSON walks the JSON text b as a token stream; see checkJSON. claims
// says b is a claim set, whose exp, nbf and iat are range-checked.
func scanJSON(b []byte, claims bool) string {
	if loneSurrogate(b) {
		return reasonNotUTF8 // the token stream would read it as U+FFFD
	}
	type level struct {
		names   map[string]bool // nil for an array
		wantKey bool            // an object's next token is a member name
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var stack []level
	var member string // the current top-level member, when a date claim (dateClaim)
	values := 0       // top-level values seen
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return ""
		}
		if err != nil {
			if values == 1 && len(stack) == 0 {
				return reasonInvalid // data after the first value
			}
			return "" // malformed: the parser refuses it
		}
		if len(stack) == 0 {
			if values++; values > 1 {
				return reasonInvalid
			}
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		var top *level
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		if top != nil && top.wantKey {
			name, _ := tok.(string) // the decoder allows only strings here
			if top.names[name] {
				return dupReason(claims)
			}
			top.names[name] = true
			top.wantKey = false
			if len(stack) == 1 {
				member = dateClaim(name)
			}
			continue
		}
		// tok is a value; in an object, a member name comes next.
		if top != nil && top.names != nil {
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{names: map[string]bool{}, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, level{})
			continue
		}
		if n, ok := tok.(json.Number); ok && claims && len(stack) == 1 && member != "" {
			if r := dateReason(member, n); r != "" {
				return r
			}
		}
	}
}

// errKey is returned by the key function; the parser wraps it in
// ErrTokenUnverifiable.
var errKey = errors.New("no usable key")

// key is the jwt.Keyfunc: the parser has already checked alg against
// Algorithms.
func (j *JWT) key(ctx context.Context, t *jwt.Token) (any, error) {
	if _, crit := t.Header["crit"]; crit {
		return nil, errKey
	}
	alg := t.Method.Alg()
	kidv, hasKID := t.Header["kid"]
	kid, isStr := kidv.(string)
	if hasKID && !isStr {
		return nil, errKey
	}
	var key any
	if j.jwks != nil {
		var err error
		if key, err = j.jwks.key(ctx, t, hasKID); err != nil {
			return nil, errKey
		}
	} else {
		var k *JWTKey
		switch {
		case len(j.keys) == 1 && (j.keys[0].ID == "" || j.keys[0].ID == kid || !hasKID):
			k = &j.keys[0]
		case hasKID:
			k = j.byID[kid]
		}
		if k == nil {
			return nil, errKey
		}
		key = k.Key
	}
	if !keyFits(key, alg) {
		return nil, errKey
	}
	return key, nil
}

// JWTConsumerID returns the consumer ID a JWT authenticator whose IDPrefix
// is prefix gives a token whose consumer claim is v (a string's
// characters, or a number's JSON text): prefix and v when v is 1 to 128
// printable ASCII characters without spaces, not starting with '~';
// otherwise prefix, '~' and the hex of the first 16 bytes of v's SHA-256.
// It names a JWT consumer's counters to a reader that holds no token (the
// gateway's admin endpoint).
func JWTConsumerID(prefix, v string) string { return consumerID(prefix, v) }

// consumerID returns prefix and v, or prefix, '~' and a hash of v when v
// is long, empty, starts with '~' or has bytes outside printable ASCII.
func consumerID(prefix, v string) string {
	literal := len(v) > 0 && len(v) <= maxLiteralID && v[0] != '~'
	for i := 0; literal && i < len(v); i++ {
		literal = v[i] > ' ' && v[i] < 0x7f
	}
	if literal {
		return prefix + v
	}
	h := sha256.Sum256([]byte(v))
	return prefix + "~" + hex.EncodeToString(h[:16])
}

// policies reads the policy claim: absent, "" or [] give nil; a string is
// one policy; an array must hold only non-empty strings. IDs must be
// printable ASCII of at most maxPolicyID bytes, at most maxPolicies of
// them.
func policies(claims map[string]any, path []string) ([]string, bool) {
	v, ok := lookup(claims, path)
	if !ok || v == nil {
		return nil, true
	}
	var out []string
	switch v := v.(type) {
	case string:
		if v == "" {
			return nil, true
		}
		out = []string{v}
	case []any:
		if len(v) > maxPolicies {
			return nil, false
		}
		out = make([]string, 0, len(v))
		for _, p := range v {
			s, ok := p.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
	default:
		return nil, false
	}
	for _, p := range out {
		if p == "" || len(p) > maxPolicyID {
			return nil, false
		}
		for i := 0; i < len(p); i++ {
			if p[i] < ' ' || p[i] >= 0x7f {
				return nil, false
			}
		}
	}
	return out, true
}
