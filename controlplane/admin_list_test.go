package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// TestAdminNullBody: a JSON null body is refused (400) by every write
// that takes a body, as an empty one is, and nothing is stored; a policy
// of {} (neither rate nor quota: it limits nothing) is valid.
func TestAdminNullBody(t *testing.T) {
	s, base := server(t, controlplane.BoltOptions{}, nil)
	null := `{"error":"body is JSON null; want a JSON object"}`
	for _, r := range [][2]string{
		{"PUT", "/api/policies/gold"},
		{"PUT", "/api/apis/echo"},
		{"POST", "/api/keys"},
		{"PUT", "/api/keys/" + hash("k")},
	} {
		for _, body := range []string{"null", " null\n"} {
			expect(t, call(t, r[0], base+r[1], body), 400, null)
		}
		expect(t, call(t, r[0], base+r[1], ""), 400, `{"error":"body is not valid JSON for this object: EOF"}`)
	}
	if got := revision(t, s); got != 0 {
		t.Fatalf("store at %d after refused writes, want 0", got)
	}
	expect(t, call(t, "PUT", base+"/api/policies/open", `{}`), 200, `{"revision":1}`)
	expect(t, call(t, "GET", base+"/api/policies/open", ""), 200, `{"id":"open"}`)
}

// TestAdminMethodNotAllowed: a method an existing path does not serve
// answers 405 with Allow; an unknown path still answers 404.
func TestAdminMethodNotAllowed(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	h := hash("k")
	for _, c := range []struct{ method, path, allow string }{
		{"PATCH", "/api/policies/gold", "DELETE, GET, HEAD, PUT"},
		{"POST", "/api/policies/gold", "DELETE, GET, HEAD, PUT"},
		{"DELETE", "/api/policies", "GET, HEAD"},
		{"PATCH", "/api/apis/echo", "DELETE, GET, HEAD, PUT"},
		{"PUT", "/api/keys", "GET, HEAD, POST"},
		{"POST", "/api/keys/" + h, "DELETE, GET, HEAD, PUT"},
		{"GET", "/api/keys/" + h + "/reset-quota", "POST"},
		{"POST", "/api/revision", "GET, HEAD"},
		{"DELETE", "/api/dataplanes", "GET, HEAD"},
	} {
		a := call(t, c.method, base+c.path, "")
		expect(t, a, 405, fmt.Sprintf(`{"error":"method %s not allowed on %s (allowed: %s)"}`, c.method, c.path, c.allow))
		if got := a.header.Get("Allow"); got != c.allow {
			t.Fatalf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	a := call(t, "PATCH", base+"/api/nothing", "")
	expect(t, a, 404, `{"error":"no such endpoint"}`)
	if got := a.header.Get("Allow"); got != "" {
		t.Fatalf("404 with Allow %q", got)
	}
}

// TestAdminLists: GET /api/policies and /api/apis list everything in ID
// order; GET /api/keys pages through the keys in hash order.
func TestAdminLists(t *testing.T) {
	s, base := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "GET", base+"/api/policies", ""), 200, `{"revision":0,"policies":[]}`)
	expect(t, call(t, "GET", base+"/api/apis", ""), 200, `{"revision":0,"apis":[]}`)
	expect(t, call(t, "GET", base+"/api/keys", ""), 200, `{"revision":0,"keys":[],"next":""}`)

	expect(t, call(t, "PUT", base+"/api/policies/silver", `{"rate":{"requests":2,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`), 200, `{"revision":2}`)
	expect(t, call(t, "PUT", base+"/api/apis/echo", `{"listen_path":"/echo/","target":"builtin:echo"}`), 200, `{"revision":3}`)
	expect(t, call(t, "PUT", base+"/api/apis/b", `{"listen_path":"/b/","target":"builtin:echo","tags":["eu"]}`), 200, `{"revision":4}`)
	a := call(t, "GET", base+"/api/policies", "")
	expect(t, a, 200, `{"revision":4,"policies":[{"id":"gold","rate":{"requests":5,"per":"1m0s"}},{"id":"silver","rate":{"requests":2,"per":"1m0s"}}]}`)
	if got := a.header.Get("Limitplane-Revision"); got != "4" {
		t.Fatalf("Limitplane-Revision %q, want 4", got)
	}
	expect(t, call(t, "GET", base+"/api/apis", ""), 200, `{"revision":4,"apis":[{"id":"b","listen_path":"/b/","target":"builtin:echo","tags":["eu"]},{"id":"echo","listen_path":"/echo/","target":"builtin:echo"}]}`)

	// 2,500 keys in one write; pages of the default 100 and of 1000.
	const n = 2500
	var hashes []string
	_, err := s.Update(context.Background(), func(tx controlplane.Tx) error {
		for i := range n {
			h := hash(fmt.Sprintf("key-%d", i))
			hashes = append(hashes, h)
			if err := tx.PutKey(spec.Key{KeyHash: h, Policies: []string{"gold"}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(hashes)
	keyJSON := func(h string) string { return `{"key_hash":"` + h + `","policies":["gold"]}` }
	page := func(hs []string, next string) string {
		var b strings.Builder
		for i, h := range hs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(keyJSON(h))
		}
		return `{"revision":5,"keys":[` + b.String() + `],"next":"` + next + `"}`
	}
	expect(t, call(t, "GET", base+"/api/keys", ""), 200, page(hashes[:100], hashes[99]))
	expect(t, call(t, "GET", base+"/api/keys?after="+hashes[99]+"&limit=3", ""), 200, page(hashes[100:103], hashes[102]))
	// after in upper case, and after a hash that is no key.
	expect(t, call(t, "GET", base+"/api/keys?limit=2&after=sha256:"+strings.ToUpper(hashes[0][7:]), ""), 200, page(hashes[1:3], hashes[2]))
	expect(t, call(t, "GET", base+"/api/keys?limit=1&after=sha256:"+strings.Repeat("0", 64), ""), 200, page(hashes[:1], hashes[0]))
	// Walk every page of 1000: 1000, 1000, 500, and the last says next "".
	var got []string
	after, pages := "", 0
	for {
		want := min(1000, n-len(got))
		var next string
		if len(got)+want < n {
			next = hashes[len(got)+want-1]
		}
		expect(t, call(t, "GET", base+"/api/keys?limit=1000&after="+after, ""), 200, page(hashes[len(got):len(got)+want], next))
		got = append(got, hashes[len(got):len(got)+want]...)
		pages++
		if next == "" {
			break
		}
		after = next
	}
	if pages != 3 || len(got) != n {
		t.Fatalf("%d pages, %d keys; want 3, %d", pages, len(got), n)
	}
	// A page that ends exactly at the last key says next "".
	expect(t, call(t, "GET", base+"/api/keys?limit=2&after="+hashes[n-3], ""), 200, page(hashes[n-2:], ""))
	expect(t, call(t, "GET", base+"/api/keys?after="+hashes[n-1], ""), 200, `{"revision":5,"keys":[],"next":""}`)

	for _, q := range []string{"limit=0", "limit=1001", "limit=-1", "limit=x"} {
		v := strings.TrimPrefix(q, "limit=")
		expect(t, call(t, "GET", base+"/api/keys?"+q, ""), 400, `{"error":"?limit=\"`+v+`\": want 1 to 1000"}`)
	}
	expect(t, call(t, "GET", base+"/api/keys?limit=1&limit=2", ""), 400, `{"error":"?limit given 2 times: give it once"}`)
	expect(t, call(t, "GET", base+"/api/keys?limit=1;2", ""), 400, `{"error":"query \"limit=1;2\" does not parse: invalid semicolon separator in query"}`)
	expect(t, call(t, "GET", base+"/api/keys?after=sha256:zz", ""), 400, `{"error":"key hash \"sha256:zz\" is not sha256:\u003c64 hex digits\u003e"}`)
}
