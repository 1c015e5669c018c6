package drl

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/internal/redistest"
)

// testWire is a wire of its own client (a gateway) on srv.
func testWire(t *testing.T, srv *redistest.Server, group, gateway string, h time.Duration) *wire {
	t.Helper()
	return &wire{c: srv.Client(t, nil), k: keysFor(group), gateway: gateway, h: h, keep: 30 * h}
}

// TestElectionExclusive: of candidates running for the lease at once,
// exactly one gets a token, every round; only the holder's lease value
// publishes, and a publish with a lapsed lease's value, or a token from
// before Redis lost its data, is refused by Redis itself.
func TestElectionExclusive(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const candidates, rounds = 6, 40
	ws := make([]*wire, candidates)
	for i := range ws {
		ws[i] = testWire(t, srv, "g1", "gw"+string(rune('a'+i)), time.Hour)
	}
	admin := srv.Client(t, nil)
	var lastToken uint64
	for r := 0; r < rounds; r++ {
		tokens := make([]uint64, candidates)
		values := make([]string, candidates)
		var wg sync.WaitGroup
		for i, w := range ws {
			wg.Go(func() {
				var err error
				tokens[i], values[i], err = w.elect(ctx, "nonce"+string(rune('a'+i)))
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		winner := -1
		for i, tok := range tokens {
			if tok == 0 {
				continue
			}
			if winner >= 0 {
				t.Fatalf("round %d: candidates %d and %d both won (tokens %d, %d)", r, winner, i, tokens[winner], tok)
			}
			winner = i
		}
		if winner < 0 || tokens[winner] != lastToken+1 {
			t.Fatalf("round %d: winner %d with token %v, want exactly one with token %d", r, winner, tokens, lastToken+1)
		}
		lastToken = tokens[winner]
		// A loser's publish, under a lease value it does not hold, is
		// refused; the winner's goes through.
		loser := (winner + 1) % candidates
		tab := &Table{Epoch: uint64(r + 1), Token: tokens[winner]}
		if ok, err := ws[loser].publish(ctx, strings.Replace(values[winner], "nonce", "other", 1), &Table{Epoch: 999, Token: tokens[winner]}); err != nil || ok {
			t.Fatalf("round %d: a loser's publish: %v, %v; want refused", r, ok, err)
		}
		if ok, err := ws[winner].publish(ctx, values[winner], tab); err != nil || !ok {
			t.Fatalf("round %d: the winner's publish: %v, %v", r, ok, err)
		}
		if got, _, err := ws[loser].readTable(ctx); err != nil || got == nil || got.Epoch != tab.Epoch || got.Token != tab.Token {
			t.Fatalf("round %d: table in Redis %+v, %v; want the winner's epoch %d", r, got, err, tab.Epoch)
		}
		// The lease lapses (as if its holder died): the next round elects
		// another, and the old value can no longer publish or renew.
		if err := admin.Del(ctx, ws[0].k.lease).Err(); err != nil {
			t.Fatal(err)
		}
		if r == rounds-1 {
			next, nextValue, err := ws[loser].elect(ctx, "fresh")
			if err != nil || next != lastToken+1 {
				t.Fatalf("election after the lapse: token %d, %v; want %d", next, err, lastToken+1)
			}
			if ok, err := ws[winner].publish(ctx, values[winner], &Table{Epoch: 1000, Token: tokens[winner]}); err != nil || ok {
				t.Fatalf("a publish under a lapsed lease: %v, %v; want refused", ok, err)
			}
			if ok, err := ws[winner].renew(ctx, values[winner]); err != nil || ok {
				t.Fatalf("renewing a lapsed lease: %v, %v; want refused", ok, err)
			}
			if ok, err := ws[loser].renew(ctx, nextValue); err != nil || !ok {
				t.Fatalf("renewing the lease held: %v, %v", ok, err)
			}
		}
	}

	// Redis loses its data: tokens count from 1 again, and the nonce keeps
	// the holder of token 1 from before from publishing under the new one.
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const oldValue = "1:before" // the lease value of token 1 of before
	tok, value, err := ws[1].elect(ctx, "after")
	if err != nil || tok != 1 || value != "1:after" {
		t.Fatalf("election after a flush: %d %q, %v; want token 1", tok, value, err)
	}
	if ok, err := ws[0].publish(ctx, oldValue, &Table{Epoch: 5, Token: 1}); err != nil || ok {
		t.Fatalf("token 1 of before the flush publishing: %v, %v; want refused", ok, err)
	}
}

// TestReportCall: the report call writes the report with a TTL of 2H +
// H/2, stamps the gateway in the ZSET, and returns the table in force:
// none, the known one (version only), or another (whole).
func TestReportCall(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const h = 400 * time.Millisecond
	w := testWire(t, srv, "g2", "gw-a", h)
	rep := &Report{Gateway: "gw-a", Keys: map[KeyID]KeyDemand{"k": {Limit: KeyLimit{Rate: 100, Burst: 10}, Demand: 42}}}
	tab, ver, err := w.report(ctx, rep, "")
	if err != nil || tab != nil || ver != "" {
		t.Fatalf("report with no table: %v %q %v", tab, ver, err)
	}
	ttl, err := w.c.PTTL(ctx, w.k.report+"gw-a").Result()
	if err != nil || ttl <= 900*time.Millisecond || ttl > time.Second {
		t.Fatalf("report PTTL %v, %v; want in (900ms, 1s] (2H + H/2 with H 400ms)", ttl, err)
	}
	if _, err := w.c.ZScore(ctx, w.k.gateways, "gw-a").Result(); err != nil {
		t.Fatalf("gateway not in the ZSET: %v", err)
	}
	val, _, err := w.elect(ctx, "n")
	if err != nil || val == 0 {
		t.Fatal(val, err)
	}
	lease, _ := w.c.Get(ctx, w.k.lease).Result()
	published := &Table{Epoch: 3, Token: val, Line: 0xabc, Keys: map[KeyID]KeyShares{"k": {Limit: KeyLimit{Rate: 100, Burst: 10}, Shares: map[string]Share{"gw-a": {Rate: 60, Burst: 6}}}}}
	if ok, err := w.publish(ctx, lease, published); err != nil || !ok {
		t.Fatal(ok, err)
	}
	tab, ver, err = w.report(ctx, rep, "")
	if err != nil || tab == nil || ver != "3:1:abc" || tab.Keys["k"].Shares["gw-a"] != (Share{Rate: 60, Burst: 6}) {
		t.Fatalf("report with a new table: %+v %q %v", tab, ver, err)
	}
	tab, ver, err = w.report(ctx, rep, "3:1:abc")
	if err != nil || tab != nil || ver != "3:1:abc" {
		t.Fatalf("report with the known table: %+v %q %v; want the version only", tab, ver, err)
	}
	st, err := testWire(t, srv, "g2", "other", h).readState(ctx)
	if err != nil || len(st.reports) != 1 || st.reports[0].Keys["k"].Demand != 42 {
		t.Fatalf("state: %+v, %v", st, err)
	}
	// Once the TTL has passed, the report is gone and the gateway is no
	// longer live.
	time.Sleep(time.Second + 50*time.Millisecond)
	st, err = testWire(t, srv, "g2", "other", h).readState(ctx)
	if err != nil || len(st.reports) != 0 {
		t.Fatalf("state after the TTL: %+v, %v; want no live report", st, err)
	}
}

// countCalls returns Redis's command counts (INFO commandstats), without
// INFO itself.
func countCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				var n int64
				for _, c := range v {
					n = n*10 + int64(c-'0')
				}
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out
}

// TestReportTTLRoundsUp: a report lives at least 2H + H/2 in Redis (the
// Limiter starts a new run once that may have passed): the TTL in
// milliseconds rounds up.
func TestReportTTLRoundsUp(t *testing.T) {
	for h, want := range map[time.Duration]int64{time.Second: 2500, 1500 * time.Microsecond: 4, time.Millisecond: 3, 10 * time.Millisecond: 25} {
		if got := (&wire{h: h}).reportPX(); got != want {
			t.Errorf("H %v: report TTL %d ms, want %d", h, got, want)
		}
	}
}
