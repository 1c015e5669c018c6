package core_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// kindsConfig: the API's quota (thresholds at 50 %), an endpoint capped
// at 2 in flight, and an endpoint whose token budget settles after the
// response, with thresholds of its own.
func kindsConfig() core.Config {
	return core.Config{
		Policies: []core.Policy{
			{ID: "api", Quota: core.Quota{Max: 10_000, Renewal: time.Hour}, Thresholds: []int64{50}},
			{ID: "reports", InFlight: 2},
			{ID: "tokens", Quota: core.Quota{Max: 1000, Renewal: time.Hour}, Settle: true, Thresholds: []int64{50, 100}},
		},
		Endpoints: map[string][]core.Endpoint{"shop": {
			{Method: "POST", Path: "/reports", Policies: []string{"reports"}},
			{Method: "POST", Path: "/complete", Policies: []string{"tokens"}},
		}},
	}
}

// TestEndpointInFlight: an endpoint's policy caps the consumer's requests
// in flight there: the third concurrent POST /reports is refused by the
// in-flight limit, naming the policy, and spends none of the API's quota;
// other routes are not capped; a released slot admits the next.
func TestEndpointInFlight(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	e, err := core.NewEngine(store, kindsConfig(), core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"api"}}
	ctx := context.Background()
	reports := core.Route{Method: "POST", Path: "/reports"}
	var held []core.Decision
	for i := range 2 {
		d, err := e.DecideRoute(ctx, c, "shop", reports, 1)
		if err != nil || !d.Allowed || !d.Hold.Held() {
			t.Fatalf("request %d: %+v, %v: want admitted holding a slot", i, d, err)
		}
		held = append(held, d)
	}
	d, err := e.DecideRoute(ctx, c, "shop", reports, 1)
	if err != nil || d.Allowed || d.DecidedBy != core.KindInFlight || d.Policy != "reports" || d.Limit != 2 || d.RetryAfter != 0 {
		t.Fatalf("third: %+v, %v: want refused by in-flight policy \"reports\", limit 2, no RetryAfter", d, err)
	}
	if n := store.InFlight("k", core.EndpointScope("shop", core.Endpoint{Method: "POST", Path: "/reports"})); n != 2 {
		t.Fatalf("store holds %d slots at the endpoint, want 2", n)
	}
	for i := range 5 {
		d, err := e.DecideRoute(ctx, c, "shop", core.Route{Method: "GET", Path: "/reports"}, 1)
		if err != nil || !d.Allowed || d.Hold.Held() {
			t.Fatalf("GET %d: %+v, %v: want admitted, holding nothing", i, d, err)
		}
	}
	held[0].Hold.Release()
	d, err = e.DecideRoute(ctx, c, "shop", reports, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("after a release: %+v, %v: want admitted", d, err)
	}
	d.Hold.Release()
	held[1].Hold.Release()
	if n := store.InFlight("k", core.EndpointScope("shop", core.Endpoint{Method: "POST", Path: "/reports"})); n != 0 {
		t.Fatalf("store holds %d slots after every release, want 0", n)
	}
	// 2 + 5 + 1 admitted spent the API's quota; the refused third did not.
	peek, err := e.Decide(ctx, c, "shop", 0)
	if err != nil || peek.Quota.Remaining != 10_000-8 {
		t.Fatalf("API quota: %+v, %v: want %d remaining", peek.Quota, err, 10_000-8)
	}
}

// TestEndpointSettleAndThresholds: an endpoint's quota settles to the
// actual cost (estimate 100; actual 400, 10, none), on the endpoint's
// counter; its thresholds are told naming the endpoint, apart from the
// API's own.
func TestEndpointSettleAndThresholds(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	obs := &seen{}
	e, err := core.NewEngine(store, kindsConfig(), core.Options{QuotaObserver: obs})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"api"}}
	ctx := context.Background()
	complete := core.Route{Method: "POST", Path: "/complete"}
	remaining := func() int64 {
		t.Helper()
		d, err := e.DecideRoute(ctx, c, "shop", complete, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Quota.Remaining
	}
	for i, actual := range []int64{400, 10, -1} {
		d, err := e.DecideRoute(ctx, c, "shop", complete, 100)
		if err != nil || !d.Allowed || !d.Hold.Held() {
			t.Fatalf("request %d: %+v, %v: want admitted, holding its settlement", i, d, err)
		}
		if actual < 0 {
			d.Hold.Release() // no usage: the estimate stands
		} else {
			d.Hold.Settle(actual)
		}
	}
	if got, want := remaining(), int64(1000-400-10-100); got != want {
		t.Fatalf("endpoint quota remaining %d, want %d", got, want)
	}
	// Thresholds are told at Decide, from what the estimate brings the
	// count to: the 2nd request's estimate took it from 400 to 500 (50 %),
	// its settle back to 410, and the 3rd's estimate to 510, past 500
	// again: told again, as ThresholdReached says (a counter that went
	// down may reach a threshold again; the event id is the same one, so
	// the notifier sends it once). 100 more (610) cross nothing; 390 more
	// reach 100 %. The API's own quota (no settling: every estimate
	// stands) reaches its 50 % (5,000) with a 5,000-unit request to a
	// route of no endpoint.
	d, err := e.DecideRoute(ctx, c, "shop", complete, 100)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	d.Hold.Release()
	d, err = e.DecideRoute(ctx, c, "shop", complete, 390)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	d.Hold.Release()
	if got := remaining(); got != 0 {
		t.Fatalf("endpoint quota remaining %d, want 0", got)
	}
	d, err = e.DecideRoute(ctx, c, "shop", core.Route{Method: "GET", Path: "/"}, 5000)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	want := []string{
		"k shop [POST /complete] tokens 50%=500 e0 used=500",
		"k shop [POST /complete] tokens 50%=500 e0 used=510",
		"k shop [POST /complete] tokens 100%=1000 e0 used=1000",
		"k shop api 50%=5000 e0 used=5790",
	}
	if got := strings.Join(obs.got, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("told:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
