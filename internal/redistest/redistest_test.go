package redistest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t, nil)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ConfigGet(ctx, "save").Result()
	if err != nil {
		t.Fatal(err)
	}
	if cfg["save"] != "" {
		t.Fatalf("save = %q, want persistence off", cfg["save"])
	}
	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil || n != 0 {
		t.Fatalf("EXISTS k after restart = %d, %v; want 0 (no persistence)", n, err)
	}
}

func TestCluster(t *testing.T) {
	cl := StartCluster(t, 3)
	c := cl.Client(t, nil)
	ctx := context.Background()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "cluster_known_nodes:3") || !strings.Contains(info, "cluster_size:3") {
		t.Fatalf("cluster info:\n%s", info)
	}
	var masters atomic.Int32
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { masters.Add(1); return m.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	if masters.Load() != 3 {
		t.Fatalf("masters = %d, want 3", masters.Load())
	}
}

// TestPauseResume: a paused server answers nothing (a call times out) and
// keeps its data; after Resume it answers with it; Stop ends a paused
// server at once.
func TestPauseResume(t *testing.T) {
	s := Start(t)
	c := s.Client(t, &redis.Options{ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	if err := c.Get(ctx, "k").Err(); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("GET while paused: %v, want a timeout", err)
	}
	s.Resume()
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after Resume = %q, %v; want v", v, err)
	}
	s.Pause()
	start := time.Now()
	s.Stop()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Stop of a paused server took %v", d)
	}
}

// TestPortTakenByAnotherServer: a server launched on a port another
// redis-server already serves is not taken for ready because the other
// one answers its PING (as when another test process's server binds the
// port found free first); launch fails, naming both processes, and Start
// would try another port.
func TestPortTakenByAnotherServer(t *testing.T) {
	other := Start(t)
	s := &Server{t: t, Dir: t.TempDir(), Port: other.Port, Addr: other.Addr}
	err := s.launch()
	if err == nil {
		s.Stop()
		t.Fatal("launch on a port another redis-server serves: ready, want an error")
	}
	if !strings.Contains(err.Error(), "is served by another redis-server") && !strings.Contains(err.Error(), "exited during start-up") {
		t.Fatalf("launch: %v", err)
	}
	if err := other.Client(t, nil).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the other server: %v", err)
	}
}
