package main

import (
	"strings"
	"testing"
	"time"
)

// wrkOutput is wrk 4.1.0's output with --latency, 99% line p99.
func wrkOutput(p99 string) string {
	return `Running 2s test @ http://127.0.0.1:40000/bench/
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.06ms    2.12ms  45.31ms   95.12%
    Req/Sec     9.98k     1.20k   12.40k    70.00%
  Latency Distribution
     50%  512.00us
     75%  830.00us
     90%    1.51ms
     99%  ` + p99 + `
  39712 requests in 2.00s, 44.70MB read
Requests/sec:  19837.52
Transfer/sec:     22.33MB
`
}

func TestParseWrk(t *testing.T) {
	for p99, want := range map[string]time.Duration{
		"812.00us": 812 * time.Microsecond,
		"12.34ms":  12340 * time.Microsecond,
		"1.20s":    1200 * time.Millisecond,
	} {
		m, err := parseWrk([]byte(wrkOutput(p99)))
		if err != nil {
			t.Fatalf("%s: %v", p99, err)
		}
		if m.rps != 19837.52 || m.p99 != want {
			t.Errorf("%s: got %v req/s, p99 %v; want 19837.52, %v", p99, m.rps, m.p99, want)
		}
	}
}

func TestParseWrkRefuses(t *testing.T) {
	for name, out := range map[string]string{
		"non-2xx":       strings.Replace(wrkOutput("1.00ms"), "Requests/sec", "  Non-2xx or 3xx responses: 7\nRequests/sec", 1),
		"socket errors": strings.Replace(wrkOutput("1.00ms"), "Requests/sec", "  Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec", 1),
		"no latency":    strings.Replace(wrkOutput("1.00ms"), "     99%  1.00ms\n", "", 1),
	} {
		if _, err := parseWrk([]byte(out)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
