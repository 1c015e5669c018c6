// Command accuracy runs the side-by-side accuracy workload (see package
// internal/accuracy) on every limiter and prints a Markdown table per trial
// and the largest overshoot each limiter showed.
//
//	go run ./cmd/accuracy -trials 3
package main

import (
	"flag"
	"fmt"

	"github.com/limitplane/limitplane/benchmarks/internal/accuracy"
)

func main() {
	w := accuracy.Default
	trials := flag.Int("trials", 3, "runs of the workload per limiter")
	flag.IntVar(&w.Goroutines, "goroutines", w.Goroutines, "goroutines calling Allow")
	flag.DurationVar(&w.Duration, "duration", w.Duration, "length of each run")
	flag.Int64Var(&w.Rate, "rate", w.Rate, "events per second")
	flag.Int64Var(&w.Burst, "burst", w.Burst, "burst")
	flag.Parse()

	worst := make([]accuracy.Result, len(accuracy.Limiters))
	for i := 1; i <= *trials; i++ {
		var rs []accuracy.Result
		for j, l := range accuracy.Limiters {
			r := accuracy.Run(l, w)
			rs = append(rs, r)
			if i == 1 || r.Overshoot > worst[j].Overshoot {
				worst[j] = r
			}
		}
		fmt.Printf("### Trial %d\n\n%s\n", i, accuracy.Table(w, rs))
	}
	fmt.Printf("### Largest overshoot over %d trials\n\n| limiter | overshoot | admitted | bound |\n|---|---:|---:|---:|\n", *trials)
	for _, r := range worst {
		fmt.Printf("| %s | %d | %d | %d |\n", r.Name, r.Overshoot, r.Admitted, r.Bound)
	}
}
