// Command globalquota runs a global quota across data planes (issue 22)
// as real processes and prints one summary line per mode, compared in
// the same run:
//
//	mode=config_only admitted_per_period=… pct_of_q=… max_over_q=… cp_calls_on_path=… p50_ms=… p99_ms=…
//	mode=static_split …
//	mode=lease_strict … bound=… exceeded=no … usage_equal=yes
//
// From the repository's root:
//
//	go run -C benchmarks ./cmd/globalquota -dataplanes 3 -quota 10000 -period 60s -offered 30000 \
//		-split 70,20,10 -periods 5 [-rotate] [-cut dp2:10s-40s] [-kill-cp 25s] [-floor 200] \
//		-mode strict|reserved|optimistic|all
//
// It builds cmd/limitplane-controlplane and cmd/limitplane-gateway once,
// and for each mode starts a fresh control plane (bbolt in a temporary
// directory), per data plane a redis-server and -gateways gateway
// processes following the control plane through a TCP proxy of the
// harness, creates the policy, API and key through the admin API, drives
// the load open-loop, and stops every process it started, also on Ctrl-C.
// config_only and static_split always run; -mode picks the lease modes
// (-modes lists the modes to run instead, e.g. config_only,static_split).
// Package benchmarks/internal/gqharness documents every measure.
//
// Exit status: 0; 1 when a process failed to start or a step failed; 2
// for a usage error; 3 when a lease mode admitted more than its bound in
// some period (what the negative control must produce).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/benchmarks/internal/gqharness"
)

// cuts collects -cut flags: dpN:FROM-TO, or several comma-separated.
type cuts []gqharness.Cut

func (c *cuts) String() string { return fmt.Sprint(*c) }

func (c *cuts) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		cut, err := parseCut(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		*c = append(*c, cut)
	}
	return nil
}

// parseCut reads "dp2:10s-40s".
func parseCut(s string) (gqharness.Cut, error) {
	dp, span, ok := strings.Cut(s, ":")
	from, to, ok2 := strings.Cut(span, "-")
	n, err := strconv.Atoi(strings.TrimPrefix(dp, "dp"))
	if !ok || !ok2 || !strings.HasPrefix(dp, "dp") || err != nil || n < 1 {
		return gqharness.Cut{}, fmt.Errorf("cut %q: want dpN:FROM-TO, like dp2:10s-40s", s)
	}
	f, err := time.ParseDuration(from)
	if err != nil {
		return gqharness.Cut{}, fmt.Errorf("cut %q: %w", s, err)
	}
	t, err := time.ParseDuration(to)
	if err != nil {
		return gqharness.Cut{}, fmt.Errorf("cut %q: %w", s, err)
	}
	return gqharness.Cut{DP: n - 1, From: f, To: t}, nil
}

func main() {
	os.Exit(run())
}

func run() int {
	var o gqharness.Options
	var cs cuts
	flag.IntVar(&o.DataPlanes, "dataplanes", 3, "data planes (each its own redis-server)")
	flag.IntVar(&o.Gateways, "gateways", 1, "gateway processes per data plane")
	flag.Int64Var(&o.Quota, "quota", 10000, "the quota Q, requests per period")
	flag.DurationVar(&o.Period, "period", 60*time.Second, "the quota's period (renewal)")
	flag.IntVar(&o.Offered, "offered", 30000, "requests offered per period, all data planes together")
	split := flag.String("split", "70,20,10", "weights of the offered load per data plane, comma-separated")
	flag.IntVar(&o.Periods, "periods", 5, "periods of load")
	flag.BoolVar(&o.Rotate, "rotate", false, "rotate the split by one data plane each period")
	flag.DurationVar(&o.Guard, "guard", 0, "quiet time before each period's end and after each later period's start (default min(period/20, 250ms); negative: none)")
	flag.Var(&cs, "cut", "cut a data plane off the control plane: dpN:FROM-TO (repeatable)")
	cutKind := flag.String("cut-kind", "refuse", "what a cut does: refuse (close the links, refuse new ones) or stall (pass no byte)")
	flag.DurationVar(&o.KillCP, "kill-cp", 0, "SIGKILL the control plane at this time and restart it on the same store and ports")
	flag.Int64Var(&o.Floor, "floor", 0, "quota.global.floor of the reserved and optimistic modes")
	flag.DurationVar(&o.LeaseDuration, "lease-duration", 0, "quota.global.lease_duration (default: left out, or the period when shorter than 10s)")
	mode := flag.String("mode", "strict", "lease modes to run after config_only and static_split: strict, reserved, optimistic, all or none")
	modes := flag.String("modes", "", "the modes to run instead, in order (config_only,static_split,lease_strict,lease_reserved,lease_optimistic)")
	flag.DurationVar(&o.CPStop, "cp-stop", 0, "SIGSTOP the control plane this long for the cp_calls_on_path probe (default min(2s, period/4); negative: no probe)")
	flag.DurationVar(&o.CPStopAt, "cp-stop-at", 0, "when the probe stops the control plane (default: the middle of the last period)")
	flag.BoolVar(&o.NegativeControl, "negative-control", false, "lease modes on a control plane built with -tags limitplane_lease_unsafe: leases not debited (TEST ONLY: breaks the bound, which the harness must catch)")
	flag.StringVar(&o.ControlPlaneBin, "controlplane", "", "a built cmd/limitplane-controlplane (with -gateway; default: build both)")
	flag.StringVar(&o.GatewayBin, "gateway", "", "a built cmd/limitplane-gateway")
	flag.StringVar(&o.Dir, "dir", "", "keep the run's configurations and logs here (default: a temporary directory, removed)")
	flag.Parse()
	usage := func(err error) int {
		fmt.Fprintln(os.Stderr, "globalquota:", err)
		return 2
	}
	if flag.NArg() > 0 {
		return usage(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	for _, f := range strings.Split(*split, ",") {
		w, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return usage(fmt.Errorf("-split weight %q: %w", f, err))
		}
		o.Split = append(o.Split, w)
	}
	o.Cuts, o.CutKind = cs, gqharness.CutKind(*cutKind)
	if *modes != "" {
		for _, m := range strings.Split(*modes, ",") {
			o.Modes = append(o.Modes, gqharness.Mode(strings.TrimSpace(m)))
		}
	} else {
		o.Modes = []gqharness.Mode{gqharness.ModeConfigOnly, gqharness.ModeStaticSplit}
		switch *mode {
		case "all":
			o.Modes = append(o.Modes, gqharness.ModeLeaseStrict, gqharness.ModeLeaseReserved, gqharness.ModeLeaseOptimistic)
		case "strict", "reserved", "optimistic":
			o.Modes = append(o.Modes, gqharness.Mode("lease_"+*mode))
		case "none":
		default:
			return usage(fmt.Errorf("-mode %q: want strict, reserved, optimistic, all or none", *mode))
		}
	}
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rs, err := gqharness.Run(ctx, o)
	exceeded := false
	for _, r := range rs {
		fmt.Println(r.Line())
		exceeded = exceeded || r.Exceeded()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "globalquota:", err)
		if errors.Is(err, gqharness.ErrOptions) {
			return 2
		}
		return 1
	}
	if exceeded {
		fmt.Fprintln(os.Stderr, "globalquota: a lease mode admitted more than its bound in some period (exceeded=YES)")
		return 3
	}
	return 0
}
