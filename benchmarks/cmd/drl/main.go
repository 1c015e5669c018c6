// Command drl runs limitplane's distributed rate limiter (DRL) as real
// processes and prints one summary line per mode, limitplane's last:
//
//	mode=equal admitted_per_s=… pct_of_possible=… worst_window=… bound=… redis_calls_on_path=…
//	mode=drl admitted_per_s=… pct_of_possible=… worst_window=… bound=… redis_calls_on_path=…
//
// From the benchmarks directory (its own module):
//
//	go run ./cmd/drl -gateways 4 -rate 1000 -burst 100 -offered 1500 -split 70,10,10,10 -duration 30s
//
// or from the repository's root, go run -C benchmarks ./cmd/drl … (the
// root module does not contain this package, so go run
// ./benchmarks/cmd/drl does not work there).
//
// It builds cmd/limitplane-gateway, starts one redis-server on a free loopback
// port and -gateways gateway processes, drives them with open-loop load
// split by -split, and stops every process it started, also on Ctrl-C.
// mode=equal is Tyk's flat split as a peer in the same run (rate R/N,
// burst B/N in each gateway's memory, no Redis); mode=drl is limitplane's
// (distributed: true, a drl: section, the Redis store). Package
// benchmarks/internal/drlharness documents every measure; the scenario
// flags add events (-churn, -step, -kill-allocator, -redis-pause,
// -slow-link, -slow-tables, -stall-at/-stall-for, -move-at) and -unsafe runs the DRL
// with grows published before shrinks are in force (test only).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/limitplane/limitplane/benchmarks/internal/drlharness"
)

func main() {
	var o drlharness.Options
	flag.IntVar(&o.Gateways, "gateways", 4, "gateway processes")
	flag.Int64Var(&o.Rate, "rate", 1000, "the limit R, requests per second")
	flag.Int64Var(&o.Burst, "burst", 100, "the burst B")
	flag.Float64Var(&o.Offered, "offered", 1500, "total offered load, requests per second")
	split := flag.String("split", "", "weights of the offered load per gateway, comma-separated (default even)")
	flag.DurationVar(&o.Duration, "duration", 30e9, "length of the load")
	flag.DurationVar(&o.Warmup, "warmup", 3e9, "start of the load left out of admitted_per_s")
	modes := flag.String("modes", "equal,drl", "modes to run, in order")
	flag.BoolVar(&o.Poisson, "poisson", false, "Poisson arrivals instead of evenly spaced ones")
	flag.Uint64Var(&o.Seed, "seed", 1, "seed of -poisson and -churn")
	flag.DurationVar(&o.Interval, "interval", 0, "drl.interval H (default: the gateway's, 1s)")
	flag.IntVar(&o.MaxGateways, "max-gateways", 0, "drl.max_gateways (default: the gateway's)")
	flag.IntVar(&o.JoinReserve, "join-reserve", 0, "drl.join_reserve (default: the gateway's)")
	flag.Float64Var(&o.Headroom, "headroom", 0, "drl.headroom (default: the gateway's)")
	flag.BoolVar(&o.Unsafe, "unsafe", false, "gateways built with -tags limitplane_drl_unsafe: grows before shrinks (TEST ONLY: breaks the bound)")
	flag.BoolVar(&o.Churn, "churn", false, "a gateway leaves (SIGKILL) or joins every 20-30s")
	flag.BoolVar(&o.Step, "step", false, "gateway 0 offered 200/s, then 5000/s from -step-at; -offered/-split apply to the others")
	flag.DurationVar(&o.StepAt, "step-at", 0, "when -step jumps (default a third into the run)")
	flag.BoolVar(&o.KillAllocator, "kill-allocator", false, "SIGKILL the gateway holding the allocator lease at -kill-at")
	flag.DurationVar(&o.KillAt, "kill-at", 0, "when -kill-allocator kills (default a third into the run)")
	flag.DurationVar(&o.RedisPause, "redis-pause", 0, "SIGSTOP redis-server for this long at -pause-at, then SIGCONT")
	flag.DurationVar(&o.PauseAt, "pause-at", 0, "when -redis-pause stops Redis (default a third into the run)")
	flag.DurationVar(&o.SlowLink, "slow-link", 0, "hold what Redis sends gateway 0 this long (through a proxy)")
	flag.DurationVar(&o.SlowTables, "slow-tables", 0, "hold what carries a table to gateway 0 this long (through a proxy)")
	flag.DurationVar(&o.SlowAt, "slow-at", 0, "when -slow-link or -slow-tables starts (default: with the load)")
	flag.DurationVar(&o.StallAt, "stall-at", 0, "when -stall-for stalls gateway 0's link to Redis (default half-way)")
	flag.DurationVar(&o.StallFor, "stall-for", 0, "stall gateway 0's link to Redis both ways this long")
	flag.DurationVar(&o.MoveAt, "move-at", 0, "move the load to -move-split (and -move-offered) at this time")
	moveSplit := flag.String("move-split", "", "weights after -move-at")
	flag.Float64Var(&o.MoveOffered, "move-offered", 0, "total offered load after -move-at (default unchanged)")
	flag.BoolVar(&o.Timeline, "timeline", false, "log each gateway's admissions per second")
	flag.StringVar(&o.GatewayBin, "gateway", "", "a built cmd/limitplane-gateway (default: build it)")
	flag.StringVar(&o.Dir, "dir", "", "keep the run's configurations and logs here (default: a temporary directory, removed)")
	flag.Parse()
	var err error
	if o.Split, err = weights(*split); err == nil {
		o.MoveSplit, err = weights(*moveSplit)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drl:", err)
		os.Exit(2)
	}
	for _, m := range strings.Split(*modes, ",") {
		o.Modes = append(o.Modes, drlharness.Mode(strings.TrimSpace(m)))
	}
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rs, err := drlharness.Run(ctx, o)
	for _, r := range rs {
		fmt.Println(r.Line())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drl:", err)
		stop()
		os.Exit(1)
	}
}

// weights parses "70,10,10,10"; "" is nil.
func weights(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var ws []float64
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("weight %q: %w", f, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}
