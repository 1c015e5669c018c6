package gateway_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/redistest"
)

// TestOpenStoreDRL: with StoreOptions.DRL, OpenStore returns a drl.Store
// in front of the Redis store, on its client; what the DRL does not
// decide in memory, Redis decides; closing closes the DRL first, while
// the client still answers (it deletes its report and leaves its group),
// then the Redis store and client. A drl.New error fails OpenStore, and
// the in-process store ignores DRL.
func TestOpenStoreDRL(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t, nil)
	ctx := context.Background()
	s, closeStore, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: "redis://" + srv.Addr, FailurePolicy: core.FailClosed,
		DRL: &drl.Options{Group: "g1", GatewayID: "gw1", Interval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	d, ok := s.(*drl.Store)
	if !ok {
		t.Fatalf("OpenStore returned %T, want *drl.Store", s)
	}
	if _, ok := d.Exact().(*redisstore.Store); !ok || d.GatewayID() != "gw1" {
		t.Fatalf("exact store %T, gateway %q; want the Redis store and gw1", d.Exact(), d.GatewayID())
	}
	var allowed int
	for range 3 {
		dec, err := core.TakeCall(ctx, s, core.Call{Consumer: "c", Rate: core.Limit{Rate: 2, Period: time.Minute}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if dec.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("allowed %d of 3, want 2 decided by Redis", allowed)
	}
	report := "limitplane:drl:{g1}:report:gw1"
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := admin.Exists(ctx, report).Result(); n != 1; n, _ = admin.Exists(ctx, report).Result() {
		if time.Now().After(deadline) {
			t.Fatal("no DRL report in Redis after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := closeStore(); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Exists(ctx, report).Result(); err != nil || n != 0 {
		t.Fatalf("after close: report exists %d (%v), want deleted by the DRL's Close, the client still open", n, err)
	}
	if err := d.Exact().(*redisstore.Store).Ping(ctx); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("PING through the Redis store after close: %v, want redis.ErrClosed", err)
	}

	_, _, err = gateway.OpenStore(ctx, gateway.StoreOptions{URL: "redis://" + srv.Addr, DRL: &drl.Options{Group: "{bad}"}})
	if err == nil || !strings.HasPrefix(err.Error(), "gateway: store redis://"+srv.Addr+": drl: New: ") {
		t.Fatalf("a bad DRL group: err %v, want drl.New's error with the store's name", err)
	}

	m, closeMem, err := gateway.OpenStore(ctx, gateway.StoreOptions{URL: "memory", DRL: &drl.Options{}})
	if err != nil || m == nil {
		t.Fatalf("memory store: %T, %v", m, err)
	}
	if _, isDRL := m.(*drl.Store); isDRL {
		t.Fatal("memory store: a drl.Store, want the in-process store alone")
	}
	if err := closeMem(); err != nil {
		t.Fatal(err)
	}
}
