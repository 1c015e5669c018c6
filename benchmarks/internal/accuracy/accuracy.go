// Package accuracy runs one concurrent workload on several rate limiters and
// counts what each admits against the most any correct limiter may admit.
//
// A limiter that never holds more than burst tokens admits at most
// burst + rate × elapsed events in any span of elapsed time, whatever its
// state when the span starts. Run reads a monotonic clock just before the
// goroutines start and just after the last one returns, so every decision
// lies inside that span; admitting more than the bound is overshoot.
package accuracy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/twoatomic"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"golang.org/x/time/rate"
)

// Workload is the shared load: Goroutines call Allow in a tight loop for
// Duration against a limit of Rate events per second with Burst.
type Workload struct {
	Goroutines int
	Duration   time.Duration
	Rate       int64
	Burst      int64
}

// Default is the workload of the README's table: 16 goroutines, 3s,
// 1000 events/s, burst 50.
var Default = Workload{Goroutines: 16, Duration: 3 * time.Second, Rate: 1000, Burst: 50}

// Instance is one limiter ready for a run.
type Instance struct {
	// Allow asks for one event.
	Allow func() bool
	// Now, when set, is the limiter's own clock (ns); Run also reports
	// the bound in that clock, which is the one its guarantee is stated
	// in (a coarse clock lags real time by up to its resolution).
	Now func() int64
	// Stop releases what the limiter holds (a clock's ticker), if set.
	Stop func()
}

// Limiter names a limiter and builds instances of it.
type Limiter struct {
	Name string
	// Ours marks limitplane's limiters, which must never overshoot in
	// their own clock.
	Ours bool
	// Coarse marks a limiter reading a cached clock, which lags the real
	// one by up to its resolution (and more when the machine is busy).
	Coarse bool
	New    func(w Workload) Instance
}

// Limiters are the limiters compared, peers first.
var Limiters = []Limiter{
	{Name: "x/time/rate", New: func(w Workload) Instance {
		l := rate.NewLimiter(rate.Limit(w.Rate), int(w.Burst))
		return Instance{Allow: l.Allow}
	}},
	{Name: "twoatomic (wall clock)", New: func(w Workload) Instance {
		return Instance{Allow: twoatomic.New(w.Rate, w.Burst, nil).Allow}
	}},
	{Name: "twoatomic (coarse clock)", Coarse: true, New: func(w Workload) Instance {
		c := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
		return Instance{Allow: twoatomic.New(w.Rate, w.Burst, c.Nanotime).Allow, Now: c.Nanotime, Stop: c.Stop}
	}},
	{Name: "limitplane Bucket (precise)", Ours: true, New: func(w Workload) Instance {
		c := core.NewSystemClock()
		return Instance{Allow: bucket(w, c).Allow, Now: c.Nanotime}
	}},
	{Name: "limitplane Bucket (coarse)", Ours: true, Coarse: true, New: func(w Workload) Instance {
		c := core.NewCoarseClock(core.NewSystemClock(), time.Millisecond)
		return Instance{Allow: bucket(w, c).Allow, Now: c.Nanotime, Stop: c.Stop}
	}},
	{Name: "limitplane Store (precise)", Ours: true, New: func(w Workload) Instance {
		c := core.NewSystemClock()
		s := memory.New(memory.Options{Clock: c})
		rule, err := s.Prepare(core.LimitSet{Rate: limit(w)})
		if err != nil {
			panic(err)
		}
		req := core.Request{Consumer: "accuracy", Rule: rule, Cost: 1}
		return Instance{
			Allow: func() bool {
				d, err := s.Take(context.Background(), req)
				if err != nil {
					panic(err)
				}
				return d.Allowed
			},
			Now:  c.Nanotime,
			Stop: func() { s.Close() },
		}
	}},
}

func limit(w Workload) core.Limit {
	return core.Limit{Rate: w.Rate, Period: time.Second, Burst: w.Burst}
}

func bucket(w Workload, c core.Clock) *memory.Bucket {
	b, err := memory.NewBucket(limit(w), c)
	if err != nil {
		panic(err)
	}
	return b
}

// Result is one limiter's run.
type Result struct {
	Name     string
	Ours     bool
	Admitted int64
	// Elapsed is the span on the real monotonic clock.
	Elapsed time.Duration
	// Bound is floor(burst + rate × Elapsed): the most a correct limiter
	// may admit.
	Bound int64
	// Overshoot is Admitted − Bound when positive, else 0.
	Overshoot int64
	// OwnBound is the bound over the span read on the limiter's own clock
	// (Instance.Now), or -1 without one.
	OwnBound int64
}

// Run runs w on a new instance of l.
func Run(l Limiter, w Workload) Result {
	in := l.New(w)
	if in.Stop != nil {
		defer in.Stop()
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	startGun := make(chan struct{})
	for range w.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGun
			n := int64(0)
			for deadline := time.Now().Add(w.Duration); time.Now().Before(deadline); {
				for range 64 { // read the deadline clock less often than the limiter's
					if in.Allow() {
						n++
					}
				}
			}
			admitted.Add(n)
		}()
	}
	own0 := int64(-1)
	if in.Now != nil {
		own0 = in.Now()
	}
	t0 := time.Now()
	close(startGun)
	wg.Wait()
	elapsed := time.Since(t0)
	r := Result{Name: l.Name, Ours: l.Ours, Admitted: admitted.Load(), Elapsed: elapsed, OwnBound: -1}
	r.Bound = w.Burst + bound(w.Rate, int64(elapsed))
	if in.Now != nil {
		r.OwnBound = w.Burst + bound(w.Rate, in.Now()-own0)
	}
	r.Overshoot = max(r.Admitted-r.Bound, 0)
	return r
}

// bound returns floor(rate × ns / 1s) without overflow for the spans used.
func bound(rate, ns int64) int64 { return rate * ns / int64(time.Second) }

// Table formats results as a Markdown table.
func Table(w Workload, rs []Result) string {
	s := fmt.Sprintf("%d goroutines, %v, rate %d/s, burst %d\n\n", w.Goroutines, w.Duration, w.Rate, w.Burst)
	s += "| limiter | admitted | elapsed | bound = burst + rate×elapsed | overshoot | admitted / bound |\n"
	s += "|---|---:|---:|---:|---:|---:|\n"
	for _, r := range rs {
		s += fmt.Sprintf("| %s | %d | %.4fs | %d | %d | %.2f%% |\n", r.Name, r.Admitted, r.Elapsed.Seconds(), r.Bound, r.Overshoot,
			100*float64(r.Admitted)/float64(r.Bound))
	}
	return s
}
