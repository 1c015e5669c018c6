package grpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	lpgrpc "github.com/limitplane/limitplane/adapters/grpc"
	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

const (
	checkMethod  = "/grpc.health.v1.Health/Check"
	uploadMethod = "/lp.test.Meter/Upload"
	uploadMsgAPI = uploadMethod + "#messages"
	start        = int64(time.Hour) // the frozen clock's reading
)

// meter is a proto-free client-streaming service: Upload counts the
// messages it accepts and answers their number.
type meter struct{ accepted atomic.Int64 }

var meterDesc = grpc.ServiceDesc{
	ServiceName: "lp.test.Meter",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Upload",
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			m := srv.(*meter)
			var n int64
			for {
				if err := ss.RecvMsg(new(emptypb.Empty)); err == io.EOF {
					return ss.SendMsg(wrapperspb.Int64(n))
				} else if err != nil {
					return err
				}
				n++
				m.accepted.Add(1)
			}
		},
	}, {
		// Careless ignores a failed RecvMsg and ends the call with OK.
		StreamName:    "Careless",
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			for ss.RecvMsg(new(emptypb.Empty)) == nil {
				srv.(*meter).accepted.Add(1)
			}
			return nil
		},
	}},
}

type env struct {
	conn  *grpc.ClientConn
	meter *meter
	store *memory.Store
}

var policies = []core.Policy{
	{ID: "default", Rate: core.Limit{Rate: 2, Period: time.Second, Burst: 2}},
	{ID: "calls", Rate: core.PerSecond(100)},
	{ID: "open", Rate: core.Limit{Rate: 1, Period: time.Second, Burst: 1}},
	{ID: "elsewhere", Rate: core.PerSecond(100), APIs: []string{"other"}},
}

func keys(t *testing.T) *identity.Keys {
	t.Helper()
	k, err := identity.NewKeys([]identity.KeyRecord{
		{Hash: identity.HashKey("k1"), Policies: []string{"default"}},
		{Hash: identity.HashKey("k-stream"), Policies: []string{"calls"}, APILimits: map[string]core.Limits{
			uploadMsgAPI:                       {Rate: core.Limit{Rate: 10, Period: time.Second, Burst: 10}},
			"/lp.test.Meter/Careless#messages": {Rate: core.Limit{Rate: 3, Period: time.Second, Burst: 3}},
		}},
		{Hash: identity.HashKey("k-open"), Policies: []string{"open"}},
		{Hash: identity.HashKey("k-elsewhere"), Policies: []string{"elsewhere"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// serve starts a gRPC server on 127.0.0.1:0 behind the interceptors over
// store, and returns a client connection to it.
func serve(t *testing.T, store core.Store, eopts core.Options, auth identity.Authenticator, opts lpgrpc.Options) *env {
	t.Helper()
	eng, err := core.NewEngine(store, core.Config{Policies: policies}, eopts)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(lpgrpc.UnaryServerInterceptor(eng, auth, opts)),
		grpc.ChainStreamInterceptor(lpgrpc.StreamServerInterceptor(eng, auth, opts)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	m := &meter{}
	srv.RegisterService(&meterDesc, m)
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
	ms, _ := store.(*memory.Store)
	return &env{conn: conn, meter: m, store: ms}
}

func frozenStore() *memory.Store {
	return memory.New(memory.Options{Clock: core.NewManualClock(start)})
}

func withKey(key string) context.Context {
	if key == "" {
		return context.Background()
	}
	return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
}

func (e *env) check(ctx context.Context) (metadata.MD, error) {
	var hdr metadata.MD
	_, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	return hdr, err
}

// details returns the RetryInfo and QuotaFailure of err's status.
func details(t *testing.T, err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		default:
			t.Fatalf("unexpected detail %T: %v", d, d)
		}
	}
	return ri, qf
}

func mdString(md metadata.MD, keys ...string) string {
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%s=%q ", k, md.Get(k))
	}
	return s
}

// expectedDenial returns the engine's third decision for three unit-cost
// calls at one instant under the "default" policy, from the GCRA math.
func expectedDenial() core.GCRAResult {
	p := policies[0].Rate.GCRA()
	r1 := p.Step(0, start, 1)
	r2 := p.Step(r1.TAT, start, 1)
	return p.Step(r2.TAT, start, 1)
}

func TestUnaryThreeAtOnce(t *testing.T) {
	e := serve(t, frozenStore(), core.Options{}, identity.NewAPIKey(keys(t), identity.APIKeyOptions{}), lpgrpc.Options{})
	type result struct {
		md  metadata.MD
		err error
	}
	results := make([]result, 3)
	var ready, wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range results {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := withKey("k1")
			ready.Done()
			<-gate
			md, err := e.check(ctx)
			results[i] = result{md, err}
		}()
	}
	ready.Wait()
	close(gate)
	wg.Wait()

	sort.Slice(results, func(i, j int) bool { return status.Code(results[i].err) < status.Code(results[j].err) })
	var got []codes.Code
	for _, r := range results {
		got = append(got, status.Code(r.err))
	}
	if fmt.Sprint(got) != fmt.Sprint([]codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}) {
		t.Fatalf("codes %v, want [OK OK ResourceExhausted]", got)
	}
	// The two allowed calls saw r=1 and r=0, in either order.
	seen := map[string]bool{}
	for _, r := range results[:2] {
		if p := r.md.Get("ratelimit-policy"); len(p) != 1 || p[0] != `"default";q=2;w=1` {
			t.Fatalf("allowed call policy metadata %q", p)
		}
		seen[fmt.Sprint(r.md.Get("ratelimit"))] = true
		if v := r.md.Get("retry-after"); v != nil {
			t.Fatalf("allowed call has retry-after %q", v)
		}
	}
	if !seen[`["default";r=1;t=1]`] || !seen[`["default";r=0;t=1]`] {
		t.Fatalf("allowed calls' ratelimit metadata %v", seen)
	}

	denied := results[2]
	want := expectedDenial()
	if want.Allowed || want.RetryAfter != int64(500*time.Millisecond) {
		t.Fatalf("GCRA expectation %+v", want)
	}
	st := status.Convert(denied.err)
	if st.Message() != "rate limit exceeded" {
		t.Fatalf("message %q", st.Message())
	}
	ri, qf := details(t, denied.err)
	if ri == nil || qf == nil {
		t.Fatalf("details: RetryInfo %v, QuotaFailure %v", ri, qf)
	}
	if d := ri.RetryDelay.AsDuration() - time.Duration(want.RetryAfter); d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("RetryInfo delay %v, decision's RetryAfter %v", ri.RetryDelay.AsDuration(), time.Duration(want.RetryAfter))
	}
	if ri.RetryDelay.AsDuration() != 500*time.Millisecond {
		t.Fatalf("RetryInfo delay %v, want exactly 500ms", ri.RetryDelay.AsDuration())
	}
	v := qf.Violations
	if len(v) != 1 || v[0].Subject != identity.HashKey("k1").ConsumerID() || v[0].Description != "rate limit exceeded" ||
		v[0].QuotaId != "default" || v[0].QuotaMetric != "rate" || v[0].QuotaValue != 2 {
		t.Fatalf("QuotaFailure %v", qf)
	}
	// What the client decoded is, field for field, what WithDetails builds.
	sameWire(t, "denial received", st, withDetailsStatus("rate limit exceeded",
		core.Decision{DecidedBy: core.KindRate, Policy: "default", Limit: 2, RetryAfter: 500 * time.Millisecond}, identity.HashKey("k1").ConsumerID()))
	if got, w := mdString(denied.md, "ratelimit-policy", "ratelimit", "retry-after"),
		`ratelimit-policy=["\"default\";q=2;w=1"] ratelimit=["\"default\";r=0;t=1"] retry-after=["1"] `; got != w {
		t.Fatalf("denied metadata\n got %s\nwant %s", got, w)
	}
}

func TestUnaryAuthAndErrors(t *testing.T) {
	auth := identity.NewAPIKey(keys(t), identity.APIKeyOptions{})
	e := serve(t, frozenStore(), core.Options{}, auth, lpgrpc.Options{})
	cases := []struct {
		name string
		ctx  context.Context
		code codes.Code
		msg  string
	}{
		{"missing key", context.Background(), codes.Unauthenticated, "no API key"},
		{"unknown key", withKey("nope"), codes.PermissionDenied, "unknown API key"},
		{"bearer authorization", metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer k1"), codes.OK, ""},
		{"no policy for this method", withKey("k-elsewhere"), codes.PermissionDenied, "access to this API is not allowed"},
	}
	for _, c := range cases {
		md, err := e.check(c.ctx)
		st := status.Convert(err)
		if st.Code() != c.code || st.Message() != c.msg {
			t.Errorf("%s: %v %q, want %v %q", c.name, st.Code(), st.Message(), c.code, c.msg)
		}
		if c.code != codes.OK && (len(md.Get("ratelimit")) != 0 || len(st.Details()) != 0) {
			t.Errorf("%s: metadata %v details %v", c.name, md, st.Details())
		}
	}
	if n := e.store.Len(); n != 1 {
		t.Fatalf("store holds %d entries, want 1 (only the authenticated call)", n)
	}

	// A failing store under FailClosed is Unavailable, never Unknown,
	// Internal or ResourceExhausted.
	e = serve(t, failingStore{}, core.Options{FailurePolicy: core.FailClosed}, auth, lpgrpc.Options{
		Renderer: response.NewRenderer(response.Options{StoreFailureStatus: 500}),
	})
	_, err := e.check(withKey("k1"))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "rate limit store unavailable" {
		t.Fatalf("store failure: %v %q", st.Code(), st.Message())
	}
}

// mdNames are the metadata keys of every field adapters/response renders.
var mdNames = []string{"ratelimit-policy", "ratelimit", "retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}

// TestUnaryAllFields checks the header metadata of allowed and denied calls
// with the X-RateLimit fields on (the values the HTTP adapters send, see
// adapters/internal/crosstest), and that a fail-open call has none.
func TestUnaryAllFields(t *testing.T) {
	rend := response.NewRenderer(response.Options{XRateLimit: true, Now: func() time.Time { return time.Unix(1_800_000_000, 0) }})
	auth := identity.NewAPIKey(keys(t), identity.APIKeyOptions{})
	opts := lpgrpc.Options{Renderer: rend}
	e := serve(t, frozenStore(), core.Options{}, auth, opts)
	for i, w := range []struct {
		code codes.Code
		md   string
	}{
		{codes.OK, `ratelimit-policy=["\"default\";q=2;w=1"] ratelimit=["\"default\";r=1;t=1"] retry-after=[] ` +
			`x-ratelimit-limit=["2"] x-ratelimit-remaining=["1"] x-ratelimit-reset=["1800000001"] `},
		{codes.OK, `ratelimit-policy=["\"default\";q=2;w=1"] ratelimit=["\"default\";r=0;t=1"] retry-after=[] ` +
			`x-ratelimit-limit=["2"] x-ratelimit-remaining=["0"] x-ratelimit-reset=["1800000001"] `},
		{codes.ResourceExhausted, `ratelimit-policy=["\"default\";q=2;w=1"] ratelimit=["\"default\";r=0;t=1"] retry-after=["1"] ` +
			`x-ratelimit-limit=["2"] x-ratelimit-remaining=["0"] x-ratelimit-reset=["1800000001"] `},
	} {
		md, err := e.check(withKey("k1"))
		if got := mdString(md, mdNames...); status.Code(err) != w.code || got != w.md {
			t.Errorf("call %d: %v, metadata\n got %s\nwant %v %s", i+1, err, got, w.code, w.md)
		}
	}
	// A failing store under FailOpen: the call passes, with no fields.
	md, err := serve(t, failingStore{}, core.Options{}, auth, opts).check(withKey("k1"))
	if got, none := mdString(md, mdNames...), mdString(nil, mdNames...); err != nil || got != none {
		t.Fatalf("fail open: %v, metadata %s", err, got)
	}
}

func TestUnaryKeylessByPeer(t *testing.T) {
	e := serve(t, frozenStore(), core.Options{}, &identity.Keyless{Policies: []string{"open"}}, lpgrpc.Options{
		API: func(string) string { return "health" },
	})
	if _, err := e.check(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := e.check(context.Background())
	ri, qf := details(t, err)
	if status.Code(err) != codes.ResourceExhausted || ri.RetryDelay.AsDuration() != time.Second ||
		qf.Violations[0].Subject != "ip:127.0.0.1" || qf.Violations[0].QuotaId != "open" {
		t.Fatalf("second call: %v %v %v", err, ri, qf)
	}
}

func TestStreamPerMessage(t *testing.T) {
	e := serve(t, frozenStore(), core.Options{}, identity.NewAPIKey(keys(t), identity.APIKeyOptions{}), lpgrpc.Options{
		PerMessage: true,
		MessageAPI: func(m string) string { return m + "#messages" },
	})
	cs, err := e.conn.NewStream(withKey("k-stream"), &meterDesc.Streams[0], uploadMethod)
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	for ; sent < 100; sent++ {
		if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
			break // io.EOF: the server ended the stream
		}
	}
	cs.CloseSend()
	err = cs.RecvMsg(new(wrapperspb.Int64Value))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream ended with %v after %d sent", err, sent)
	}
	if n := e.meter.accepted.Load(); n != 10 {
		t.Fatalf("server accepted %d messages, want exactly 10", n)
	}
	p := core.Limit{Rate: 10, Period: time.Second, Burst: 10}.GCRA()
	want := p.Step(start+10*p.T, start, 1) // the 11th message
	ri, qf := details(t, err)
	if ri.RetryDelay.AsDuration() != time.Duration(want.RetryAfter) || want.RetryAfter != int64(100*time.Millisecond) {
		t.Fatalf("RetryInfo %v, want %v", ri.RetryDelay.AsDuration(), time.Duration(want.RetryAfter))
	}
	if v := qf.Violations[0]; v.QuotaMetric != "rate" || v.QuotaValue != 10 || v.Subject != identity.HashKey("k-stream").ConsumerID() {
		t.Fatalf("QuotaFailure %v", qf)
	}
	hdr, _ := cs.Header()
	if got := mdString(hdr, "ratelimit-policy", "ratelimit"); got != `ratelimit-policy=["\"calls\";q=100;w=1"] ratelimit=["\"calls\";r=99;t=1"] ` {
		t.Fatalf("stream header metadata %s", got)
	}
	if got := mdString(cs.Trailer(), "ratelimit-policy", "ratelimit", "retry-after"); got != `ratelimit-policy=["\"limit\";q=10;w=1"] ratelimit=["\"limit\";r=0;t=1"] retry-after=["1"] ` {
		t.Fatalf("stream trailer metadata %s", got)
	}
}

// TestStreamDenialOutlivesHandler checks that a stream over its message
// rate ends with ResourceExhausted even when the handler swallows the error.
func TestStreamDenialOutlivesHandler(t *testing.T) {
	e := serve(t, frozenStore(), core.Options{}, identity.NewAPIKey(keys(t), identity.APIKeyOptions{}), lpgrpc.Options{
		PerMessage: true,
		MessageAPI: func(m string) string { return m + "#messages" },
	})
	cs, err := e.conn.NewStream(withKey("k-stream"), &meterDesc.Streams[1], "/lp.test.Meter/Careless")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20 && cs.SendMsg(&emptypb.Empty{}) == nil; i++ {
	}
	cs.CloseSend()
	err = cs.RecvMsg(new(wrapperspb.Int64Value))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded" {
		t.Fatalf("stream ended with %v", err)
	}
	if n := e.meter.accepted.Load(); n != 3 {
		t.Fatalf("handler accepted %d messages, want 3", n)
	}
}

func TestStreamOpenDenied(t *testing.T) {
	e := serve(t, frozenStore(), core.Options{}, identity.NewAPIKey(keys(t), identity.APIKeyOptions{}), lpgrpc.Options{})
	upload := func() (int64, error) {
		cs, err := e.conn.NewStream(withKey("k-open"), &meterDesc.Streams[0], uploadMethod)
		if err != nil {
			return 0, err
		}
		for i := 0; i < 3; i++ {
			if cs.SendMsg(&emptypb.Empty{}) != nil {
				break
			}
		}
		cs.CloseSend()
		var n wrapperspb.Int64Value
		err = cs.RecvMsg(&n)
		return n.Value, err
	}
	if n, err := upload(); err != nil || n != 3 {
		t.Fatalf("first stream: %d messages, %v", n, err)
	}
	_, err := upload()
	ri, _ := details(t, err)
	if status.Code(err) != codes.ResourceExhausted || ri.RetryDelay.AsDuration() != time.Second {
		t.Fatalf("second stream: %v, RetryInfo %v", err, ri)
	}
	if n := e.meter.accepted.Load(); n != 3 {
		t.Fatalf("handler ran for the denied stream: %d messages", n)
	}
}

func TestStatus(t *testing.T) {
	quotaDenied := core.Decision{DecidedBy: core.KindQuota, Policy: "gold", Limit: 100, RetryAfter: 90 * time.Second,
		Quota: core.Status{Limit: 100, ResetAfter: 90 * time.Second, Window: time.Hour, Policy: "gold"}}
	never := core.Decision{DecidedBy: core.KindRate, Limit: 5, RetryAfter: -1, Rate: core.Status{Limit: 5, Remaining: 5, Window: time.Second}}
	limited := &identity.LimitError{Decision: core.Decision{DecidedBy: core.KindRate, Policy: "authfail", Limit: 3, RetryAfter: 20 * time.Second,
		Rate: core.Status{Limit: 3, ResetAfter: time.Minute, Window: time.Minute}}}
	r := response.NewRenderer(response.Options{QuotaExceededStatus: 403, StoreFailureStatus: 500})
	cases := []struct {
		name  string
		d     core.Decision
		err   error
		code  codes.Code
		retry time.Duration // -1: no RetryInfo; -2: no details at all
	}{
		{"quota denied as 403 is still ResourceExhausted", quotaDenied, nil, codes.ResourceExhausted, 90 * time.Second},
		{"cost over burst", never, nil, codes.ResourceExhausted, -1},
		{"missing credentials", core.Decision{}, &identity.Error{Status: 401, Kind: identity.ErrMissingCredentials, Reason: "no API key"}, codes.Unauthenticated, -2},
		{"invalid credentials", core.Decision{}, &identity.Error{Status: 403, Kind: identity.ErrInvalidCredentials, Reason: "unknown API key"}, codes.PermissionDenied, -2},
		{"unknown policy", core.Decision{}, core.ErrUnknownPolicy, codes.PermissionDenied, -2},
		{"store unavailable", core.Decision{}, fmt.Errorf("%w: %w", core.ErrStoreUnavailable, errors.New("dial")), codes.Unavailable, -2},
		{"invalid cost", core.Decision{}, core.ErrInvalidCost, codes.InvalidArgument, -2},
		{"caller canceled", core.Decision{}, fmt.Errorf("%w (the store's error: %w)", context.Canceled, errors.New("i/o timeout")), codes.Canceled, -2},
		{"too many auth failures", core.Decision{}, limited, codes.ResourceExhausted, 20 * time.Second},
		{"unexpected", core.Decision{}, errors.New("boom"), codes.Internal, -2},
	}
	for _, c := range cases {
		res := r.Render(nil, c.d, c.err)
		st := lpgrpc.Status(res, c.d, "key:abc", c.err)
		if st.Code() != c.code || st.Message() != res.Message || res.Message == "" {
			t.Errorf("%s: %v %q (rendered %d %q)", c.name, st.Code(), st.Message(), res.Status, res.Message)
			continue
		}
		ri, qf := details(t, st.Err())
		switch {
		case c.retry == -2 && (ri != nil || qf != nil):
			t.Errorf("%s: unexpected details %v %v", c.name, ri, qf)
		case c.retry == -1 && (ri != nil || qf == nil):
			t.Errorf("%s: details %v %v, want QuotaFailure only", c.name, ri, qf)
		case c.retry >= 0 && (ri == nil || ri.RetryDelay.AsDuration() != c.retry || qf == nil):
			t.Errorf("%s: details %v %v, want RetryInfo %v", c.name, ri, qf, c.retry)
		}
	}
}

func TestMetadata(t *testing.T) {
	md := lpgrpc.Metadata([]response.Header{
		{Name: response.HeaderPolicy, Value: `"p";q=1;w=1`},
		{Name: response.HeaderXReset, Value: "9"},
		{Name: "X-Custom", Value: "v"},
	})
	want := metadata.MD{"ratelimit-policy": {`"p";q=1;w=1`}, "x-ratelimit-reset": {"9"}, "x-custom": {"v"}}
	// metadata.MD's String redacts the values: compare the maps.
	if !maps.EqualFunc(md, want, slices.Equal) {
		t.Fatalf("got %q, want %q", map[string][]string(md), map[string][]string(want))
	}
	if lpgrpc.Metadata(nil) != nil {
		t.Fatal("Metadata(nil) is not nil")
	}
	// The values are copies: the caller's buffer may be reused at once,
	// also for more fields and longer values than the one block holds.
	buf := []byte(strings.Repeat("a", 100) + strings.Repeat("b", 60))
	var hs []response.Header
	want = metadata.MD{}
	for i, n := range []string{response.HeaderPolicy, response.HeaderRateLimit, response.HeaderRetryAfter,
		response.HeaderXLimit, response.HeaderXRemaining, response.HeaderXReset} {
		v := buf[i*20 : i*20+20]
		if i == 5 {
			v = buf[60:160] // more than is left of the block
		}
		want[strings.ToLower(n)] = []string{string(v)}
		hs = append(hs, response.Header{Name: n, Value: unsafe.String(unsafe.SliceData(v), len(v))})
	}
	md = lpgrpc.Metadata(hs)
	clear(buf)
	if !maps.EqualFunc(md, want, slices.Equal) {
		t.Fatalf("six fields from a reused buffer: got %q, want %q", map[string][]string(md), map[string][]string(want))
	}
	for _, n := range []string{response.HeaderPolicy, response.HeaderRateLimit, response.HeaderRetryAfter,
		response.HeaderXLimit, response.HeaderXRemaining, response.HeaderXReset} {
		if md := lpgrpc.Metadata([]response.Header{{Name: n, Value: "v"}}); len(md) != 1 || len(md[strings.ToLower(n)]) != 1 {
			t.Errorf("%s: metadata %v, want it under %q", n, md, strings.ToLower(n))
		}
	}
}

// failingStore accepts every limit set and fails every request, as an
// unreachable store does.
type failingStore struct{}

func (failingStore) Prepare(s core.LimitSet) (*core.Rule, error) { return core.NewRule(s, nil) }
func (failingStore) Take(context.Context, core.Request) (core.Decision, error) {
	return core.Decision{}, errors.New("connection refused")
}
func (failingStore) ResetQuota(context.Context, string, string, uint64) error { return nil }
func (failingStore) Penalize(context.Context, core.Request, time.Duration) error {
	return errors.New("connection refused")
}

// TestRequestHeaderCase: identity asks for canonical HTTP names; the
// incoming metadata keys are lower-case. Each lookup finds its value, for
// the constant-mapped names, for other mixed-case names and for names
// already lower-case.
func TestRequestHeaderCase(t *testing.T) {
	md := metadata.Pairs("authorization", "Bearer a", "x-api-key", "k1", "x-tenant-key", "t1", "x-tenant-key", "t2")
	q := lpgrpc.Request{Ctx: metadata.NewIncomingContext(context.Background(), md)}
	for name, want := range map[string]string{
		"Authorization": "Bearer a",
		"X-Api-Key":     "k1",
		"X-API-KEY":     "k1",
		"x-api-key":     "k1",
		"X-Tenant-Key":  "t1",
		"X-Missing":     "",
	} {
		if got := q.Header(name); got != want {
			t.Errorf("Header(%q) = %q, want %q", name, got, want)
		}
	}
	if got := q.HeaderValues("X-Tenant-Key"); len(got) != 2 || got[0] != "t1" || got[1] != "t2" {
		t.Errorf("HeaderValues(X-Tenant-Key) = %q, want [t1 t2]", got)
	}
}
