package protocol_test

import (
	"strings"
	"testing"

	"github.com/limitplane/limitplane/dataplane/protocol"
)

// TestCheckGatewayID: the ids a Hello may carry, and the problems of the
// others.
func TestCheckGatewayID(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"gw-1", ""},
		{"host.example.com-4242", ""},
		{"网关-1", ""},
		{strings.Repeat("a", 256), ""},
		{"", "gateway_id is empty"},
		{strings.Repeat("a", 257), "gateway_id is 257 bytes long, more than 256"},
		{"gw\xff", `gateway_id "gw\xff" is not UTF-8`},
		{"gw\n1", `gateway_id "gw\n1" has a control character`},
		{"gw\u00851", `gateway_id "gw\u00851" has a control character`},
	} {
		err := protocol.CheckGatewayID(tc.id)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("CheckGatewayID(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}
