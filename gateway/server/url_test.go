package server

import (
	"net"
	"testing"
)

// TestBaseURL: wildcard listen addresses are shown as the loopback.
func TestBaseURL(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"0.0.0.0:80", "http://127.0.0.1:80"},
		{"[::]:9000", "http://[::1]:9000"},
		{"[::1]:9000", "http://[::1]:9000"},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := baseURL(a); got != tc.want {
			t.Errorf("baseURL(%s) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}
