package memory_test

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// BenchmarkInFlight is core.Engine.Decide for one consumer, with the
// decision's Hold released as a middleware would: a rate limit alone
// ("rate", the plain Decide), an in-flight limit alone ("in_flight"), and
// both ("rate+in_flight"). Coarse clock, one goroutine. The limits never
// deny (1e9/s, cap 1000).
func BenchmarkInFlight(b *testing.B) {
	ctx := context.Background()
	coarse := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(coarse.Stop)
	rate := core.Limit{Rate: 1_000_000_000, Period: time.Second}
	for _, tc := range []struct {
		name string
		p    core.Policy
	}{
		{"rate", core.Policy{ID: "p", Rate: rate}},
		{"in_flight", core.Policy{ID: "p", InFlight: 1000}},
		{"rate+in_flight", core.Policy{ID: "p", Rate: rate, InFlight: 1000}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := memory.New(memory.Options{Clock: coarse})
			b.Cleanup(func() { s.Close() })
			e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{tc.p}}, core.Options{})
			if err != nil {
				b.Fatal(err)
			}
			c := &core.Consumer{ID: "hot-consumer", Policies: []string{"p"}}
			if d, err := e.Decide(ctx, c, "api", 1); err != nil || !d.Allowed {
				b.Fatal(d, err)
			} else {
				d.Hold.Release()
			}
			b.ReportAllocs()
			b.ResetTimer()
			n := 0
			for range b.N {
				d, _ := e.Decide(ctx, c, "api", 1)
				if d.Allowed {
					n++
				}
				d.Hold.Release()
			}
			if n != b.N {
				b.Fatalf("%d of %d allowed", n, b.N)
			}
		})
	}
}

// TestDecisionSize pins core.Decision's size: 176 bytes on 64-bit
// platforms (168 before Hold, one pointer, was added).
func TestDecisionSize(t *testing.T) {
	if sz := unsafeSizeofDecision(); sz != 176 {
		t.Fatalf("core.Decision is %d bytes, want 176", sz)
	}
}

func unsafeSizeofDecision() uintptr { return unsafe.Sizeof(core.Decision{}) }

// BenchmarkSettle is Engine.Decide and the end of the request for a quota
// that settles: the estimate stands ("quota", Release) or is settled to
// another cost ("quota+settle"); "quota, no settle" is the same quota on
// a policy that does not settle. Coarse clock, one goroutine.
func BenchmarkSettle(b *testing.B) {
	ctx := context.Background()
	coarse := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(coarse.Stop)
	q := core.Quota{Max: 1 << 50, Renewal: time.Hour}
	for _, tc := range []struct {
		name   string
		p      core.Policy
		settle bool
	}{
		{"quota, no settle", core.Policy{ID: "p", Quota: q}, false},
		{"quota", core.Policy{ID: "p", Quota: q, Settle: true}, false},
		{"quota+settle", core.Policy{ID: "p", Quota: q, Settle: true}, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := memory.New(memory.Options{Clock: coarse})
			b.Cleanup(func() { s.Close() })
			e, err := core.NewEngine(s, core.Config{Policies: []core.Policy{tc.p}}, core.Options{})
			if err != nil {
				b.Fatal(err)
			}
			c := &core.Consumer{ID: "hot-consumer", Policies: []string{"p"}}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d, _ := e.Decide(ctx, c, "api", 100)
				if tc.settle {
					d.Hold.Settle(7)
				} else {
					d.Hold.Release()
				}
			}
		})
	}
}
