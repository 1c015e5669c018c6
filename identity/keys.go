package identity

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/limitplane/limitplane/core"
)

// KeyHash is the SHA-256 of an API key. Only hashes are kept after load;
// raw keys never reach a store or a log.
type KeyHash [sha256.Size]byte

// HashKey returns the SHA-256 of raw.
func HashKey(raw string) KeyHash {
	// sha256 only reads its input: hashing raw's own bytes spares the
	// copy (an allocation for a key over 32 bytes) that []byte(raw) is.
	return sha256.Sum256(unsafe.Slice(unsafe.StringData(raw), len(raw)))
}

// ParseKeyHash parses "sha256:<64 hex digits>".
func ParseKeyHash(s string) (KeyHash, error) {
	var h KeyHash
	hexpart, ok := strings.CutPrefix(s, "sha256:")
	if !ok {
		return h, fmt.Errorf("identity: key hash %q: want sha256:<64 hex digits>", s)
	}
	if len(hexpart) != 2*len(h) {
		return h, fmt.Errorf("identity: key hash %q: want sha256:<64 hex digits>", s)
	}
	// Decoded in place, as hex.DecodeString would (either case), without
	// its allocation: UpdateKeys parses every hash it is given. A table
	// instead of comparisons: random digits defeat branch prediction.
	var bad byte
	for i := range h {
		hi, lo := unhexTable[hexpart[2*i]], unhexTable[hexpart[2*i+1]]
		bad |= hi | lo
		h[i] = hi<<4 | lo&0x0f
	}
	if bad > 0x0f {
		return KeyHash{}, fmt.Errorf("identity: key hash %q: want sha256:<64 hex digits>", s)
	}
	return h, nil
}

// unhexTable holds the value of each byte as a hex digit (either case),
// 0xff for a byte that is not one.
const unhexTable = "" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\xff\xff\xff\xff\xff\xff" +
	"\xff\x0a\x0b\x0c\x0d\x0e\x0f\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\x0a\x0b\x0c\x0d\x0e\x0f\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"

// String returns "sha256:<hex>".
func (h KeyHash) String() string {
	const prefix = "sha256:"
	var b [len(prefix) + 2*len(h)]byte // one allocation, not two
	copy(b[:], prefix)
	hex.Encode(b[len(prefix):], h[:])
	return string(b[:])
}

// ConsumerID returns the consumer ID used for h's counters: "key:" and the
// hex of the hash's first 16 bytes.
func (h KeyHash) ConsumerID() string { return "key:" + hex.EncodeToString(h[:16]) }

// KeyRecord is what the registry knows about one API key. A registry
// keeps its own copy of each record it is given, and hands out pointers to
// it (Lookup, Records, Range) that stay valid, and unchanged, after later
// changes of the registry.
type KeyRecord struct {
	// Hash is the key's SHA-256.
	Hash KeyHash
	// Policies are the IDs of the policies the key has. A registry's
	// records share one slice among the keys with the same list (an
	// empty list is nil there), so it must never be written through.
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
	// Data is the caller's own value, kept with the record and never read
	// by the registry (the gateway keeps there what it cannot make again
	// from the other fields, to give its configuration back).
	Data any

	// consumer is the registry's cell of the record's engine view, made
	// on first use (a million keys mostly idle need not hold a million
	// consumers). It lives beside the record (see held), not in it, so
	// that copying a record never races with its being filled.
	consumer *atomic.Pointer[core.Consumer]
	seq      uint64 // order of first insertion, for Records
}

// held is a record as a registry holds it: the record and its consumer
// cell in one allocation.
type held struct {
	rec      KeyRecord
	consumer atomic.Pointer[core.Consumer]
}

// Consumer returns the engine's view of the key: its consumer ID
// (KeyHash.ConsumerID), policies, per-API limits and quota epoch. For a
// record held by a registry it is made on the first call and the same
// pointer is returned after, so a key's first request pays for one small
// allocation; the caller must not change it. For any other record it is
// made anew on every call.
func (k *KeyRecord) Consumer() *core.Consumer {
	if p := k.consumer; p != nil {
		if c := p.Load(); c != nil {
			return c
		}
	}
	return k.makeConsumer()
}

// consumerBox is a consumer and the bytes of its ID in one allocation, so
// that a request, which reads both (the engine hashes the ID to name the
// counters), finds them together, as it found the consumer inside the
// record and its ID apart when the consumer was made with the record.
// The ID is a string over id (unsafe.String), which is never written
// after it is made.
type consumerBox struct {
	c  core.Consumer
	id [len("key:") + 32]byte
}

// makeConsumer makes the record's consumer, for Consumer's first use.
func (k *KeyRecord) makeConsumer() *core.Consumer {
	b := &consumerBox{c: core.Consumer{Policies: k.Policies, APILimits: k.APILimits, QuotaEpoch: k.QuotaEpoch}}
	copy(b.id[:], "key:")
	hex.Encode(b.id[4:], k.Hash[:16])
	b.c.ID = unsafe.String(&b.id[0], len(b.id))
	c := &b.c
	if k.consumer == nil || k.consumer.CompareAndSwap(nil, c) {
		return c
	}
	return k.consumer.Load()
}

// ErrUnknownKey is wrapped by Update for the delete of a key the registry
// does not hold.
var ErrUnknownKey = errors.New("identity: no such key")

// Keys is the key registry (make one with NewKeys): a table of shards
// that spreads the keys by the first bits of their hash. Each shard is an
// immutable open-addressing array of (tag, record) slots, indexed by
// further bits of the hash (a SHA-256 needs no hashing again) and probed
// linearly. The table is two levels of arrays (a top array of leaves, each
// leafSize shards), so a change copies only what it touches: the top
// array, the touched leaves and the touched shards (about shardTarget keys
// each), then swaps the new table in with one atomic store. Lookup takes
// no lock: one atomic load, two indexed loads, and a probe that usually
// reads one cache line before the record. Every change (Replace, Update)
// is atomic as a whole: a reader sees all of it or none.
//
// When Update grows the registry past shardMax keys a shard on average,
// the table is rebuilt with more shards (an O(n) step after the registry
// has grown fourfold, so amortised O(1) per key added).
type Keys struct {
	t      atomic.Pointer[keyTable]
	mu     sync.Mutex // serialises Replace and Update
	intern *interner  // of the current table's records; guarded by mu
}

const (
	// shardTarget is the mean number of keys per shard a rebuilt table
	// aims at: copying one shard is most of the cost of Update.
	shardTarget = 32
	// shardMax is the mean shard size past which Update rebuilds the
	// table with more shards.
	shardMax = 4 * shardTarget
	// leafBits are the shard-index bits a leaf resolves; the rest index
	// the top array.
	leafBits = 7
	leafSize = 1 << leafBits
	// maxShardBits bounds the table at 2^maxShardBits shards.
	maxShardBits = 24
)

// slot is one place in a shard: an empty slot has a nil rec and ends a
// probe. tag is bits 96..127 of the hash, compared before the record's
// full hash is.
type slot struct {
	tag uint32
	rec *KeyRecord
}

// emptyShard is the shard of no keys: one empty slot. It is never
// written (Update builds new shards).
var emptyShard = make([]slot, 1)

// leaf is leafSize shards.
type leaf [leafSize][]slot

// keyTable is one immutable version of the registry.
type keyTable struct {
	bits uint8   // log2 of the number of shards
	top  []*leaf // max(1, 2^bits / leafSize) leaves
	n    int     // keys held
	next uint64  // the seq of the next key added
}

// newTable returns an empty table of 2^bits shards.
func newTable(bits uint8) *keyTable {
	t := &keyTable{bits: bits, top: make([]*leaf, max(1, 1<<bits/leafSize))}
	for i := range t.top {
		l := new(leaf)
		for j := range l {
			l[j] = emptyShard
		}
		t.top[i] = l
	}
	return t
}

// shard returns the index of h's shard: the hash's first bits.
func (t *keyTable) shard(h KeyHash) uint32 {
	return binary.BigEndian.Uint32(h[:4]) >> (32 - t.bits) // 0 when bits is 0
}

// home is h's first slot in a shard of mask+1 slots: bits 32..95 of the
// hash.
func home(h KeyHash, mask uint64) uint64 { return binary.LittleEndian.Uint64(h[4:12]) & mask }

// tag is bits 96..127 of the hash.
func tag(h KeyHash) uint32 { return binary.LittleEndian.Uint32(h[12:16]) }

// find returns the record of h in shard slots, or nil.
func find(slots []slot, h KeyHash) *KeyRecord {
	mask := uint64(len(slots) - 1)
	tg := tag(h)
	for i := home(h, mask); ; i = (i + 1) & mask {
		e := &slots[i]
		if e.rec == nil || e.tag == tg && e.rec.Hash == h {
			return e.rec
		}
	}
}

// newShard returns a shard holding recs, with at most three slots in four
// used so that probes stay short. When two records have the same hash it
// returns the second, and the shard is not usable.
func newShard(recs []*KeyRecord) ([]slot, *KeyRecord) {
	if len(recs) == 0 {
		return emptyShard, nil
	}
	size := 2
	for size*3 < len(recs)*4+1 {
		size *= 2
	}
	slots := make([]slot, size)
	mask := uint64(size - 1)
	for _, r := range recs {
		i := home(r.Hash, mask)
		tg := tag(r.Hash)
		for slots[i].rec != nil {
			if slots[i].tag == tg && slots[i].rec.Hash == r.Hash {
				return nil, r
			}
			i = (i + 1) & mask
		}
		slots[i] = slot{tg, r}
	}
	return slots, nil
}

// bitsFor returns the shard bits for a registry of n keys.
func bitsFor(n int) uint8 {
	var b uint8
	for b < maxShardBits && n>>b > shardTarget {
		b++
	}
	return b
}

// newRecord returns the registry's copy of r, with its policies interned
// by in and its insertion order set to seq.
func newRecord(r *KeyRecord, seq uint64, in *interner) *KeyRecord {
	h := &held{rec: *r}
	h.rec.Policies = in.policies(r.Policies)
	h.rec.consumer = &h.consumer
	h.rec.seq = seq
	return &h.rec
}

// maxInterned bounds the distinct policy lists an interner keeps; lists
// past it are copied per key. Keys share a few lists in practice, so the
// bound only matters for a registry that sees unbounded distinct lists.
const maxInterned = 1 << 16

// interner shares one copy of each distinct policy list among the records
// of a registry: a million keys with policies ["gold"] hold one slice. A
// shared slice is never written (records are immutable), so a change of
// one key, which makes that key a new record with its own list, cannot
// change another key's. Replace starts a new interner, so lists no key
// uses any more are dropped then.
type interner struct {
	lists map[string][]string // by encodeList
	buf   []byte
}

func newInterner() *interner { return &interner{lists: map[string][]string{}} }

// policies returns the registry's copy of list: nil for an empty list,
// otherwise an interned copy.
func (in *interner) policies(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	// Each ID with its length in front, so that no two lists encode the
	// same (IDs may hold any byte).
	b := in.buf[:0]
	for _, id := range list {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	in.buf = b
	if s, ok := in.lists[string(b)]; ok {
		return s
	}
	s := slices.Clone(list)
	if len(in.lists) < maxInterned {
		in.lists[string(b)] = s
	}
	return s
}

// NewKeys returns a registry holding records (see Replace).
func NewKeys(records []KeyRecord) (*Keys, error) {
	k := &Keys{}
	if err := k.Replace(records); err != nil {
		return nil, err
	}
	return k, nil
}

// fill returns a table of 2^bits shards holding recs, or an error for two
// records with the same hash.
func fill(bits uint8, recs []*KeyRecord) (*keyTable, error) {
	t := newTable(bits)
	byShard := make([][]*KeyRecord, 1<<bits)
	for _, r := range recs {
		s := t.shard(r.Hash)
		byShard[s] = append(byShard[s], r)
	}
	for s, rs := range byShard {
		slots, dup := newShard(rs)
		if dup != nil {
			return nil, fmt.Errorf("identity: duplicate key %s", dup.Hash)
		}
		t.top[s>>leafBits][s&(leafSize-1)] = slots
	}
	t.n = len(recs)
	return t, nil
}

// Replace swaps in a new set of records, in O(len(records)). Duplicate
// hashes are an error and leave the registry unchanged. Records keeps
// their order.
func (k *Keys) Replace(records []KeyRecord) error {
	recs := make([]*KeyRecord, len(records))
	in := newInterner()
	for i := range records {
		recs[i] = newRecord(&records[i], uint64(i), in)
	}
	t, err := fill(bitsFor(len(recs)), recs) // finds duplicates too
	if err != nil {
		return err
	}
	t.next = uint64(len(recs))
	k.mu.Lock()
	defer k.mu.Unlock()
	k.t.Store(t)
	k.intern = in
	return nil
}

// Update changes the registry in place of a Replace: it adds or replaces
// the records of put and removes the keys of del, as one atomic change.
// It copies only what the change touches, so one key changed costs the
// copy of one shard (about shardTarget slots), one leaf and the top array
// (a few KiB in all for a million keys), whatever the registry's size. A
// replaced key keeps its place in Records' order; an added one goes last,
// in put's order.
//
// Errors, which leave the registry unchanged: a hash twice in put, a hash
// in both put and del, and the delete of a key not held (wrapping
// ErrUnknownKey; a hash twice in del is one such delete).
func (k *Keys) Update(put []KeyRecord, del []KeyHash) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.intern == nil {
		k.intern = newInterner()
	}
	old := k.t.Load()
	t := &keyTable{bits: old.bits, top: slices.Clone(old.top), n: old.n, next: old.next}
	// The new contents of each touched shard, edited below.
	touched := map[uint32][]*KeyRecord{}
	contents := func(h KeyHash) (uint32, []*KeyRecord) {
		s := t.shard(h)
		rs, ok := touched[s]
		if !ok {
			// A shard has more slots than records, so one key added
			// fits without growing rs.
			slots := t.top[s>>leafBits][s&(leafSize-1)]
			rs = make([]*KeyRecord, 0, len(slots))
			for _, e := range slots {
				if e.rec != nil {
					rs = append(rs, e.rec)
				}
			}
		}
		return s, rs
	}
	deleted := make(map[KeyHash]bool, len(del))
	for _, h := range del {
		deleted[h] = true
		s, rs := contents(h)
		i := slices.IndexFunc(rs, func(r *KeyRecord) bool { return r.Hash == h })
		if i < 0 {
			return fmt.Errorf("%w: delete of %s", ErrUnknownKey, h)
		}
		touched[s] = slices.Delete(rs, i, i+1)
		t.n--
	}
	seen := make(map[KeyHash]bool, len(put))
	for i := range put {
		h := put[i].Hash
		if seen[h] {
			return fmt.Errorf("identity: update: key %s is put twice", h)
		}
		seen[h] = true
		if deleted[h] {
			return fmt.Errorf("identity: update: key %s is both put and deleted", h)
		}
		s, rs := contents(h)
		if j := slices.IndexFunc(rs, func(r *KeyRecord) bool { return r.Hash == h }); j >= 0 {
			rs[j] = newRecord(&put[i], rs[j].seq, k.intern)
		} else {
			rs = append(rs, newRecord(&put[i], t.next, k.intern))
			t.next++
			t.n++
		}
		touched[s] = rs
	}
	copied := map[uint32]bool{}
	for s, rs := range touched {
		li := s >> leafBits
		if !copied[li] {
			copied[li] = true
			l := *t.top[li]
			t.top[li] = &l
		}
		slots, _ := newShard(rs) // distinct: checked above
		t.top[li][s&(leafSize-1)] = slots
	}
	if t.n>>t.bits > shardMax && t.bits < maxShardBits {
		t = t.reshard(bitsFor(t.n))
	}
	k.t.Store(t)
	return nil
}

// each calls fn with every record of t until fn returns false.
func (t *keyTable) each(fn func(*KeyRecord) bool) {
	for _, l := range t.top {
		for _, slots := range l {
			for i := range slots {
				if r := slots[i].rec; r != nil && !fn(r) {
					return
				}
			}
		}
	}
}

// reshard returns t with its records spread over 2^bits shards.
func (t *keyTable) reshard(bits uint8) *keyTable {
	recs := make([]*KeyRecord, 0, t.n)
	t.each(func(r *KeyRecord) bool { recs = append(recs, r); return true })
	nt, _ := fill(bits, recs) // t's records are distinct
	nt.next = t.next
	return nt
}

// Lookup returns the record for hash h, or nil.
func (k *Keys) Lookup(h KeyHash) *KeyRecord {
	t := k.t.Load()
	s := t.shard(h)
	return find(t.top[s>>leafBits][s&(leafSize-1)], h)
}

// Len returns the number of keys.
func (k *Keys) Len() int { return k.t.Load().n }

// Records returns every record of one version of the registry, in the
// order they were first added: Replace's order, then keys added by Update
// (a replaced key keeps its place, a deleted and added again one goes
// last). It costs O(n) while no more keys were ever added than twice
// those held (each record goes to its place by its insertion number),
// O(n log n) after more churn, and allocates n pointers (2n at most for
// the places). The records are the registry's own: the caller must not
// change them.
func (k *Keys) Records() []*KeyRecord {
	t := k.t.Load()
	if t.next <= 2*uint64(t.n)+leafSize {
		// Insertion numbers are below next: place each record at its
		// own, then close the gaps the deleted and replaced keys left.
		out := make([]*KeyRecord, t.next)
		t.each(func(r *KeyRecord) bool { out[r.seq] = r; return true })
		return slices.DeleteFunc(out, func(r *KeyRecord) bool { return r == nil })
	}
	type entry struct {
		seq uint64
		rec *KeyRecord
	}
	// Sorted with the numbers beside the pointers: comparing them then
	// reads no record.
	es := make([]entry, 0, t.n)
	t.each(func(r *KeyRecord) bool { es = append(es, entry{r.seq, r}); return true })
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]*KeyRecord, len(es))
	for i, e := range es {
		out[i] = e.rec
	}
	return out
}

// Range calls fn with every record of one version of the registry, in no
// particular order, until fn returns false. The records are the
// registry's own: fn must not change them.
func (k *Keys) Range(fn func(*KeyRecord) bool) { k.t.Load().each(fn) }

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

// CheckKey reports why the plaintext key could never be presented to a
// gateway with the default options, or returns nil: it is empty, longer
// than DefaultMaxKeyLength bytes (refused without hashing), starts or
// ends with white space (Extract trims it, so the key presented would be
// another), holds a control character (CR, LF, NUL, any byte below 0x20
// or DEL: no header can carry one but the tab, which proxies and clients
// may fold or trim), is not valid UTF-8, or holds
// U+FFFD, the replacement character that JSON and YAML decoders put for
// bytes that are not UTF-8 and for lone surrogates (the key meant was
// another). The gateway's file and the control plane refuse such keys
// with its message, which names no key.
func CheckKey(key string) error {
	switch {
	case key == "":
		return errors.New("identity: empty key")
	case len(key) > DefaultMaxKeyLength:
		return fmt.Errorf("identity: longer than %d bytes; the gateway refuses such keys", DefaultMaxKeyLength)
	case strings.TrimSpace(key) != key:
		return errors.New("identity: starts or ends with white space, which the gateway trims from a presented key")
	case !utf8.ValidString(key):
		return errors.New("identity: not valid UTF-8")
	case strings.ContainsRune(key, utf8.RuneError):
		return errors.New("identity: holds U+FFFD, which a JSON or YAML decoder puts for bytes that are not UTF-8 or a lone surrogate: the key meant is another")
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '\t':
			// RFC 9110 lets a field value hold a tab, but proxies and
			// clients fold and trim it: the key that arrives may be
			// another.
			return fmt.Errorf("identity: holds a tab at byte %d; keys hold no control characters, not even the tab a request header may carry", i)
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("identity: holds the control character %q at byte %d; no request header can carry it", c, i)
		}
	}
	return nil
}

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

// NewAPIKey returns an APIKey authenticator over keys. A nil keys is an
// empty registry of its own: every key presented is refused (403), none
// can be added.
func NewAPIKey(keys *Keys, opts APIKeyOptions) *APIKey {
	if keys == nil {
		keys, _ = NewKeys(nil) // no records: no error
	}
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
// Request that implements RawQuerier or QueryValuer), or two sources
// presenting different keys. Whichever key a reader took (the first, as
// net/http's Header.Get and url.Values.Get do, or the last) a client could
// then pass the gateway with one key while a component behind it acts on
// the other. Through a RawQuerier, a query parameter source in a pair
// holding a ';', or with a value that does not unescape, is refused too
// (401, see RawQuerier).
func (a *APIKey) Extract(r Request) (string, error) {
	return owned(extract(r, a.opts.Sources, a.lookup, false))
}

// owned returns extract's credential as a string of its own: a copy when
// it was lent by a Peeker or a RawQuerier.
func owned(cred string, lent bool, err error) (string, error) {
	if lent {
		cred = strings.Clone(cred)
	}
	return cred, err
}

// Sources returns the sources the key is read from.
func (a *APIKey) Sources() []Source { return append([]Source(nil), a.opts.Sources...) }

// extract returns the credential presented in sources, with surrounding
// white space trimmed and, for the Authorization header, the
// case-insensitive "Bearer" scheme (RFC 6750 §2.1) removed; "" when none
// is presented. Every source is read: a header source with more than one
// field line, a query parameter source given more than once (when r is a
// RawQuerier or a QueryValuer), or two sources with different non-empty
// values, is refused as ambiguous; so is what queryParam refuses, when r
// is a RawQuerier. With bearerOnly, an Authorization header in any other
// scheme (or a bare credential) is refused too.
//
// When r is a Peeker, header and query values are read through it without
// a copy, and a RawQuerier's query may be lent too: lent is then true when
// cred may be such a value, valid only while r's request is handled; a
// caller that keeps it clones it (owned).
func extract(r Request, sources []Source, lookup []string, bearerOnly bool) (cred string, lent bool, err error) {
	p, peeks := r.(Peeker)
	var from Source
	for i, s := range sources {
		var v string
		fromRaw := false // v may be lent by a RawQuerier
		switch s.In {
		case InHeader:
			var first string
			var lines int
			if peeks {
				first, lines = p.PeekHeader(lookup[i])
			} else {
				vals := r.HeaderValues(lookup[i])
				if lines = len(vals); lines > 0 {
					first = vals[0]
				}
			}
			if v, err = headerLines(first, lines, s, bearerOnly); err != nil {
				return "", false, err
			}
		case InQuery:
			var n int
			if rq, ok := r.(RawQuerier); ok {
				fromRaw = true
				if v, n, err = queryParam(rq.RawQuery(), s); err != nil {
					return "", false, err
				}
			} else if peeks {
				v, n = p.PeekQuery(s.Name)
			} else if qv, ok := r.(QueryValuer); ok {
				vals := qv.QueryValues(s.Name)
				if n = len(vals); n > 0 {
					v = vals[0]
				}
			} else {
				v = r.Query(s.Name)
			}
			if n > 1 {
				return "", false, invalid(401, "ambiguous credentials: more than one "+s.String())
			}
		case InCookie:
			v = r.Cookie(s.Name)
		}
		switch v = strings.TrimSpace(v); {
		case v == "":
		case cred == "":
			cred, from = v, s
			lent = peeks && s.In != InCookie || fromRaw
		case v != cred:
			return "", false, invalid(401, "ambiguous credentials: "+from.String()+" and "+s.String()+" differ")
		}
	}
	return cred, lent, nil
}

// queryParam returns the first value of query parameter source s in the
// raw query raw, and how many times it is given, as RawQuerier says; the
// value is a substring of raw when it holds no escape.
func queryParam(raw string, s Source) (first string, n int, err error) {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if strings.IndexByte(pair, ';') >= 0 {
			for seg := range strings.SplitSeq(pair, ";") {
				if k, _, _ := strings.Cut(seg, "="); queryName(k) == s.Name {
					return "", 0, invalid(401, "ambiguous credentials: the "+s.String()+" beside a ';'")
				}
			}
			continue // not the parameter, and no pair to url.ParseQuery either
		}
		k, v, _ := strings.Cut(pair, "=")
		if queryName(k) != s.Name {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			if v, err = url.QueryUnescape(v); err != nil {
				return "", 0, invalid(401, "malformed "+s.String())
			}
		}
		if n++; n == 1 {
			first = v
		}
	}
	return first, n, nil
}

// queryName returns the query parameter name k unescaped; "" when it does
// not unescape, which names no source.
func queryName(k string) string {
	if !strings.ContainsAny(k, "%+") {
		return k
	}
	u, err := url.QueryUnescape(k)
	if err != nil {
		return ""
	}
	return u
}

// headerCredential returns the credential in the field lines vals of
// header source s, as extract reads it: "" for none; more than one line
// is ambiguous; in the Authorization header, the case-insensitive
// "Bearer" scheme is removed, and with bearerOnly another scheme is
// refused.
func headerCredential(vals []string, s Source, bearerOnly bool) (string, error) {
	var first string
	if len(vals) > 0 {
		first = vals[0]
	}
	return headerLines(first, len(vals), s, bearerOnly)
}

// headerLines is headerCredential of a header source given in lines field
// lines, the first of them first.
func headerLines(first string, lines int, s Source, bearerOnly bool) (string, error) {
	switch {
	case lines > 1:
		return "", invalid(401, "ambiguous credentials: more than one "+s.String())
	case first == "":
		return "", nil // no field, or an empty one: the common case of every source but one
	}
	v := strings.TrimSpace(first)
	if strings.EqualFold(s.Name, "Authorization") && v != "" {
		if len(v) >= 6 && strings.EqualFold(v[:6], "bearer") && (len(v) == 6 || v[6] == ' ' || v[6] == '\t') {
			v = v[6:] // "Bearer" alone is no credential
		} else if bearerOnly {
			return "", invalid(401, reasonNotBearer)
		}
	}
	return strings.TrimSpace(v), nil
}

// BearerToken returns the token in the Authorization header's field lines
// vals (http.Header.Values("Authorization")) as the gateway reads a JWT:
// exactly one line, in the Bearer scheme, its name in any case (RFC 6750
// §2.1), the token with surrounding white space trimmed. It fails with a
// 401 *Error: ErrMissingCredentials when there is no line, an empty one
// or "Bearer" alone; ErrInvalidCredentials for more than one line
// (ambiguous: net/http's Get reads the first, a proxy may use the last)
// or another scheme.
func BearerToken(vals []string) (string, error) {
	v, err := headerCredential(vals, Source{InHeader, "Authorization"}, true)
	if err != nil {
		return "", err
	}
	if v == "" {
		return "", missing("no bearer token in the Authorization header")
	}
	return v, nil
}

// reasonNotBearer refuses a token sent in the Authorization header without
// the Bearer scheme.
const reasonNotBearer = "Authorization scheme is not Bearer"

// Authenticate implements Authenticator: no key → 401 ErrMissingCredentials;
// an ambiguous request (see Extract) → 401 ErrInvalidCredentials; unknown,
// expired, inactive or over-long key → 403 ErrInvalidCredentials.
//
// When r is a Peeker, the presented key is read, hashed and refused
// without a copy of it being made.
func (a *APIKey) Authenticate(_ context.Context, r Request) (*core.Consumer, error) {
	// raw may be lent by r (a Peeker or a RawQuerier): it is only measured
	// and hashed.
	raw, _, err := extract(r, a.opts.Sources, a.lookup, false)
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
	// Consumer's fast path, written out: Consumer is too big to inline.
	if p := rec.consumer; p != nil {
		if c := p.Load(); c != nil {
			return c, nil
		}
	}
	return rec.makeConsumer(), nil
}
