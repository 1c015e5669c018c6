package grpc

import (
	"context"
	"errors"
	"fmt"
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
// service's limit, through a core.Throttle: each call (or stream opening)
// waits, honouring the call's context and failing fast with
// DeadlineExceeded when the wait would pass its deadline. When the server
// still ends a call with ResourceExhausted carrying errdetails.RetryInfo,
// later calls are held back that long — in every process sharing the Store
// (core.Store.Penalize). It is the gRPC twin of nethttp.Transport.
type Client struct {
	cost     func(ctx context.Context, fullMethod string) int64
	throttle *core.Throttle
}

// NewClient returns a Client for o.
func NewClient(o ClientOptions) (*Client, error) {
	th, err := core.NewThrottle(core.ThrottleOptions{Store: o.Store, Key: o.Key, Limit: o.Limit, MaxBackoff: o.MaxBackoff})
	if err != nil {
		return nil, fmt.Errorf("grpc: NewClient: %w", err)
	}
	return &Client{cost: o.Cost, throttle: th}, nil
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

// admit waits for the shared limit. Its errors are gRPC statuses:
// DeadlineExceeded or Canceled for the context, ResourceExhausted when the
// cost can never pass, Unavailable when the store fails.
func (c *Client) admit(ctx context.Context, method string) error {
	cost := int64(1)
	if c.cost != nil {
		cost = c.cost(ctx, method)
	}
	err := c.throttle.Wait(ctx, cost)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, core.ErrWaitExceedsDeadline):
		return status.Errorf(codes.DeadlineExceeded, "grpc: client %q: %v", c.throttle.Key(), err)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, core.ErrCostExceedsBurst):
		return status.Errorf(codes.ResourceExhausted, "grpc: client %q: %v", c.throttle.Key(), err)
	}
	return status.Errorf(codes.Unavailable, "grpc: client %q: %v", c.throttle.Key(), err)
}

// observe backs off after a ResourceExhausted that carries RetryInfo.
func (c *Client) observe(ctx context.Context, err error) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return
	}
	for _, det := range st.Details() {
		if ri, ok := det.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			c.throttle.Backoff(ctx, ri.GetRetryDelay().AsDuration())
			return
		}
	}
}
