package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// A Store keeps one counter per (consumer, scope); Take applies a request
// to it. Here: 3 per second, burst 3, with a frozen clock.
func ExampleStore_Take() {
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	defer store.Close()
	// The limit is prepared once; requests carry the rule.
	rule, err := store.Prepare(core.LimitSet{Rate: core.Limit{Rate: 3, Period: time.Second}})
	if err != nil {
		panic(err)
	}
	req := core.Request{Consumer: "alice", Rule: rule, Cost: 1}
	for i := 0; i < 4; i++ {
		d, _ := store.Take(context.Background(), req)
		fmt.Printf("allowed=%v remaining=%d retry_after=%v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	clock.Advance(time.Second / 3)
	d, _ := store.Take(context.Background(), req)
	fmt.Printf("one emission interval later: allowed=%v\n", d.Allowed)
	// Output:
	// allowed=true remaining=2 retry_after=0s
	// allowed=true remaining=1 retry_after=0s
	// allowed=true remaining=0 retry_after=0s
	// allowed=false remaining=0 retry_after=333.333333ms
	// one emission interval later: allowed=true
}

// A Bucket guards one resource with no key lookup: the fastest limiter.
func ExampleBucket() {
	b, err := memory.NewBucket(core.Limit{Rate: 2, Period: time.Second}, core.NewManualClock(1))
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Allow(), b.Allow(), b.Allow())
	// Output: true true false
}
