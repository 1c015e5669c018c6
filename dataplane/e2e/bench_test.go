package e2e

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// appliedRE finds a gateway's log line for an applied delivery: its
// time (slog's, in milliseconds) and revision.
var appliedRE = regexp.MustCompile(`(?m)^time=(\S+) level=INFO msg="dataplane: applied" .*revision=(\d+)`)

// appliedLog reads the revisions a gateway's log says it applied, and
// when, incrementally.
type appliedLog struct {
	g   *gateway
	off int
	at  map[uint64]time.Time
}

func (l *appliedLog) scan(tb testing.TB) {
	out := l.g.proc.stderr.String()
	end := strings.LastIndexByte(out, '\n') + 1
	for _, m := range appliedRE.FindAllStringSubmatch(out[l.off:end], -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			tb.Fatalf("gateway %s: log time %q: %v", l.g.id, m[1], err)
		}
		rev, _ := strconv.ParseUint(m[2], 10, 64)
		l.at[rev] = at
	}
	l.off = end
}

// BenchmarkPropagation measures how long one key change takes from the
// admin API call (a PUT of a key, written durably) until all four
// gateways of two data planes have applied it, by the time of each
// gateway's "dataplane: applied" log line (millisecond resolution). Each
// change waits for the previous to reach all four. Run it with
// -benchtime=1000x for the 1,000 changes; it reports p50, p99 and
// the maximum in milliseconds.
func BenchmarkPropagation(b *testing.B) {
	cp, dp1, dp2 := twoDataPlanes(b, cpOptions{})
	gws := all(dp1, dp2)
	cp.putPolicy(b, quotaPolicy("a", 1000))
	cp.putPolicy(b, quotaPolicy("b", 2000))
	cp.putAPI(b, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(b, "propagation-key", spec.Key{Policies: []string{"a"}})
	waitSynced(b, cp, gws...)
	logs := make([]*appliedLog, len(gws))
	for i, g := range gws {
		logs[i] = &appliedLog{g: g, at: map[uint64]time.Time{}}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		pol := []string{"a"}
		if i%2 == 0 {
			pol = []string{"b"}
		}
		start := time.Now()
		rev := cp.putKey(b, hash, spec.Key{Policies: pol}, true)
		var last time.Time
		deadline := start.Add(syncTimeout)
		for _, l := range logs {
			for {
				l.scan(b)
				if at, ok := l.at[rev]; ok {
					if at.After(last) {
						last = at
					}
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("gateway %s did not apply revision %d within %v", l.g.id, rev, syncTimeout)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
		// The log has milliseconds; start is truncated alike.
		lat = append(lat, last.Sub(start.Truncate(time.Millisecond)))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(q(0.5)), "p50-ms")
	b.ReportMetric(ms(q(0.99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}
