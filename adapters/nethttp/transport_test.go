package nethttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// thirdParty is a real HTTP server that enforces its own limit and counts
// what it saw.
func thirdParty(t *testing.T, l core.Limit) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	b, err := memory.NewBucket(l, nil)
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

func TestTransportKeepsThirdPartyUnderItsLimit(t *testing.T) {
	// The third party allows 20/s with a burst of 5 (slack for up to 200ms
	// of scheduling and network jitter on a loaded machine); the client is
	// held at 20/s burst 1, so its calls start exactly 50ms apart.
	srv, ok, limited := thirdParty(t, core.Limit{Rate: 20, Period: time.Second, Burst: 5})
	tr, err := nethttp.NewTransport(nethttp.TransportOptions{Store: memory.New(memory.Options{}), Key: "third-party", Limit: core.Limit{Rate: 20, Period: time.Second, Burst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < 50; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= 200 {
				resp, err := client.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if ok.Load() != 200 || limited.Load() != 0 {
		t.Fatalf("third party saw %d ok and %d 429s; want 200 and 0", ok.Load(), limited.Load())
	}
	// 200 calls at 20/s burst 1: the last may start 199 emission intervals
	// after the first.
	if el < 199*50*time.Millisecond {
		t.Fatalf("200 calls took %v, faster than the limit allows", el)
	}
	t.Logf("200 calls through the transport took %v", el)
}

func TestTransportBacksOffOnRetryAfter(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(429)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	store := memory.New(memory.Options{})
	opts := nethttp.TransportOptions{Store: store, Key: "tp", Limit: core.PerSecond(100)}
	a, _ := nethttp.NewTransport(opts)
	b, _ := nethttp.NewTransport(opts) // another client sharing the store
	resp, err := (&http.Client{Transport: a}).Get(srv.URL)
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("first call: %v %v", resp, err)
	}
	resp.Body.Close()
	start := time.Now()
	resp, err = (&http.Client{Transport: b}).Get(srv.URL)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("second call: %v %v", resp, err)
	}
	resp.Body.Close()
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("a client sharing the store waited %v after Retry-After: 1", el)
	}
	// A deadline shorter than the hold fails fast.
	calls.Store(0)
	resp, _ = (&http.Client{Transport: a}).Get(srv.URL) // 429 again, hold 1s
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = a.RoundTrip(mustReq(t, ctx, srv.URL))
	if !errors.Is(err, core.ErrWaitExceedsDeadline) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("short deadline: err %v after %v; want ErrWaitExceedsDeadline at once", err, time.Since(start))
	}
}

func mustReq(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewTransportValidates(t *testing.T) {
	for _, o := range []nethttp.TransportOptions{
		{},
		{Store: memory.New(memory.Options{}), Key: "k"},
		{Store: memory.New(memory.Options{}), Key: "k", Limit: core.Limit{Rate: 5}},
	} {
		if _, err := nethttp.NewTransport(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
