package identity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"

	"github.com/limitplane/limitplane/core"
)

// KeyHash is the SHA-256 of an API key. Only hashes are kept after load;
// raw keys never reach a store or a log.
type KeyHash [sha256.Size]byte

// HashKey returns the SHA-256 of raw.
func HashKey(raw string) KeyHash { return sha256.Sum256([]byte(raw)) }

// ParseKeyHash parses "sha256:<64 hex digits>".
func ParseKeyHash(s string) (KeyHash, error) {
	var h KeyHash
	hexpart, ok := strings.CutPrefix(s, "sha256:")
	if !ok {
		return h, fmt.Errorf("identity: key hash %q: want sha256:<64 hex digits>", s)
	}
	b, err := hex.DecodeString(hexpart)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("identity: key hash %q: want sha256:<64 hex digits>", s)
	}
	copy(h[:], b)
	return h, nil
}

// String returns "sha256:<hex>".
func (h KeyHash) String() string { return "sha256:" + hex.EncodeToString(h[:]) }

// ConsumerID returns the consumer ID used for h's counters: "key:" and the
// hex of the hash's first 16 bytes.
func (h KeyHash) ConsumerID() string { return "key:" + hex.EncodeToString(h[:16]) }

// KeyRecord is what the registry knows about one API key.
type KeyRecord struct {
	// Hash is the key's SHA-256.
	Hash KeyHash
	// Policies are the IDs of the policies the key has.
	Policies []string
	// APILimits are per-API limits that replace the policies for those
	// APIs (see core.Consumer.APILimits).
	APILimits map[string]core.Limits
	// Expires is when the key stops working; zero means never.
	Expires time.Time
	// Inactive keys are refused like unknown ones.
	Inactive bool
	// QuotaEpoch is the epoch of the key's key-wide quota counter
	// (core.Consumer.QuotaEpoch); per-API ones are in APILimits.
	QuotaEpoch uint64

	consumer core.Consumer
}

// Consumer returns the engine's view of the key.
func (k *KeyRecord) Consumer() *core.Consumer { return &k.consumer }

// Keys is the key registry: an immutable map from hash to record, swapped
// atomically on change, so lookups take no lock.
type Keys struct {
	m atomic.Pointer[map[KeyHash]*KeyRecord]
}

// NewKeys returns a registry holding records (see Replace).
func NewKeys(records []KeyRecord) (*Keys, error) {
	k := &Keys{}
	if err := k.Replace(records); err != nil {
		return nil, err
	}
	return k, nil
}

// Replace swaps in a new set of records. Duplicate hashes are an error and
// leave the registry unchanged.
func (k *Keys) Replace(records []KeyRecord) error {
	m := make(map[KeyHash]*KeyRecord, len(records))
	for i := range records {
		r := records[i]
		if _, dup := m[r.Hash]; dup {
			return fmt.Errorf("identity: duplicate key %s", r.Hash)
		}
		r.Policies = append([]string(nil), r.Policies...)
		r.consumer = core.Consumer{ID: r.Hash.ConsumerID(), Policies: r.Policies, APILimits: r.APILimits, QuotaEpoch: r.QuotaEpoch}
		m[r.Hash] = &r
	}
	k.m.Store(&m)
	return nil
}

// Lookup returns the record for hash h, or nil.
func (k *Keys) Lookup(h KeyHash) *KeyRecord { return (*k.m.Load())[h] }

// Len returns the number of keys.
func (k *Keys) Len() int { return len(*k.m.Load()) }

// SourceKind says where a credential is read from.
type SourceKind uint8

const (
	// InHeader reads a request header (gRPC: metadata).
	InHeader SourceKind = iota
	// InQuery reads a URL query parameter.
	InQuery
	// InCookie reads a cookie.
	InCookie
)

// Source is one place to look for a credential (an API key or a JWT).
type Source struct {
	// In says whether Name is a header, query parameter or cookie.
	In SourceKind
	// Name is the header, query parameter or cookie name.
	Name string
}

// DefaultKeySources returns the sources tried when APIKeyOptions.Sources
// is empty: the Authorization header (a case-insensitive "Bearer " prefix is
// stripped; a bare key is accepted too), the X-API-Key header, and the
// api_key query parameter.
func DefaultKeySources() []Source {
	return []Source{{InHeader, "Authorization"}, {InHeader, "X-API-Key"}, {InQuery, "api_key"}}
}

// DefaultJWTSources returns the sources JWT reads when JWTOptions.Sources
// is empty: the Authorization header, Bearer scheme only.
func DefaultJWTSources() []Source {
	return []Source{{InHeader, "Authorization"}}
}

// String names the source for messages: "X-API-Key header", "api_key query
// parameter", "session cookie".
func (s Source) String() string {
	switch s.In {
	case InQuery:
		return s.Name + " query parameter"
	case InCookie:
		return s.Name + " cookie"
	}
	return s.Name + " header"
}

// DefaultMaxKeyLength bounds presented keys; longer ones are refused
// without hashing.
const DefaultMaxKeyLength = 512

// APIKeyOptions configure an APIKey authenticator. The zero value uses
// DefaultKeySources, DefaultMaxKeyLength and time.Now.
type APIKeyOptions struct {
	// Sources are where the key may be presented. Every source is read:
	// a request that presents different keys in two of them, or repeats a
	// header or query parameter source, is refused (see Extract).
	Sources []Source
	// MaxKeyLength bounds a key's length in bytes.
	MaxKeyLength int
	// Now is the clock used for key expiry.
	Now func() time.Time
}

// APIKey authenticates requests by API key against a Keys registry.
type APIKey struct {
	keys   *Keys
	opts   APIKeyOptions
	lookup []string // header sources' names in canonical form, by source
}

// NewAPIKey returns an APIKey authenticator over keys.
func NewAPIKey(keys *Keys, opts APIKeyOptions) *APIKey {
	if len(opts.Sources) == 0 {
		opts.Sources = DefaultKeySources()
	}
	if opts.MaxKeyLength <= 0 {
		opts.MaxKeyLength = DefaultMaxKeyLength
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &APIKey{keys: keys, opts: opts, lookup: lookupNames(opts.Sources)}
}

// lookupNames returns each source's name as it is looked up: header names
// in canonical MIME form (textproto.CanonicalMIMEHeaderKey), computed once
// here rather than, allocating, on every request. Header lookups are
// case-insensitive everywhere (net/http, fasthttp, gRPC metadata), so only
// the cost changes; messages keep the configured spelling.
func lookupNames(sources []Source) []string {
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = s.Name
		if s.In == InHeader {
			names[i] = textproto.CanonicalMIMEHeaderKey(s.Name)
		}
	}
	return names
}

// Extract returns the presented key, or "" when there is none. It fails
// with a 401 *Error (ErrInvalidCredentials) when the request is ambiguous:
// a header source given more than once (even with one value twice), a
// query parameter source given more than once (likewise; this needs a
// Request that implements QueryValuer), or two sources presenting
// different keys. Whichever key a reader took (the first, as net/http's
// Header.Get and url.Values.Get do, or the last) a client could then pass
// the gateway with one key while a component behind it acts on the other.
func (a *APIKey) Extract(r Request) (string, error) {
	return extract(r, a.opts.Sources, a.lookup, false)
}

// Sources returns the sources the key is read from.
func (a *APIKey) Sources() []Source { return append([]Source(nil), a.opts.Sources...) }

// extract returns the credential presented in sources, with surrounding
// white space trimmed and, for the Authorization header, the
// case-insensitive "Bearer" scheme (RFC 6750 §2.1) removed; "" when none
// is presented. Every source is read: a header source with more than one
// field line, a query parameter source given more than once (when r is a
// QueryValuer), or two sources with different non-empty values, is
// refused as ambiguous. With bearerOnly, an Authorization header in any other
// scheme (or a bare credential) is refused too.
func extract(r Request, sources []Source, lookup []string, bearerOnly bool) (string, error) {
	var cred string
	var from Source
	for i, s := range sources {
		var v string
		switch s.In {
		case InHeader:
			vals := r.HeaderValues(lookup[i])
			if len(vals) > 1 {
				return "", invalid(401, "ambiguous credentials: more than one "+s.String())
			}
			if len(vals) == 1 {
				v = strings.TrimSpace(vals[0])
			}
			if strings.EqualFold(s.Name, "Authorization") && v != "" {
				if len(v) >= 6 && strings.EqualFold(v[:6], "bearer") && (len(v) == 6 || v[6] == ' ' || v[6] == '\t') {
					v = v[6:] // "Bearer" alone is no credential
				} else if bearerOnly {
					return "", invalid(401, reasonNotBearer)
				}
			}
		case InQuery:
			qv, ok := r.(QueryValuer)
			if !ok {
				v = r.Query(s.Name)
				break
			}
			vals := qv.QueryValues(s.Name)
			if len(vals) > 1 {
				return "", invalid(401, "ambiguous credentials: more than one "+s.String())
			}
			if len(vals) == 1 {
				v = vals[0]
			}
		case InCookie:
			v = r.Cookie(s.Name)
		}
		switch v = strings.TrimSpace(v); {
		case v == "":
		case cred == "":
			cred, from = v, s
		case v != cred:
			return "", invalid(401, "ambiguous credentials: "+from.String()+" and "+s.String()+" differ")
		}
	}
	return cred, nil
}

// reasonNotBearer refuses a token sent in the Authorization header without
// the Bearer scheme.
const reasonNotBearer = "Authorization scheme is not Bearer"

// Authenticate implements Authenticator: no key → 401 ErrMissingCredentials;
// an ambiguous request (see Extract) → 401 ErrInvalidCredentials; unknown,
// expired, inactive or over-long key → 403 ErrInvalidCredentials.
func (a *APIKey) Authenticate(_ context.Context, r Request) (*core.Consumer, error) {
	raw, err := a.Extract(r)
	if err != nil {
		return nil, err
	}
	if raw == "" {
		return nil, missing("no API key")
	}
	if len(raw) > a.opts.MaxKeyLength {
		return nil, invalid(403, "unknown API key")
	}
	rec := a.keys.Lookup(HashKey(raw))
	if rec == nil || rec.Inactive {
		return nil, invalid(403, "unknown API key")
	}
	if !rec.Expires.IsZero() && !a.opts.Now().Before(rec.Expires) {
		return nil, invalid(403, "API key expired")
	}
	return &rec.consumer, nil
}
