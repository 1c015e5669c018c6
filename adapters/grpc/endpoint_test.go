package grpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// ordersDesc is a proto-free service of three unary methods that answer
// Empty.
var ordersDesc = grpc.ServiceDesc{
	ServiceName: "lp.test.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: emptyHandler("/lp.test.Orders/Create")},
		{MethodName: "List", Handler: emptyHandler("/lp.test.Orders/List")},
		{MethodName: "Report", Handler: emptyHandler("/lp.test.Orders/Report")},
	},
}

func emptyHandler(method string) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
		req := new(emptypb.Empty)
		if err := dec(req); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) { return new(emptypb.Empty), nil }
		if in == nil {
			return h(ctx, req)
		}
		return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
	}
}

// serveOrders serves ordersDesc behind the unary interceptor with
// per-method endpoints of API shop (every method's API): Create 2/min,
// List 10/min, Report costing 5; the key k1's own policy is apiRate a
// minute.
func serveOrders(t *testing.T, apiRate int64) *grpc.ClientConn {
	t.Helper()
	eng, err := core.NewEngine(frozenStore(), core.Config{
		Policies: []core.Policy{
			{ID: "api", Rate: core.PerMinute(apiRate)},
			{ID: "create", Rate: core.PerMinute(2)},
			{ID: "list", Rate: core.PerMinute(10)},
		},
		Endpoints: map[string][]core.Endpoint{"shop": {
			{Path: "/lp.test.Orders/Create", Policies: []string{"create"}},
			{Path: "/lp.test.Orders/List", Policies: []string{"list"}},
			{Path: "/lp.test.Orders/Report", Cost: 5},
		}},
	}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{"api"}}})
	if err != nil {
		t.Fatal(err)
	}
	opts := lpgrpc.Options{API: func(string) string { return "shop" }, Route: lpgrpc.MethodRoute}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(eng, identity.NewAPIKey(k, identity.APIKeyOptions{}), opts)))
	srv.RegisterService(&ordersDesc, struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// calls makes n calls of method with key k1 and returns how many
// succeeded; a code other than OK and ResourceExhausted fails the test.
func calls(t *testing.T, conn *grpc.ClientConn, method string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		ctx, cancel := context.WithTimeout(withKey("k1"), 10*time.Second)
		err := conn.Invoke(ctx, method, new(emptypb.Empty), new(emptypb.Empty))
		cancel()
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
		default:
			t.Fatalf("%s: %v", method, err)
		}
	}
	return ok
}

// TestPerMethodEndpoints: per-method limits through a real gRPC server:
// exactly 2 Create and 10 List calls a minute for one key, each on its
// own counters, the API-wide limit applying across both (11 stops the
// 12th), and a method's cost.
func TestPerMethodEndpoints(t *testing.T) {
	conn := serveOrders(t, 1000)
	if got := calls(t, conn, "/lp.test.Orders/Create", 5); got != 2 {
		t.Errorf("Create: %d admitted, want 2", got)
	}
	if got := calls(t, conn, "/lp.test.Orders/List", 15); got != 10 {
		t.Errorf("List: %d admitted, want 10", got)
	}

	conn = serveOrders(t, 11)
	if got := calls(t, conn, "/lp.test.Orders/Create", 4); got != 2 {
		t.Errorf("API-wide 11: Create: %d admitted, want 2", got)
	}
	if got := calls(t, conn, "/lp.test.Orders/List", 12); got != 9 {
		t.Errorf("API-wide 11: List: %d admitted, want 9 (11 across both)", got)
	}

	conn = serveOrders(t, 12)
	if got := calls(t, conn, "/lp.test.Orders/Report", 3); got != 2 {
		t.Errorf("Report at cost 5 of 12: %d admitted, want 2", got)
	}
}
