package core_test

// Tests of how the engine binds limits to its stores: every policy is
// prepared once by SetConfig, a rate from one policy with a quota from
// another and a consumer's per-API Limits once on first use, on the
// fallback store too, and a policy a store cannot prepare is refused.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// recordingStore is a Store that records the limit sets it is asked to
// prepare and the quota resets it is asked for, and passes everything on
// to the store it wraps.
type recordingStore struct {
	core.Store
	mu       sync.Mutex
	prepared []core.LimitSet
	resets   []string
}

func (s *recordingStore) Prepare(ls core.LimitSet) (*core.Rule, error) {
	s.mu.Lock()
	s.prepared = append(s.prepared, ls)
	s.mu.Unlock()
	return s.Store.Prepare(ls)
}

func (s *recordingStore) ResetQuota(ctx context.Context, consumer, scope string, epoch uint64) error {
	s.mu.Lock()
	s.resets = append(s.resets, fmt.Sprintf("%s/%s@%d", consumer, scope, epoch))
	s.mu.Unlock()
	return s.Store.ResetQuota(ctx, consumer, scope, epoch)
}

// since returns the limit sets prepared from the n-th on.
func (s *recordingStore) since(n int) []core.LimitSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]core.LimitSet(nil), s.prepared[n:]...)
}

func (s *recordingStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.prepared)
}

func wantPrepared(t *testing.T, what string, got []core.LimitSet, want ...core.LimitSet) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: prepared %+v, want %+v", what, got, want)
	}
}

func decideEach(t *testing.T, e *core.Engine, c *core.Consumer, api string, want ...bool) core.Decision {
	t.Helper()
	var d core.Decision
	for i, w := range want {
		var err error
		if d, err = e.Decide(context.Background(), c, api, 1); err != nil || d.Allowed != w {
			t.Fatalf("%s on %q, request %d: %+v, %v; want allowed %v", c.ID, api, i+1, d, err, w)
		}
	}
	return d
}

// TestEnginePairRulePreparedOnce: the rate of one policy with the quota of
// another is one rule, prepared on the first request that needs it and
// shared by every consumer with the same pair, in either order, until the
// next SetConfig, which prepares it again (and keeps the counters).
func TestEnginePairRulePreparedOnce(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	s := &recordingStore{Store: memory.New(memory.Options{Clock: clock})}
	rate := core.Policy{ID: "rate", Rate: core.PerMinute(5)}
	quota := core.Policy{ID: "quota", Quota: core.Quota{Max: 3, Renewal: time.Hour}}
	cfg := core.Config{Policies: []core.Policy{rate, quota}}
	e, err := core.NewEngine(s, cfg, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantPrepared(t, "NewEngine", s.since(0), core.LimitSet{}, core.LimitSet{Rate: rate.Rate}, core.LimitSet{Quota: quota.Quota})
	pair := core.LimitSet{Rate: rate.Rate, Quota: quota.Quota}

	c1 := &core.Consumer{ID: "c1", Policies: []string{"rate", "quota"}}
	n := s.count()
	d := decideEach(t, e, c1, "api", true, true, true, false)
	if d.DecidedBy != core.KindQuota || d.Policy != "quota" || d.Rate.Policy != "rate" || d.Rate.Limit != 5 || d.Rate.Remaining != 2 {
		t.Fatalf("c1's 4th request: %+v; want denied by the quota of \"quota\", 2 of the rate of \"rate\" left", d)
	}
	wantPrepared(t, "c1's requests", s.since(n), pair)

	c2 := &core.Consumer{ID: "c2", Policies: []string{"quota", "rate"}}
	n = s.count()
	decideEach(t, e, c2, "api", true, true, true, false)
	wantPrepared(t, "c2's requests (same pair, other order)", s.since(n))

	if err := e.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	n = s.count()
	d = decideEach(t, e, c1, "api", false)
	if d.DecidedBy != core.KindQuota || d.Quota.Remaining != 0 {
		t.Fatalf("c1 after SetConfig: %+v; want its spent quota kept", d)
	}
	decideEach(t, e, c2, "api", false)
	wantPrepared(t, "requests after SetConfig", s.since(n), pair)
}

// TestEngineAPILimitsRulePreparedOnce: a consumer's per-API Limits are
// prepared on first use, with the API as the scope, and the rule is shared
// by every consumer with the same limits (their quota epochs apart); other
// limits get a rule of their own. Counters stay per consumer.
func TestEngineAPILimitsRulePreparedOnce(t *testing.T) {
	s := &recordingStore{Store: memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})}
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerMinute(1)}}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	two := core.Limits{Rate: core.PerMinute(2)}
	consumer := func(id string, l core.Limits) *core.Consumer {
		return &core.Consumer{ID: id, Policies: []string{"p"}, APILimits: map[string]core.Limits{"x": l}}
	}
	n := s.count()
	decideEach(t, e, consumer("c1", two), "x", true, true, false)
	wantPrepared(t, "c1's requests", s.since(n), core.LimitSet{Rate: two.Rate, Scope: "x"})

	n = s.count()
	decideEach(t, e, consumer("c2", two), "x", true, true, false)
	epoch := two
	epoch.QuotaEpoch = 7
	decideEach(t, e, consumer("c3", epoch), "x", true, true, false)
	wantPrepared(t, "c2's and c3's requests (same limits)", s.since(n))

	n = s.count()
	three := core.Limits{Rate: core.PerMinute(3)}
	decideEach(t, e, consumer("c4", three), "x", true, true, true, false)
	wantPrepared(t, "c4's requests", s.since(n), core.LimitSet{Rate: three.Rate, Scope: "x"})

	// The policy elsewhere: its own rule, prepared by SetConfig.
	n = s.count()
	decideEach(t, e, consumer("c1", two), "y", true, false)
	wantPrepared(t, "c1 on another API", s.since(n))
}

// TestEngineRefusesPolicyTheStoreCannotPrepare: a window policy on a store
// without window algorithms (core/memory without WindowsAsGCRA) fails
// NewEngine and SetConfig, naming the policy, and a failed SetConfig keeps
// the config it had; the same policy on a memory store with WindowsAsGCRA
// is enforced as GCRA. Under FailFallback the fallback must prepare it too.
func TestEngineRefusesPolicyTheStoreCannotPrepare(t *testing.T) {
	ok := core.Policy{ID: "ok", Rate: core.PerMinute(3)}
	sw := core.Policy{ID: "sw", Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.SlidingWindow}}
	fw := core.Policy{ID: "fw", Rate: core.Limit{Rate: 3, Period: time.Minute, Algorithm: core.FixedWindow}}
	clock := core.NewManualClock(int64(time.Hour))
	gcraOnly := memory.New(memory.Options{Clock: clock})
	windows := memory.New(memory.Options{Clock: clock, WindowsAsGCRA: true})

	_, err := core.NewEngine(gcraOnly, core.Config{Policies: []core.Policy{ok, sw}}, core.Options{})
	if want := `policy "sw": algorithm not supported by this store: sliding_window`; !errors.Is(err, core.ErrUnsupportedAlgorithm) || err == nil || err.Error() != want {
		t.Fatalf("NewEngine: %v; want %q", err, want)
	}

	e, err := core.NewEngine(gcraOnly, core.Config{Policies: []core.Policy{ok}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = e.SetConfig(core.Config{Policies: []core.Policy{{ID: "new", Rate: core.PerSecond(1)}, fw}})
	if want := `policy "fw": algorithm not supported by this store: fixed_window`; !errors.Is(err, core.ErrUnsupportedAlgorithm) || err == nil || err.Error() != want {
		t.Fatalf("SetConfig: %v; want %q", err, want)
	}
	if _, has := e.Policy("ok"); !has {
		t.Fatal("a refused SetConfig dropped the config in force")
	}
	if _, has := e.Policy("new"); has {
		t.Fatal("a refused SetConfig installed part of its config")
	}
	if err := core.CheckSupport(gcraOnly, sw.Rate); !errors.Is(err, core.ErrUnsupportedAlgorithm) {
		t.Fatalf("CheckSupport(GCRA-only store, sliding window): %v", err)
	}
	if err := core.CheckSupport(windows, sw.Rate); err != nil {
		t.Fatalf("CheckSupport(WindowsAsGCRA store, sliding window): %v", err)
	}

	// With WindowsAsGCRA: 3 a minute as GCRA with a burst of 3, T = 20s.
	we, err := core.NewEngine(windows, core.Config{Policies: []core.Policy{sw}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := decideEach(t, we, &core.Consumer{ID: "c", Policies: []string{"sw"}}, "api", true, true, true, false)
	if d.Policy != "sw" || d.Rate.Limit != 3 || d.RetryAfter != 20*time.Second || d.Rate.Window != time.Minute {
		t.Fatalf("the window policy as GCRA: %+v; want limit 3, retry after 20s, window 1m", d)
	}

	// The fallback prepares every policy too.
	_, err = core.NewEngine(windows, core.Config{Policies: []core.Policy{ok, sw}}, core.Options{FailurePolicy: core.FailFallback, Fallback: gcraOnly})
	if want := `policy "sw": fallback store: algorithm not supported by this store: sliding_window`; !errors.Is(err, core.ErrUnsupportedAlgorithm) || err == nil || err.Error() != want {
		t.Fatalf("NewEngine with a GCRA-only fallback: %v; want %q", err, want)
	}
}

// TestEngineFailFallbackPreparesOnFallback: under FailFallback every rule
// the engine prepares (policies, a pair of policies, per-API limits) is
// prepared on the fallback as well, and a request the store fails is
// decided by the fallback under the fallback's own rule: the memory store
// refuses a rule it did not prepare (core.ErrForeignRule), so exact
// decisions here show the engine handed it its own. Quota resets reach
// both stores with the consumer's epoch.
func TestEngineFailFallbackPreparesOnFallback(t *testing.T) {
	primary := &recordingStore{Store: &brokenStore{}}
	fallback := &recordingStore{Store: memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})}
	rate := core.Policy{ID: "rate", Rate: core.PerMinute(2)}
	quota := core.Policy{ID: "quota", Quota: core.Quota{Max: 3, Renewal: time.Hour}}
	e, err := core.NewEngine(primary, core.Config{Policies: []core.Policy{rate, quota}}, core.Options{FailurePolicy: core.FailFallback, Fallback: fallback})
	if err != nil {
		t.Fatal(err)
	}
	own := []core.LimitSet{{}, {Rate: rate.Rate}, {Quota: quota.Quota}}
	wantPrepared(t, "NewEngine, store", primary.since(0), own...)
	wantPrepared(t, "NewEngine, fallback", fallback.since(0), own...)

	c := &core.Consumer{ID: "c", Policies: []string{"rate", "quota"}, QuotaEpoch: 4,
		APILimits: map[string]core.Limits{"x": {Rate: core.PerMinute(1), Quota: core.Quota{Max: 5, Renewal: time.Hour}, QuotaEpoch: 9}}}
	d := decideEach(t, e, c, "api", true, true, false)
	if d.DecidedBy != core.KindRate || d.Policy != "rate" || d.Quota.Remaining != 1 || d.Quota.Policy != "quota" || d.RetryAfter != 30*time.Second {
		t.Fatalf("third request through the fallback: %+v; want denied by the rate of \"rate\", quota 1 left", d)
	}
	d = decideEach(t, e, c, "x", true, false)
	if d.DecidedBy != core.KindRate || d.Rate.Limit != 1 || d.Quota.Remaining != 4 {
		t.Fatalf("per-API limits through the fallback: %+v", d)
	}
	pair := core.LimitSet{Rate: rate.Rate, Quota: quota.Quota}
	api := core.LimitSet{Rate: core.PerMinute(1), Quota: core.Quota{Max: 5, Renewal: time.Hour}, Scope: "x"}
	wantPrepared(t, "requests, store", primary.since(len(own)), pair, api)
	wantPrepared(t, "requests, fallback", fallback.since(len(own)), pair, api)

	if err := e.ResetQuota(context.Background(), c, "api"); !errors.Is(err, errDown) {
		t.Fatalf("ResetQuota: %v, want the store's error", err)
	}
	if err := e.ResetQuota(context.Background(), c, "x"); !errors.Is(err, errDown) {
		t.Fatalf("ResetQuota: %v, want the store's error", err)
	}
	for _, s := range []*recordingStore{primary, fallback} {
		if got, want := fmt.Sprint(s.resets), "[c/@4 c/x@9]"; got != want {
			t.Fatalf("resets %s, want %s", got, want)
		}
	}
	// The fallback's counters were reset: the quota of "quota" has its 3
	// again (the rate limit, not reset, still denies at once).
	if d, err := e.Decide(context.Background(), c, "api", 0); err != nil || d.Quota.Remaining != 3 {
		t.Fatalf("after the reset: %+v, %v; want 3 of the quota left", d, err)
	}
}
