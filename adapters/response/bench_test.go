package response

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
)

// BenchmarkRenderDecision renders an admitted answer and a denial (rate
// limited, one policy) into a Scratch, as the fasthttp and Fiber adapters
// do.
func BenchmarkRenderDecision(b *testing.B) {
	rend := NewRenderer(Options{})
	admitted := core.Decision{Allowed: true, DecidedBy: core.KindRate, Limit: 1000000000, Remaining: 999999999, ResetAfter: time.Nanosecond,
		Rate: core.Status{Policy: "bench", Limit: 1000000000, Remaining: 999999999, Window: time.Second, ResetAfter: time.Nanosecond}}
	denied := core.Decision{DecidedBy: core.KindRate, Limit: 1, ResetAfter: 59*time.Minute + 59*time.Second + 123456789, RetryAfter: 59*time.Minute + 59*time.Second + 123456789,
		Rate: core.Status{Policy: "bench", Limit: 1, Window: time.Hour, ResetAfter: 59*time.Minute + 59*time.Second + 123456789}}
	for _, c := range []struct {
		name string
		d    core.Decision
	}{{"admitted", admitted}, {"denied", denied}} {
		b.Run(c.name, func(b *testing.B) {
			var s Scratch
			b.ReportAllocs()
			for b.Loop() {
				res := rend.RenderDecision(&s, &c.d, nil)
				if len(res.Headers) == 0 {
					b.Fatal("no fields")
				}
			}
		})
	}
}
