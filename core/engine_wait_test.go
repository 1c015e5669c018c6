package core_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// observed is one ObserveDecision call.
type observed struct {
	api string
	d   core.Decision
	err error
}

// recorder is an Observer that keeps every call.
type recorder struct {
	mu    sync.Mutex
	calls []observed
}

func (r *recorder) ObserveDecision(api string, d core.Decision, err error, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, observed{api, d, err})
}

func (r *recorder) got() []observed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observed(nil), r.calls...)
}

// tenSeconds returns a context whose deadline is 10s away: a Wait that
// would need longer fails at once with ErrWaitExceedsDeadline instead of
// sleeping, so these tests never sleep.
func tenSeconds(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestEngineWaitShadowPolicy: a denial by a shadow policy is allowed and
// Shadowed at once, as Decide answers it; Wait neither waits for the
// minute 1/min would need nor fails for the deadline.
func TestEngineWaitShadowPolicy(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "try", Rate: core.PerMinute(1), Shadow: true}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"try"}}
	d1, err1 := e.Wait(tenSeconds(t), c, "api", 1)
	d2, err2 := e.Wait(tenSeconds(t), c, "api", 1)
	if err1 != nil || !d1.Allowed || d1.Shadowed || d1.Policy != "try" {
		t.Fatalf("first Wait: %+v, %v", d1, err1)
	}
	if err2 != nil || !d2.Allowed || !d2.Shadowed || d2.RetryAfter != 0 || d2.Delay != 0 || d2.DecidedBy != core.KindRate || d2.Policy != "try" || d2.Rate.Policy != "try" {
		t.Fatalf("second Wait: %+v, %v; want allowed and Shadowed by \"try\" at once", d2, err2)
	}
}

// TestEngineWaitOptionsShadow: the same under Options.Shadow, for a policy
// that is not a shadow policy itself.
func TestEngineWaitOptionsShadow(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerMinute(1)}}}, core.Options{Shadow: true})
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	if d, err := e.Wait(tenSeconds(t), c, "api", 1); err != nil || !d.Allowed || d.Shadowed {
		t.Fatalf("first Wait: %+v, %v", d, err)
	}
	d, err := e.Wait(tenSeconds(t), c, "api", 1)
	if err != nil || !d.Allowed || !d.Shadowed || d.Delay != 0 || d.Policy != "p" {
		t.Fatalf("second Wait: %+v, %v; want allowed and Shadowed at once", d, err)
	}
}

// TestEngineWaitObserved: the Observer sees every Wait call once, with its
// final decision and error, as it sees every Decide call.
func TestEngineWaitObserved(t *testing.T) {
	rec := &recorder{}
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "p", Rate: core.PerMinute(2)}}}, core.Options{Observer: rec})
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	if _, err := e.Decide(context.Background(), c, "api", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Wait(tenSeconds(t), c, "api", 1); err != nil {
		t.Fatal(err)
	}
	_, werr := e.Wait(tenSeconds(t), c, "api", 1) // needs 30s
	if !errors.Is(werr, core.ErrWaitExceedsDeadline) {
		t.Fatalf("third call: %v, want ErrWaitExceedsDeadline", werr)
	}
	_, nerr := e.Wait(context.Background(), &core.Consumer{ID: "x", Policies: []string{"gone"}}, "api", 1)
	calls := rec.got()
	if len(calls) != 4 {
		t.Fatalf("observer saw %d calls, want 4: %+v", len(calls), calls)
	}
	for i, want := range []struct {
		allowed   bool
		remaining int64
		err       error
	}{{true, 1, nil}, {true, 0, nil}, {false, 0, werr}} {
		o := calls[i]
		if o.api != "api" || o.d.Allowed != want.allowed || o.d.Policy != "p" || o.d.Rate.Remaining != want.remaining || o.err != want.err {
			t.Errorf("call %d: %+v; want allowed %v, remaining %d, err %v", i, o, want.allowed, want.remaining, want.err)
		}
	}
	if o := calls[3]; !errors.Is(o.err, core.ErrUnknownPolicy) || o.err != nerr || o.d != (core.Decision{}) {
		t.Errorf("call 3: %+v; want the ErrUnknownPolicy Wait returned", o)
	}
}

// TestEngineWaitChecksCost: Wait refuses the costs Decide refuses, also
// when no limit would reach the store.
func TestEngineWaitChecksCost(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{{ID: "free", Rate: core.Limit{Rate: core.Unlimited}}}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"free"}}
	for _, cost := range []int64{-1, core.MaxCost + 1} {
		if d, err := e.Wait(context.Background(), c, "api", cost); !errors.Is(err, core.ErrInvalidCost) || d != (core.Decision{}) {
			t.Errorf("Wait(cost %d): %+v, %v; want ErrInvalidCost", cost, d, err)
		}
	}
	if d, err := e.Wait(context.Background(), c, "api", core.MaxCost); err != nil || !d.Allowed {
		t.Errorf("Wait(cost MaxCost): %+v, %v; want allowed", d, err)
	}
}

// TestEngineWaitNamesPolicies: Wait's decision names the policies as
// Decide's does.
func TestEngineWaitNamesPolicies(t *testing.T) {
	e, _ := newEngine(t, core.Config{Policies: []core.Policy{
		{ID: "rate", Rate: core.PerMinute(5)},
		{ID: "quota", Quota: core.Quota{Max: 100, Renewal: time.Hour}},
	}}, core.Options{})
	c := &core.Consumer{ID: "c", Policies: []string{"rate", "quota"}}
	d, err := e.Wait(tenSeconds(t), c, "api", 1)
	if err != nil || !d.Allowed || d.DecidedBy != core.KindRate || d.Policy != "rate" || d.Rate.Policy != "rate" ||
		d.Rate.Remaining != 4 || d.Quota.Policy != "quota" || d.Quota.Remaining != 99 {
		t.Fatalf("Wait: %+v, %v; want rate from \"rate\" (4 left), quota from \"quota\" (99 left)", d, err)
	}
}

// TestEngineWaitSleepsAndObservesOnce: over a memory store and a
// ManualClock, Wait sleeps exactly one emission interval per request past
// the burst, is admitted by reservation (Delay), and is observed once per
// call however long it slept.
func TestEngineWaitSleepsAndObservesOnce(t *testing.T) {
	rec := &recorder{}
	clock := core.NewManualClock(int64(time.Hour))
	e, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
		{ID: "p", Rate: core.Limit{Rate: 4, Period: time.Second, Burst: 1}},
	}}, core.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	var slept []time.Duration
	for i, wantDelay := range []time.Duration{0, 250 * time.Millisecond, 250 * time.Millisecond} {
		d, err := core.WaitFakeTimer(context.Background(), e, c, "api", 1, clock, &slept)
		if err != nil || !d.Allowed || d.Delay != wantDelay || d.Policy != "p" || d.Rate.Policy != "p" {
			t.Fatalf("Wait %d: %+v, %v; want allowed by \"p\" after %v", i, d, err, wantDelay)
		}
	}
	if len(slept) != 2 || slept[0] != 250*time.Millisecond || slept[1] != 250*time.Millisecond {
		t.Fatalf("slept %v, want [250ms 250ms]", slept)
	}
	if n := len(rec.got()); n != 3 {
		t.Fatalf("observer saw %d calls, want 3", n)
	}
}

// TestEngineWaitShadowedRateIsNotReserved: a shadowed rate limit is never
// reserved, so Wait does not sleep for it; a quota from a policy that is
// not shadowed still applies, and a shadowed denial spends no quota.
func TestEngineWaitShadowedRateIsNotReserved(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	e, err := core.NewEngine(memory.New(memory.Options{Clock: clock}), core.Config{Policies: []core.Policy{
		{ID: "try", Rate: core.PerMinute(1), Shadow: true},
		{ID: "quota", Quota: core.Quota{Max: 100, Renewal: time.Hour}},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "c", Policies: []string{"try", "quota"}}
	var slept []time.Duration
	for i, shadowed := range []bool{false, true, true} {
		d, err := core.WaitFakeTimer(context.Background(), e, c, "api", 1, clock, &slept)
		if err != nil || !d.Allowed || d.Shadowed != shadowed || d.Delay != 0 || d.Policy != "try" || d.Quota.Policy != "quota" || d.Quota.Remaining != 99 {
			t.Fatalf("Wait %d: %+v, %v; want allowed (shadowed %v) at once, quota 99 left", i, d, err, shadowed)
		}
	}
	if len(slept) != 0 {
		t.Fatalf("slept %v, want no sleep", slept)
	}
}
