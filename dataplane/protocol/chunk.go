package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"runtime"
	"slices"
	"strconv"

	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/internal/parallel"
	"github.com/limitplane/limitplane/spec"
)

// DefaultChunkBytes is the data size of a SnapshotChunk when none is
// given: 1 MiB, a quarter of gRPC's default 4 MiB message limit, so the
// envelope and any limit a proxy sets keep ample room.
const DefaultChunkBytes = 1 << 20

// DefaultMaxSnapshotBytes is the largest snapshot an Assembler accepts
// when none is given: 1 GiB of JSON, several times a snapshot of a million
// keys.
const DefaultMaxSnapshotBytes = 1 << 30

// Chunks encodes snap as spec JSON and cuts the encoding into chunks of at
// most maxBytes data bytes each (DefaultChunkBytes when maxBytes <= 0),
// numbered from 0, with snap's revision and the given nonce. The last
// chunk is marked last and carries Digest(snap). An empty snapshot is one
// chunk. The encoding is json.Marshal(snap)'s, byte for byte (see
// ChunksDigester); the chunks share one buffer: do not modify their data.
func Chunks(snap *spec.Snapshot, nonce string, maxBytes int) ([]*syncpb.SnapshotChunk, error) {
	chunks, _, err := ChunksDigester(snap, nonce, maxBytes)
	return chunks, err
}

// ChunksDigester returns Chunks(snap, nonce, maxBytes) and a Digester
// holding every object of snap (its Digest is the last chunk's), from one
// pass over snap: each object's JSON is written once, into the snapshot's
// encoding, and hashed from there when it is already canonical (every
// policy and API; a key with a lower-case hash and no expiry). The
// encoding is json.Marshal(snap)'s, byte for byte. It fails, with an
// error starting "protocol: ", when snap is nil or does not encode.
func ChunksDigester(snap *spec.Snapshot, nonce string, maxBytes int) ([]*syncpb.SnapshotChunk, Digester, error) {
	var d Digester
	if snap == nil {
		return nil, d, errors.New("protocol: chunks: nil snapshot")
	}
	if maxBytes <= 0 {
		maxBytes = DefaultChunkBytes
	}
	data, err := encodeDigest(snap, &d)
	if err != nil {
		return nil, d, fmt.Errorf("protocol: chunks: encode revision %d: %w", snap.Revision, err)
	}
	n := (len(data) + maxBytes - 1) / maxBytes
	chunks := make([]*syncpb.SnapshotChunk, 0, max(n, 1))
	for seq := 0; seq == 0 || len(data) > 0; seq++ {
		part := data[:min(maxBytes, len(data))]
		data = data[len(part):]
		chunks = append(chunks, &syncpb.SnapshotChunk{
			Revision: snap.Revision,
			Nonce:    nonce,
			Seq:      uint32(seq),
			Last:     len(data) == 0,
			Data:     part,
		})
	}
	chunks[len(chunks)-1].Digest = d.Digest()
	return chunks, d, nil
}

// encodeDigest returns json.Marshal(snap), written object by object, and
// adds every object to d. It mirrors spec.Snapshot's JSON form: revision,
// then policies, keys and APIs, each left out when empty. The keys are
// encoded in parts on every CPU, and the parts joined.
func encodeDigest(snap *spec.Snapshot, d *Digester) ([]byte, error) {
	main := newObjectEncoder()
	main.buf.WriteString(`{"revision":`)
	main.buf.Write(strconv.AppendUint(main.buf.AvailableBuffer(), snap.Revision, 10))
	if len(snap.Policies) > 0 {
		main.buf.WriteString(`,"policies":[`)
		for i := range snap.Policies {
			if err := main.policy(i > 0, &snap.Policies[i]); err != nil {
				return nil, err
			}
		}
		main.buf.WriteByte(']')
	}
	if len(snap.Keys) > 0 {
		main.buf.WriteString(`,"keys":[`)
		encs := make([]*objectEncoder, len(snap.Keys)/parallel.MinPart+1)
		err := parallel.Ranges(len(snap.Keys), runtime.GOMAXPROCS(0), func(lo, hi int) error {
			e := main
			if lo > 0 {
				e = newObjectEncoder()
			}
			encs[lo/parallel.MinPart] = e
			for i := lo; i < hi; i++ {
				if err := e.key(i > lo, &snap.Keys[i]); err != nil {
					return err
				}
				if i == lo+sampleKeys-1 {
					// Size the buffer for the rest at the first keys' mean (+1/8),
					// instead of growing it by copies.
					e.buf.Grow(e.buf.Len() / sampleKeys * (hi - i) * 9 / 8)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rest := 0
		for _, e := range encs[1:] {
			if e != nil {
				rest += 1 + e.buf.Len()
			}
		}
		main.buf.Grow(rest + 2 + len(`,"apis":[]}`))
		for _, e := range encs[1:] {
			if e != nil {
				main.buf.WriteByte(',')
				main.buf.Write(e.buf.Bytes())
				main.d.merge(&e.d)
			}
		}
		main.buf.WriteByte(']')
	}
	if len(snap.APIs) > 0 {
		main.buf.WriteString(`,"apis":[`)
		for i := range snap.APIs {
			if err := main.api(i > 0, &snap.APIs[i]); err != nil {
				return nil, err
			}
		}
		main.buf.WriteByte(']')
	}
	main.buf.WriteByte('}')
	d.merge(&main.d)
	return main.buf.Bytes(), nil
}

// sampleKeys is how many keys encodeDigest encodes before sizing a
// part's buffer from them.
const sampleKeys = 64

// objectEncoder writes objects' JSON one after the other into buf, as
// json.Marshal writes each, and adds each to d.
type objectEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
	h   hash.Hash
	d   Digester
}

func newObjectEncoder() *objectEncoder {
	e := &objectEncoder{h: sha256.New()}
	e.enc = json.NewEncoder(&e.buf) // escapes HTML, as json.Marshal does
	return e
}

// write appends v's JSON (after a comma when comma) and returns it.
func (e *objectEncoder) write(comma bool, v any) ([]byte, error) {
	if comma {
		e.buf.WriteByte(',')
	}
	start := e.buf.Len()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	e.buf.Truncate(e.buf.Len() - 1) // Encode's newline
	return e.buf.Bytes()[start:], nil
}

// hash is SHA-256 of the kind tag and an object's canonical JSON b,
// reusing e.h.
func (e *objectEncoder) hash(tag byte, b []byte) (out [32]byte) {
	e.h.Reset()
	e.h.Write([]byte{tag})
	e.h.Write(b)
	e.h.Sum(out[:0])
	return out
}

func (e *objectEncoder) policy(comma bool, p *spec.Policy) error {
	b, err := e.write(comma, p)
	if err == nil {
		e.d.add(e.hash(tagPolicy, b))
	}
	return err
}

func (e *objectEncoder) api(comma bool, a *spec.API) error {
	b, err := e.write(comma, a)
	if err == nil {
		e.d.add(e.hash(tagAPI, b))
	}
	return err
}

// key adds k's hash from its JSON when that is canonical (a lower-case
// hash and no expiry), else from its canonical form.
func (e *objectEncoder) key(comma bool, k *spec.Key) error {
	b, err := e.write(comma, k)
	switch {
	case err != nil:
		return err
	case k.Expires != nil || hasUpper(k.KeyHash):
		e.d.add(objectHash(tagKey, canonicalKeyOf(k)))
	default:
		e.d.add(e.hash(tagKey, b))
	}
	return nil
}

// hasUpper reports whether s has an ASCII upper-case letter.
func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// minKeyJSON is the length of the shortest key in JSON:
// {"key_hash":"sha256:<64 hex digits>","policies":["p"]}.
const minKeyJSON = 103

// AssemblerOptions configure an Assembler.
type AssemblerOptions struct {
	// MaxBytes bounds the JSON of one snapshot, in bytes; a snapshot that
	// grows past it is refused before it is held whole. 0 means
	// DefaultMaxSnapshotBytes.
	MaxBytes int
}

// Assembler puts a snapshot's chunks back together, one snapshot at a
// time. It refuses a chunk that does not continue the snapshot under way
// (a seq out of order or missing, another revision or nonce while one is
// under way, a first chunk whose seq is not 0) and a snapshot past
// MaxBytes. After an error or a complete snapshot it starts afresh, so
// the next chunk must be seq 0. It keeps each chunk's data, not a copy,
// until its snapshot is decoded or dropped (the JSON is decoded from the
// chunks as they are, so a large snapshot is not copied into one buffer
// first): the caller must not modify it. Not safe for concurrent use.
type Assembler struct {
	max      int
	parts    [][]byte // the data of the chunks so far
	size     int      // their bytes
	active   bool
	revision uint64
	nonce    string
	next     uint32
}

// NewAssembler returns an Assembler with the given options.
func NewAssembler(opts AssemblerOptions) *Assembler {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxSnapshotBytes
	}
	return &Assembler{max: opts.MaxBytes}
}

// InProgress reports whether a snapshot is under way: a chunk was added
// and the last one has not come.
func (a *Assembler) InProgress() bool { return a.active }

// Reset drops a snapshot under way (when its stream breaks).
func (a *Assembler) Reset() {
	clear(a.parts) // drop the chunks' data, keep the slice
	a.parts, a.size = a.parts[:0], 0
	a.active, a.revision, a.nonce, a.next = false, 0, "", 0
}

// Add adds the next chunk. It returns the snapshot when c is the last
// one, and nil before. The snapshot is decoded strictly (an unknown field
// is an error, so a gateway older than its control plane refuses what it
// cannot enforce instead of dropping it), its revision must equal the
// chunks' revision, and when the last chunk carries a digest, the
// snapshot's Digest must equal it. It does not validate the snapshot
// (gateway.Apply does). Every error starts with "protocol: " and leaves
// the Assembler empty.
func (a *Assembler) Add(c *syncpb.SnapshotChunk) (*spec.Snapshot, error) {
	snap, err := a.add(c)
	if err != nil || snap != nil {
		a.Reset()
	}
	return snap, err
}

func (a *Assembler) add(c *syncpb.SnapshotChunk) (*spec.Snapshot, error) {
	if c == nil {
		return nil, errors.New("protocol: snapshot chunk: nil")
	}
	if !a.active {
		if c.Seq != 0 {
			return nil, fmt.Errorf("protocol: snapshot %d chunk %d: the first chunk must be 0", c.Revision, c.Seq)
		}
		a.active, a.revision, a.nonce = true, c.Revision, c.Nonce
	}
	switch {
	case c.Revision != a.revision || c.Nonce != a.nonce:
		return nil, fmt.Errorf("protocol: snapshot %d chunk %d (nonce %q) came while snapshot %d (nonce %q) was at chunk %d", c.Revision, c.Seq, c.Nonce, a.revision, a.nonce, a.next)
	case c.Seq != a.next:
		return nil, fmt.Errorf("protocol: snapshot %d: chunk %d came where chunk %d was due", c.Revision, c.Seq, a.next)
	case a.size+len(c.Data) > a.max:
		return nil, fmt.Errorf("protocol: snapshot %d: over %d bytes at chunk %d", c.Revision, a.max, c.Seq)
	}
	a.parts = append(a.parts, c.Data)
	a.size += len(c.Data)
	a.next++
	if !c.Last {
		return nil, nil
	}
	readers := make([]io.Reader, len(a.parts))
	for i, p := range a.parts {
		readers[i] = bytes.NewReader(p)
	}
	// The decoder appends the keys to the slice it is given: one sized
	// for the JSON (no key's is shorter than minKeyJSON bytes) instead of
	// one grown by copies, a million keys' worth at the end.
	snap := spec.Snapshot{Keys: make([]spec.Key, 0, a.size/minKeyJSON)}
	err := decodeStrictFrom(io.MultiReader(readers...), &snap)
	if err != nil {
		return nil, fmt.Errorf("protocol: snapshot %d: %w", c.Revision, err)
	}
	switch n := len(snap.Keys); {
	case n == 0:
		snap.Keys = nil // as decoded into nothing
	case cap(snap.Keys)-n > n/8+1024:
		snap.Keys = slices.Clone(snap.Keys) // policies or APIs took the room
	}
	if snap.Revision != c.Revision {
		return nil, fmt.Errorf("protocol: snapshot %d: its JSON says revision %d", c.Revision, snap.Revision)
	}
	if c.Digest != "" {
		if got := Digest(&snap); got != c.Digest {
			return nil, fmt.Errorf("protocol: snapshot %d: digest %s, the control plane sent %s", c.Revision, got, c.Digest)
		}
	}
	return &snap, nil
}

// DecodeSnapshot decodes a snapshot's spec JSON strictly: unknown fields
// and anything after the value are errors (wrapped, unprefixed, for the
// caller to place).
func DecodeSnapshot(data []byte) (*spec.Snapshot, error) {
	var snap spec.Snapshot
	if err := decodeStrict(data, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

func decodeStrict(data []byte, v any) error {
	return decodeStrictFrom(bytes.NewReader(data), v)
}

// decodeStrictFrom decodes the one JSON value r holds into v, strictly:
// unknown fields, and anything but white space after the value, are
// errors.
func decodeStrictFrom(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("decode JSON: data after the value")
	}
	return nil
}
