// Package grpc is limitplane's gRPC glue: unary and stream server
// interceptors that identify the caller from metadata or the peer address,
// ask the engine for a decision and end denied calls with a status.
//
// A call is limited under the API ID Options.API(fullMethod) — by default
// the full method name, "/pkg.Service/Method". The answers match the HTTP
// adapters, since all of them render through adapters/response:
//
//   - the rate-limit fields (RateLimit-Policy, RateLimit, Retry-After and,
//     when enabled, X-RateLimit-*) travel as response header metadata
//     under the same names, lower-cased;
//   - a denial ends the call with codes.ResourceExhausted carrying
//     errdetails.RetryInfo (the decision's RetryAfter rounded up to the
//     millisecond, as the HTTP body's retry_after_ms; left out when the
//     cost can never pass) and errdetails.QuotaFailure; repeated denials
//     that say the same share one status, built once;
//   - authentication failures end it with Unauthenticated (HTTP 401) or
//     PermissionDenied (403) (a keyless call from a peer with no IP
//     address, a Unix socket's, with Internal: identity.ErrNoClientAddress),
//     a store failure under core.FailClosed with Unavailable, an invalid
//     cost with InvalidArgument.
//
// Streams are checked when they open; with Options.PerMessage every message
// the server receives is decided too, and a stream over its message rate
// ends with ResourceExhausted.
//
// For outbound calls, Client's UnaryClientInterceptor and
// StreamClientInterceptor hold calls to a remote service under that
// service's limit (the gRPC twin of nethttp.Transport).
//
// Import it under a name that does not clash with gRPC itself:
//
//	import lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
//
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(engine, auth, lpgrpc.Options{})),
//		grpc.ChainStreamInterceptor(lpgrpc.StreamServerInterceptor(engine, auth, lpgrpc.Options{})),
//	)
package grpc

import (
	"context"
	"errors"
	"hash/maphash"
	"math/bits"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/limitplane/limitplane/adapters/internal/admit"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// Options configure the interceptors. The zero value limits every call (and
// every stream when it opens) at cost 1 under its full method name, does not
// meter stream messages, and uses the default Renderer.
type Options struct {
	// API maps a full method name ("/pkg.Service/Method") to the API ID
	// the engine decides for; nil means the full method name itself.
	API func(fullMethod string) string
	// Cost returns the cost of a unary call or of opening a stream; nil
	// means 1. An endpoint with a cost of its own overrides it
	// (core.Endpoint.Cost). 0 admits the call without spending anything
	// (a peek, core.Request.Cost); a cost below 0 or above core.MaxCost is
	// answered InvalidArgument, so clamp what comes from the request.
	Cost func(ctx context.Context, fullMethod string) int64
	// CostHeader, when it names a metadata key, reads the cost of a
	// unary call or a stream's opening from the incoming metadata of
	// that name (core.CostHeader: bounded; a malformed value ends the
	// call with codes.InvalidArgument naming the key, before
	// authentication, nothing counted); a call without it costs what
	// Cost says. When Name is "" and the decider is a
	// core.CostHeaderSource (a data-plane member's Limiter), the key of
	// the running API definition is read.
	CostHeader core.CostHeader
	// Route, when set, says where a call (or a stream's opening) goes
	// within its API, so that a core.RouteDecider (an engine with
	// endpoints, the Limiter(api) of a data-plane member) decides it at
	// the endpoint it matches: MethodRoute makes the full method name
	// the path, so an API's endpoints name methods
	// ({path: /shop.Orders/Create}) or services ({path: /shop.Orders}),
	// each with its policies and cost. nil decides every call for its API
	// as a whole (Decide). Stream messages (PerMessage) are decided for
	// MessageAPI as a whole.
	Route func(fullMethod string) core.Route
	// PerMessage meters every message a stream receives (client and
	// bidirectional streams): after each successful RecvMsg the engine is
	// asked for MessageCost units under MessageAPI. A denied message ends
	// the stream with ResourceExhausted: RecvMsg returns that status, and
	// the interceptor returns it whatever the handler returns.
	PerMessage bool
	// MessageAPI maps a full method name to the API ID messages are
	// decided for; nil means API's. Under the same API ID messages and
	// calls spend the same counters; a distinct ID with per-API limits
	// (core.Consumer.APILimits) gives messages counters of their own.
	MessageAPI func(fullMethod string) string
	// MessageCost is each received message's cost; 0 means 1.
	MessageCost int64
	// Renderer renders answers; nil means response.NewRenderer with zero
	// Options.
	Renderer *response.Renderer
	// OnDecision, if set, is called once per call, stream opening and
	// metered message with the decision or error (for metrics and logs).
	OnDecision func(ctx context.Context, fullMethod string, d core.Decision, err error)
	// SettleTrailer, when set, names the trailer metadata key (lower
	// case, e.g. "x-usage-tokens") in which the handler gives a call's
	// (or stream's) actual cost with grpc.SetTrailer or SetTrailer: once
	// the handler returns, a policy that settles (core.Policy.Settle)
	// charges or refunds the difference from the estimate (the call's
	// cost) in the quota period it charged. Settle, when set, is asked
	// first. A call without either keeps the estimate.
	SettleTrailer string
	// Settle, when set, returns a unary call's actual cost from its
	// response and error (ok false: unknown, keep the estimate).
	Settle func(ctx context.Context, fullMethod string, resp any, err error) (actual int64, ok bool)
}

// interceptor holds what both interceptors share.
type interceptor struct {
	l    core.Decider
	auth identity.Authenticator
	rend *response.Renderer
	o    Options
	// scratch holds *scratch: a call's memory, reused once its answer is
	// copied out.
	scratch sync.Pool
	// denials caches the statuses of recent denials by what they say
	// (deniedAnswer): a direct-mapped, lock-free table where a colliding
	// answer replaces the older. A consumer denied again and again (a
	// denial storm, when a denial's cost matters) gets the status built
	// once per distinct answer, that is per millisecond of RetryInfo,
	// instead of once per call. Statuses are immutable, so calls share
	// them.
	seed    maphash.Seed
	denials [256]atomic.Pointer[deniedStatus]
}

// deniedAnswer is everything a denial's status says.
type deniedAnswer struct {
	subject, policy, msg string
	kind                 core.Kind
	limit                int64
	retry                time.Duration // the decision's RetryAfter: Status rounds it
}

// deniedStatus is a cached denial: its answer and status. It is also the
// error the call ends with (GRPCStatus), so a status built costs no
// status.Err besides.
type deniedStatus struct {
	k  deniedAnswer
	st *status.Status
	// text holds k.subject and k.msg (the status message shares k.msg)
	// when they fit: most do, and then the entry is one allocation.
	text [96]byte
}

// Error returns what status.Err's error says: "rpc error: code = ... desc = ...".
func (e *deniedStatus) Error() string { return e.st.String() }

// GRPCStatus returns the status; status.FromError, status.Code and
// status.Convert find it, and a server sends it.
func (e *deniedStatus) GRPCStatus() *status.Status { return e.st }

// Is reports whether target is a status error with an equal status, as
// the errors of status.Err compare.
func (e *deniedStatus) Is(target error) bool {
	if t, ok := target.(*deniedStatus); ok {
		target = t.st.Err()
	}
	return errors.Is(e.st.Err(), target)
}

// denial returns the error of a denied decision d for subject (the
// consumer's ID, possibly in scratch memory: the cache keeps a copy), from
// the cache or built in sp and cached.
func (in *interceptor) denial(res response.Result, d core.Decision, subject string, sp *statusProto) error {
	k := deniedAnswer{subject: subject, policy: d.Policy, msg: res.Message, kind: d.DecidedBy, limit: d.Limit, retry: retryDelay(d.RetryAfter)}
	h := maphash.String(in.seed, subject) ^ bits.RotateLeft64(maphash.String(in.seed, d.Policy), 31) ^
		uint64(k.retry)*0x9e3779b97f4a7c15 ^ uint64(k.limit)*0xc2b2ae3d27d4eb4f ^ uint64(k.kind)<<56 ^ uint64(len(k.msg))
	slot := &in.denials[h%uint64(len(in.denials))]
	if c := slot.Load(); c != nil && c.k == k {
		return c
	}
	c := &deniedStatus{k: k}
	t := c.text[:0]
	if n := len(subject) + len(k.msg); n > len(c.text) {
		t = make([]byte, 0, n) // not subject + k.msg: that returns a lone non-empty operand uncopied
	}
	t = append(append(t, subject...), k.msg...)
	c.k.subject = unsafe.String(unsafe.SliceData(t), len(subject))
	c.k.msg = unsafe.String(unsafe.SliceData(t[len(subject):]), len(k.msg))
	c.st = sp.exhausted(c.k.msg, d, c.k.subject)
	slot.Store(c)
	return c
}

// retryDelay is RetryInfo's delay for a RetryAfter: rounded up to the
// millisecond, as the JSON body's retry_after_ms; negative stays negative
// (no RetryInfo).
func retryDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// scratch is the memory one call's decision is made and rendered in. None
// of it outlives admit: the metadata gRPC keeps is copied out of it
// (Metadata) and so is the consumer ID a status names.
type scratch struct {
	req  Request // given to the authenticator as *Request: no allocation
	cons admit.Consumer
	resp response.Scratch
	st   statusProto
}

func newInterceptor(who string, l core.Decider, auth identity.Authenticator, o Options) *interceptor {
	admit.Require(who, l, auth)
	if o.Renderer == nil {
		o.Renderer = response.NewRenderer(response.Options{})
	}
	if o.API == nil {
		o.API = func(m string) string { return m }
	}
	if o.MessageAPI == nil {
		o.MessageAPI = o.API
	}
	if o.MessageCost == 0 {
		o.MessageCost = 1
	}
	in := &interceptor{l: l, auth: auth, rend: o.Renderer, o: o, seed: maphash.MakeSeed()}
	in.scratch.New = func() any { return new(scratch) }
	return in
}

// UnaryServerInterceptor returns an interceptor that authenticates each
// unary call with auth and limits it with l (see the package comment for
// the answers).
//
// l is any core.Decider: a *core.Engine, or the Limiter(api) of a
// data-plane member (live.Config, dataplane.Follower). It panics when l or
// auth is nil.
func UnaryServerInterceptor(l core.Decider, auth identity.Authenticator, opts Options) grpc.UnaryServerInterceptor {
	in := newInterceptor("grpc.UnaryServerInterceptor", l, auth, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		_, md, hold, err := in.admit(ctx, info.FullMethod, false)
		defer hold.Release() // the in-flight slot, whatever the handler does
		if md != nil {
			grpc.SetHeader(ctx, md) // fails only without a server transport stream
		}
		if err != nil {
			return nil, err
		}
		if !hold.Held() || (in.o.SettleTrailer == "" && in.o.Settle == nil) {
			return handler(ctx, req)
		}
		var tc *trailerCapture
		if in.o.SettleTrailer != "" {
			if sts := grpc.ServerTransportStreamFromContext(ctx); sts != nil {
				tc = &trailerCapture{ServerTransportStream: sts}
				ctx = grpc.NewContextWithServerTransportStream(ctx, tc)
			}
		}
		resp, herr := handler(ctx, req)
		if in.o.Settle != nil {
			if n, ok := in.o.Settle(ctx, info.FullMethod, resp, herr); ok {
				hold.Settle(n)
				return resp, herr
			}
		}
		if tc != nil {
			admit.Finish(hold, tc.value(in.o.SettleTrailer))
		}
		return resp, herr
	}
}

// StreamServerInterceptor returns an interceptor that authenticates each
// stream with auth and limits its opening with l and, with
// Options.PerMessage, each message it receives. It panics when l or auth
// is nil.
func StreamServerInterceptor(l core.Decider, auth identity.Authenticator, opts Options) grpc.StreamServerInterceptor {
	in := newInterceptor("grpc.StreamServerInterceptor", l, auth, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c, md, hold, err := in.admit(ss.Context(), info.FullMethod, in.o.PerMessage)
		defer hold.Release() // a stream holds its in-flight slot until it ends
		if md != nil {
			ss.SetHeader(md) // fails only once headers are sent, which they are not yet
		}
		if err != nil {
			return err
		}
		if in.o.SettleTrailer != "" && hold.Held() {
			sc := &settleStream{ServerStream: ss}
			defer func() { admit.Finish(hold, sc.value(in.o.SettleTrailer)) }()
			ss = sc
		}
		if !in.o.PerMessage {
			return handler(srv, ss)
		}
		ms := &meteredStream{ServerStream: ss, in: in, c: c, method: info.FullMethod, api: in.o.MessageAPI(info.FullMethod)}
		herr := handler(srv, ms)
		if st := ms.denied.Load(); st != nil {
			return st.Err()
		}
		return herr
	}
}

// trailerCapture records the trailer metadata a unary handler sets.
type trailerCapture struct {
	grpc.ServerTransportStream
	mu sync.Mutex
	md metadata.MD
}

func (t *trailerCapture) SetTrailer(md metadata.MD) error {
	t.mu.Lock()
	t.md = metadata.Join(t.md, md)
	t.mu.Unlock()
	return t.ServerTransportStream.SetTrailer(md)
}

// value is the last value of key in the trailers set.
func (t *trailerCapture) value(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if vs := t.md.Get(key); len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return ""
}

// settleStream records the trailer metadata a stream handler sets.
type settleStream struct {
	grpc.ServerStream
	mu sync.Mutex
	md metadata.MD
}

func (s *settleStream) SetTrailer(md metadata.MD) {
	s.mu.Lock()
	s.md = metadata.Join(s.md, md)
	s.mu.Unlock()
	s.ServerStream.SetTrailer(md)
}

func (s *settleStream) value(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if vs := s.md.Get(key); len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return ""
}

// MethodRoute is an Options.Route: the full method name
// ("/shop.Orders/Create") as the path, and POST, the method of every gRPC
// call over HTTP/2.
func MethodRoute(fullMethod string) core.Route {
	return core.Route{Method: "POST", Path: fullMethod}
}

// admit authenticates and decides a call or stream opening. It returns the
// consumer when keep is set (a metered stream decides its messages for
// it; nil otherwise), the header metadata to send (nil if none), what the
// admitted call holds (its in-flight slot: the caller releases it when the
// call ends) and, when the call must not proceed, its status error.
//
// Its memory comes from the interceptor's pool: with an
// identity.ConsumerWriter (keyless APIs) and without keep, an admitted call
// allocates only the metadata gRPC keeps (Metadata), and a denied one also
// its status. A hold refers to none of that memory.
func (in *interceptor) admit(ctx context.Context, method string, keep bool) (*core.Consumer, metadata.MD, core.Hold, error) {
	s := in.scratch.Get().(*scratch)
	defer func() {
		s.req = Request{} // no ctx kept in the pool
		in.scratch.Put(s)
	}()
	var cost func() int64
	if in.o.Cost != nil {
		cost = func() int64 { return in.o.Cost(ctx, method) }
	}
	api := in.o.API(method)
	if n, err := admit.HeaderCost(in.l, api, in.o.CostHeader, func(name string) []string { return metadataValues(ctx, name) }); err != nil {
		md, serr := in.answer(ctx, method, "", core.Decision{}, err, true, s)
		return nil, md, core.Hold{}, serr
	} else if n > 0 {
		cost = func() int64 { return n }
	}
	var route func() core.Route
	if in.o.Route != nil {
		route = func() core.Route { return in.o.Route(method) }
	}
	s.req = Request{ctx}
	var (
		c       *core.Consumer
		subject string
		d       core.Decision
		err     error
	)
	if keep {
		c, d, err = admit.Check(ctx, in.l, in.auth, &s.req, api, route, cost)
		if c != nil {
			subject = c.ID
		}
	} else {
		d, subject, err = admit.DecideID(ctx, in.l, in.auth, &s.req, api, route, cost, &s.cons)
	}
	md, serr := in.answer(ctx, method, subject, d, err, true, s)
	if serr != nil {
		return c, md, core.Hold{}, serr // admit released any hold
	}
	return c, md, d.Hold, nil
}

// answer renders a decision in s and returns its metadata and, unless it
// passes, the status error that ends the call; neither refers to s or to
// subject's memory. For a decision that passes, the metadata is built only
// with passMD (nil otherwise).
func (in *interceptor) answer(ctx context.Context, method, subject string, d core.Decision, err error, passMD bool, s *scratch) (metadata.MD, error) {
	if in.o.OnDecision != nil {
		in.o.OnDecision(ctx, method, d, err)
	}
	if !passMD && err == nil && d.Allowed {
		return nil, nil // Render would pass it
	}
	res := in.rend.RenderMessage(&s.resp, d, err)
	md := Metadata(res.Headers)
	if res.Pass {
		return md, nil
	}
	if err == nil {
		return md, in.denial(res, d, subject, &s.st)
	}
	return md, errStatus(res, d, subject, err, &s.st).Err()
}

// meteredStream decides every message received on a stream.
type meteredStream struct {
	grpc.ServerStream
	in     *interceptor
	c      *core.Consumer
	method string
	api    string
	// denied is the status that ended the stream, once a message is
	// denied. Atomic: a bidirectional handler may return while its receiving
	// goroutine is still in RecvMsg.
	denied atomic.Pointer[status.Status]
}

// RecvMsg receives a message and then spends its cost. When the message is
// denied, RecvMsg returns the status that ends the stream instead (m must
// then be ignored), as does every later call; the rate-limit fields go out
// as trailer metadata.
func (s *meteredStream) RecvMsg(m any) error {
	if st := s.denied.Load(); st != nil {
		return st.Err()
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	// A message has no response to end a slot: the stream holds its one
	// slot, and messages are limited by rate and quota alone.
	d, err := s.in.l.Decide(core.WithoutInFlight(ctx), s.c, s.api, s.in.o.MessageCost)
	if err == nil && d.Allowed {
		if s.in.o.OnDecision != nil {
			s.in.o.OnDecision(ctx, s.method, d, err)
		}
		return nil
	}
	sc := s.in.scratch.Get().(*scratch)
	md, serr := s.in.answer(ctx, s.method, s.c.ID, d, err, false, sc)
	s.in.scratch.Put(sc)
	if serr == nil {
		return nil
	}
	st := status.Convert(serr)
	if md != nil {
		s.SetTrailer(md)
	}
	s.denied.Store(st)
	return st.Err()
}

// Status maps a rendered answer that does not pass to the gRPC status that
// ends the call; it is the one place this package turns limitplane answers
// into codes. d is the decision (for denials) and err the error Render was
// given; subject names the consumer in the QuotaFailure violation.
//
//   - a denied decision (HTTP 429, or QuotaExceededStatus), and an
//     identity.LimitError: ResourceExhausted with RetryInfo (RetryAfter
//     rounded up to the millisecond; none when the cost can never pass, or
//     when an in-flight limit refused: then the message is "too many
//     concurrent requests" and no time is promised) and QuotaFailure
//     details (QuotaMetric "in_flight" for an in-flight refusal,
//     QuotaValue its cap);
//   - 401: Unauthenticated; 403: PermissionDenied;
//   - core.ErrStoreUnavailable: Unavailable (whatever StoreFailureStatus);
//   - 400: InvalidArgument; anything else: Internal.
//
// The status message is res.Message.
func Status(res response.Result, d core.Decision, subject string, err error) *status.Status {
	return errStatus(res, d, subject, err, new(statusProto))
}

// errStatus is Status with the ResourceExhausted status built in sp.
func errStatus(res response.Result, d core.Decision, subject string, err error, sp *statusProto) *status.Status {
	// A copy of the message keeps res from escaping, so callers may render
	// into a stack buffer; the status shares it.
	msg := strings.Clone(res.Message)
	if err != nil {
		var le *identity.LimitError
		switch {
		case errors.As(err, &le):
			d = le.Decision
		case errors.Is(err, core.ErrStoreUnavailable):
			return status.New(codes.Unavailable, msg)
		case errors.Is(err, context.Canceled):
			return status.New(codes.Canceled, msg)
		default:
			return status.New(errorCode(res.Status), msg)
		}
	}
	return sp.exhausted(msg, d, subject)
}

// The type URLs anypb.New gives the details, and so status.WithDetails.
const (
	retryInfoURL    = "type.googleapis.com/google.rpc.RetryInfo"
	quotaFailureURL = "type.googleapis.com/google.rpc.QuotaFailure"
)

// statusProto is the memory a ResourceExhausted status is assembled in:
// the details are marshalled into one buffer and status.FromProto copies
// the proto out, so none of it outlives exhausted and an interceptor
// reuses it (scratch). The status is the one
// status.New(...).WithDetails(RetryInfo, QuotaFailure) builds, byte for
// byte (TestStatusWire), in the 8 allocations of FromProto's copy instead
// of 17.
type statusProto struct {
	p     spb.Status
	anys  [2]anypb.Any
	list  [2]*anypb.Any
	retry errdetails.RetryInfo
	delay durationpb.Duration
	quota errdetails.QuotaFailure
	viol  errdetails.QuotaFailure_Violation
	viols [1]*errdetails.QuotaFailure_Violation
	buf   []byte
}

// exhausted returns the ResourceExhausted status with message msg and the
// details of d for subject that Status describes. The status refers to
// msg, not to subject.
func (sp *statusProto) exhausted(msg string, d core.Decision, subject string) *status.Status {
	n := 0
	sp.buf = sp.buf[:0]
	ok := true
	if d.RetryAfter >= 0 && d.DecidedBy != core.KindInFlight {
		delay := retryDelay(d.RetryAfter) // as durationpb.New
		sp.delay.Seconds, sp.delay.Nanos = int64(delay/time.Second), int32(delay%time.Second)
		sp.retry.RetryDelay = &sp.delay
		ok = sp.detail(&n, retryInfoURL, &sp.retry)
	}
	sp.viol.Subject, sp.viol.Description = subject, msg
	sp.viol.QuotaMetric, sp.viol.QuotaId, sp.viol.QuotaValue = d.DecidedBy.String(), d.Policy, d.Limit
	sp.viols[0] = &sp.viol
	sp.quota.Violations = sp.viols[:]
	ok = ok && sp.detail(&n, quotaFailureURL, &sp.quota)
	if !ok {
		n = 0 // WithDetails fails as a whole (say, a subject that is not UTF-8): no details
	}
	sp.p.Code, sp.p.Message, sp.p.Details = int32(codes.ResourceExhausted), msg, sp.list[:n]
	st := status.FromProto(&sp.p)
	// Keep no caller's strings.
	sp.p.Message, sp.viol.Subject, sp.viol.Description, sp.viol.QuotaId = "", "", "", ""
	return st
}

// detail marshals m as detail *n, with type URL url, as anypb.New does;
// false when m does not marshal.
func (sp *statusProto) detail(n *int, url string, m proto.Message) bool {
	start := len(sp.buf)
	buf, err := proto.MarshalOptions{}.MarshalAppend(sp.buf, m)
	if err != nil {
		return false
	}
	sp.buf = buf
	sp.anys[*n].TypeUrl, sp.anys[*n].Value = url, buf[start:len(buf):len(buf)]
	sp.list[*n] = &sp.anys[*n]
	*n++
	return true
}

// errorCode maps the HTTP status Render chose for an error.
func errorCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case response.StatusClientClosedRequest:
		return codes.Canceled
	}
	return codes.Internal
}

// metadataValues returns every value of an incoming metadata key
// (matched lower-cased).
func metadataValues(ctx context.Context, name string) []string {
	md, _ := metadata.FromIncomingContext(ctx)
	return md.Get(name)
}

// mdKey returns the metadata key of a header field: the names
// adapters/response writes are matched without lower-casing them.
func mdKey(name string) string {
	switch name {
	case response.HeaderPolicy:
		return "ratelimit-policy"
	case response.HeaderRateLimit:
		return "ratelimit"
	case response.HeaderRetryAfter:
		return "retry-after"
	case response.HeaderXLimit:
		return "x-ratelimit-limit"
	case response.HeaderXRemaining:
		return "x-ratelimit-remaining"
	case response.HeaderXReset:
		return "x-ratelimit-reset"
	}
	return strings.ToLower(name)
}

// Metadata returns header fields rendered by adapters/response as gRPC
// metadata: the same names, lower-cased as gRPC requires, with the same
// values, copied, so hs may be in memory the caller reuses
// (response.Scratch). It returns nil for no fields. Up to four fields of
// 112 bytes in all (the IETF fields and Retry-After for policy names of
// up to about 30 bytes) take one allocation besides the map's; beyond
// them, a field's value and its slice take allocations of their own.
func Metadata(hs []response.Header) metadata.MD {
	if len(hs) == 0 {
		return nil
	}
	md := make(metadata.MD, len(hs))
	b := new(mdValues)
	t := b.text[:0]
	for i, h := range hs {
		v := h.Value
		if len(t)+len(v) <= cap(t) {
			n := len(t)
			t = append(t, v...)
			v = unsafe.String(unsafe.SliceData(t[n:]), len(v))
		} else {
			v = strings.Clone(v)
		}
		if i < len(b.vals) {
			b.vals[i] = v
			md[mdKey(h.Name)] = b.vals[i : i+1 : i+1]
		} else {
			md[mdKey(h.Name)] = []string{v}
		}
	}
	return md
}

// mdValues is the one block Metadata copies values into: the value slices
// share vals, the strings share text. gRPC keeps them until it sends the
// header (metadata.Join copies the slices, not the strings), so the block
// is per call, never pooled.
type mdValues struct {
	vals [4]string
	text [112]byte
}

// Request adapts an incoming gRPC call's context to identity.Request:
// headers are the incoming metadata (keys matched case-insensitively, so
// "Authorization" finds "authorization"), the remote address is the peer's.
// gRPC has no query parameters or cookies; Query and Cookie return "".
type Request struct{ Ctx context.Context }

// Header implements identity.Request.
func (q Request) Header(name string) string {
	if v := metadata.ValueFromIncomingContext(q.Ctx, metadataKey(name)); len(v) > 0 {
		return v[0]
	}
	return ""
}

// HeaderValues returns every value of the named metadata key (nil when
// absent).
func (q Request) HeaderValues(name string) []string {
	return metadata.ValueFromIncomingContext(q.Ctx, metadataKey(name))
}

// metadataKey returns name lower-cased, the form gRPC keeps incoming keys
// in (HTTP/2 header names are lower-case), so that
// metadata.ValueFromIncomingContext finds it with one map lookup instead of
// comparing it case-insensitively with every key. identity asks for the
// canonical HTTP forms, so the common ones are constants here.
func metadataKey(name string) string {
	switch name {
	case "Authorization":
		return "authorization"
	case "X-Api-Key":
		return "x-api-key"
	}
	for i := 0; i < len(name); i++ {
		if 'A' <= name[i] && name[i] <= 'Z' {
			return strings.ToLower(name)
		}
	}
	return name
}

// Query implements identity.Request; gRPC calls have no query, so it
// returns "".
func (Request) Query(string) string { return "" }

// Cookie implements identity.Request; it returns "".
func (Request) Cookie(string) string { return "" }

// PeerAddr implements identity.PeerAddrer: a TCP peer's address, unmapped
// and unzoned, read without formatting it; ok is false for other peers
// (unix sockets, in-process transports), which identity then reads from
// RemoteAddr.
func (q Request) PeerAddr() (netip.Addr, bool) {
	p, ok := peer.FromContext(q.Ctx)
	if !ok {
		return netip.Addr{}, false
	}
	ta, ok := p.Addr.(*net.TCPAddr)
	if !ok || ta == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// RemoteAddr implements identity.Request: the peer's address, or "" when
// the context has none.
func (q Request) RemoteAddr() string {
	if p, ok := peer.FromContext(q.Ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
