package gqharness

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// apiKey is the one API key every request carries.
const apiKey = "globalquota-harness-key"

// Statuses of a record beside HTTP's.
const (
	statusTransport = 0  // no answer: connection refused or reset, timeout
	statusDropped   = -1 // not sent: too many requests in flight
)

// maxInFlight bounds the requests of one data plane waiting for an
// answer; an arrival beyond it is recorded as dropped (an error), not
// queued, so the load stays open-loop and memory stays bounded.
const maxInFlight = 4096

// requestTimeout bounds one request.
const requestTimeout = 10 * time.Second

// record is one request: its period and data plane, when it was sent
// and when its answer arrived (nanoseconds since the load's start), and
// the answer's status.
type record struct {
	sent, recv int64
	status     int16
	period     int16
	dp         int8
}

// Counts splits a number of requests n over weights w by the largest
// remainder, so that the parts sum to n exactly and each is floor or
// ceiling of its exact share (ties to the lower index).
func Counts(n int, w []float64) []int {
	out := make([]int, len(w))
	var sum float64
	for _, x := range w {
		sum += x
	}
	if sum <= 0 || n <= 0 {
		return out
	}
	type rem struct {
		i int
		r float64
	}
	rs := make([]rem, len(w))
	left := n
	for i, x := range w {
		exact := float64(n) * x / sum
		out[i] = int(math.Floor(exact))
		left -= out[i]
		rs[i] = rem{i, exact - float64(out[i])}
	}
	slices.SortStableFunc(rs, func(a, b rem) int {
		switch {
		case a.r > b.r:
			return -1
		case a.r < b.r:
			return 1
		}
		return 0
	})
	for k := 0; k < left; k++ {
		out[rs[k%len(rs)].i]++
	}
	return out
}

// Rotated returns split rotated by k data planes: data plane i gets
// split[(i−k) mod n] (70/20/10 rotated by 1 is 10/70/20).
func Rotated(split []float64, k int) []float64 {
	n := len(split)
	out := make([]float64, n)
	for i := range split {
		out[i] = split[((i-k)%n+n)%n]
	}
	return out
}

// schedule is the load of a run: offered[k][i] requests in period k to
// data plane i, each period's requests to one data plane evenly spaced
// over [k·P + a_k, (k+1)·P − G): request j of n at
// k·P + a_k + (j + ½)·(P − a_k − G)/n, where G is the guard, a_0 = 0
// and a_k = G for k ≥ 1. The quiet 2G around every boundary but the
// first keeps a request from crossing into the quota's next period by
// its latency (< G), and the quota's period, which starts at the key's
// first request (at most a few milliseconds after 0), from starting
// after a request of the next period.
type schedule struct {
	period, guard time.Duration
	offered       [][]int
}

// at is when request j of n of period k is sent, from the load's start.
func (s schedule) at(k, j, n int) time.Duration {
	a := time.Duration(0)
	if k > 0 {
		a = s.guard
	}
	span := s.period - a - s.guard
	return time.Duration(k)*s.period + a + time.Duration((float64(j)+0.5)*float64(span)/float64(n))
}

// dpLoad is one data plane's targets: its gateways' URLs, round-robin.
type dpLoad struct {
	urls     []string
	client   *http.Client
	tr       *http.Transport
	inFlight atomic.Int64
	mu       sync.Mutex
	recs     []record
}

func newDPLoad(urls []string) *dpLoad {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        maxInFlight,
		MaxIdleConnsPerHost: maxInFlight,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &dpLoad{urls: urls, tr: tr, client: &http.Client{Transport: tr, Timeout: requestTimeout}}
}

func (d *dpLoad) add(r record) {
	d.mu.Lock()
	d.recs = append(d.recs, r)
	d.mu.Unlock()
}

// load drives the data planes open-loop by the schedule: every request
// is sent at its time, whatever happened to earlier ones.
type load struct {
	start time.Time
	sched schedule
	dps   []*dpLoad
	// reqCtx bounds the requests themselves; cancelled on Ctrl-C.
	reqCtx context.Context
	wg     sync.WaitGroup
}

func (l *load) since() int64 { return int64(time.Since(l.start)) }

// run sends every request of the schedule, or stops when ctx ends, then
// waits for the answers in flight (each bounded by requestTimeout).
func (l *load) run(ctx context.Context) {
	var sched sync.WaitGroup
	for i, d := range l.dps {
		sched.Add(1)
		go func() { defer sched.Done(); l.drive(ctx, i, d) }()
	}
	sched.Wait()
	l.wg.Wait()
}

// drive is data plane i's scheduler, on an absolute schedule so that a
// late wake-up sends the requests due at once instead of drifting.
func (l *load) drive(ctx context.Context, i int, d *dpLoad) {
	n := 0
	for k, offered := range l.sched.offered {
		c := offered[i]
		for j := range c {
			at := l.sched.at(k, j, c)
			if wait := time.Until(l.start.Add(at)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			} else if ctx.Err() != nil {
				return
			}
			l.send(d, i, k, d.urls[n%len(d.urls)])
			n++
		}
	}
}

// send issues one request and records the answer.
func (l *load) send(d *dpLoad, i, k int, url string) {
	sent := l.since()
	if d.inFlight.Load() >= maxInFlight {
		d.add(record{sent: sent, recv: sent, status: statusDropped, period: int16(k), dp: int8(i)})
		return
	}
	d.inFlight.Add(1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer d.inFlight.Add(-1)
		req, _ := http.NewRequestWithContext(l.reqCtx, "GET", url, nil)
		req.Header.Set("X-API-Key", apiKey)
		status := int16(statusTransport)
		if resp, err := d.client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = int16(resp.StatusCode)
		}
		d.add(record{sent: sent, recv: l.since(), status: status, period: int16(k), dp: int8(i)})
	}()
}
