package grpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// keptStream is a grpc.ServerTransportStream that keeps the header
// metadata it is given as it is (gRPC's own copies it with metadata.Join,
// whose allocations are gRPC's for any server that sets a header field), so
// that the allocations counted are the interceptor's.
type keptStream struct{ header metadata.MD }

func (s *keptStream) Method() string                  { return "/lp.test.Alloc/Call" }
func (s *keptStream) SetHeader(md metadata.MD) error  { s.header = md; return nil }
func (s *keptStream) SendHeader(md metadata.MD) error { s.header = md; return nil }
func (s *keptStream) SetTrailer(md metadata.MD) error { return nil }

// An admitted unary call on a keyless API allocates 3 times (the metadata
// map's two and the block its values are copied into; was 9), one with an
// API key 4 (metadata.ValueFromIncomingContext copies the key's values;
// was 6). A denial: 23 and 24 (was 30 and 27), most of them building the
// status and its two details (status.New, WithDetails, anypb.New).
func TestUnaryAllocations(t *testing.T) {
	const apiKey = "alloc-key"
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey(apiKey), Policies: []string{"p"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		auth    identity.Authenticator
		rate    int64 // requests per hour
		allowed bool
		want    float64
	}{
		{"keyless admitted", &identity.Keyless{Policies: []string{"p"}}, 1_000_000, true, 3},
		{"api key admitted", identity.NewAPIKey(keys, identity.APIKeyOptions{}), 1_000_000, true, 4},
		{"keyless denied", &identity.Keyless{Policies: []string{"p"}}, 1, false, 23},
		{"api key denied", identity.NewAPIKey(keys, identity.APIKeyOptions{}), 1, false, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, err := core.NewEngine(memory.New(memory.Options{}), core.Config{Policies: []core.Policy{
				{ID: "p", Rate: core.Limit{Rate: tc.rate, Period: time.Hour}},
			}}, core.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ts := &keptStream{}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", apiKey))
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 4000}})
			ctx = grpc.NewContextWithServerTransportStream(ctx, ts)
			icpt := lpgrpc.UnaryServerInterceptor(eng, tc.auth, lpgrpc.Options{})
			info := &grpc.UnaryServerInfo{FullMethod: ts.Method()}
			handler := func(ctx context.Context, req any) (any, error) { return req, nil }
			call := func() error { _, err := icpt(ctx, nil, info, handler); return err }
			if !tc.allowed {
				if err := call(); err != nil {
					t.Fatalf("first call: %v", err)
				}
			}
			err = call()
			if got := status.Code(err); (got == codes.OK) != tc.allowed {
				t.Fatalf("code %v, allowed %v", got, tc.allowed)
			}
			if got := ts.header.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"p";q=`+map[bool]string{true: "1000000", false: "1"}[tc.allowed]+`;w=3600` {
				t.Fatalf("ratelimit-policy %q", got)
			}
			if n := testing.AllocsPerRun(200, func() { call() }); n != tc.want {
				t.Errorf("%v allocations per call, want %v", n, tc.want)
			}
		})
	}
}
