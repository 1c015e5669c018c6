package grpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

// keptServerStream is a grpc.ServerStream that keeps the header metadata
// it is given, as keptStream.
type keptServerStream struct {
	grpc.ServerStream
	ctx    context.Context
	header metadata.MD
}

func (s *keptServerStream) Context() context.Context        { return s.ctx }
func (s *keptServerStream) SetHeader(md metadata.MD) error  { s.header = md; return nil }
func (s *keptServerStream) SendHeader(md metadata.MD) error { s.header = md; return nil }
func (s *keptServerStream) SetTrailer(metadata.MD)          {}

// An admitted unary call on a keyless API allocates 3 times (the metadata
// map's two and the block its values are copied into; was 9), one with an
// API key 4 (metadata.ValueFromIncomingContext copies the key's values;
// was 6). A denial that says what an earlier one said (same consumer,
// limit and RetryInfo to the millisecond: a denial storm) shares its
// status: 3 and 4 allocations (was 30 and 27). One that says something new
// builds it: 12 and 13 (was 25 and 26): the metadata's 3, the cache entry
// (which is also the error, and holds the consumer ID and message) and the
// 8 of status.FromProto's copy of the proto (the Status, the proto, its
// details slice grown twice, each detail's Any and bytes), the proto
// assembled in pooled memory. A stream's opening allocates as a unary
// call.
func TestUnaryAllocations(t *testing.T) {
	const apiKey = "alloc-key"
	keys, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey(apiKey), Policies: []string{"p"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			auth    identity.Authenticator
			rate    int64 // requests per hour
			allowed bool
			advance time.Duration // the clock's step between calls
			want    float64
		}{
			{"keyless admitted", &identity.Keyless{Policies: []string{"p"}}, 1_000_000, true, 0, 3},
			{"api key admitted", identity.NewAPIKey(keys, identity.APIKeyOptions{}), 1_000_000, true, 0, 4},
			{"keyless denied again", &identity.Keyless{Policies: []string{"p"}}, 1, false, 0, 3},
			{"api key denied again", identity.NewAPIKey(keys, identity.APIKeyOptions{}), 1, false, 0, 4},
			{"keyless denied anew", &identity.Keyless{Policies: []string{"p"}}, 1, false, time.Millisecond, 12},
			{"api key denied anew", identity.NewAPIKey(keys, identity.APIKeyOptions{}), 1, false, time.Millisecond, 13},
		} {
			name := "unary " + tc.name
			if stream {
				name = "stream " + tc.name
			}
			t.Run(name, func(t *testing.T) {
				clock := core.NewManualClock(int64(time.Hour))
				eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
					{ID: "p", Rate: core.Limit{Rate: tc.rate, Period: time.Hour}},
				}}, core.Options{})
				if err != nil {
					t.Fatal(err)
				}
				ts := &keptStream{}
				ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", apiKey))
				ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 4000}})
				ctx = grpc.NewContextWithServerTransportStream(ctx, ts)
				var call func() error
				header := func() metadata.MD { return ts.header }
				if stream {
					ss := &keptServerStream{ctx: ctx}
					icpt := lpgrpc.StreamServerInterceptor(eng, tc.auth, lpgrpc.Options{})
					info := &grpc.StreamServerInfo{FullMethod: ts.Method()}
					handler := func(any, grpc.ServerStream) error { return nil }
					call = func() error { return icpt(nil, ss, info, handler) }
					header = func() metadata.MD { return ss.header }
				} else {
					icpt := lpgrpc.UnaryServerInterceptor(eng, tc.auth, lpgrpc.Options{})
					info := &grpc.UnaryServerInfo{FullMethod: ts.Method()}
					handler := func(ctx context.Context, req any) (any, error) { return req, nil }
					call = func() error { _, err := icpt(ctx, nil, info, handler); return err }
				}
				if !tc.allowed {
					if err := call(); err != nil {
						t.Fatalf("first call: %v", err)
					}
				}
				err = call()
				if got := status.Code(err); (got == codes.OK) != tc.allowed {
					t.Fatalf("code %v, allowed %v", got, tc.allowed)
				}
				if got := header().Get("ratelimit-policy"); len(got) != 1 || got[0] != `"p";q=`+map[bool]string{true: "1000000", false: "1"}[tc.allowed]+`;w=3600` {
					t.Fatalf("ratelimit-policy %q", got)
				}
				// Under the race detector sync.Pool drops a quarter of what
				// it is given: a pool miss can add one on average.
				if n := testing.AllocsPerRun(200, func() { clock.Advance(tc.advance); call() }); n != tc.want && !(raceEnabled && n == tc.want+1) {
					t.Errorf("%v allocations per call, want %v", n, tc.want)
				}
			})
		}
	}
}

// Denials that say the same share one status; a denial that says
// something else (another millisecond of RetryInfo, another consumer) gets
// its own, with its own details.
func TestDenialStatusShared(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
		{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	icpt := lpgrpc.UnaryServerInterceptor(eng, &identity.Keyless{Policies: []string{"p"}}, lpgrpc.Options{})
	call := func(ip byte) error {
		ts := &keptStream{}
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, ip), Port: 4000}})
		ctx = grpc.NewContextWithServerTransportStream(ctx, ts)
		_, err := icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: ts.Method()}, func(ctx context.Context, req any) (any, error) { return req, nil })
		return err
	}
	for _, ip := range []byte{1, 2} {
		if err := call(ip); err != nil {
			t.Fatalf("10.0.0.%d first call: %v", ip, err)
		}
	}
	clock.Advance(1500 * time.Microsecond)
	a, b := call(1), call(1)
	clock.Advance(200 * time.Microsecond) // RetryInfo still 3,599,999 ms (rounded up)
	c := call(1)
	clock.Advance(time.Millisecond)
	d := call(1)
	e := call(2)
	if a != b || a != c {
		t.Errorf("the same denial three times: %p %p %p, want one shared status", a, b, c)
	}
	if d == a || e == d || e == a {
		t.Errorf("other denials share a status: %p %p %p", a, d, e)
	}
	for _, tc := range []struct {
		err     error
		retry   time.Duration
		subject string
	}{{a, 3599999 * time.Millisecond, "ip:10.0.0.1"}, {d, 3599998 * time.Millisecond, "ip:10.0.0.1"}, {e, 3599998 * time.Millisecond, "ip:10.0.0.2"}} {
		st := status.Convert(tc.err)
		var ri *errdetails.RetryInfo
		var qf *errdetails.QuotaFailure
		for _, x := range st.Details() {
			switch x := x.(type) {
			case *errdetails.RetryInfo:
				ri = x
			case *errdetails.QuotaFailure:
				qf = x
			}
		}
		if st.Code() != codes.ResourceExhausted || ri == nil || ri.RetryDelay.AsDuration() != tc.retry ||
			qf == nil || len(qf.Violations) != 1 || qf.Violations[0].Subject != tc.subject {
			t.Errorf("status %v: RetryInfo %v, QuotaFailure %v; want delay %v, subject %q", st.Code(), ri, qf, tc.retry, tc.subject)
		}
	}
}
