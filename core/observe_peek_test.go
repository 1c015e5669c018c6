package core_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// TestObserverSkipsPeeks: a cost-0 call (a peek) is not reported to the
// Observer, from Decide, DecideRoute and Wait alike; a call that spends
// is, and so is a cost-0 call at an endpoint whose own cost makes it
// spend (2 of the endpoint's 10 and 2 of the API's, 6 left there).
func TestObserverSkipsPeeks(t *testing.T) {
	o := &recorder{}
	e, err := core.NewEngine(memory.New(memory.Options{}), core.Config{
		Policies:  []core.Policy{{ID: "p", Rate: core.Limit{Rate: 10, Period: time.Hour}}, {ID: "e", Rate: core.Limit{Rate: 10, Period: time.Hour}}},
		Endpoints: map[string][]core.Endpoint{"api": {{Path: "/costly", Policies: []string{"e"}, Cost: 2}}},
	}, core.Options{Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := &core.Consumer{ID: "c", Policies: []string{"p"}}
	steps := []func() (core.Decision, error){
		func() (core.Decision, error) { return e.Decide(ctx, c, "api", 0) },
		func() (core.Decision, error) { return e.Decide(ctx, c, "api", 1) },
		func() (core.Decision, error) {
			return e.DecideRoute(ctx, c, "api", core.Route{Method: "GET", Path: "/other"}, 0)
		},
		func() (core.Decision, error) {
			return e.DecideRoute(ctx, c, "api", core.Route{Method: "GET", Path: "/other"}, 1)
		},
		func() (core.Decision, error) {
			return e.DecideRoute(ctx, c, "api", core.Route{Method: "GET", Path: "/costly"}, 0)
		},
		func() (core.Decision, error) { return e.Wait(ctx, c, "api", 0) },
	}
	for i, step := range steps {
		if _, err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	var got []string
	for _, c := range o.got() {
		got = append(got, fmt.Sprintf("%s:%d", c.api, c.d.Remaining))
	}
	if want := []string{"api:9", "api:8", "api:6"}; !slices.Equal(got, want) {
		t.Fatalf("observed %q, want %q", got, want)
	}
}
