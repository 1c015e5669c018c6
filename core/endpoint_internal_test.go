package core

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkEndpointMatch is the matching alone among 100 endpoints: what
// DecideRoute adds to a decision before the endpoint's own store call.
func BenchmarkEndpointMatch(b *testing.B) {
	m := &endpointMatcher{}
	for i := range 100 {
		segs, err := parseEndpointPath(fmt.Sprintf("/r%d/{id}/items", i/4))
		if err != nil {
			b.Fatal(err)
		}
		m.add(segs, &endpointEntry{method: []string{"GET", "POST", "PUT", "DELETE"}[i%4]})
	}
	for _, tc := range []struct{ name, method, path string }{
		{"last", "DELETE", "/r24/42/items"},
		{"none", "GET", "/nothing/42/items"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if (m.match(tc.method, tc.path) == nil) != (tc.name == "none") {
					b.Fatal("wrong match")
				}
			}
		})
	}
}

// TestManyLiterals: a node with many literal children (indexed in a
// litTable once past maxLinearLits) finds each child, and misses
// segments no child has: unknown ones, longer ones, prefixes and
// extensions of children, and the empty segment.
func TestManyLiterals(t *testing.T) {
	for _, n := range []int{maxLinearLits, maxLinearLits + 1, 1000} {
		m := &endpointMatcher{}
		want := map[string]*endpointEntry{}
		for i := range n {
			p := fmt.Sprintf("/v%d/items", i)
			segs, err := parseEndpointPath(p)
			if err != nil {
				t.Fatal(err)
			}
			e := &endpointEntry{method: "GET"}
			m.add(segs, e)
			want[p] = e
		}
		for p, e := range want {
			if got := m.match("GET", p+"/42"); got != e {
				t.Fatalf("%d children: %s matched %p, want %p", n, p, got, e)
			}
		}
		for _, p := range []string{"/v/items", fmt.Sprintf("/v%d/items", n), "/v1x/items", "/1/items", "//items", "/" + strings.Repeat("v", 5000) + "/items", "/v10"} {
			if got := m.match("GET", p); got != nil {
				t.Fatalf("%d children: %s matched %+v, want none", n, p, got)
			}
		}
	}
}

// TestEscapedSegments: a route's path may be escaped: each segment is
// decoded before a literal is compared, and an encoded "/" stays in its
// segment, which only a {param} takes.
func TestEscapedSegments(t *testing.T) {
	m := &endpointMatcher{}
	eps := map[string]*endpointEntry{}
	for _, p := range []string{"/orders", "/o/{id}/items", "/o/a/items"} {
		segs, err := parseEndpointPath(p)
		if err != nil {
			t.Fatal(err)
		}
		eps[p] = &endpointEntry{method: "*"}
		m.add(segs, eps[p])
	}
	for _, tc := range []struct{ path, want string }{
		{"/ord%65rs", "/orders"},
		{"/ord%65rs/42", "/orders"},
		{"/o/1%2F2/items", "/o/{id}/items"},
		{"/o/a%2Fb/items", "/o/{id}/items"}, // "a/b" is no "a"
		{"/o/%61/items", "/o/a/items"},
		{"/o/%zz/items", "/o/{id}/items"}, // not decodable: taken as it is
		{"/o%2F1/items", ""},              // "o/1" is no "o"
		{"/orders%2F", ""},
	} {
		got := m.match("GET", tc.path)
		if want := eps[tc.want]; got != want {
			t.Errorf("%s matched %p, want %s (%p)", tc.path, got, tc.want, want)
		}
	}
}
