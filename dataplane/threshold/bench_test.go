package threshold_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane/threshold"
)

// BenchmarkDecideThresholds is Decide on the memory store (frozen clock)
// with a threshold Notifier as the engine's QuotaObserver, each consumer
// making 100 requests: none, a policy with no thresholds (quota 200);
// notReached, thresholds [100] of a quota of 200 (never reached: one
// length check and the crossing test); reached, thresholds 1..100 of a
// quota of 100, so every request reaches one and queues an event (or
// drops it when the queue of 1024 is full), the sending goroutine
// posting them to a real receiver on the same two cores meanwhile;
// reachedQueueFull, the same with the receiver stuck, so the queue is
// full and every event after the first 1025 is dropped: the request
// path's own cost.
func BenchmarkDecideThresholds(b *testing.B) {
	all := make([]int64, 100)
	for i := range all {
		all[i] = int64(i + 1)
	}
	for _, bc := range []struct {
		name       string
		max        int64
		thresholds []int64
		stuck      bool
	}{
		{"none", 200, nil, false},
		{"notReached", 200, []int64{100}, false},
		{"reached", 100, all, false},
		{"reachedQueueFull", 100, all, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			release := make(chan struct{})
			rcv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				if bc.stuck {
					<-release
				}
			}))
			defer rcv.Close()
			defer close(release)
			n, err := threshold.New(threshold.Options{URL: rcv.URL, Secret: secret, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
			defer store.Close()
			e, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
				{ID: "q", Quota: core.Quota{Max: bc.max, Renewal: time.Hour}, Thresholds: bc.thresholds},
			}}, core.Options{QuotaObserver: n})
			if err != nil {
				b.Fatal(err)
			}
			cs := make([]core.Consumer, b.N/100+1)
			for i := range cs {
				cs[i] = core.Consumer{ID: "key:" + strconv.Itoa(i), Policies: []string{"q"}}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				d, err := e.Decide(ctx, &cs[i/100], "api", 1)
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			b.StopTimer()
			s := n.Stats()
			b.ReportMetric(float64(s.Queued+s.Dropped)/float64(b.N), "events/op")
		})
	}
}
