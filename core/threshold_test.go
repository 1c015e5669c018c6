package core_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

type seen struct {
	mu  sync.Mutex
	got []string
}

func (s *seen) ObserveThreshold(c *core.Consumer, t core.ThresholdReached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	api := t.API
	if t.Endpoint != "" {
		api += " [" + t.Endpoint + "]"
	}
	s.got = append(s.got, fmt.Sprintf("%s %s %s %d%%=%d e%d used=%d", c.ID, api, t.Policy, t.Percent, t.Units, t.Epoch, t.Quota.Limit-t.Quota.Remaining))
}

// TestThresholds: each threshold is told once, by the request whose
// spend reaches it (cost 3 steps over 50 % of 10 at the 2nd request);
// a refused request tells nothing; a new epoch's period tells again; a
// policy without thresholds tells nothing.
func TestThresholds(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	obs := &seen{}
	e, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "q", Quota: core.Quota{Max: 10, Renewal: time.Hour}, Thresholds: []int64{50, 80, 100}},
		{ID: "plain", Quota: core.Quota{Max: 10, Renewal: time.Hour}},
	}}, core.Options{QuotaObserver: obs})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"q"}}
	var allowed []bool
	for _, cost := range []int64{3, 3, 1, 1, 2, 1} {
		d, err := e.Decide(context.Background(), c, "api", cost)
		if err != nil {
			t.Fatal(err)
		}
		allowed = append(allowed, d.Allowed)
	}
	if got := fmt.Sprint(allowed); got != "[true true true true true false]" {
		t.Fatalf("allowed %s", got)
	}
	c.QuotaEpoch = 1
	for range 5 {
		e.Decide(context.Background(), c, "api", 1)
	}
	p := &core.Consumer{ID: "p", Policies: []string{"plain"}}
	for range 11 {
		e.Decide(context.Background(), p, "api", 1)
	}
	want := []string{
		"k api q 50%=5 e0 used=6",
		"k api q 80%=8 e0 used=8",
		"k api q 100%=10 e0 used=10",
		"k api q 50%=5 e1 used=5",
	}
	if got := strings.Join(obs.got, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("told:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	for _, bad := range [][]int64{{0}, {101}, {80, 80}} {
		if _, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "x", Quota: core.Quota{Max: 1, Renewal: time.Hour}, Thresholds: bad}}}, core.Options{}); err == nil {
			t.Errorf("thresholds %v accepted", bad)
		}
	}
	if _, err := core.NewEngine(store, core.Config{Policies: []core.Policy{{ID: "x", Rate: core.PerSecond(1), Thresholds: []int64{80}}}}, core.Options{}); err == nil {
		t.Error("thresholds without a quota accepted")
	}
}

// TestThresholdsReachedBySettle: a quota that settles after the response
// is told of the thresholds its settles reach, not only its estimates:
// estimate 1 each, settled to 30, 30, 1, 0 and 35, then a request of 4
// reaches 100 % at Decide. A settle that refunds, or charges nothing
// more, tells nothing.
func TestThresholdsReachedBySettle(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	obs := &seen{}
	e, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "q", Quota: core.Quota{Max: 100, Renewal: time.Hour}, Settle: true, Thresholds: []int64{50, 90, 100}},
	}}, core.Options{QuotaObserver: obs})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "k", Policies: []string{"q"}}
	for _, actual := range []int64{30, 30, 1, 0, 35} {
		d, err := e.Decide(context.Background(), c, "api", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("%+v, %v", d, err)
		}
		d.Hold.Settle(actual)
	}
	d, err := e.Decide(context.Background(), c, "api", 4)
	if err != nil || !d.Allowed || d.Quota.Remaining != 0 {
		t.Fatalf("%+v, %v: want admitted, 0 left", d, err)
	}
	d.Hold.Release()
	want := []string{
		"k api q 50%=50 e0 used=60",
		"k api q 90%=90 e0 used=96",
		"k api q 100%=100 e0 used=100",
	}
	if got := strings.Join(obs.got, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("told:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
