package drl

import (
	"context"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestHoldKeptWhenLoadRetried: an allocator elected on a Redis with no
// table publishes nothing for 2H + a call's timeout, also when the load in
// elect failed and step loads (finding no table): step then starts the
// hold and publishes nothing (it published at once before), and the first
// table comes once the hold is over.
func TestHoldKeptWhenLoadRetried(t *testing.T) {
	srv := redistest.Start(t)
	clock := core.NewManualClock(int64(time.Hour))
	g := startGateway(t, srv, Options{Group: "hold", Interval: time.Second}, seams{manual: true, clock: clock})
	g.client.AddHook(&failOnce{cmd: "mget", match: "tablever"}) // Store.load's readTable
	admin := srv.Client(t, nil)
	ctx := context.Background()
	start := clock.Nanotime()
	g.tick(ctx) // report, elect, load fails
	if !g.allocator.Load() {
		t.Fatal("not elected")
	}
	// The first step (at 250 ms) loads, finds no table and holds until
	// 250 ms + 2H + H/2 = 2.75 s.
	for {
		clock.Advance(250 * time.Millisecond)
		g.tick(ctx)
		since := time.Duration(clock.Nanotime() - start)
		_, e := tableToken(t, admin, "hold")
		if since < 2750*time.Millisecond {
			if e != 0 {
				t.Fatalf("table epoch %d published %v after election, within the 2H+timeout hold", e, since)
			}
			continue
		}
		if e != 1 || since != 2750*time.Millisecond {
			t.Fatalf("%v after election: table epoch %d, want epoch 1 at 2.75 s, when the hold ends", since, e)
		}
		return
	}
}
