package grpc_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// withDetailsStatus is the ResourceExhausted status as Status built it
// with status.New(...).WithDetails (before session 37): the reference the
// statuses built now must equal on the wire.
func withDetailsStatus(msg string, d core.Decision, subject string) *status.Status {
	st := status.New(codes.ResourceExhausted, msg)
	details := make([]protoadapt.MessageV1, 0, 2)
	if d.RetryAfter >= 0 && d.DecidedBy != core.KindInFlight {
		delay := d.RetryAfter
		if delay > 0 {
			delay = (delay + time.Millisecond - 1) / time.Millisecond * time.Millisecond
		}
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     subject,
		Description: msg,
		QuotaMetric: d.DecidedBy.String(),
		QuotaId:     d.Policy,
		QuotaValue:  d.Limit,
	}}})
	if wd, err := st.WithDetails(details...); err == nil {
		st = wd
	}
	return st
}

// sameWire fails t unless got's status and want's are equal and marshal
// to the same bytes (what a server sends as grpc-status-details-bin).
func sameWire(t *testing.T, name string, got, want *status.Status) {
	t.Helper()
	gp, wp := got.Proto(), want.Proto()
	gb, gerr := proto.Marshal(gp)
	wb, werr := proto.Marshal(wp)
	if !proto.Equal(gp, wp) || !bytes.Equal(gb, wb) || (gerr == nil) != (werr == nil) {
		t.Errorf("%s:\n got %v (%x, %v)\nwant %v (%x, %v)", name, gp, gb, gerr, wp, wb, werr)
	}
}

// TestStatusWire checks that Status builds, for every shape of denial,
// the status WithDetails built: RetryInfo present (rounded up to the
// millisecond, long and zero delays) and absent (the cost can never pass,
// an in-flight refusal), each kind, empty and long fields, and fields that
// are not UTF-8 (no details then, as WithDetails fails).
func TestStatusWire(t *testing.T) {
	long := strings.Repeat("a long message, ", 300)
	for _, c := range []struct {
		name, msg, subject string
		d                  core.Decision
	}{
		{"rate", "rate limit exceeded", "key:abc", core.Decision{DecidedBy: core.KindRate, Policy: "p", Limit: 5, RetryAfter: 1500 * time.Microsecond}},
		{"quota", "quota exceeded", "ip:10.0.0.1", core.Decision{DecidedBy: core.KindQuota, Policy: "gold", Limit: 100, RetryAfter: 90 * time.Second}},
		{"retry now", "rate limit exceeded", "key:abc", core.Decision{DecidedBy: core.KindRate, Policy: "p", Limit: 1, RetryAfter: 0}},
		{"retry in 1ns", "rate limit exceeded", "key:abc", core.Decision{DecidedBy: core.KindRate, Policy: "p", Limit: 1, RetryAfter: 1}},
		{"retry in years", "quota exceeded", "key:abc", core.Decision{DecidedBy: core.KindQuota, Policy: "p", Limit: 1 << 40, RetryAfter: 1 << 62}},
		{"never passes", "cost exceeds the limit", "key:abc", core.Decision{DecidedBy: core.KindRate, Limit: 5, RetryAfter: -1}},
		{"in flight", "too many concurrent requests", "key:abc", core.Decision{DecidedBy: core.KindInFlight, Policy: "conc", Limit: 3, RetryAfter: time.Second}},
		{"kind none, empty fields", "", "", core.Decision{}},
		{"negative limit", "x", "s", core.Decision{DecidedBy: core.KindRate, Limit: -7, RetryAfter: time.Hour}},
		{"long", long, strings.Repeat("consumer-", 40), core.Decision{DecidedBy: core.KindQuota, Policy: strings.Repeat("policy", 50), Limit: 1e12, RetryAfter: 3599999 * time.Millisecond}},
		{"subject not UTF-8", "rate limit exceeded", "key:\xff", core.Decision{DecidedBy: core.KindRate, Policy: "p", Limit: 1, RetryAfter: time.Second}},
		{"message not UTF-8", "rate \xc3 limit", "key:abc", core.Decision{DecidedBy: core.KindRate, Policy: "p", Limit: 1, RetryAfter: time.Second}},
		{"policy not UTF-8, no RetryInfo", "m", "key:abc", core.Decision{DecidedBy: core.KindInFlight, Policy: "\x80", Limit: 1}},
	} {
		res := response.Result{Status: 429, Message: c.msg}
		sameWire(t, c.name, lpgrpc.Status(res, c.d, c.subject, nil), withDetailsStatus(c.msg, c.d, c.subject))
	}
	// An identity.LimitError is answered from its decision; other errors
	// get no details.
	le := &identity.LimitError{Decision: core.Decision{DecidedBy: core.KindRate, Policy: "authfail", Limit: 3, RetryAfter: 20 * time.Second}}
	res := response.Result{Status: 429, Message: "too many authentication failures"}
	sameWire(t, "limit error", lpgrpc.Status(res, core.Decision{}, "ip:10.0.0.1", le), withDetailsStatus(res.Message, le.Decision, "ip:10.0.0.1"))
	res = response.Result{Status: 503, Message: "store unavailable"}
	sameWire(t, "store unavailable", lpgrpc.Status(res, core.Decision{}, "s", core.ErrStoreUnavailable), status.New(codes.Unavailable, res.Message))
	res = response.Result{Status: 401, Message: "missing credentials"}
	sameWire(t, "401", lpgrpc.Status(res, core.Decision{}, "s", errors.New("x")), status.New(codes.Unauthenticated, res.Message))
}

// rebuilt is st built anew with WithDetails from its own details: a status
// whose details were not encoded as anypb.New encodes them differs.
func rebuilt(t *testing.T, st *status.Status) *status.Status {
	t.Helper()
	var ds []protoadapt.MessageV1
	for _, d := range st.Details() {
		m, ok := d.(protoadapt.MessageV1)
		if !ok {
			t.Fatalf("detail %v", d)
		}
		ds = append(ds, m)
	}
	r, err := status.New(st.Code(), st.Message()).WithDetails(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInterceptorDenialWire checks the statuses the interceptors end
// denied calls and streams with, built anew and cached: each is the status
// WithDetails builds from its details, and its error reads as status.Err's.
func TestInterceptorDenialWire(t *testing.T) {
	for _, c := range []struct {
		auth    identity.Authenticator
		details int
	}{
		{&identity.Keyless{Policies: []string{"p"}}, 2},
		{longID(strings.Repeat("a consumer ID longer than a cache entry holds ", 4)), 2},
		{longID("key:\xff"), 0}, // not UTF-8: no details, as WithDetails fails
	} {
		auth := c.auth
		clock := core.NewManualClock(int64(time.Hour))
		eng, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
			{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Hour}},
		}}, core.Options{})
		if err != nil {
			t.Fatal(err)
		}
		unary := lpgrpc.UnaryServerInterceptor(eng, auth, lpgrpc.Options{})
		stream := lpgrpc.StreamServerInterceptor(eng, auth, lpgrpc.Options{})
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 4000}})
		call := func() error {
			ctx := grpc.NewContextWithServerTransportStream(ctx, &keptStream{})
			_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/lp.test.Alloc/Call"}, func(ctx context.Context, req any) (any, error) { return req, nil })
			return err
		}
		open := func() error {
			return stream(nil, &headerStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: "/lp.test.Alloc/Call"}, func(any, grpc.ServerStream) error { return nil })
		}
		if err := call(); err != nil {
			t.Fatal(err)
		}
		for i, err := range []error{call(), call(), open(), open()} {
			st := status.Convert(err)
			want := rebuilt(t, st)
			if st.Code() != codes.ResourceExhausted || len(st.Details()) != c.details {
				t.Fatalf("denial %d: %v", i, st.Proto())
			}
			sameWire(t, "interceptor denial", st, want)
			if want := status.New(st.Code(), st.Message()).Err().Error(); err.Error() != want {
				t.Errorf("denial %d reads %q, want %q", i, err.Error(), want)
			}
			if !errors.Is(err, want.Err()) || !errors.Is(err, err) {
				t.Errorf("denial %d is not its status error", i)
			}
			clock.Advance(time.Millisecond)
		}
	}
}

// longID authenticates every call as the consumer it names.
type longID string

func (id longID) Authenticate(context.Context, identity.Request) (*core.Consumer, error) {
	return &core.Consumer{ID: string(id), Policies: []string{"p"}}, nil
}

// headerStream is a grpc.ServerStream that only has a context and takes
// header metadata.
type headerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *headerStream) Context() context.Context     { return s.ctx }
func (s *headerStream) SetHeader(metadata.MD) error  { return nil }
func (s *headerStream) SendHeader(metadata.MD) error { return nil }
func (s *headerStream) SetTrailer(metadata.MD)       {}
