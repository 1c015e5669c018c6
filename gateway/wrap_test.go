package gateway_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/redistest"
)

// countingStore counts the requests it passes on.
type countingStore struct {
	core.Store
	takes atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, req core.Request) (core.Decision, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, req)
}

// TestOpenStoreWrap: Wrap receives the Redis client and store; OpenStore
// returns the wrapper; closing runs the wrapper's close first, while the
// client still answers, then closes the client. A Wrap error fails
// OpenStore, and Wrap is not called for the in-process store.
func TestOpenStoreWrap(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	var (
		wrapped     *countingStore
		client      redis.UniversalClient
		pingAtClose error
		closed      int
	)
	wrap := func(c redis.UniversalClient, s core.Store) (core.Store, func() error, error) {
		client, wrapped = c, &countingStore{Store: s}
		return wrapped, func() error {
			closed++
			pingAtClose = c.Ping(ctx).Err()
			return nil
		}, nil
	}
	s, closeStore, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: "redis://" + srv.Addr, FailurePolicy: core.FailClosed, Wrap: wrap})
	if err != nil {
		t.Fatal(err)
	}
	if s != core.Store(wrapped) || client == nil {
		t.Fatalf("OpenStore returned %T, want the wrapper", s)
	}
	rule, err := s.Prepare(core.LimitSet{Rate: core.Limit{Rate: 2, Period: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	req := core.Request{Consumer: "c", Rule: rule, Cost: 1}
	var allowed int
	for range 3 {
		d, err := s.Take(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 || wrapped.takes.Load() != 3 {
		t.Fatalf("allowed %d through the wrapper with %d takes, want 2 of 3 decided by Redis", allowed, wrapped.takes.Load())
	}
	if err := closeStore(); err != nil {
		t.Fatal(err)
	}
	if closed != 1 || pingAtClose != nil {
		t.Fatalf("wrapper closed %d times, PING in its close: %v; want once, with the client still open", closed, pingAtClose)
	}
	if err := client.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("PING after close: %v, want redis.ErrClosed", err)
	}

	boom := errors.New("boom")
	_, _, err = gateway.OpenStore(ctx, gateway.StoreOptions{URL: "redis://" + srv.Addr, Wrap: func(redis.UniversalClient, core.Store) (core.Store, func() error, error) {
		return nil, nil, boom
	}})
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "gateway: store redis://"+srv.Addr+": ") {
		t.Fatalf("Wrap failing: err %v, want it wrapped with the store's name", err)
	}

	called := false
	m, closeMem, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: "memory", Wrap: func(redis.UniversalClient, core.Store) (core.Store, func() error, error) {
		called = true
		return nil, nil, nil
	}})
	if err != nil || called || m == nil {
		t.Fatalf("memory store: %T, %v, Wrap called %v; want the memory store without Wrap", m, err, called)
	}
	closeMem()
}
