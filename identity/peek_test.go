package identity

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unsafe"
)

// peekReq is a testReq that is also a Peeker: it lends every value from
// one buffer, which scribble overwrites as fasthttp reuses its request
// memory once the handler returns.
type peekReq struct {
	*testReq
	buf []byte
}

func (r *peekReq) lend(v string) string {
	start := len(r.buf)
	r.buf = append(r.buf, v...)
	b := r.buf[start:len(r.buf):len(r.buf)]
	return unsafe.String(unsafe.SliceData(b), len(b))
}

func (r *peekReq) PeekHeader(name string) (string, int) {
	vs := r.h.Values(name)
	if len(vs) == 0 {
		return "", 0
	}
	return r.lend(vs[0]), len(vs)
}

func (r *peekReq) PeekQuery(name string) (string, int) {
	vs := r.q[name]
	if len(vs) == 0 {
		return "", 0
	}
	return r.lend(vs[0]), len(vs)
}

func (r *peekReq) scribble() {
	for i := range r.buf {
		r.buf[i] = '#'
	}
}

// TestPeekerSameAnswers checks that APIKey and JWT answer a Peeker exactly
// as they answer the same request read through HeaderValues and
// QueryValues, and that the credential Extract returns is a copy, unchanged
// once the lent memory is overwritten.
func TestPeekerSameAnswers(t *testing.T) {
	keys, err := NewKeys([]KeyRecord{{Hash: HashKey("good-key"), Policies: []string{"p"}}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAPIKey(keys, APIKeyOptions{})
	long := strings.Repeat("k", DefaultMaxKeyLength+1)
	for _, tc := range []struct {
		name  string
		build func(*testReq)
		key   string
		err   string
	}{
		{"header", func(r *testReq) { r.with("X-API-Key", " good-key ") }, "good-key", ""},
		{"bearer", func(r *testReq) { r.with("Authorization", "bearer good-key") }, "good-key", ""},
		{"query", func(r *testReq) { r.q.Set("api_key", "good-key") }, "good-key", ""},
		{"header and query agree", func(r *testReq) { r.with("X-API-Key", "good-key"); r.q.Set("api_key", "good-key") }, "good-key", ""},
		{"unknown", func(r *testReq) { r.with("X-API-Key", "other") }, "other", "invalid credentials: unknown API key"},
		{"over-long", func(r *testReq) { r.with("X-API-Key", long) }, long, "invalid credentials: unknown API key"},
		{"header twice", func(r *testReq) { r.with("X-API-Key", "good-key").with("X-API-Key", "good-key") }, "",
			"invalid credentials: ambiguous credentials: more than one X-API-Key header"},
		{"query twice", func(r *testReq) { r.q.Add("api_key", "a"); r.q.Add("api_key", "a") }, "",
			"invalid credentials: ambiguous credentials: more than one api_key query parameter"},
		{"differ", func(r *testReq) { r.with("Authorization", "a"); r.q.Set("api_key", "b") }, "",
			"invalid credentials: ambiguous credentials: Authorization header and api_key query parameter differ"},
		{"none", func(r *testReq) {}, "", "missing credentials: no API key"},
	} {
		plain := newReq("10.0.0.1:1")
		tc.build(plain)
		peek := &peekReq{testReq: plain}
		for _, r := range []Request{plain, peek} {
			_, isPeek := r.(*peekReq)
			key, xerr := a.Extract(r)
			if strings.Contains(tc.err, "ambiguous") {
				if xerr == nil || xerr.Error() != tc.err {
					t.Errorf("%s (peek %v): Extract error %v, want %q", tc.name, isPeek, xerr, tc.err)
				}
			} else if xerr != nil || key != tc.key {
				t.Errorf("%s (peek %v): Extract %q, %v, want %q", tc.name, isPeek, key, xerr, tc.key)
			}
			peek.scribble()
			if tc.key != "" && key != tc.key {
				t.Errorf("%s (peek %v): Extract's key changed with the lent memory: %q", tc.name, isPeek, key)
			}
			c, err := a.Authenticate(context.Background(), r)
			switch {
			case tc.err == "" && (err != nil || c == nil || c.ID != HashKey("good-key").ConsumerID()):
				t.Errorf("%s (peek %v): Authenticate %v, %v", tc.name, isPeek, c, err)
			case tc.err != "" && (err == nil || err.Error() != tc.err):
				t.Errorf("%s (peek %v): Authenticate error %v, want %q", tc.name, isPeek, err, tc.err)
			}
		}
	}

	// JWT.Extract reads through the Peeker too, and returns a copy.
	j := &JWT{sources: DefaultJWTSources(), lookup: lookupNames(DefaultJWTSources())}
	peek := &peekReq{testReq: newReq("10.0.0.1:1").with("Authorization", "Bearer tok.en.x")}
	tok, err := j.Extract(peek)
	peek.scribble()
	if err != nil || tok != "tok.en.x" {
		t.Errorf("JWT.Extract through a Peeker: %q, %v", tok, err)
	}
	peek = &peekReq{testReq: newReq("10.0.0.1:1").with("Authorization", "Basic x")}
	if _, err := j.Extract(peek); !errors.Is(err, ErrInvalidCredentials) || !strings.Contains(err.Error(), reasonNotBearer) {
		t.Errorf("JWT.Extract of a Basic credential through a Peeker: %v", err)
	}
}

// TestHashKeyAllocations: hashing a presented key copies nothing, however
// long (a []byte conversion would allocate past 32 bytes).
func TestHashKeyAllocations(t *testing.T) {
	k := strings.Repeat("k", 200)
	if n := testing.AllocsPerRun(100, func() { HashKey(k) }); n != 0 {
		t.Errorf("HashKey allocates %v", n)
	}
	if HashKey("abc").String() != "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("HashKey(\"abc\") = %s", HashKey("abc"))
	}
}
