package core_test

import (
	"context"
	"fmt"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// An Engine decides requests for consumers against named policies. Here a
// consumer on the "default" policy (2 per second, 100 a day) makes three
// requests at one instant.
func ExampleEngine_Decide() {
	clock := core.NewManualClock(int64(time.Hour)) // frozen, so the output is exact
	store := memory.New(memory.Options{Clock: clock})
	engine, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{
		ID:    "default",
		Rate:  core.Limit{Rate: 2, Period: time.Second},
		Quota: core.Quota{Max: 100, Renewal: 24 * time.Hour},
	}}}, core.Options{})
	if err != nil {
		panic(err)
	}
	alice := &core.Consumer{ID: "alice", Policies: []string{"default"}}
	for i := 0; i < 3; i++ {
		d, _ := engine.Decide(context.Background(), alice, "orders", 1)
		fmt.Printf("allowed=%v by=%v remaining=%d quota_remaining=%d retry_after=%v\n",
			d.Allowed, d.DecidedBy, d.Remaining, d.Quota.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true by=rate remaining=1 quota_remaining=99 retry_after=0s
	// allowed=true by=rate remaining=0 quota_remaining=98 retry_after=0s
	// allowed=false by=rate remaining=0 quota_remaining=98 retry_after=500ms
}

// Wait throttles work to a shared rate: each call returns once the limit
// allows it. With a Redis store, any number of processes share the rate.
func ExampleWait() {
	store := memory.New(memory.Options{})
	// The limit is prepared once; every call reuses the rule.
	rule, err := store.Prepare(core.LimitSet{Rate: core.Limit{Rate: 50, Period: time.Second, Burst: 1}})
	if err != nil {
		panic(err)
	}
	job := core.Request{Consumer: "nightly-export", Rule: rule, Cost: 1}
	start := time.Now()
	for i := 0; i < 6; i++ {
		if _, err := core.Wait(context.Background(), store, job); err != nil {
			panic(err)
		}
	}
	fmt.Println("6 jobs at 50/s took at least 100ms:", time.Since(start) >= 100*time.Millisecond)
	// Output: 6 jobs at 50/s took at least 100ms: true
}

// GCRAParams.Step is the pure GCRA every store agrees with.
func ExampleGCRAParams_Step() {
	p := core.Limit{Rate: 10, Period: time.Second, Burst: 2}.GCRA() // T = 100ms, τ = 200ms
	now := int64(time.Hour)
	var tat int64
	for i := 0; i < 3; i++ {
		r := p.Step(tat, now, 1)
		if r.Store {
			tat = r.TAT
		}
		fmt.Printf("allowed=%v remaining=%d retry_after=%v\n", r.Allowed, r.Remaining, time.Duration(r.RetryAfter))
	}
	// Output:
	// allowed=true remaining=1 retry_after=0s
	// allowed=true remaining=0 retry_after=0s
	// allowed=false remaining=0 retry_after=100ms
}
