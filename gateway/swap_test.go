package gateway_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/limitplane/limitplane/spec"
)

// Keys of the swap test: kA's policy never changes; kV's policy changes
// its rate with every generation; kB exists only in even generations.
const (
	swapKeyA = "swap-key-a"
	swapKeyV = "swap-key-v"
	swapKeyB = "swap-key-b"
)

// swapBurst is kA's burst: with the clock frozen, exactly this many of
// kA's requests pass, across every swap.
const swapBurst = 50

// varRate is the rate of policy "var" in generation g, its marker in the
// RateLimit-Policy field: q=varRate(g).
func varRate(g int) int64 { return 1_000_000 + int64(g) }

// swapSnapshot is generation g: policy "var" with rate varRate(g); in even
// generations key kB and the API "even" (at /even/, builtin:echo) exist;
// policy "fixed", key kA and the API "stable" (at /stable/, a real
// upstream) are the same in every generation.
func swapSnapshot(g int, upstreamURL string) *spec.Snapshot {
	s := &spec.Snapshot{
		Revision: uint64(g + 1),
		Policies: []spec.Policy{
			{ID: "fixed", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(3600e9), Burst: swapBurst}},
			{ID: "var", Rate: &spec.Rate{Requests: varRate(g), Per: spec.Duration(1e9)}},
		},
		Keys: []spec.Key{
			{KeyHash: keyHash(swapKeyA), Policies: []string{"fixed"}},
			{KeyHash: keyHash(swapKeyV), Policies: []string{"var"}},
		},
		APIs: []spec.API{{ID: "stable", ListenPath: "/stable/", Target: upstreamURL}},
	}
	if g%2 == 0 {
		s.Keys = append(s.Keys, spec.Key{KeyHash: keyHash(swapKeyB), Policies: []string{"var"}})
		s.APIs = append(s.APIs, spec.API{ID: "even", ListenPath: "/even/", Target: spec.BuiltinEcho})
	}
	return s
}

var varPolicyRE = regexp.MustCompile(`^"var";q=(\d+);w=1$`)

// swapCheck is one kind of request of the swap test and what it may
// answer in generation g.
type swapCheck struct {
	path, key string
}

// valid reports whether a is a possible answer to c in some generation
// from lo to hi (the generation running when the request was sent, and
// the newest one being applied when its answer had been read), and says
// why not.
func (c swapCheck) valid(a answer, lo, hi int) error {
	if a.status >= 500 {
		return fmt.Errorf("%d %s", a.status, a.body)
	}
	marker := func() (int, error) {
		m := varPolicyRE.FindStringSubmatch(a.header.Get("RateLimit-Policy"))
		if m == nil {
			return 0, fmt.Errorf("RateLimit-Policy %q is not policy var's", a.header.Get("RateLimit-Policy"))
		}
		q, _ := strconv.ParseInt(m[1], 10, 64)
		g := int(q - varRate(0))
		if g < lo || g > hi {
			return g, fmt.Errorf("decided by generation %d's policy, outside %d..%d", g, lo, hi)
		}
		return g, nil
	}
	oddIn := hi > lo || lo%2 == 1 // some generation in lo..hi is odd
	switch {
	case c.key == swapKeyV && c.path == "/stable/x":
		if a.status != 200 || a.body != "upstream /x" {
			return fmt.Errorf("%d %q, want 200 from the upstream", a.status, a.body)
		}
		_, err := marker()
		return err
	case c.key == swapKeyB && c.path == "/stable/x":
		if a.status == 403 && oddIn {
			return nil // kB is unknown in odd generations
		}
		if a.status != 200 || a.body != "upstream /x" {
			return fmt.Errorf("%d %q, want 200 from the upstream or 403 in an odd generation", a.status, a.body)
		}
		g, err := marker()
		if err == nil && g%2 == 1 {
			err = fmt.Errorf("kB passed under odd generation %d's policy", g)
		}
		return err
	case c.path == "/even/x":
		if a.status == 404 && oddIn {
			return nil // no API at /even/ in odd generations
		}
		// A 401 or 403 here would be the even generations' route with an
		// odd generation's keys.
		if a.status != 200 || !strings.Contains(a.body, `"api": "even"`) {
			return fmt.Errorf("%d %q, want 200 from the echo API or 404 in an odd generation", a.status, a.body)
		}
		g, err := marker()
		if err == nil && g%2 == 1 {
			err = fmt.Errorf("/even/ served under odd generation %d's policy", g)
		}
		return err
	}
	return fmt.Errorf("no check for %v", c)
}

// TestSwapUnderLoad applies 100 generations of a snapshot (a policy's
// rate changed every time, a key and an API added and removed every other
// time) while 8 clients send requests as fast as they can through a real
// listener. No answer is a 5xx, every answer is one that a generation
// running during the request gives (so policies, keys and routes change
// together), and a key whose policy never changes keeps its count across
// every swap: exactly its burst passes.
func TestSwapUnderLoad(t *testing.T) {
	const (
		clients     = 8
		generations = 100
		// perSwap requests are answered between two applies, so that
		// every generation serves traffic.
		perSwap = 16
	)
	up := upstream(t)
	g := newTestGateway(t)
	var applying, applied atomic.Int64
	g.apply(t, swapSnapshot(0, up.URL))

	checks := []swapCheck{
		{"/stable/x", swapKeyV}, {"/stable/x", swapKeyB}, {"/even/x", swapKeyB}, {"/even/x", swapKeyV},
	}
	var (
		stop                         = make(chan struct{})
		progress                     = make(chan struct{}, 4096)
		wg                           sync.WaitGroup
		mu                           sync.Mutex
		problems                     []string
		admittedA, deniedA, requests atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := i; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if n%(len(checks)+1) == len(checks) {
					// kA, whose policy never changes.
					a, err := g.get("/stable/x", swapKeyA)
					switch {
					case err != nil:
						fail("kA: %v", err)
					case a.status == 200:
						admittedA.Add(1)
					case a.status == 429:
						deniedA.Add(1)
					default:
						fail("kA: %d %s", a.status, a.body)
					}
				} else {
					c := checks[n%(len(checks)+1)]
					lo := int(applied.Load())
					a, err := g.get(c.path, c.key)
					hi := int(applying.Load())
					if err != nil {
						fail("%s %s: %v", c.key, c.path, err)
					} else if err := c.valid(a, lo, hi); err != nil {
						fail("%s %s in generations %d..%d: %v", c.key, c.path, lo, hi, err)
					}
				}
				requests.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	for gen := 1; gen <= generations; gen++ {
		for range perSwap {
			<-progress
		}
		applying.Store(int64(gen))
		g.apply(t, swapSnapshot(gen, up.URL))
		applied.Store(int64(gen))
	}
	for range perSwap {
		<-progress
	}
	close(stop)
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}
	// Spend what is left of kA's burst, if the clients did not.
	tail := 0
	for {
		a := g.mustGet(t, "/stable/x", swapKeyA)
		if a.status == 429 {
			break
		}
		if a.status != 200 {
			t.Fatalf("kA after the swaps: %d %s", a.status, a.body)
		}
		tail++
	}
	if got := admittedA.Load() + int64(tail); got != swapBurst {
		t.Errorf("kA was admitted %d times across %d swaps (%d during, %d after), want exactly %d",
			got, generations, admittedA.Load(), tail, swapBurst)
	}
	if got := g.gw.Snapshot().Revision; got != generations+1 {
		t.Errorf("running revision %d, want %d", got, generations+1)
	}
	t.Logf("%d requests, kA %d admitted and %d denied during the swaps", requests.Load(), admittedA.Load(), deniedA.Load())
}
