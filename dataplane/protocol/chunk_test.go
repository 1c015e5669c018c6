package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/internal/parallel"
	"github.com/limitplane/limitplane/spec"
)

func TestChunksAssemble(t *testing.T) {
	snap := snapshotWithKeys(42, 200)
	want := jsonOf(t, snap)
	chunks, err := Chunks(snap, "n1", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if wantN := (len(want) + 999) / 1000; len(chunks) != wantN {
		t.Fatalf("%d chunks of a %d-byte snapshot, want %d", len(chunks), len(want), wantN)
	}
	var joined strings.Builder
	for i, c := range chunks {
		if c.Seq != uint32(i) || c.Revision != 42 || c.Nonce != "n1" || c.Last != (i == len(chunks)-1) {
			t.Fatalf("chunk %d: seq %d revision %d nonce %q last %v", i, c.Seq, c.Revision, c.Nonce, c.Last)
		}
		if i < len(chunks)-1 && (len(c.Data) != 1000 || c.Digest != "") {
			t.Fatalf("chunk %d: %d bytes, digest %q; want 1000 and none", i, len(c.Data), c.Digest)
		}
		joined.Write(c.Data)
	}
	if joined.String() != want {
		t.Fatal("chunks do not join to the snapshot's JSON")
	}
	if got := chunks[len(chunks)-1].Digest; got != Digest(snap) {
		t.Fatalf("last chunk digest %s, want %s", got, Digest(snap))
	}

	a := NewAssembler(AssemblerOptions{})
	for i, c := range chunks {
		got, err := a.Add(c)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if (got != nil) != c.Last || a.InProgress() == c.Last {
			t.Fatalf("chunk %d: snapshot %v, in progress %v", i, got != nil, a.InProgress())
		}
		if got != nil && jsonOf(t, got) != want {
			t.Fatal("assembled snapshot differs")
		}
	}
}

func TestChunksOfEmptySnapshot(t *testing.T) {
	chunks, err := Chunks(snapshotWithKeys(3, 0), "n", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) != 1 || !chunks[0].Last || chunks[0].Seq != 0 {
		t.Fatalf("chunks = %v, want one last chunk", chunks)
	}
}

func TestAssemblerRefuses(t *testing.T) {
	snap := snapshotWithKeys(5, 50)
	chunks, err := Chunks(snap, "n", 500)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 4 {
		t.Fatalf("only %d chunks", len(chunks))
	}
	last := chunks[len(chunks)-1]
	one := func(data string, rev uint64, digest string) []*syncpb.SnapshotChunk {
		return []*syncpb.SnapshotChunk{{Revision: rev, Nonce: "x", Last: true, Data: []byte(data), Digest: digest}}
	}
	withDigest := func(c *syncpb.SnapshotChunk, d string) *syncpb.SnapshotChunk {
		return &syncpb.SnapshotChunk{Revision: c.Revision, Nonce: c.Nonce, Seq: c.Seq, Last: c.Last, Data: c.Data, Digest: d}
	}
	for _, tc := range []struct {
		name   string
		chunks []*syncpb.SnapshotChunk
		opts   AssemblerOptions
		want   string
	}{
		{"first not 0", chunks[1:], AssemblerOptions{}, "protocol: snapshot 5 chunk 1: the first chunk must be 0"},
		{"missing chunk", []*syncpb.SnapshotChunk{chunks[0], chunks[2]}, AssemblerOptions{}, "protocol: snapshot 5: chunk 2 came where chunk 1 was due"},
		{"repeated chunk", []*syncpb.SnapshotChunk{chunks[0], chunks[0]}, AssemblerOptions{}, "protocol: snapshot 5: chunk 0 came where chunk 1 was due"},
		{"other nonce", []*syncpb.SnapshotChunk{chunks[0], {Revision: 5, Nonce: "m", Seq: 1}}, AssemblerOptions{}, `protocol: snapshot 5 chunk 1 (nonce "m") came while snapshot 5 (nonce "n") was at chunk 1`},
		{"too big", chunks, AssemblerOptions{MaxBytes: 1200}, "protocol: snapshot 5: over 1200 bytes at chunk 2"},
		{"wrong digest", append(append([]*syncpb.SnapshotChunk{}, chunks[:len(chunks)-1]...), withDigest(last, "v1:00")), AssemblerOptions{}, "protocol: snapshot 5: digest " + Digest(snap) + ", the control plane sent v1:00"},
		{"revision inside", one(`{"revision":4}`, 5, ""), AssemblerOptions{}, "protocol: snapshot 5: its JSON says revision 4"},
		{"unknown field", one(`{"revision":5,"keyz":[]}`, 5, ""), AssemblerOptions{}, `protocol: snapshot 5: decode JSON: json: unknown field "keyz"`},
		{"trailing data", one(`{"revision":5} {}`, 5, ""), AssemblerOptions{}, "protocol: snapshot 5: decode JSON: data after the value"},
		{"truncated", one(`{"revision":5,`, 5, ""), AssemblerOptions{}, "protocol: snapshot 5: decode JSON: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAssembler(tc.opts)
			var err error
			for i, c := range tc.chunks {
				var got *spec.Snapshot
				if got, err = a.Add(c); err != nil {
					break
				}
				if got != nil {
					t.Fatalf("chunk %d: assembled a snapshot", i)
				}
			}
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %s", err, tc.want)
			}
			if a.InProgress() {
				t.Fatal("still in progress after an error")
			}
			// It starts afresh: a small snapshot now assembles.
			fresh, err := Chunks(snapshotWithKeys(6, 0), "r", 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.Add(fresh[0])
			if err != nil || got == nil || got.Revision != 6 {
				t.Fatalf("after the error: %v, %v", got, err)
			}
		})
	}
}

// TestChunksDigesterMatchesChunksAndDigest: ChunksDigester's chunks are
// Chunks' (json.Marshal of the snapshot, cut alike, the same last
// digest) and its Digester's digest is Digest(snap), for snapshots with
// keys whose hash is in upper case, keys with an expiry in another zone,
// api_limits, IDs that JSON escapes, and none at all.
func TestChunksDigesterMatchesChunksAndDigest(t *testing.T) {
	exp := time.Date(2031, 5, 6, 7, 8, 9, 10, time.FixedZone("X", -5*3600))
	odd := snapshotWithKeys(9, 50)
	odd.Keys[3].KeyHash = strings.ToUpper(odd.Keys[3].KeyHash)
	odd.Keys[4].Expires = &exp
	odd.Keys[5].APILimits = map[string]spec.Limits{"orders": {Rate: &spec.Rate{Requests: 3, Per: spec.Duration(time.Second)}}}
	odd.Policies = append(odd.Policies, spec.Policy{ID: "<b>&\"é\u2028", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Hour)}})
	odd.APIs = append(odd.APIs, spec.API{ID: "a&b", ListenPath: "/a<b>/", Target: spec.BuiltinEcho})
	many := snapshotWithKeys(8, 3*parallel.MinPart+5) // encoded in parts
	many.Keys[2*parallel.MinPart+1].KeyHash = strings.ToUpper(many.Keys[2*parallel.MinPart+1].KeyHash)
	many.Keys[3*parallel.MinPart].Expires = &exp
	for name, snap := range map[string]*spec.Snapshot{
		"empty":    {Revision: 1},
		"keys":     snapshotWithKeys(7, 1000),
		"many":     many,
		"odd":      odd,
		"policies": {Revision: 2, Policies: odd.Policies},
		"apis":     {Revision: 3, APIs: odd.APIs},
	} {
		want, err := Chunks(snap, "n", 700)
		if err != nil {
			t.Fatal(err)
		}
		got, d, err := ChunksDigester(snap, "n", 700)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d chunks, want %d", name, len(got), len(want))
		}
		var joined strings.Builder
		for i := range got {
			if jsonOf(t, got[i]) != jsonOf(t, want[i]) {
				t.Fatalf("%s: chunk %d differs", name, i)
			}
			joined.Write(got[i].Data)
		}
		if joined.String() != jsonOf(t, snap) {
			t.Fatalf("%s: chunks join to\n%s\nwant\n%s", name, joined.String(), jsonOf(t, snap))
		}
		var one Digester // one object at a time, in order
		for i := range snap.Policies {
			one.AddPolicy(&snap.Policies[i])
		}
		for i := range snap.Keys {
			one.AddKey(&snap.Keys[i])
		}
		for i := range snap.APIs {
			one.AddAPI(&snap.APIs[i])
		}
		if want := one.Digest(); d.Digest() != want || got[len(got)-1].Digest != want || Digest(snap) != want {
			t.Fatalf("%s: digester %s, last chunk %s, Digest %s, want %s", name, d.Digest(), got[len(got)-1].Digest, Digest(snap), want)
		}
		// The Digester goes on: removing a key gives the digest without it.
		if len(snap.Keys) > 4 {
			d.RemoveKey(&snap.Keys[4])
			less := *snap
			less.Keys = slices.Delete(slices.Clone(snap.Keys), 4, 5)
			if d.Digest() != Digest(&less) {
				t.Fatalf("%s: digest after removing a key %s, want %s", name, d.Digest(), Digest(&less))
			}
		}
	}
	if _, _, err := ChunksDigester(nil, "n", 0); err == nil || err.Error() != "protocol: chunks: nil snapshot" {
		t.Fatalf("nil snapshot: %v", err)
	}
}

// TestAssemblerDecodesAcrossChunks: the Assembler decodes the chunks as
// they came, with no join: a snapshot cut into chunks of one byte, white
// space after its value in chunks of their own included, decodes to the
// snapshot; a byte other than white space in a chunk after the value is
// data after the value, and so is a second value.
func TestAssemblerDecodesAcrossChunks(t *testing.T) {
	snap := snapshotWithKeys(5, 3)
	text := jsonOf(t, snap)
	split := func(data string) []*syncpb.SnapshotChunk {
		var cs []*syncpb.SnapshotChunk
		for i := range len(data) {
			cs = append(cs, &syncpb.SnapshotChunk{Revision: 5, Nonce: "x", Seq: uint32(i), Last: i == len(data)-1, Data: []byte{data[i]}})
		}
		return cs
	}
	add := func(cs []*syncpb.SnapshotChunk) (*spec.Snapshot, error) {
		a := NewAssembler(AssemblerOptions{})
		for i, c := range cs {
			got, err := a.Add(c)
			if err != nil || got != nil {
				if i != len(cs)-1 && err == nil {
					t.Fatalf("a snapshot at chunk %d of %d", i, len(cs))
				}
				return got, err
			}
		}
		t.Fatal("no snapshot and no error at the last chunk")
		return nil, nil
	}
	got, err := add(split(text + " \n\t "))
	if err != nil || jsonOf(t, got) != text {
		t.Fatalf("one-byte chunks: %v\n%s\nwant\n%s", err, jsonOf(t, got), text)
	}
	for _, tail := range []string{" x", "\n{}", "  0"} {
		if _, err := add(split(text + tail)); err == nil || err.Error() != "protocol: snapshot 5: decode JSON: data after the value" {
			t.Errorf("%q after the value: %v", tail, err)
		}
	}
}

// TestEncodeCutIsMarshal: the chunks' data, joined, is json.Marshal of the
// snapshot byte for byte, for snapshots with and without each list and
// for chunk sizes from one byte up; and spec.Snapshot still has exactly
// the fields encodeDigest writes (a new field must be written there too).
func TestEncodeCutIsMarshal(t *testing.T) {
	var fields []string
	st := reflect.TypeFor[spec.Snapshot]()
	for i := range st.NumField() {
		fields = append(fields, st.Field(i).Name+" "+string(st.Field(i).Tag))
	}
	if got, want := strings.Join(fields, "; "), `Revision json:"revision"; Policies json:"policies,omitempty"; Keys json:"keys,omitempty"; APIs json:"apis,omitempty"`; got != want {
		t.Fatalf("spec.Snapshot fields: %s\nencodeDigest writes: %s", got, want)
	}
	full := variedSnapshot(300)
	full.APIs[0].JWT = &spec.JWT{Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{{SecretEnv: "S<&>"}}, DefaultPolicies: []string{"free"}}
	for name, s := range map[string]*spec.Snapshot{
		"empty":       {},
		"revision":    {Revision: 1 << 63},
		"keys only":   {Revision: 3, Keys: variedSnapshot(5).Keys},
		"no keys":     snapshotWithKeys(4, 0),
		"full":        full,
		"empty lists": {Revision: 2, Policies: []spec.Policy{}, Keys: []spec.Key{}, APIs: []spec.API{}},
	} {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, max := range []int{1, 7, 512, 513, 4096, DefaultChunkBytes} {
			chunks, err := Chunks(s, "n", max)
			if err != nil {
				t.Fatalf("%s, %d: %v", name, max, err)
			}
			var joined []byte
			for i, c := range chunks {
				if p := c.Data; i < len(chunks)-1 && len(p) != max || len(p) == 0 || len(p) > max {
					t.Fatalf("%s, %d: chunk %d of %d has %d bytes", name, max, i, len(chunks), len(p))
				}
				joined = append(joined, c.Data...)
			}
			if !bytes.Equal(joined, want) {
				t.Fatalf("%s, %d:\n%s\nwant\n%s", name, max, joined, want)
			}
		}
	}
}
