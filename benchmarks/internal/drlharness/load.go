package drlharness

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// apiKey is the one API key every request carries: the hot key.
const apiKey = "drl-harness-key"

// Statuses of a record beside HTTP's.
const (
	statusTransport = 0  // no answer: connection refused or reset, timeout
	statusDropped   = -1 // not sent: too many of the slot's requests in flight
)

// maxInFlight bounds the requests of one slot waiting for an answer; an
// arrival beyond it is recorded as dropped (an error), not queued, so the
// load stays open-loop and memory stays bounded.
const maxInFlight = 8192

// record is one request: when it was sent and when its answer arrived, in
// nanoseconds since the run's start, and the answer's status.
type record struct {
	sent, recv int64
	status     int16
	slot       int8
}

// target is where a slot's requests go: one gateway process.
type target struct {
	url    string
	client *http.Client
	tr     *http.Transport
}

func newTarget(url string) *target {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        maxInFlight,
		MaxIdleConnsPerHost: maxInFlight,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &target{url: url, tr: tr, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// slot is one gateway position of the load balancer: its offered rate
// and its current gateway process (nil while it has none).
type slot struct {
	i        int
	rate     atomic.Uint64 // math.Float64bits of requests/s
	tgt      atomic.Pointer[target]
	inFlight atomic.Int64
	mu       sync.Mutex
	recs     []record
}

func (s *slot) setRate(r float64) { s.rate.Store(math.Float64bits(r)) }
func (s *slot) getRate() float64  { return math.Float64frombits(s.rate.Load()) }

// load drives the slots open-loop: each slot's arrivals follow its own
// schedule at its current rate (evenly spaced, or a Poisson process), and
// every arrival is sent at its time whatever happened to earlier ones.
type load struct {
	start   time.Time
	end     time.Duration // no arrival at or after this offset
	slots   []*slot
	poisson bool
	seed    uint64
	// reqCtx bounds the requests themselves; cancelled after the drain.
	reqCtx context.Context
	wg     sync.WaitGroup // requests in flight
}

// since is the offset of now from the run's start.
func (l *load) since() int64 { return int64(time.Since(l.start)) }

// run schedules arrivals on every slot until l.end or ctx is done, then
// waits up to 6 s for the answers in flight.
func (l *load) run(ctx context.Context) {
	var sched sync.WaitGroup
	for _, s := range l.slots {
		sched.Add(1)
		go func() {
			defer sched.Done()
			l.drive(ctx, s)
		}()
	}
	sched.Wait()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(6 * time.Second):
	}
}

// drive is one slot's scheduler. Arrival times are kept on an absolute
// schedule, so sleeping late sends the arrivals due at once instead of
// drifting.
func (l *load) drive(ctx context.Context, s *slot) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(s.i)))
	next := time.Duration(-1)
	for ctx.Err() == nil {
		r := s.getRate()
		now := time.Since(l.start)
		if r <= 0 {
			next = -1
			if now >= l.end {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if next < 0 {
			next = now
		}
		gap := 1 / r
		if l.poisson {
			gap = rng.ExpFloat64() / r
		}
		next += time.Duration(gap * float64(time.Second))
		if next >= l.end {
			return
		}
		if d := next - time.Since(l.start); d > 0 {
			time.Sleep(d)
		}
		l.send(s)
	}
}

// send issues one request on s's current gateway and records the answer.
func (l *load) send(s *slot) {
	t := s.tgt.Load()
	sent := l.since()
	if t == nil || s.inFlight.Load() >= maxInFlight {
		s.add(record{sent: sent, recv: sent, status: statusDropped, slot: int8(s.i)})
		return
	}
	s.inFlight.Add(1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer s.inFlight.Add(-1)
		req, _ := http.NewRequestWithContext(l.reqCtx, "GET", t.url, nil)
		req.Header.Set("X-API-Key", apiKey)
		sent := l.since()
		status := int16(statusTransport)
		if resp, err := t.client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = int16(resp.StatusCode)
		}
		s.add(record{sent: sent, recv: l.since(), status: status, slot: int8(s.i)})
	}()
}

func (s *slot) add(r record) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

// plan is the load balancer: the total offered rate split over the live
// slots by weight (a dead slot's share goes to the live ones, in their
// proportions, or evenly when they all weigh 0), with fixed rates for
// slots taken out of the split. Every change is kept, so the possible
// admissions of the run can be integrated afterwards.
type plan struct {
	mu      sync.Mutex
	slots   []*slot
	total   float64
	weights []float64
	live    []bool
	fixed   []float64 // < 0: in the split
	start   time.Time
	history []offeredAt
}

// offeredAt is the total offered rate from an offset on.
type offeredAt struct {
	at   time.Duration
	rate float64
}

func newPlan(slots []*slot, total float64, weights []float64) *plan {
	p := &plan{slots: slots, total: total, weights: append([]float64(nil), weights...),
		live: make([]bool, len(slots)), fixed: make([]float64, len(slots))}
	for i := range p.fixed {
		p.fixed[i] = -1
	}
	return p
}

// update applies change under the lock and sets every slot's rate.
func (p *plan) update(change func(p *plan)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change(p)
	var sumW float64
	nSplit := 0
	for i := range p.slots {
		if p.live[i] && p.fixed[i] < 0 {
			sumW += p.weights[i]
			nSplit++
		}
	}
	offered := 0.0
	for i, s := range p.slots {
		r := 0.0
		switch {
		case !p.live[i]:
		case p.fixed[i] >= 0:
			r = p.fixed[i]
		case sumW > 0:
			r = p.total * p.weights[i] / sumW
		default:
			r = p.total / float64(nSplit)
		}
		s.setRate(r)
		offered += r
	}
	at := time.Duration(0)
	if !p.start.IsZero() {
		at = time.Since(p.start)
	}
	p.history = append(p.history, offeredAt{at: at, rate: offered})
}

// possible integrates min(limit, offered) over [from, to), in requests.
func (p *plan) possible(limit float64, from, to time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum float64
	for i, h := range p.history {
		end := to
		if i+1 < len(p.history) {
			end = p.history[i+1].at
		}
		a, b := max(h.at, from), min(end, to)
		if b > a {
			sum += min(limit, h.rate) * (b - a).Seconds()
		}
	}
	return sum
}
