package grpc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/core"
)

// ClientOptions configure the client interceptors.
type ClientOptions struct {
	// Store keeps the shared budget: a memory.Store shares it within one
	// process, a Redis store across every process using the same Key.
	Store core.Store
	// Key names the budget (e.g. "payments.example.com").
	Key string
	// Limit is the remote service's rate limit. Required.
	Limit core.Limit
	// Cost returns a call's cost; nil means 1.
	Cost func(ctx context.Context, fullMethod string) int64
	// MaxBackoff caps how long one RetryInfo from the server holds calls
	// back; default one minute.
	MaxBackoff time.Duration
}

// Client holds outbound gRPC calls to a remote service under that
// service's limit: each call (or stream opening) waits with core.Wait,
// honouring the call's context and failing fast with an error matching
// core.ErrWaitExceedsDeadline when the wait would pass its deadline. When
// the server still ends a call with ResourceExhausted carrying
// errdetails.RetryInfo, later calls are held back that long — in every
// process sharing the Store when it is a core.Penalizer. It is the gRPC
// twin of nethttp.Transport.
type Client struct {
	o         ClientOptions
	req       core.Request
	notBefore atomic.Int64 // Unix ns before which no call is sent
}

// NewClient returns a Client for o.
func NewClient(o ClientOptions) (*Client, error) {
	if o.Store == nil || o.Key == "" {
		return nil, errors.New("limitplane: grpc.NewClient: Store and Key are required")
	}
	if o.Limit.IsUnlimited() {
		return nil, errors.New("limitplane: grpc.NewClient: a Limit is required")
	}
	if err := o.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("limitplane: grpc.NewClient: %w", err)
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	return &Client{o: o, req: core.Request{Consumer: o.Key, Rate: o.Limit, Cost: 1}}, nil
}

// UnaryClientInterceptor returns the interceptor for unary calls.
func (c *Client) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := c.admit(ctx, method); err != nil {
			return err
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		c.observe(ctx, err)
		return err
	}
}

// StreamClientInterceptor returns the interceptor for streams; a stream
// waits once, when it opens.
func (c *Client) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := c.admit(ctx, method); err != nil {
			return nil, err
		}
		s, err := streamer(ctx, desc, cc, method, opts...)
		c.observe(ctx, err)
		return s, err
	}
}

// admit waits out any server-requested backoff, then the shared limit. Its
// errors are gRPC statuses: DeadlineExceeded or Canceled for the context,
// ResourceExhausted when the cost can never pass, Unavailable when the
// store fails.
func (c *Client) admit(ctx context.Context, method string) error {
	if d := time.Duration(c.notBefore.Load() - time.Now().UnixNano()); d > 0 {
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(d).After(dl) {
			return status.Errorf(codes.DeadlineExceeded, "limitplane: %s asked to wait %v, past the deadline", c.o.Key, d)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	req := c.req
	if c.o.Cost != nil {
		req.Cost = c.o.Cost(ctx, method)
	}
	_, err := core.Wait(ctx, c.o.Store, req)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, core.ErrWaitExceedsDeadline):
		return status.Errorf(codes.DeadlineExceeded, "limitplane: %v", err)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, core.ErrCostExceedsBurst):
		return status.Errorf(codes.ResourceExhausted, "limitplane: %v", err)
	}
	return status.Errorf(codes.Unavailable, "limitplane: %s: %v", c.o.Key, err)
}

// observe backs off after a ResourceExhausted that carries RetryInfo.
func (c *Client) observe(ctx context.Context, err error) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return
	}
	for _, det := range st.Details() {
		ri, ok := det.(*errdetails.RetryInfo)
		if !ok || ri.GetRetryDelay() == nil {
			continue
		}
		d := min(max(ri.GetRetryDelay().AsDuration(), 0), c.o.MaxBackoff)
		until := time.Now().Add(d).UnixNano()
		for {
			cur := c.notBefore.Load()
			if cur >= until || c.notBefore.CompareAndSwap(cur, until) {
				break
			}
		}
		if p, ok := c.o.Store.(core.Penalizer); ok {
			_ = p.Penalize(ctx, c.o.Key, "", c.o.Limit, d) // best effort; the call's error is returned either way
		}
		return
	}
}
