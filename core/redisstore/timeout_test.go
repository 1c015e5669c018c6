package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
)

type traceKey struct{}

// TestTimeoutBoundsEveryCall: against a paused redis-server, a Take
// fails after Options.Timeout and not much later whatever its context:
// one that can never be canceled (Background, or values on it) and one
// that can. Options.Timeout 320ms, breaker off, on a client with
// ContextTimeoutEnabled (without it go-redis's ReadTimeout, 3 s by
// default, bounds the socket read instead: see Options.Timeout).
func TestTimeoutBoundsEveryCall(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 320 * time.Millisecond
	client, err := redisstore.NewClientFromURL("redis://" + srv.Addr) // ContextTimeoutEnabled
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	s := newStore(t, client, redisstore.Options{Timeout: timeout, BreakerFailures: -1})
	rule, err := s.Prepare(core.LimitSet{Rate: core.Limit{Rate: 10, Period: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(context.Background(), core.Request{Consumer: "warm", Rule: rule, Cost: 1}); err != nil {
		t.Fatal(err) // the script is loaded and a connection open
	}
	cancelable, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv.Pause()
	defer srv.Resume()
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{
		{"Background", context.Background()},
		{"values on Background", context.WithValue(context.Background(), traceKey{}, "t")},
		{"cancelable", cancelable},
	} {
		start := time.Now()
		_, err := s.Take(c.ctx, core.Request{Consumer: "c", Rule: rule, Cost: 1})
		took := time.Since(start)
		// The upper bound leaves room for a loaded machine.
		if err == nil || took < timeout || took > timeout+500*time.Millisecond {
			t.Errorf("%s: Take against a paused Redis took %v with %v; want an error after %v and well within %v", c.name, took, err, timeout, timeout+500*time.Millisecond)
		}
	}
}
