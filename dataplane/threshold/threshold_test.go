package threshold_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane/threshold"
	"github.com/limitplane/limitplane/internal/redistest"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// receiver is a real HTTP webhook receiver: it checks each event's
// signature, answers fail[i] (0: 200) to the i-th attempt, and records
// the events it answered 200 to and every attempt.
type receiver struct {
	srv      *httptest.Server
	fail     []int
	mu       sync.Mutex
	attempts int
	got      []threshold.Event
	gate     chan struct{} // when set, each attempt waits for it
}

func newReceiver(t *testing.T, fail ...int) *receiver {
	r := &receiver{fail: fail}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if r.gate != nil {
		<-r.gate
	}
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.attempts
	r.attempts++
	if req.Header.Get(threshold.SignatureHeader) != threshold.Sign(secret, body) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if i < len(r.fail) && r.fail[i] != 0 {
		w.WriteHeader(r.fail[i])
		return
	}
	var e threshold.Event
	if err := json.Unmarshal(body, &e); err != nil || req.Header.Get(threshold.EventIDHeader) != e.ID {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.got = append(r.got, e)
}

// events returns "consumer api policy threshold% epoch" per event
// received, sorted, and the number of attempts.
func (r *receiver) events() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.got {
		out = append(out, fmt.Sprintf("%s %s %s %d%% e%d used=%d/%d", e.Consumer, e.API, e.Policy, e.Threshold, e.Epoch, e.Used, e.Quota))
	}
	sort.Strings(out)
	return out, r.attempts
}

// waitFor polls until cond holds (10 s at most).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func policies() []core.Policy {
	return []core.Policy{{ID: "q", Quota: core.Quota{Max: 10, Renewal: time.Hour}, Thresholds: []int64{80, 100}}}
}

// TestExactlyOncePerThreshold: two keys spend a quota of 10 with
// thresholds 80 and 100 (and beyond it, refused): the receiver gets
// exactly one event per key and threshold, while it fails twice (500,
// 500, then 200) for the first: still delivered once; a new epoch
// (a quota reset) is a new period with events of its own.
func TestExactlyOncePerThreshold(t *testing.T) {
	rcv := newReceiver(t, 500, 500)
	n, err := threshold.New(threshold.Options{URL: rcv.srv.URL, Secret: secret, DataPlane: "dp1"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	e, err := core.NewEngine(store, core.Config{Policies: policies()}, core.Options{QuotaObserver: n})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"key:a", "key:b"} {
		c := &core.Consumer{ID: id, Policies: []string{"q"}}
		for range 13 {
			e.Decide(context.Background(), c, "shop", 1)
		}
	}
	// Again under the same epoch: nothing new is reached.
	c := &core.Consumer{ID: "key:a", Policies: []string{"q"}}
	e.Decide(context.Background(), c, "shop", 1)
	c.QuotaEpoch = 7
	for range 8 {
		e.Decide(context.Background(), c, "shop", 1)
	}
	want := []string{
		"key:a shop q 100% e0 used=10/10", "key:a shop q 80% e0 used=8/10", "key:a shop q 80% e7 used=8/10",
		"key:b shop q 100% e0 used=10/10", "key:b shop q 80% e0 used=8/10",
	}
	waitFor(t, "5 events", func() bool { got, _ := rcv.events(); return len(got) >= 5 })
	time.Sleep(300 * time.Millisecond) // no more come
	got, attempts := rcv.events()
	if fmt.Sprint(got) != fmt.Sprint(want) || attempts != 7 {
		t.Fatalf("received %q in %d attempts, want %q in 7", got, attempts, want)
	}
	if s := n.Stats(); s != (threshold.Stats{Queued: 5, Delivered: 5}) {
		t.Fatalf("stats %+v", s)
	}
}

// TestTwoGatewaysOneRedis: two engines (two gateways) on one
// redis-server, each with its own Notifier claiming ids in that Redis,
// spend one key's quota concurrently: one event per threshold, and a
// repeat of an event (the same id observed again, as after a refund or
// by a restarted gateway) is claimed already and not sent.
func TestTwoGatewaysOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	rcv := newReceiver(t)
	var ns []*threshold.Notifier
	var engines []*core.Engine
	for i := range 2 {
		client := srv.Client(t, nil)
		store, err := redisstore.New(client, redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		n, err := threshold.New(threshold.Options{URL: rcv.srv.URL, Secret: secret, DataPlane: fmt.Sprint("gw", i),
			Claimer: threshold.NewRedisClaimer(client, "limitplane:")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		e, err := core.NewEngine(store, core.Config{Policies: policies()}, core.Options{QuotaObserver: n})
		if err != nil {
			t.Fatal(err)
		}
		ns, engines = append(ns, n), append(engines, e)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &core.Consumer{ID: "key:shared", Policies: []string{"q"}}
			for range 3 {
				d, err := engines[g%2].Decide(context.Background(), c, "shop", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 10 {
		t.Fatalf("admitted %d, want 10", admitted.Load())
	}
	waitFor(t, "2 events", func() bool { got, _ := rcv.events(); return len(got) >= 2 })
	// The 80 % event observed again on the other gateway: a duplicate.
	c := &core.Consumer{ID: "key:shared", Policies: []string{"q"}}
	d, _ := engines[0].Decide(context.Background(), c, "shop", 0)
	ns[1].ObserveThreshold(c, core.ThresholdReached{API: "shop", Policy: "q", Percent: 80, Units: 8, Quota: d.Quota})
	waitFor(t, "the duplicate", func() bool { return ns[1].Stats().Duplicates+ns[0].Stats().Duplicates == 1 })
	got, attempts := rcv.events()
	want := []string{"key:shared shop q 100% e0 used=10/10", "key:shared shop q 80% e0 used=8/10"}
	if fmt.Sprint(got) != fmt.Sprint(want) || attempts != 2 {
		t.Fatalf("received %q in %d attempts, want %q in 2", got, attempts, want)
	}
}

// TestFullQueueDrops: with a queue of 1 and a receiver that does not
// answer yet, the sender holds one event, the queue one, and the rest
// are dropped and counted; the request path never waits. Close ends
// the sender.
func TestFullQueueDrops(t *testing.T) {
	rcv := newReceiver(t)
	rcv.gate = make(chan struct{})
	n, err := threshold.New(threshold.Options{URL: rcv.srv.URL, Secret: secret, Queue: 1, Senders: 1})
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	e, err := core.NewEngine(store, core.Config{Policies: policies()}, core.Options{QuotaObserver: n})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "key:first", Policies: []string{"q"}}
	for range 8 {
		e.Decide(context.Background(), c, "shop", 1)
	}
	waitFor(t, "the sender to take the first", func() bool { return n.Stats().Queued == 1 && len(rcv.srv.URL) > 0 })
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	for i := range 5 {
		c := &core.Consumer{ID: fmt.Sprint("key:", i), Policies: []string{"q"}}
		for range 10 {
			e.Decide(context.Background(), c, "shop", 1)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("50 decisions took %s with the receiver stuck", took)
	}
	// 11 events: one sending, one queued, nine dropped.
	if s := n.Stats(); s.Queued != 2 || s.Dropped != 9 {
		t.Fatalf("stats %+v, want 2 queued and 9 dropped", s)
	}
	close(rcv.gate)
	waitFor(t, "2 delivered", func() bool { return n.Stats().Delivered == 2 })
	n.Close()
	if got, _ := rcv.events(); len(got) != 2 {
		t.Fatalf("received %q", got)
	}
}

// TestPermanentRefusal: a receiver answering 400 is not retried: the
// event is counted failed after one attempt and its claim released, so
// the same event observed again is sent again.
func TestPermanentRefusal(t *testing.T) {
	rcv := newReceiver(t, 400, 400)
	claims := threshold.NewMemoryClaimer(0, nil)
	n, err := threshold.New(threshold.Options{URL: rcv.srv.URL, Secret: secret, Claimer: claims, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c := &core.Consumer{ID: "key:a"}
	tr := core.ThresholdReached{API: "shop", Policy: "q", Percent: 100, Units: 10, Quota: core.Status{Limit: 10, Window: time.Hour, ResetAfter: time.Hour}}
	n.ObserveThreshold(c, tr)
	waitFor(t, "the failure", func() bool { return n.Stats().Failed == 1 })
	if _, a := rcv.events(); a != 1 || claims.Len() != 0 {
		t.Fatalf("%d attempts, %d claims held; want 1 and 0", a, claims.Len())
	}
	n.ObserveThreshold(c, tr)
	waitFor(t, "the failure", func() bool { return n.Stats().Failed == 2 })
	n.ObserveThreshold(c, tr)
	waitFor(t, "the delivery", func() bool { return n.Stats().Delivered == 1 })
	if got, a := rcv.events(); a != 3 || len(got) != 1 {
		t.Fatalf("%q in %d attempts", got, a)
	}
}

// gatedReceiver answers 200 to every event at once, except those of
// consumer stuck, which wait for release; stuckAt counts the attempts of
// those that arrived.
func gatedReceiver(t *testing.T, stuck string, release chan struct{}) (srv *httptest.Server, got func() []string, stuckAt *atomic.Int64) {
	var mu sync.Mutex
	var events []string
	stuckAt = new(atomic.Int64)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var e threshold.Event
		if err := json.NewDecoder(req.Body).Decode(&e); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if e.Consumer == stuck {
			stuckAt.Add(1)
			<-release
		}
		mu.Lock()
		events = append(events, fmt.Sprintf("%s %d%%", e.Consumer, e.Threshold))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}, stuckAt
}

// reach spends 8 of q's 10 for consumer: its 80 % threshold.
func reach(t *testing.T, e *core.Engine, consumer string) {
	t.Helper()
	c := &core.Consumer{ID: consumer, Policies: []string{"q"}}
	for range 8 {
		if d, err := e.Decide(context.Background(), c, "shop", 1); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v, %v", consumer, d, err)
		}
	}
}

// TestStuckReceiverHoldsOneSender: an event whose receiver does not answer
// holds one sender, not the events behind it; the consumer's ID is copied
// when the threshold is observed, so a caller may reuse its memory.
func TestStuckReceiverHoldsOneSender(t *testing.T) {
	release := make(chan struct{})
	srv, got, stuckAt := gatedReceiver(t, "key:stuck", release)
	defer close(release) // before the server's Close, which waits for handlers
	n, err := threshold.New(threshold.Options{URL: srv.URL, Secret: secret, Senders: 2, Timeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	e, err := core.NewEngine(store, core.Config{Policies: policies()}, core.Options{QuotaObserver: n})
	if err != nil {
		t.Fatal(err)
	}
	reach(t, e, "key:stuck")
	waitFor(t, "the stuck event at the receiver", func() bool { return stuckAt.Load() == 1 })
	// A consumer whose ID is in a buffer reused once Decide returns, as
	// an adapter's pooled consumer is.
	buf := []byte("key:other")
	reach(t, e, unsafe.String(unsafe.SliceData(buf), len(buf)))
	copy(buf, "XXXXXXXXX")
	reach(t, e, "key:third")
	waitFor(t, "2 events past the stuck one", func() bool { return len(got()) == 2 })
	g := got()
	sort.Strings(g)
	if fmt.Sprint(g) != "[key:other 80% key:third 80%]" {
		t.Fatalf("received %q", g)
	}
}

// TestCloseCountsQueued: events still queued when the Notifier closes are
// counted dropped; the one being sent is cancelled and counted failed.
func TestCloseCountsQueued(t *testing.T) {
	release := make(chan struct{})
	srv, _, stuckAt := gatedReceiver(t, "key:a", release)
	defer close(release)
	n, err := threshold.New(threshold.Options{URL: srv.URL, Secret: secret, Senders: 1, Timeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	e, err := core.NewEngine(store, core.Config{Policies: policies()}, core.Options{QuotaObserver: n})
	if err != nil {
		t.Fatal(err)
	}
	reach(t, e, "key:a")
	waitFor(t, "key:a's event at the receiver", func() bool { return stuckAt.Load() == 1 })
	reach(t, e, "key:b")
	reach(t, e, "key:c")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if s := n.Stats(); s != (threshold.Stats{Queued: 3, Dropped: 2, Failed: 1}) {
		t.Fatalf("stats %+v, want 3 queued, 2 dropped, 1 failed", s)
	}
}

// TestEndpointEvents: one policy's quota with thresholds 80 and 100
// limits both an API and one of its endpoints (two counters): the
// receiver gets exactly one event per counter and threshold, the
// endpoint's naming it, under ids of their own; a refund that takes the
// endpoint's counter back under 80 % and a request that reaches it again
// is the same event, not sent twice.
func TestEndpointEvents(t *testing.T) {
	rcv := newReceiver(t)
	n, err := threshold.New(threshold.Options{URL: rcv.srv.URL, Secret: secret, DataPlane: "dp1"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	defer store.Close()
	ps := policies()
	ps[0].Settle = true
	e, err := core.NewEngine(store, core.Config{Policies: ps, Endpoints: map[string][]core.Endpoint{
		"shop": {{Method: "POST", Path: "/complete", Policies: []string{"q"}}},
	}}, core.Options{QuotaObserver: n})
	if err != nil {
		t.Fatal(err)
	}
	c := &core.Consumer{ID: "key:a", Policies: []string{"q"}}
	ctx := context.Background()
	post := core.Route{Method: "POST", Path: "/complete"}
	// 8 at the endpoint (and the API): both reach 80 %.
	d, err := e.DecideRoute(ctx, c, "shop", post, 8)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	d.Hold.Settle(1) // back to 1 on both counters
	d, err = e.DecideRoute(ctx, c, "shop", post, 7)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	d.Hold.Release()
	d, err = e.DecideRoute(ctx, c, "shop", core.Route{Method: "GET", Path: "/"}, 2)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	// The endpoint counts 2 more (100 %); the API, at 10, refuses.
	d, err = e.DecideRoute(ctx, c, "shop", post, 2)
	if err != nil || d.Allowed || d.Quota.Limit != 10 || d.Quota.Remaining != 0 {
		t.Fatalf("%+v, %v: want refused by the API's quota", d, err)
	}
	waitFor(t, "4 events", func() bool { got, _ := rcv.events(); return len(got) >= 4 })
	time.Sleep(300 * time.Millisecond) // no more come
	rcv.mu.Lock()
	var got []string
	ids := map[string]bool{}
	for _, ev := range rcv.got {
		got = append(got, fmt.Sprintf("[%s] %d%% used=%d", ev.Endpoint, ev.Threshold, ev.Used))
		ids[ev.ID] = true
	}
	rcv.mu.Unlock()
	sort.Strings(got)
	// The API's counter: 8, settled to 1, +7 = 8 (80 % again: the same
	// event), +2 = 10 (100 %) at GET /; the endpoint's: 8, 1, 8 (again),
	// then 10 by the last POST, which the API refused after the endpoint
	// counted it (Engine.DecideRoute).
	want := []string{"[POST /complete] 100% used=10", "[POST /complete] 80% used=8", "[] 100% used=10", "[] 80% used=8"}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(ids) != 4 {
		t.Fatalf("received %q under %d ids, want %q under 4", got, len(ids), want)
	}
	if s := n.Stats(); s.Delivered != 4 || s.Duplicates != 2 {
		t.Fatalf("stats %+v: want 4 delivered, 2 duplicates (80 %% reached again on each counter)", s)
	}
}
