package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
// chunk. The chunks share one buffer: do not modify their data.
func Chunks(snap *spec.Snapshot, nonce string, maxBytes int) ([]*syncpb.SnapshotChunk, error) {
	if snap == nil {
		return nil, errors.New("protocol: chunks: nil snapshot")
	}
	if maxBytes <= 0 {
		maxBytes = DefaultChunkBytes
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("protocol: chunks: encode revision %d: %w", snap.Revision, err)
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
	chunks[len(chunks)-1].Digest = Digest(snap)
	return chunks, nil
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
