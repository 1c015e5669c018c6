package nethttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// thirdParty is a real HTTP server that enforces its own limit on clock
// and counts what it saw.
func thirdParty(t *testing.T, l core.Limit, clock core.Clock) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	b, err := memory.NewBucket(l, clock)
	if err != nil {
		t.Fatal(err)
	}
	var ok, limited atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !b.Allow() {
			limited.Add(1)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(429)
			return
		}
		ok.Add(1)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv, &ok, &limited
}

// TestTransportKeepsThirdPartyUnderItsLimit: the client's store and the
// third party read one frozen ManualClock, so the outcome does not depend
// on scheduling. The third party allows 5 an hour (burst 5) and so does
// the client; of 200 concurrent calls with a one-minute deadline exactly 5
// reach it, and 195 fail at once: the next slot is 12 minutes away (one
// emission interval), past their deadline. Twelve minutes later exactly one
// more passes.
func TestTransportKeepsThirdPartyUnderItsLimit(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	limit := core.Limit{Rate: 5, Period: time.Hour}
	srv, ok, limited := thirdParty(t, limit, clock)
	tr, err := nethttp.NewTransport(nethttp.TransportOptions{Store: memory.New(memory.Options{Clock: clock}), Key: "third-party", Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	const wantErr = `nethttp: transport "third-party": core: Wait(cost=1) needs 12m0s: wait would exceed context deadline (context deadline exceeded)`
	round := func() (refused int64) {
		var next, n atomic.Int64
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= 200 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					resp, err := client.Do(mustReq(t, ctx, srv.URL, nil))
					cancel()
					if err != nil {
						var ue *url.Error
						if !errors.As(err, &ue) || !errors.Is(err, core.ErrWaitExceedsDeadline) || ue.Err.Error() != wantErr {
							t.Errorf("error %v, want %s", err, wantErr)
						}
						n.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		return n.Load()
	}
	if refused := round(); ok.Load() != 5 || limited.Load() != 0 || refused != 195 {
		t.Fatalf("third party saw %d ok and %d 429s, the transport refused %d; want 5, 0, 195", ok.Load(), limited.Load(), refused)
	}
	clock.Advance(12 * time.Minute)
	if refused := round(); ok.Load() != 6 || limited.Load() != 0 || refused != 199 {
		t.Fatalf("12 minutes later: third party saw %d ok and %d 429s, the transport refused %d; want 6, 0, 199", ok.Load(), limited.Load(), refused)
	}
}

// TestTransportBacksOffOnRetryAfter: a 429 with Retry-After holds back the
// transport that got it and, through the shared store (Store.Penalize),
// another transport; each fails at once when its deadline is inside the
// hold. The store reads a frozen ManualClock, so the hold ends only when
// the test moves it.
func TestTransportBacksOffOnRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		hold       time.Duration // the 1h, or MaxBackoff for what is longer
	}{
		{"3600", time.Hour},
		{"99999999999999999999", 2 * time.Hour}, // longer than int64 holds: retried at once before
	} {
		t.Run(tc.retryAfter, func(t *testing.T) { testTransportBacksOff(t, tc.retryAfter, tc.hold) })
	}
}

func testTransportBacksOff(t *testing.T, retryAfter string, hold time.Duration) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", retryAfter)
			w.WriteHeader(429)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	clock := core.NewManualClock(int64(time.Hour))
	opts := nethttp.TransportOptions{Store: memory.New(memory.Options{Clock: clock}), Key: "tp", Limit: core.PerSecond(100), MaxBackoff: 2 * time.Hour}
	a, err := nethttp.NewTransport(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := nethttp.NewTransport(opts) // another client sharing the store
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.RoundTrip(mustReq(t, context.Background(), srv.URL, nil))
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("first call: %v %v", resp, err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The store holds b for the hold: RetryAfter = hold exactly.
	_, err = b.RoundTrip(mustReq(t, ctx, srv.URL, nil))
	if want := `nethttp: transport "tp": core: Wait(cost=1) needs ` + hold.String() + `: wait would exceed context deadline (context deadline exceeded)`; err == nil || err.Error() != want || !errors.Is(err, core.ErrWaitExceedsDeadline) {
		t.Fatalf("a client sharing the store, inside the hold: %v; want %s", err, want)
	}
	// a holds itself back too (its own Backoff, on the real clock).
	if _, err = a.RoundTrip(mustReq(t, ctx, srv.URL, nil)); !errors.Is(err, core.ErrWaitExceedsDeadline) || !strings.HasPrefix(err.Error(), `nethttp: transport "tp": core: throttle "tp" backing off for `) {
		t.Fatalf("the client that got the 429, inside the hold: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the third party saw %d calls during the hold, want 1", n)
	}
	clock.Advance(hold)
	resp, err = b.RoundTrip(mustReq(t, ctx, srv.URL, nil))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the hold: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestTransportBackoffHoldsWaitingCalls: calls already waiting for the
// slots they reserved when a 429 with Retry-After comes back do not go out
// inside the hold. Six concurrent calls at 2/s, burst 1, real clock; the
// third party answers the third call 429 with Retry-After: 2. Every call
// after it reaches the third party at least 2 s after it answered, and
// all six calls are made (a trial once saw 19 of 40 calls inside such a
// hold).
func TestTransportBackoffHoldsWaitingCalls(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	var answered429 time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		n := len(arrivals)
		mu.Unlock()
		if n == 3 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
			mu.Lock()
			answered429 = time.Now()
			mu.Unlock()
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr, err := nethttp.NewTransport(nethttp.TransportOptions{Store: memory.New(memory.Options{}), Key: "tp", Limit: core.Limit{Rate: 2, Period: time.Second, Burst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	statuses := make(chan int, 6)
	for range 6 {
		wg.Go(func() {
			resp, err := tr.RoundTrip(mustReq(t, ctx, srv.URL, nil))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	var ok, limited int
	for s := range statuses {
		switch s {
		case 200:
			ok++
		case 429:
			limited++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if ok != 5 || limited != 1 || len(arrivals) != 6 {
		t.Fatalf("%d ok, %d 429, %d calls at the third party; want 5, 1, 6", ok, limited, len(arrivals))
	}
	for i, at := range arrivals[3:] {
		if gap := at.Sub(answered429); gap < 2*time.Second {
			t.Errorf("call %d reached the third party %v after its 429, inside the 2s hold", i+4, gap)
		}
	}
}

// closeRecorder is a request body that records Close.
type closeRecorder struct {
	io.Reader
	once   sync.Once
	closed chan struct{}
}

func newCloseRecorder() *closeRecorder {
	return &closeRecorder{Reader: strings.NewReader("payload"), closed: make(chan struct{})}
}

func (c *closeRecorder) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *closeRecorder) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// TestTransportClosesBodyOnError: net/http's RoundTripper contract says
// RoundTrip closes the request body, errors included. Every way the
// throttle can refuse a call closes it before RoundTrip returns; a call that
// goes through hands it to Base, which closes it.
func TestTransportClosesBodyOnError(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/slow-down" {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(429)
		}
	}))
	defer srv.Close()
	clock := core.NewManualClock(int64(time.Hour))
	newTr := func(cost func(*http.Request) int64) *nethttp.Transport {
		tr, err := nethttp.NewTransport(nethttp.TransportOptions{Store: memory.New(memory.Options{Clock: clock}), Key: "k",
			Limit: core.Limit{Rate: 1, Period: time.Hour, Burst: 2}, Cost: cost, MaxBackoff: 2 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	short, cancelShort := context.WithTimeout(context.Background(), time.Minute)
	defer cancelShort()
	backedOff := newTr(nil)
	body := newCloseRecorder()
	resp, err := backedOff.RoundTrip(mustReq(t, context.Background(), srv.URL+"/slow-down", body))
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("call through: %v %v", resp, err)
	}
	resp.Body.Close()
	<-body.closed // closed by Base (http.Transport), maybe after RoundTrip returned
	for _, c := range []struct {
		name string
		tr   *nethttp.Transport
		ctx  context.Context
		is   error
	}{
		{"context cancelled", newTr(nil), cancelled, context.Canceled},
		{"cost above burst", newTr(func(*http.Request) int64 { return 3 }), context.Background(), core.ErrCostExceedsBurst},
		{"store error (invalid cost)", newTr(func(*http.Request) int64 { return -1 }), context.Background(), core.ErrInvalidCost},
		{"deadline inside the store's hold", newTr(nil), short, core.ErrWaitExceedsDeadline}, // the shared key is full: 2 hours away
		{"deadline inside a Backoff", backedOff, short, core.ErrWaitExceedsDeadline},
	} {
		if c.name == "deadline inside the store's hold" {
			for range 2 { // fill the burst; the bodies go to Base
				b := newCloseRecorder()
				resp, err := c.tr.RoundTrip(mustReq(t, context.Background(), srv.URL, b))
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("filling the burst: %v %v", resp, err)
				}
				resp.Body.Close()
				<-b.closed
			}
		}
		body := newCloseRecorder()
		before := calls.Load()
		resp, err := c.tr.RoundTrip(mustReq(t, c.ctx, srv.URL, body))
		if resp != nil || !errors.Is(err, c.is) || !strings.HasPrefix(err.Error(), `nethttp: transport "k": `) {
			t.Errorf("%s: %v %v, want an error matching %v", c.name, resp, err, c.is)
		}
		if !body.isClosed() {
			t.Errorf("%s: request body not closed", c.name)
		}
		if calls.Load() != before {
			t.Errorf("%s: the call reached the server", c.name)
		}
	}
}

func mustReq(t *testing.T, ctx context.Context, url string, body io.ReadCloser) *http.Request {
	t.Helper()
	method := "GET"
	if body != nil {
		method = "POST"
	}
	r, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewTransportValidates(t *testing.T) {
	for _, c := range []struct {
		o    nethttp.TransportOptions
		want string
	}{
		{nethttp.TransportOptions{}, "nethttp: NewTransport: core: NewThrottle: Store and Key are required"},
		{nethttp.TransportOptions{Store: memory.New(memory.Options{}), Key: "k"}, "nethttp: NewTransport: core: NewThrottle: a Limit is required"},
		{nethttp.TransportOptions{Store: memory.New(memory.Options{}), Key: "k", Limit: core.Limit{Rate: 5}}, "nethttp: NewTransport: core: NewThrottle: rate: invalid limit: period 0s must be > 0"},
	} {
		if _, err := nethttp.NewTransport(c.o); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %s", c.o, err, c.want)
		}
	}
}
