package grpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// TestCostMetadata: a real gRPC server whose interceptor reads each
// call's cost from the x-cost metadata (bound 5): quota 10 at cost 3
// admits exactly 3 calls, the 4th is ResourceExhausted; every malformed
// value ends the call InvalidArgument naming the key and counts nothing;
// a call without it costs 1.
func TestCostMetadata(t *testing.T) {
	eng, err := core.NewEngine(frozenStore(), core.Config{Policies: []core.Policy{
		{ID: "q", Quota: core.Quota{Max: 10, Renewal: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k1"), Policies: []string{"q"}}})
	if err != nil {
		t.Fatal(err)
	}
	opts := lpgrpc.Options{API: func(string) string { return "shop" }, CostHeader: core.CostHeader{Name: "X-Cost", Max: 5}}
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
	call := func(costs ...string) error {
		ctx := withKey("k1")
		for _, c := range costs {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-cost", c)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return conn.Invoke(ctx, "/lp.test.Orders/List", new(emptypb.Empty), new(emptypb.Empty))
	}
	const bad = "malformed X-Cost header: want a whole number from 1 to 5"
	for _, v := range [][]string{{"abc"}, {"-1"}, {"0"}, {"6"}, {"2.5"}, {"3", "3"}} {
		err := call(v...)
		want := bad
		if len(v) == 2 {
			want = "malformed X-Cost header: given more than once"
		}
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != want {
			t.Fatalf("x-cost %q: %v, want InvalidArgument %q", v, err, want)
		}
	}
	var got []codes.Code
	for range 4 {
		got = append(got, status.Code(call("3")))
	}
	if want := []codes.Code{codes.OK, codes.OK, codes.OK, codes.ResourceExhausted}; len(got) != 4 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("cost 3 on quota 10: %v, want %v", got, want)
	}
	if err := call(); err != nil {
		t.Fatalf("without x-cost (1 unit left): %v", err)
	}
	if err := call(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("quota spent: %v", err)
	}
}
