package benchmarks

// Side-by-side benchmarks: every limiter runs the same workloads, serial and
// parallel, in one `go test -bench` run, next to the bare clock reads they
// are built on.
//
//	Admit: a limit so generous that every call is admitted (each call
//	       writes the limiter's state).
//	Deny:  an exhausted limit: every call is denied (read-only).
//
// Each limiter is called directly, not through an interface or a func
// value, so no benchmark pays for an indirect call the others do not.

import (
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/twoatomic"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"golang.org/x/time/rate"
)

// workload is a limit stated once and built for each limiter.
type workload struct {
	name   string
	perSec int64 // events per second
	burst  int64
}

var workloads = []workload{
	// T = 1ns, burst 1e9: a call would have to come more than once a
	// nanosecond, for a whole second, to be denied.
	{"Admit", 1_000_000_000, 1_000_000_000},
	// One event a second and a burst of one, spent before timing starts:
	// at most one admission a second afterwards.
	{"Deny", 1, 1},
}

var (
	sinkMu sync.Mutex
	sink   int64
)

func keep(n int64) {
	sinkMu.Lock()
	sink += n
	sinkMu.Unlock()
}

func coarseClock(b *testing.B) *core.CoarseClock {
	c := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
	b.Cleanup(c.Stop)
	return c
}

// BenchmarkClock is the bare clock reads: time.Since of a fixed origin (one
// monotonic read, what core.SystemClock does), time.Now (wall and
// monotonic, what x/time/rate and the article's bucket read), and a
// core.CoarseClock read.
func BenchmarkClock(b *testing.B) {
	origin := time.Now()
	b.Run("since/serial", func(b *testing.B) {
		var s time.Duration
		for range b.N {
			s += time.Since(origin)
		}
		keep(int64(s))
	})
	b.Run("since/parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			var s time.Duration
			for pb.Next() {
				s += time.Since(origin)
			}
			keep(int64(s))
		})
	})
	b.Run("now/serial", func(b *testing.B) {
		var s int64
		for range b.N {
			s += time.Now().UnixNano()
		}
		keep(s)
	})
	b.Run("coarse/serial", func(b *testing.B) {
		c := coarseClock(b)
		var s int64
		for range b.N {
			s += c.Nanotime()
		}
		keep(s)
	})
}

func BenchmarkXTimeRate(b *testing.B) {
	for _, w := range workloads {
		mk := func() *rate.Limiter {
			l := rate.NewLimiter(rate.Limit(w.perSec), int(w.burst))
			l.Allow()
			return l
		}
		b.Run(w.name+"/serial", func(b *testing.B) {
			l := mk()
			b.ResetTimer()
			n := int64(0)
			for range b.N {
				if l.Allow() {
					n++
				}
			}
			keep(n)
		})
		b.Run(w.name+"/parallel", func(b *testing.B) {
			l := mk()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := int64(0)
				for pb.Next() {
					if l.Allow() {
						n++
					}
				}
				keep(n)
			})
		})
	}
}

func BenchmarkTwoAtomic(b *testing.B) {
	for _, w := range workloads {
		for _, clock := range []string{"wall", "coarse"} {
			mk := func(b *testing.B) *twoatomic.Bucket {
				var now func() int64 // wall: time.Now().UnixNano(), as published
				if clock == "coarse" {
					now = coarseClock(b).Nanotime
				}
				l := twoatomic.New(w.perSec, w.burst, now)
				l.Allow()
				return l
			}
			b.Run(w.name+"/"+clock+"/serial", func(b *testing.B) {
				l := mk(b)
				b.ResetTimer()
				n := int64(0)
				for range b.N {
					if l.Allow() {
						n++
					}
				}
				keep(n)
			})
			b.Run(w.name+"/"+clock+"/parallel", func(b *testing.B) {
				l := mk(b)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					n := int64(0)
					for pb.Next() {
						if l.Allow() {
							n++
						}
					}
					keep(n)
				})
			})
		}
	}
}

func BenchmarkLimitplaneBucket(b *testing.B) {
	for _, w := range workloads {
		for _, clock := range []string{"precise", "coarse"} {
			mk := func(b *testing.B) *memory.Bucket {
				var c core.Clock = core.NewSystemClock()
				if clock == "coarse" {
					c = coarseClock(b)
				}
				l, err := memory.NewBucket(core.Limit{Rate: w.perSec, Period: time.Second, Burst: w.burst}, c)
				if err != nil {
					b.Fatal(err)
				}
				l.Allow()
				return l
			}
			b.Run(w.name+"/"+clock+"/serial", func(b *testing.B) {
				l := mk(b)
				b.ResetTimer()
				n := int64(0)
				for range b.N {
					if l.Allow() {
						n++
					}
				}
				keep(n)
			})
			b.Run(w.name+"/"+clock+"/parallel", func(b *testing.B) {
				l := mk(b)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					n := int64(0)
					for pb.Next() {
						if l.Allow() {
							n++
						}
					}
					keep(n)
				})
			})
		}
	}
}
