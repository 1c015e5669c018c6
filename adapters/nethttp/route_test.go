package nethttp_test

import (
	"net/http/httptest"
	"testing"

	"github.com/limitplane/limitplane/adapters/nethttp"
)

// TestPathRouteEscaped: PathRoute gives the path as the client escaped
// it, so that an encoded "/" stays inside its segment (core.Route.Path).
func TestPathRouteEscaped(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"/o/1%2F2/items", "/o/1%2F2/items"},
		{"/orders/42", "/orders/42"},
		{"/ord%65rs", "/ord%65rs"},
	} {
		if got := nethttp.PathRoute(httptest.NewRequest("POST", tc.target, nil)); got.Path != tc.want || got.Method != "POST" {
			t.Errorf("%s: %+v, want POST %s", tc.target, got, tc.want)
		}
	}
}
