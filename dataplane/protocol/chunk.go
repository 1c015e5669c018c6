package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/limitplane/limitplane/dataplane/syncpb"
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
// chunk. The encoding is json.Marshal(snap)'s, byte for byte, written
// straight into the chunks key by key (a snapshot of a million keys is
// never held whole in one buffer). Do not modify the chunks' data.
func Chunks(snap *spec.Snapshot, nonce string, maxBytes int) ([]*syncpb.SnapshotChunk, error) {
	if snap == nil {
		return nil, errors.New("protocol: chunks: nil snapshot")
	}
	if maxBytes <= 0 {
		maxBytes = DefaultChunkBytes
	}
	parts, err := encodeCut(snap, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("protocol: chunks: encode revision %d: %w", snap.Revision, err)
	}
	chunks := make([]*syncpb.SnapshotChunk, len(parts))
	for seq, part := range parts {
		chunks[seq] = &syncpb.SnapshotChunk{
			Revision: snap.Revision,
			Nonce:    nonce,
			Seq:      uint32(seq),
			Last:     seq == len(parts)-1,
			Data:     part,
		}
	}
	chunks[len(chunks)-1].Digest = Digest(snap)
	return chunks, nil
}

// encodeCut writes json.Marshal(snap) cut into parts of max bytes (the
// last one shorter), writing the keys one at a time. It writes the fields
// of spec.Snapshot as encoding/json does, in order and with their
// omitempty rules; TestEncodeCutIsMarshal holds it to json.Marshal, and to
// spec.Snapshot's fields.
func encodeCut(snap *spec.Snapshot, max int) ([][]byte, error) {
	w := cutter{max: max}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	value := func(v any) error { // v's JSON, without Encode's newline
		buf.Reset()
		if err := enc.Encode(v); err != nil {
			return err
		}
		w.write(buf.Bytes()[:buf.Len()-1])
		return nil
	}
	w.write([]byte(`{"revision":`))
	w.write(strconv.AppendUint(nil, snap.Revision, 10))
	if len(snap.Policies) > 0 {
		w.write([]byte(`,"policies":`))
		if err := value(snap.Policies); err != nil {
			return nil, err
		}
	}
	if len(snap.Keys) > 0 {
		w.write([]byte(`,"keys":[`))
		for i := range snap.Keys {
			if i > 0 {
				w.write([]byte{','})
			}
			if err := value(&snap.Keys[i]); err != nil {
				return nil, err
			}
		}
		w.write([]byte{']'})
	}
	if len(snap.APIs) > 0 {
		w.write([]byte(`,"apis":`))
		if err := value(snap.APIs); err != nil {
			return nil, err
		}
	}
	w.write([]byte{'}'})
	return w.parts, nil
}

// cutter collects written bytes in parts of max bytes each. The first
// part grows as it is written (a small snapshot takes little); the next
// ones, of a snapshot that proved large, are allocated once at full size.
type cutter struct {
	max   int
	parts [][]byte
}

func (c *cutter) write(b []byte) {
	for len(b) > 0 {
		n := len(c.parts)
		if n == 0 || len(c.parts[n-1]) == c.max {
			size := c.max
			if n == 0 {
				size = min(c.max, 512)
			}
			c.parts = append(c.parts, make([]byte, 0, size))
			n++
		}
		last := c.parts[n-1]
		k := min(len(b), c.max-len(last))
		c.parts[n-1] = append(last, b[:k]...)
		b = b[k:]
	}
}

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
	var snap spec.Snapshot
	err := decodeStrictFrom(io.MultiReader(readers...), &snap)
	if err != nil {
		return nil, fmt.Errorf("protocol: snapshot %d: %w", c.Revision, err)
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
