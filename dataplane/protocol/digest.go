package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// Object tags in a digest: an object's hash covers its kind, so a policy
// and an API with the same JSON are different objects.
const (
	tagPolicy = 'P'
	tagKey    = 'K'
	tagAPI    = 'A'
)

// digestDomain separates the digest from any other SHA-256 of the same
// bytes and names the construction's version.
const digestDomain = "limitplane.sync.v1 digest\x00"

// Digest returns the digest of a snapshot's content: "v1:" and 64 hex
// digits. Two configurations with the same policies, keys and APIs have
// the same digest, whatever their revisions and whatever the order of
// their lists. Reports compare contents, and a gateway's revision travels
// beside the digest anyway, so a gateway that reached the same content by
// another path (a snapshot, or changes) reports the same digest.
//
// The content is canonical spec JSON per object: encoding/json writes a
// struct's fields in declaration order and a map's keys sorted; a key's
// key_hash is written in lower case (identity treats the case of its hex
// digits as insignificant) and its expiry in UTC (RFC 3339 with
// nanoseconds). Order within an object's own lists (a key's policies, a
// policy's APIs) is kept: it is what the control plane sent.
//
// Construction: each object hashes to SHA-256(kind tag, canonical JSON);
// the digest is SHA-256 over a domain string, the sum of the object hashes
// modulo 2^256 and the number of objects. The sum does not depend on
// order and can be kept up to date one object at a time (see Digester),
// so neither side rehashes a million keys for one change. It detects
// drift, which is its job; it is not a signature: authenticity comes from
// the stream's TLS.
//
// A nil snapshot has the digest of an empty one. The keys of a large
// snapshot are hashed in parallel (see Digester.AddKeys).
func Digest(snap *spec.Snapshot) string {
	d := DigesterOf(snap)
	return d.Digest()
}

// DigesterOf returns a Digester holding every object of snap (none for a
// nil snap), to be kept up to date one change at a time; its Digest is
// Digest(snap). The keys are hashed as AddKeys does, in parallel.
func DigesterOf(snap *spec.Snapshot) Digester {
	var d Digester
	if snap != nil {
		for i := range snap.Policies {
			d.AddPolicy(&snap.Policies[i])
		}
		d.AddKeys(snap.Keys)
		for i := range snap.APIs {
			d.AddAPI(&snap.APIs[i])
		}
	}
	return d
}

// Digester computes Digest one object at a time: add every object of a
// configuration, then remove the old and add the new version of each
// object a change touches. The zero value is the digest of an empty
// configuration. Removing an object that was never added leaves a digest
// that no configuration has. A Digester is a value: copy it to keep a
// state; it is not safe for concurrent use.
type Digester struct {
	sum [4]uint64 // little-endian limbs of a 256-bit sum
	n   uint64    // objects added minus objects removed
}

// AddPolicy adds a policy.
func (d *Digester) AddPolicy(p *spec.Policy) { d.add(objectHash(tagPolicy, p)) }

// RemovePolicy removes a policy added before.
func (d *Digester) RemovePolicy(p *spec.Policy) { d.sub(objectHash(tagPolicy, p)) }

// AddKey adds a key.
func (d *Digester) AddKey(k *spec.Key) { d.add(objectHash(tagKey, canonicalKeyOf(k))) }

// RemoveKey removes a key added before.
func (d *Digester) RemoveKey(k *spec.Key) { d.sub(objectHash(tagKey, canonicalKeyOf(k))) }

// parallelKeys is the number of keys from which AddKeys spreads the work:
// below it, starting goroutines costs more than it saves.
const parallelKeys = 1 << 12

// AddKeys adds every key of keys: the same as AddKey of each, in any
// order (the digest does not depend on it). With many keys the work is
// spread over GOMAXPROCS goroutines, each summing a part of keys, and
// their sums added together, which gives the same digest since the sum
// is commutative and associative. It returns when every key is added.
func (d *Digester) AddKeys(keys []spec.Key) {
	parts := min(runtime.GOMAXPROCS(0), len(keys)/parallelKeys)
	if parts <= 1 {
		d.addKeys(keys)
		return
	}
	sums := make([]Digester, parts)
	var wg sync.WaitGroup
	for p := range parts {
		part := keys[p*len(keys)/parts : (p+1)*len(keys)/parts]
		wg.Go(func() { sums[p].addKeys(part) })
	}
	wg.Wait()
	for i := range sums {
		d.merge(&sums[i])
	}
}

// addKeys adds keys one by one, with one encoder and one hash for all.
func (d *Digester) addKeys(keys []spec.Key) {
	h := new(objectHasher)
	c := new(canonicalKey) // one for all: no garbage per key
	for i := range keys {
		canonicalKeyInto(c, &keys[i])
		d.add(h.hash(tagKey, c))
	}
}

// merge adds the objects summed by o.
func (d *Digester) merge(o *Digester) {
	var c uint64
	for i := range 4 {
		d.sum[i], c = bits.Add64(d.sum[i], o.sum[i], c)
	}
	d.n += o.n
}

// AddAPI adds an API.
func (d *Digester) AddAPI(a *spec.API) { d.add(objectHash(tagAPI, a)) }

// RemoveAPI removes an API added before.
func (d *Digester) RemoveAPI(a *spec.API) { d.sub(objectHash(tagAPI, a)) }

// Digest returns the digest of the objects added and not removed, in
// Digest's form.
func (d *Digester) Digest() string {
	var buf [len(digestDomain) + 40]byte
	b := append(buf[:0], digestDomain...)
	for i := 3; i >= 0; i-- {
		b = binary.BigEndian.AppendUint64(b, d.sum[i])
	}
	b = binary.BigEndian.AppendUint64(b, d.n)
	h := sha256.Sum256(b)
	return "v1:" + hex.EncodeToString(h[:])
}

func (d *Digester) add(h [32]byte) {
	var c uint64
	for i := range 4 {
		d.sum[i], c = bits.Add64(d.sum[i], limb(h, i), c)
	}
	d.n++
}

func (d *Digester) sub(h [32]byte) {
	var b uint64
	for i := range 4 {
		d.sum[i], b = bits.Sub64(d.sum[i], limb(h, i), b)
	}
	d.n--
}

// limb returns the i-th least significant 64 bits of h read as a
// big-endian 256-bit number.
func limb(h [32]byte, i int) uint64 { return binary.BigEndian.Uint64(h[24-8*i:]) }

// canonicalKey is a key as the digest sees it: key_hash in lower case and
// the expiry formatted in UTC by hand (time.Time's MarshalJSON fails for
// years past 9999; Format does not).
type canonicalKey struct {
	spec.Key
	Expires string `json:"expires,omitempty"` // shadows Key.Expires
	buf     []byte // for Expires, reused
}

func canonicalKeyOf(k *spec.Key) *canonicalKey {
	c := new(canonicalKey)
	canonicalKeyInto(c, k)
	return c
}

// canonicalKeyInto sets *c to k as the digest sees it, reusing c's
// buffer for the expiry.
func canonicalKeyInto(c *canonicalKey, k *spec.Key) {
	c.Key = *k
	c.KeyHash = strings.ToLower(k.KeyHash)
	c.Expires = ""
	if k.Expires != nil {
		c.buf = k.Expires.UTC().AppendFormat(c.buf[:0], time.RFC3339Nano)
		c.Expires = string(c.buf)
	}
}

// objectHash is SHA-256 of the kind tag and the object's JSON.
func objectHash(tag byte, v any) [32]byte {
	var h objectHasher
	return h.hash(tag, v)
}

// objectHasher computes objectHash again and again with one buffer, JSON
// encoder and SHA-256 state. The zero value is ready; it is not safe for
// concurrent use.
type objectHasher struct {
	buf bytes.Buffer
	enc *json.Encoder
	sha hash.Hash
}

// hash returns SHA-256 of tag and v's JSON as json.Marshal writes it (an
// Encoder writes the same bytes, with escapeHTML on as Marshal has it, and
// a newline after them, which is not hashed). The spec types hold only
// strings, numbers, bools, slices, string-keyed maps and Durations (and a
// key's expiry, formatted by canonicalKeyOf), none of which fails to
// marshal; an error is a bug in this package.
func (h *objectHasher) hash(tag byte, v any) [32]byte {
	if h.enc == nil {
		h.enc = json.NewEncoder(&h.buf)
		h.sha = sha256.New()
	}
	h.buf.Reset()
	h.buf.WriteByte(tag)
	if err := h.enc.Encode(v); err != nil {
		panic(fmt.Sprintf("protocol: digest: %v", err))
	}
	b := h.buf.Bytes()
	h.sha.Reset()
	h.sha.Write(b[:len(b)-1])
	var out [32]byte
	h.sha.Sum(out[:0])
	return out
}
