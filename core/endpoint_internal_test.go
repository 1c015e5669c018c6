package core

import (
	"fmt"
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
