package memory_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// keyLimit keeps a key limited for 6s after one unit: T = 6s.
var keyLimit = core.Limit{Rate: 10, Period: time.Minute}

// TestMaxKeysExactUnderConcurrency: 16 goroutines offer 8,000 distinct keys
// to a store capped at 1,000: exactly 1,000 are admitted and every other
// request fails with ErrTooManyKeys, counted by KeysRefused.
func TestMaxKeysExactUnderConcurrency(t *testing.T) {
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 1000})
	const workers, each = 16, 500
	rule := prepare(t, s, core.LimitSet{Rate: keyLimit})
	var admitted, refused, other atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, err := s.Take(context.Background(), core.Request{Consumer: fmt.Sprintf("c%d-%d", w, i), Rule: rule, Cost: 1})
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, memory.ErrTooManyKeys):
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 1000 || refused.Load() != workers*each-1000 || other.Load() != 0 {
		t.Fatalf("admitted %d, refused %d, other errors %d; want 1000, %d, 0", admitted.Load(), refused.Load(), other.Load(), workers*each-1000)
	}
	if s.Len() != 1000 || s.KeysRefused() != workers*each-1000 || s.MaxKeys() != 1000 {
		t.Fatalf("Len %d, KeysRefused %d, MaxKeys %d; want 1000, %d, 1000", s.Len(), s.KeysRefused(), s.MaxKeys(), workers*each-1000)
	}
}

// TestMaxKeysDecision: at the cap a request that would add a key fails
// with ErrTooManyKeys and a zero Decision; requests that add no key are
// answered as usual; keys already held keep exact counters, quotas
// included.
func TestMaxKeysDecision(t *testing.T) {
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 2, Shards: 1})
	ctx := context.Background()
	q := core.Quota{Max: 3, Renewal: time.Hour}
	take := func(r core.Request) core.Decision {
		t.Helper()
		d, err := s.Take(ctx, r)
		if err != nil {
			t.Fatalf("Take(%+v): %v", r, err)
		}
		return d
	}
	take(request(t, s, core.Call{Consumer: "a", Rate: keyLimit, Cost: 1}))
	take(request(t, s, core.Call{Consumer: "b", Quota: q, Cost: 1}))

	d, err := s.Take(ctx, request(t, s, core.Call{Consumer: "new", Rate: keyLimit, Cost: 1}))
	const want = "memory: too many keys: the store holds its MaxKeys 2; a new key was refused"
	if !errors.Is(err, memory.ErrTooManyKeys) || err.Error() != want || d != (core.Decision{}) {
		t.Fatalf("new key at the cap: %+v, %v; want the zero Decision and %q", d, err, want)
	}
	// A new scope of a held consumer is a new key too.
	if _, err := s.Take(ctx, request(t, s, core.Call{Consumer: "a", Scope: "api", Rate: keyLimit, Cost: 1})); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("new scope at the cap: %v, want ErrTooManyKeys", err)
	}
	// A peek and a cost above the burst create no key: answered.
	if d := take(request(t, s, core.Call{Consumer: "new", Rate: keyLimit, Cost: 0})); !d.Allowed || d.Remaining != 10 {
		t.Fatalf("peek of a new key: %+v", d)
	}
	if d := take(request(t, s, core.Call{Consumer: "new", Rate: keyLimit, Cost: 11})); d.Allowed || d.RetryAfter != -1 {
		t.Fatalf("cost above burst: %+v", d)
	}
	// Held keys go on exactly.
	for i := int64(8); i >= 0; i-- {
		if d := take(request(t, s, core.Call{Consumer: "a", Rate: keyLimit, Cost: 1})); !d.Allowed || d.Remaining != i {
			t.Fatalf("held key a: %+v, want allowed with %d remaining", d, i)
		}
	}
	if d := take(request(t, s, core.Call{Consumer: "a", Rate: keyLimit, Cost: 1})); d.Allowed || d.RetryAfter != 6*time.Second {
		t.Fatalf("held key a, 11th: %+v", d)
	}
	for i := int64(1); i >= 0; i-- {
		if d := take(request(t, s, core.Call{Consumer: "b", Quota: q, Cost: 1})); !d.Allowed || d.Remaining != i {
			t.Fatalf("held key b: %+v, want allowed with %d remaining", d, i)
		}
	}
	if d := take(request(t, s, core.Call{Consumer: "b", Quota: q, Cost: 1})); d.Allowed || d.DecidedBy != core.KindQuota {
		t.Fatalf("held key b past its quota: %+v", d)
	}
	// Penalize of a new key is refused alike.
	if err := s.Penalize(ctx, request(t, s, core.Call{Consumer: "new", Rate: keyLimit}), time.Second); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("Penalize of a new key at the cap: %v", err)
	}
	if s.Len() != 2 || s.KeysRefused() != 3 {
		t.Fatalf("Len %d, KeysRefused %d; want 2, 3", s.Len(), s.KeysRefused())
	}
}

// TestMaxKeysSweepsMakeRoom: keys that no longer limit anything leave by a
// sweep (Sweep, or the insert at the cap sweeping its shard, at most once
// a second per shard), and their room goes to new keys; a key whose quota
// period is running stays.
func TestMaxKeysSweepsMakeRoom(t *testing.T) {
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 3, Shards: 1})
	ctx := context.Background()
	short := core.Limit{Rate: 1000, Period: time.Second} // idle 1ms after one unit
	try := func(consumer string, l core.Limit, q core.Quota) error {
		_, err := s.Take(ctx, request(t, s, core.Call{Consumer: consumer, Rate: l, Quota: q, Cost: 1}))
		return err
	}
	for _, c := range []string{"a", "b", "c"} {
		if err := try(c, short, core.Quota{}); err != nil {
			t.Fatal(err)
		}
	}
	// The first insert at the cap sweeps the shard; nothing is idle yet.
	if err := try("d", short, core.Quota{}); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("d at the cap: %v", err)
	}
	// 2ms later a, b and c are idle, but the shard swept less than a
	// second ago: still refused.
	clock.Advance(2 * time.Millisecond)
	if err := try("d", short, core.Quota{}); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("d within a second of the last sweep at the cap: %v", err)
	}
	// One second after that sweep, the insert sweeps again and fits.
	clock.Advance(time.Second - 2*time.Millisecond)
	if err := try("d", short, core.Quota{}); err != nil {
		t.Fatalf("d a second later: %v", err)
	}
	if s.Len() != 1 {
		t.Fatalf("Len %d after the sweep at the cap, want 1 (d)", s.Len())
	}
	// An explicit Sweep makes room at once; a running quota keeps its key.
	q := core.Quota{Max: 5, Renewal: time.Hour}
	if err := try("e", short, q); err != nil {
		t.Fatal(err)
	}
	if err := try("f", short, core.Quota{}); err != nil {
		t.Fatal(err)
	}
	if err := try("g", short, core.Quota{}); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("g at the cap: %v", err)
	}
	clock.Advance(2 * time.Millisecond)
	s.Sweep()
	if s.Len() != 1 {
		t.Fatalf("Len %d after Sweep, want 1 (e, whose quota period runs)", s.Len())
	}
	for _, c := range []string{"g", "h"} {
		if err := try(c, short, core.Quota{}); err != nil {
			t.Fatalf("%s after Sweep: %v", c, err)
		}
	}
	if d, err := s.Take(ctx, request(t, s, core.Call{Consumer: "e", Quota: q, Cost: 0})); err != nil || d.Quota.Remaining != 4 {
		t.Fatalf("e's quota after the sweeps: %+v, %v; want 4 remaining", d, err)
	}
	if s.KeysRefused() != 3 {
		t.Fatalf("KeysRefused %d, want 3", s.KeysRefused())
	}
}

// TestMaxKeysEngineFailurePolicy: the engine treats a refusal at the cap as
// a store failure: FailClosed answers ErrStoreUnavailable, FailOpen lets
// the request through unlimited, and held consumers are limited as usual.
func TestMaxKeysEngineFailurePolicy(t *testing.T) {
	pol := core.Policy{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Minute}}
	for _, fp := range []core.FailurePolicy{core.FailClosed, core.FailOpen} {
		s := memory.New(memory.Options{Clock: core.NewManualClock(int64(1000 * time.Hour)), MaxKeys: 1})
		var storeErr error
		e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{pol}}, core.Options{FailurePolicy: fp, OnStoreError: func(err error) { storeErr = err }})
		if err != nil {
			t.Fatal(err)
		}
		held := &core.Consumer{ID: "held", Policies: []string{"p"}}
		if d, err := e.Decide(context.Background(), held, "api", 1); err != nil || !d.Allowed {
			t.Fatalf("policy %d: first consumer: %+v, %v", fp, d, err)
		}
		d, err := e.Decide(context.Background(), &core.Consumer{ID: "flood", Policies: []string{"p"}}, "api", 1)
		switch fp {
		case core.FailClosed:
			if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, memory.ErrTooManyKeys) {
				t.Fatalf("closed: new consumer at the cap: %+v, %v; want ErrStoreUnavailable wrapping ErrTooManyKeys", d, err)
			}
		case core.FailOpen:
			if err != nil || !d.Allowed || d.DecidedBy != core.KindNone {
				t.Fatalf("open: new consumer at the cap: %+v, %v; want allowed, undecided", d, err)
			}
		}
		if !errors.Is(storeErr, memory.ErrTooManyKeys) {
			t.Fatalf("policy %d: OnStoreError got %v", fp, storeErr)
		}
		if d, err := e.Decide(context.Background(), held, "api", 1); err != nil || d.Allowed {
			t.Fatalf("policy %d: held consumer's second request: %+v, %v; want denied", fp, d, err)
		}
	}
}

// TestMaxKeysSweepReachesOtherShards: with many shards and a small cap,
// the idle keys are in other shards than the new one's; the sweep at the
// cap covers the whole store, so once they are idle (and a second after
// the last sweep at the cap) every new key finds room.
func TestMaxKeysSweepReachesOtherShards(t *testing.T) {
	clock := core.NewManualClock(int64(1000 * time.Hour))
	s := memory.New(memory.Options{Clock: clock, MaxKeys: 5, Shards: 256})
	defer s.Close()
	ctx := context.Background()
	short := core.Limit{Rate: 1000, Period: time.Second} // idle 1ms after one unit
	try := func(consumer string) error {
		_, err := s.Take(ctx, request(t, s, core.Call{Consumer: consumer, Rate: short, Cost: 1}))
		return err
	}
	for i := range 5 {
		if err := try(fmt.Sprintf("old%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := try("new0"); !errors.Is(err, memory.ErrTooManyKeys) {
		t.Fatalf("new0 at the cap: %v", err)
	}
	clock.Advance(time.Second + 2*time.Millisecond)
	for i := range 5 {
		if err := try(fmt.Sprintf("new%d", i)); err != nil {
			t.Fatalf("new%d after the old keys went idle: %v", i, err)
		}
	}
	if s.Len() != 5 || s.KeysRefused() != 1 {
		t.Fatalf("Len %d, refused %d; want 5 and 1", s.Len(), s.KeysRefused())
	}
}
