package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// TestCanceledCallerIsNotAStoreFailure: a caller whose context is canceled
// while its Take waits on a paused redis-server (a client that went away)
// gets an error wrapping context.Canceled under FailFallback, and nothing
// else happens: OnStoreError is not told and the fallback does not count
// the request, so the next request of the same consumer, from a caller
// that waits, is the fallback's first (299 of 300 left) and the one store
// failure reported.
func TestCanceledCallerIsNotAStoreFailure(t *testing.T) {
	srv, _, eng, failures := newSeeded(t)
	c := &core.Consumer{ID: "gone", Policies: []string{"q"}}
	srv.Pause()
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(20*time.Millisecond, cancel)
	defer stop.Stop()
	d, err := eng.Decide(ctx, c, "api", 1)
	if !errors.Is(err, context.Canceled) || d.Allowed || d.DecidedBy != core.KindNone {
		t.Fatalf("canceled while Redis is paused: allowed %v by %v, err %v; want refused, decided by nothing, context.Canceled", d.Allowed, d.DecidedBy, err)
	}
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d store failures reported for a canceled caller, want 0", n)
	}
	d, err = eng.Decide(context.Background(), c, "api", 1)
	if err != nil || !d.Allowed || d.DecidedBy != core.KindQuota || d.Quota.Remaining != 299 {
		t.Fatalf("next request, Redis still paused: allowed %v by %v, %d left, err %v; want the fallback's first: allowed, 299 left", d.Allowed, d.DecidedBy, d.Quota.Remaining, err)
	}
	if n := failures.Load(); n != 1 {
		t.Fatalf("%d store failures reported, want exactly 1 (the request that waited)", n)
	}
}
