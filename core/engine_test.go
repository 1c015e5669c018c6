package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

func newEngine(t *testing.T, cfg core.Config, opts core.Options) (*core.Engine, *core.ManualClock) {
	t.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	e, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e, clock
}

func TestEngineMostGenerousPolicyWins(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{
		{ID: "small", Rate: core.PerSecond(2), Quota: core.Quota{Max: 1000, Renewal: time.Hour}},
		{ID: "big", Rate: core.PerSecond(5), Quota: core.Quota{Max: 10, Renewal: time.Hour}},
		{ID: "other-api", Rate: core.PerSecond(100), APIs: []string{"b"}},
	}}, core.Options{})
	c := &core.Consumer{ID: "c1", Policies: []string{"small", "big", "other-api"}}
	d, err := e.Decide(context.Background(), c, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Rate.Limit != 5 || d.Rate.Policy != "big" || d.Quota.Limit != 1000 || d.Quota.Policy != "small" || d.Policy != "big" {
		t.Fatalf("decision %+v: want rate 5 from big, quota 1000 from small", d)
	}
	d, _ = e.Decide(context.Background(), c, "b", 1)
	if d.Rate.Limit != 100 || d.Policy != "other-api" {
		t.Fatalf("api b: %+v, want rate 100 from other-api", d)
	}
}

// TestEnginePolicyLookup resolves every policy of configurations on both
// sides of the engine's lookup shapes (a few policies are compared in a
// list, more are found in a map): each consumer gets its own policy's
// limit and name, alone and beside another, from IDs that share no bytes
// with the configuration's, and an unknown ID is refused.
func TestEnginePolicyLookup(t *testing.T) {
	for _, n := range []int{0, 1, 8, 9, 40} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var ps []core.Policy
			for i := range n {
				ps = append(ps, core.Policy{ID: fmt.Sprintf("p%d", i), Rate: core.PerSecond(int64(i + 1))})
			}
			e, _ := newEngine(t, core.Config{Policies: ps}, core.Options{})
			ctx := context.Background()
			for i := range n {
				id := string([]byte(fmt.Sprintf("p%d", i))) // its own bytes
				d, err := e.Decide(ctx, &core.Consumer{ID: "c" + id, Policies: []string{id}}, "a", 1)
				if err != nil || d.Rate.Limit != int64(i+1) || d.Policy != id {
					t.Fatalf("policy %s: %+v, %v; want limit %d from %s", id, d, err, i+1, id)
				}
				d, err = e.Decide(ctx, &core.Consumer{ID: "d" + id, Policies: []string{"p0", id}}, "a", 1)
				if err != nil || d.Rate.Limit != int64(i+1) || d.Policy != id {
					t.Fatalf("p0 and %s: %+v, %v; want limit %d from %s", id, d, err, i+1, id)
				}
				if p, ok := e.Policy(id); !ok || p.ID != id {
					t.Fatalf("Policy(%s) = %+v, %v", id, p, ok)
				}
			}
			for _, gone := range []string{"p", fmt.Sprintf("p%d", n), "", "p00"} {
				if _, err := e.Decide(ctx, &core.Consumer{ID: "x", Policies: []string{gone}}, "a", 1); !errors.Is(err, core.ErrUnknownPolicy) {
					t.Fatalf("unknown policy %q: err %v, want ErrUnknownPolicy", gone, err)
				}
			}
		})
	}
}

func TestEngineAccessErrors(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerSecond(1), APIs: []string{"a"}}}}, core.Options{})
	if _, err := e.Decide(context.Background(), &core.Consumer{ID: "x", Policies: []string{"p"}}, "b", 1); !errors.Is(err, core.ErrNoPolicy) {
		t.Fatalf("policy for another API: err %v, want ErrNoPolicy", err)
	}
	if _, err := e.Decide(context.Background(), &core.Consumer{ID: "x", Policies: []string{"gone"}}, "a", 1); !errors.Is(err, core.ErrUnknownPolicy) {
		t.Fatalf("unknown policy: err %v, want ErrUnknownPolicy", err)
	}
	if _, err := e.Decide(context.Background(), &core.Consumer{ID: "x", Policies: []string{"p"}}, "a", -1); !errors.Is(err, core.ErrInvalidCost) {
		t.Fatalf("negative cost: err %v", err)
	}
	if err := e.SetConfig(core.Config{Policies: []core.Policy{{ID: "p"}, {ID: "p"}}}); err == nil {
		t.Fatal("duplicate policy ids accepted")
	}
	if err := e.SetConfig(core.Config{Policies: []core.Policy{{ID: "bad", Rate: core.Limit{Rate: -3, Period: time.Second}}}}); !errors.Is(err, core.ErrInvalidLimit) {
		t.Fatalf("invalid policy: %v", err)
	}
	if _, ok := e.Policy("p"); !ok {
		t.Fatal("failed SetConfig replaced the config")
	}
}

func TestEngineAPILimitsUseOwnCounters(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Minute}}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"p"}, APILimits: map[string]core.Limits{"special": {Rate: core.Limit{Rate: 2, Period: time.Minute}}}}
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		if d, _ := e.Decide(ctx, c, "plain", 1); d.Allowed != want {
			t.Fatalf("plain #%d: allowed %v", i, d.Allowed)
		}
	}
	for i, want := range []bool{true, true, false} {
		if d, _ := e.Decide(ctx, c, "special", 1); d.Allowed != want {
			t.Fatalf("special #%d: allowed %v", i, d.Allowed)
		}
	}
}

func TestEngineRateChangeAtRuntimeKeepsState(t *testing.T) {
	e, clock := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 2, Period: time.Second}}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	ctx := context.Background()
	e.Decide(ctx, c, "", 1)
	e.Decide(ctx, c, "", 1)
	if d, _ := e.Decide(ctx, c, "", 1); d.Allowed {
		t.Fatal("third request allowed at 2/s")
	}
	// Raise to 4/s burst 6 (T=250ms, τ=1.5s): the 2 units spent carry
	// over (the debt of 2 emission intervals becomes 500ms), leaving room
	// for exactly 4 more.
	if err := e.SetConfig(core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 4, Period: time.Second, Burst: 6}}}}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, true, true, false} {
		if d, _ := e.Decide(ctx, c, "", 1); d.Allowed != want {
			t.Fatalf("after raise #%d: allowed %v, want %v", i, d.Allowed, want)
		}
	}
	clock.Advance(250 * time.Millisecond)
	if d, _ := e.Decide(ctx, c, "", 1); !d.Allowed {
		t.Fatal("not allowed one new emission interval later")
	}
}

func TestEngineShadow(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "try", Rate: core.Limit{Rate: 1, Period: time.Minute}, Shadow: true}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"try"}}
	d1, _ := e.Decide(context.Background(), c, "", 1)
	d2, _ := e.Decide(context.Background(), c, "", 1)
	if !d1.Allowed || d1.Shadowed || !d2.Allowed || !d2.Shadowed || d2.RetryAfter != 0 || d2.DecidedBy != core.KindRate {
		t.Fatalf("shadow: %+v then %+v", d1, d2)
	}
}

func TestEngineUnlimitedSkipsStore(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "free", Rate: core.Limit{Rate: core.Unlimited}, Quota: core.Quota{Max: core.Unlimited}}}}, core.Options{})
	d, err := e.Decide(context.Background(), &core.Consumer{ID: "c", Policies: []string{"free"}}, "", 1)
	if err != nil || !d.Allowed || d.DecidedBy != core.KindNone {
		t.Fatalf("%+v %v", d, err)
	}
	if n := e.Store().(*memory.Store).Len(); n != 0 {
		t.Fatalf("unlimited request created %d entries", n)
	}
}

// brokenStore always fails, to drive the engine's failure policies. (Real
// Redis outages are exercised in core/redisstore.)
type brokenStore struct{ calls atomic.Int64 }

var errDown = errors.New("connection refused")

func (b *brokenStore) Take(context.Context, core.Request) (core.Decision, error) {
	b.calls.Add(1)
	return core.Decision{}, errDown
}
func (b *brokenStore) Prepare(ls core.LimitSet) (*core.Rule, error) { return core.NewRule(ls, nil) }
func (b *brokenStore) ResetQuota(context.Context, string, string, uint64) error {
	return errDown
}
func (b *brokenStore) Penalize(context.Context, core.Request, time.Duration) error { return errDown }

func TestEngineFailurePolicies(t *testing.T) {
	cfg := core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Minute}}}}
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	var seen atomic.Int64
	onErr := func(err error) {
		if errors.Is(err, errDown) {
			seen.Add(1)
		}
	}

	open, _ := core.NewEngine(&brokenStore{}, cfg, core.Options{OnStoreError: onErr})
	d, err := open.Decide(context.Background(), c, "", 1)
	if err != nil || !d.Allowed || d.DecidedBy != core.KindNone || d.Remaining != 0 {
		t.Fatalf("fail open: %+v, %v", d, err)
	}

	closed, _ := core.NewEngine(&brokenStore{}, cfg, core.Options{FailurePolicy: core.FailClosed, OnStoreError: onErr})
	if _, err := closed.Decide(context.Background(), c, "", 1); !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, errDown) {
		t.Fatalf("fail closed: err %v", err)
	}

	fb := memory.New(memory.Options{Clock: core.NewManualClock(1)})
	fallback, _ := core.NewEngine(&brokenStore{}, cfg, core.Options{FailurePolicy: core.FailFallback, Fallback: fb, OnStoreError: onErr})
	for i, want := range []bool{true, false} {
		if d, err := fallback.Decide(context.Background(), c, "", 1); err != nil || d.Allowed != want || d.DecidedBy != core.KindRate {
			t.Fatalf("fallback #%d: %+v %v", i, d, err)
		}
	}
	if seen.Load() != 4 {
		t.Fatalf("OnStoreError saw %d errors, want 4", seen.Load())
	}
	if _, err := core.NewEngine(&brokenStore{}, cfg, core.Options{FailurePolicy: core.FailFallback}); err == nil {
		t.Fatal("FailFallback without Fallback accepted")
	}
}

func TestEngineStoreTimeout(t *testing.T) {
	cfg := core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerSecond(1)}}}
	e, _ := core.NewEngine(slowStore{}, cfg, core.Options{FailurePolicy: core.FailClosed, StoreTimeout: 20 * time.Millisecond})
	_, err := e.Decide(context.Background(), &core.Consumer{ID: "c", Policies: []string{"p"}}, "", 1)
	if !errors.Is(err, core.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want ErrStoreUnavailable wrapping DeadlineExceeded", err)
	}
}

// TestEngineCanceledCaller: a store error that comes after the caller's
// context was canceled is not a store failure under any policy: the
// engine returns an error wrapping context.Canceled (and the store's),
// admits nothing, tells OnStoreError nothing and asks no fallback. A
// deadline of the caller's that passes is still a failure.
func TestEngineCanceledCaller(t *testing.T) {
	cfg := core.Config{Policies: []core.Policy{{ID: "p", Rate: core.Limit{Rate: 1, Period: time.Minute}}}}
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, policy := range []core.FailurePolicy{core.FailOpen, core.FailClosed, core.FailFallback} {
		var seen atomic.Int64
		fb := memory.New(memory.Options{Clock: core.NewManualClock(1)})
		e, err := core.NewEngine(&brokenStore{}, cfg, core.Options{FailurePolicy: policy, Fallback: fb, OnStoreError: func(error) { seen.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Decide(canceled, c, "", 1)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, errDown) || errors.Is(err, core.ErrStoreUnavailable) || d.Allowed {
			t.Errorf("policy %d, canceled caller: allowed %v, err %v; want refused with context.Canceled and the store's error", policy, d.Allowed, err)
		}
		if _, err := e.Wait(canceled, c, "", 1); !errors.Is(err, context.Canceled) {
			t.Errorf("policy %d, Wait of a canceled caller: err %v, want context.Canceled", policy, err)
		}
		if n := seen.Load(); n != 0 {
			t.Errorf("policy %d: OnStoreError told %d times of a canceled caller's errors, want 0", policy, n)
		}
		if n := fb.Len(); n != 0 {
			t.Errorf("policy %d: the fallback holds %d keys after canceled callers only, want 0", policy, n)
		}
	}
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	var seen atomic.Int64
	e, _ := core.NewEngine(slowStore{}, cfg, core.Options{FailurePolicy: core.FailClosed, OnStoreError: func(error) { seen.Add(1) }})
	if _, err := e.Decide(expired, c, "", 1); !errors.Is(err, core.ErrStoreUnavailable) || seen.Load() != 1 {
		t.Errorf("caller's deadline passed: err %v, OnStoreError told %d times; want ErrStoreUnavailable, told once", err, seen.Load())
	}
}

// slowStore blocks until its context ends, like a Redis that stopped answering.
type slowStore struct{}

func (slowStore) Take(ctx context.Context, _ core.Request) (core.Decision, error) {
	<-ctx.Done()
	return core.Decision{}, ctx.Err()
}
func (slowStore) Prepare(ls core.LimitSet) (*core.Rule, error)                { return core.NewRule(ls, nil) }
func (slowStore) ResetQuota(context.Context, string, string, uint64) error    { return nil }
func (slowStore) Penalize(context.Context, core.Request, time.Duration) error { return nil }

func TestEngineResetQuota(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "q", Quota: core.Quota{Max: 1, Renewal: time.Hour}}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"q"}}
	ctx := context.Background()
	e.Decide(ctx, c, "", 1)
	if d, _ := e.Decide(ctx, c, "", 1); d.Allowed || d.DecidedBy != core.KindQuota {
		t.Fatalf("quota not exhausted: %+v", d)
	}
	if err := e.ResetQuota(ctx, c, ""); err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Decide(ctx, c, "", 1); !d.Allowed {
		t.Fatalf("after reset: %+v", d)
	}
}

func TestEngineRefusesAlgorithmsTheStoreLacks(t *testing.T) {
	store := memory.New(memory.Options{})
	cfg := core.Config{Policies: []core.Policy{{ID: "sw", Rate: core.Limit{Rate: 5, Period: time.Second, Algorithm: core.SlidingWindow}}}}
	if _, err := core.NewEngine(store, cfg, core.Options{}); !errors.Is(err, core.ErrUnsupportedAlgorithm) || err.Error() != `policy "sw": algorithm not supported by this store: sliding_window` {
		t.Fatalf("NewEngine: %v", err)
	}
	e, err := core.NewEngine(&brokenStore{}, core.Config{}, core.Options{FailurePolicy: core.FailFallback, Fallback: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetConfig(cfg); !errors.Is(err, core.ErrUnsupportedAlgorithm) {
		t.Fatalf("SetConfig with a GCRA-only fallback: %v", err)
	}
}

func TestEngineNilConsumer(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerSecond(1)}}}, core.Options{})
	ctx := context.Background()
	if _, err := e.Decide(ctx, nil, "", 1); !errors.Is(err, core.ErrNoConsumer) {
		t.Fatalf("Decide(nil): %v", err)
	}
	if _, err := e.Wait(ctx, nil, "", 1); !errors.Is(err, core.ErrNoConsumer) {
		t.Fatalf("Wait(nil): %v", err)
	}
	if err := e.ResetQuota(ctx, nil, ""); !errors.Is(err, core.ErrNoConsumer) {
		t.Fatalf("ResetQuota(nil): %v", err)
	}
}

// TestEnginePartitionedPolicies: one policy carries the rate, another the
// quota (Tyk's partitioned policies). The limit each leaves out takes no
// part, so both apply, in either order, and each is named after its policy.
func TestEnginePartitionedPolicies(t *testing.T) {
	const year = 365 * 24 * time.Hour
	cfg := core.Config{Policies: []core.Policy{
		{ID: "rate", Rate: core.PerMinute(5)},
		{ID: "quota", Quota: core.Quota{Max: 100_000, Renewal: year}},
	}}
	for _, order := range [][]string{{"rate", "quota"}, {"quota", "rate"}} {
		t.Run(strings.Join(order, "+"), func(t *testing.T) {
			e, clock := newEngine(t, cfg, core.Options{})
			c := &core.Consumer{ID: "c", Policies: order}
			ctx := context.Background()
			check := func(what string, d core.Decision, allowed bool, rateLeft, quotaLeft int64) {
				t.Helper()
				if d.Allowed != allowed || d.DecidedBy != core.KindRate || d.Policy != "rate" ||
					d.Rate.Policy != "rate" || d.Rate.Limit != 5 || d.Rate.Remaining != rateLeft ||
					d.Quota.Policy != "quota" || d.Quota.Limit != 100_000 || d.Quota.Remaining != quotaLeft {
					t.Fatalf("%s: %+v; want allowed %v by the rate of \"rate\" (remaining %d), quota of \"quota\" remaining %d",
						what, d, allowed, rateLeft, quotaLeft)
				}
			}
			for i := int64(1); i <= 5; i++ {
				d, err := e.Decide(ctx, c, "api", 1)
				if err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("request %d", i), d, true, 5-i, 100_000-i)
			}
			d, err := e.Decide(ctx, c, "api", 1)
			if err != nil {
				t.Fatal(err)
			}
			check("request 6", d, false, 0, 99_995)
			if d.RetryAfter != 12*time.Second {
				t.Fatalf("request 6: RetryAfter %v, want 12s (one emission interval)", d.RetryAfter)
			}
			clock.Advance(12 * time.Second)
			d, err = e.Decide(ctx, c, "api", 1)
			if err != nil {
				t.Fatal(err)
			}
			check("12s later", d, true, 0, 99_994)
		})
	}
}

// TestEnginePartitionedQuotaDenies: with the rate and the quota from two
// policies, the exhausted quota denies and the decision names the quota's
// policy; the rate limit's units are not spent by the denial.
func TestEnginePartitionedQuotaDenies(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{
		{ID: "rate", Rate: core.PerMinute(5)},
		{ID: "quota", Quota: core.Quota{Max: 3, Renewal: time.Hour}},
	}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"rate", "quota"}}
	ctx := context.Background()
	for i := int64(1); i <= 3; i++ {
		d, err := e.Decide(ctx, c, "api", 1)
		if err != nil || !d.Allowed || d.Policy != "rate" || d.Rate.Remaining != 5-i || d.Quota.Remaining != 3-i || d.Quota.Policy != "quota" {
			t.Fatalf("request %d: %+v, %v", i, d, err)
		}
	}
	d, err := e.Decide(ctx, c, "api", 1)
	if err != nil || d.Allowed || d.DecidedBy != core.KindQuota || d.Policy != "quota" || d.Quota.Policy != "quota" ||
		d.Rate.Policy != "rate" || d.Rate.Remaining != 2 || d.Quota.Remaining != 0 || d.RetryAfter != time.Hour {
		t.Fatalf("request 4: %+v, %v; want denied by the quota of \"quota\", retry after 1h, rate remaining 2", d, err)
	}
}

// TestEngineExplicitUnlimitedBeatsFinite: -1 is the most generous limit,
// wherever it is listed; the other limit still comes from the policy that
// sets it.
func TestEngineExplicitUnlimitedBeatsFinite(t *testing.T) {
	cfg := core.Config{Policies: []core.Policy{
		{ID: "finite", Rate: core.PerMinute(5), Quota: core.Quota{Max: 3, Renewal: time.Hour}},
		{ID: "free-rate", Rate: core.Limit{Rate: core.Unlimited}},
		{ID: "free-quota", Quota: core.Quota{Max: core.Unlimited}},
	}}
	ctx := context.Background()
	for _, order := range [][]string{{"finite", "free-rate"}, {"free-rate", "finite"}} {
		t.Run(strings.Join(order, "+"), func(t *testing.T) {
			e, _ := newEngine(t, cfg, core.Options{})
			c := &core.Consumer{ID: "c", Policies: order}
			admitted := 0
			var last core.Decision
			for range 10 {
				d, err := e.Decide(ctx, c, "api", 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
				last = d
			}
			// The unlimited rate lets all through to the quota of 3.
			if admitted != 3 {
				t.Fatalf("admitted %d of 10, want 3 (unlimited rate, quota 3 from \"finite\")", admitted)
			}
			if last.DecidedBy != core.KindQuota || last.Policy != "finite" || last.Quota.Policy != "finite" ||
				last.Rate != (core.Status{Policy: "free-rate"}) {
				t.Fatalf("denial: %+v; want the quota of \"finite\", and an unlimited rate from \"free-rate\"", last)
			}
		})
	}
	t.Run("finite+free-rate+free-quota", func(t *testing.T) {
		e, _ := newEngine(t, cfg, core.Options{})
		c := &core.Consumer{ID: "c", Policies: []string{"finite", "free-rate", "free-quota"}}
		for i := range 10 {
			d, err := e.Decide(ctx, c, "api", 1)
			if err != nil || !d.Allowed || d.DecidedBy != core.KindNone || d.Policy != "" ||
				d.Rate != (core.Status{Policy: "free-rate"}) || d.Quota != (core.Status{Policy: "free-quota"}) {
				t.Fatalf("request %d: %+v, %v; want allowed, both limits unlimited", i, d, err)
			}
		}
		if n := e.Store().(*memory.Store).Len(); n != 0 {
			t.Fatalf("unlimited requests created %d store entries", n)
		}
	})
}

// TestEngineNoPolicySetsALimit: a policy that sets neither limit grants
// access but limits nothing, and does not lift a limit another policy sets.
func TestEngineNoPolicySetsALimit(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{
		{ID: "access"},
		{ID: "rate", Rate: core.PerMinute(2)},
	}}, core.Options{})
	ctx := context.Background()
	open := &core.Consumer{ID: "open", Policies: []string{"access"}}
	for i := range 10 {
		d, err := e.Decide(ctx, open, "api", 1)
		if err != nil || d != (core.Decision{Allowed: true}) {
			t.Fatalf("access only, request %d: %+v, %v; want allowed with no limit", i, d, err)
		}
	}
	c := &core.Consumer{ID: "c", Policies: []string{"access", "rate"}}
	for i, want := range []bool{true, true, false} {
		d, err := e.Decide(ctx, c, "api", 1)
		if err != nil || d.Allowed != want || d.Policy != "rate" || d.Rate.Policy != "rate" || d.Quota != (core.Status{}) {
			t.Fatalf("access+rate, request %d: %+v, %v; want allowed %v by \"rate\", no quota", i, d, err, want)
		}
	}
	if n := e.Store().(*memory.Store).Len(); n != 1 {
		t.Fatalf("store holds %d entries, want 1 (consumer c's rate)", n)
	}
}

// distributedStore records the Distributed flag of every request's rule.
type distributedStore struct{ got []bool }

func (s *distributedStore) Take(_ context.Context, r core.Request) (core.Decision, error) {
	s.got = append(s.got, r.Rule.Distributed())
	return core.Decision{Allowed: true, DecidedBy: core.KindRate}, nil
}

func (s *distributedStore) Prepare(ls core.LimitSet) (*core.Rule, error) {
	return core.NewRule(ls, nil)
}
func (s *distributedStore) ResetQuota(context.Context, string, string, uint64) error { return nil }
func (s *distributedStore) Penalize(context.Context, core.Request, time.Duration) error {
	return nil
}

func TestEngineDistributedFollowsTheRatePolicy(t *testing.T) {
	s := &distributedStore{}
	e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{
		{ID: "shared", Rate: core.PerSecond(100), Distributed: true},
		{ID: "bigger", Rate: core.PerSecond(200)},
		{ID: "quota", Quota: core.Quota{Max: 10, Renewal: time.Hour}, Distributed: true},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []*core.Consumer{
		{ID: "a", Policies: []string{"shared"}},           // rate from a distributed policy
		{ID: "b", Policies: []string{"shared", "bigger"}}, // rate from "bigger", not distributed
		{ID: "c", Policies: []string{"quota", "bigger"}},  // only the quota's policy is distributed
		{ID: "d", Policies: []string{"shared"}, APILimits: map[string]core.Limits{"x": {Rate: core.PerSecond(5)}}},
	} {
		if _, err := e.Decide(ctx, c, "x", 1); err != nil {
			t.Fatal(err)
		}
	}
	if want := []bool{true, false, false, false}; fmt.Sprint(s.got) != fmt.Sprint(want) {
		t.Fatalf("Rule.Distributed() = %v, want %v", s.got, want)
	}
}
