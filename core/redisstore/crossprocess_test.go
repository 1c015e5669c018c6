package redisstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

// workerEnv names the Redis address a re-executed test binary works
// against; when set, TestMain runs worker instead of the tests.
const workerEnv = "REDISSTORE_TEST_WORKER_ADDR"

func TestMain(m *testing.M) {
	// The fault tests kill redis-server on purpose; go-redis would log every
	// refused dial ("failed to dial after N attempts") to stderr. Drop those
	// lines only, so anything else go-redis says still shows.
	redis.SetLogger(logging.NewBlacklistLogger([]string{"failed to dial"}))
	if addr := os.Getenv(workerEnv); addr != "" {
		worker(addr)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// workerResult is one Take as a worker reports it.
type workerResult struct {
	Allowed   bool
	Remaining int64
	Retry     time.Duration
	Err       string
}

// crossLimit is issue 3's: 10 per minute.
var crossLimit = core.PerMinute(10)

// worker is a separate process with its own client and pool: for each
// consumer id read from stdin it fires 50 concurrent Takes and prints the
// results as one JSON line.
func worker(addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 50})
	defer c.Close()
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	rule, err := s.Prepare(core.LimitSet{Rate: crossLimit})
	if err != nil {
		panic(err)
	}
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		id := in.Text()
		res := make([]workerResult, 50)
		var wg sync.WaitGroup
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := s.Take(context.Background(), core.Request{Consumer: id, Rule: rule, Cost: 1})
				res[i] = workerResult{Allowed: d.Allowed, Remaining: d.Remaining, Retry: d.RetryAfter}
				if err != nil {
					res[i].Err = err.Error()
				}
			}()
		}
		wg.Wait()
		if err := out.Encode(res); err != nil {
			panic(err)
		}
	}
}

// TestExactAcrossProcesses is issue 3's exactness check: 3 processes, 50
// requests each within a few milliseconds against one consumer limited to
// 10 per minute: exactly 10 allowed, with Remaining 9…0 and no repeats;
// repeated for 40 consumers.
func TestExactAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	const procs, rounds = 3, 40
	type proc struct {
		in  io.Writer
		out *bufio.Scanner
	}
	ps := make([]proc, procs)
	for i := range ps {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+srv.Addr)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Wait() })
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		ps[i] = proc{stdin, sc}
	}
	for r := 0; r < rounds; r++ {
		id := fmt.Sprintf("cross-%d-%d", r, time.Now().UnixNano())
		for _, p := range ps { // all three start the round at once
			if _, err := fmt.Fprintln(p.in, id); err != nil {
				t.Fatal(err)
			}
		}
		var remaining []int64
		denied := 0
		for i, p := range ps {
			if !p.out.Scan() {
				t.Fatalf("worker %d: no reply: %v", i, p.out.Err())
			}
			var res []workerResult
			if err := json.Unmarshal(p.out.Bytes(), &res); err != nil {
				t.Fatalf("worker %d: %v: %s", i, err, p.out.Bytes())
			}
			for _, x := range res {
				switch {
				case x.Err != "":
					t.Fatalf("round %d worker %d: %s", r, i, x.Err)
				case x.Allowed:
					remaining = append(remaining, x.Remaining)
				default:
					denied++
					if x.Remaining != 0 || x.Retry <= 0 || x.Retry > 6*time.Second {
						t.Fatalf("round %d: denial %+v", r, x)
					}
				}
			}
		}
		sort.Slice(remaining, func(i, j int) bool { return remaining[i] < remaining[j] })
		if len(remaining) != 10 || denied != 140 {
			t.Fatalf("round %d: %d allowed (remaining %v), %d denied; want exactly 10 and 140", r, len(remaining), remaining, denied)
		}
		for i, v := range remaining {
			if v != int64(i) {
				t.Fatalf("round %d: remaining values %v, want 0…9 once each", r, remaining)
			}
		}
	}
}
