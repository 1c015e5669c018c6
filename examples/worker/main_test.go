package main

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/limitplane/limitplane/internal/redistest"
)

// TestMain lets the test binary act as a worker process when the parent
// (run, inside a test) re-runs it.
func TestMain(m *testing.M) {
	if os.Getenv("LIMITPLANE_WORKER_CHILD") == "1" {
		if err := run(os.Args[1:], os.Stdout, ""); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Four processes sharing 50 jobs/s through one redis-server for 10 s
// complete 500 ± 10 jobs; the limit's bound is 1 + 50×10 = 501.
func TestFourProcessesShareOneRate(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	err := run([]string{"-processes", "4", "-rate", "50", "-duration", "10s", "-redis", "redis://" + srv.Addr + "/0"}, &out, os.Args[0])
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`(?m)^jobs=(\d+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no total in output:\n%s", out.String())
	}
	total, _ := strconv.Atoi(m[1])
	if total < 490 || total > 501 {
		t.Fatalf("4 workers at 50/s for 10s did %d jobs, want 490..501\n%s", total, out.String())
	}
	if n := len(regexp.MustCompile(`(?m)^worker done: [1-9]\d* jobs$`).FindAllString(out.String(), -1)); n != 4 {
		t.Fatalf("%d workers reported jobs, want 4\n%s", n, out.String())
	}
	t.Log(out.String())
}

// A worker whose Redis is unreachable fails loudly instead of reporting 0
// jobs.
func TestUnreachableRedisFails(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-processes", "1", "-duration", "2s", "-redis", "redis://127.0.0.1:1/0"}, &out, os.Args[0])
	if err == nil || !strings.Contains(err.Error(), "worker process: exit status 1") {
		t.Fatalf("err %v, want the worker process to fail\n%s", err, out.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-processes", "0"}, {"-rate", "-1"}, {"-duration", "0s"}, {"-nope"}} {
		if err := run(args, &bytes.Buffer{}, ""); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
