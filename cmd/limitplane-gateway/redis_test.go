package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redisKey returns the Redis key of consumer's counter of the given kind
// ("gcra", "fw", "sw", "sl", "quota") for key-wide counters, as DESIGN.md
// lays keys out: prefix, the consumer's hash in a hash tag, kind, scope.
func redisKey(prefix, consumer, kind string) string {
	h := sha256.Sum256([]byte(consumer))
	return prefix + "{" + hex.EncodeToString(h[:])[:32] + "}:" + kind + ":"
}

// keyConsumer is the consumer ID of an API key.
func keyConsumer(key string) string { return identity.HashKey(key).ConsumerID() }

// keys returns every key in the Redis c talks to, sorted.
func keys(t *testing.T, c redis.UniversalClient) []string {
	t.Helper()
	var all []string
	scan := func(ctx context.Context, n *redis.Client) error {
		ks, err := n.Keys(ctx, "*").Result()
		all = append(all, ks...)
		return err
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex // ForEachMaster calls concurrently
		err = cc.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		})
	} else {
		err = scan(context.Background(), c.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	return all
}

// checkKeys compares the keys in Redis with want (in any order).
func checkKeys(t *testing.T, c redis.UniversalClient, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := keys(t, c); !slices.Equal(got, want) {
		t.Errorf("redis keys:\n got %q\nwant %q", got, want)
	}
}

// slowRedisOK gives the gateways of tests that count exact answers a Redis
// timeout far above the 250ms default: under -race, with 50 clients on two
// CPUs, a call can take longer, and the default failure policy (open) would
// then let a request through uncounted, which such a test reports as a
// wrong answer rather than a slow one.
const slowRedisOK = "redis: {timeout: 10s}\n"

// TestRedisTwoGatewaysOneLimit: two gateways (two run calls, two ports)
// share one redis-server; 50 concurrent clients split across them send 500
// requests for one key at 100 per 10s, burst 100: exactly 100 pass, each
// seeing a different remaining count, and 400 get the same exact 429, as
// with one gateway. Redis holds one key, named by the key's hash only.
// When both gateways have shut down, they have closed their connections.
func TestRedisTwoGatewaysOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	cfg := writeConfig(t, "store: redis://"+srv.Addr+"/0\n"+slowRedisOK+concurrentConfig)
	e := frozen() // one clock for both, as if they read one Redis TIME
	gw1 := start(t, e, "-config", cfg)
	gw2 := start(t, e, "-config", cfg)
	if want := "(config: " + cfg + ", store: redis://" + srv.Addr + "/0" + engineNote() + ")"; !strings.Contains(gw1.stdout.String(), want) {
		t.Errorf("banner %q does not say %q", gw1.stdout, want)
	}

	checkExact(t, hammerAll(t, []string{gw1.base + "/echo/hello", gw2.base + "/echo/hello"}, 50, 500, "X-API-Key", "k-e2e"))
	checkKeys(t, rc, redisKey("limitplane:", keyConsumer("k-e2e"), "gcra"))

	for _, gw := range []*running{gw1, gw2} {
		if err := gw.stop(); err != nil {
			t.Fatal(err)
		}
	}
	// Only the test's own connection is left (the server sees the
	// gateways' connections close a moment after they do).
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := rc.ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(strings.TrimSpace(list), "\n") + 1; n == 1 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d client connections left after both gateways stopped:\n%s", n, list)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisTwoGatewaysRealClock is the same load with the gateways'
// clocks untouched, so Redis TIME decides: the limit may refill one
// request per 100ms while the test runs, and never more.
func TestRedisTwoGatewaysRealClock(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeConfig(t, "store: redis://"+srv.Addr+"/0\nredis: {pipeline: 16, timeout: 10s}\n"+concurrentConfig)
	gw1, gw2 := start(t, env{}, "-config", cfg), start(t, env{}, "-config", cfg)
	begin := time.Now()
	replies := hammerAll(t, []string{gw1.base + "/echo/hello", gw2.base + "/echo/hello"}, 50, 500, "X-API-Key", "k-e2e")
	elapsed := time.Since(begin)
	checkRealClockReplies(t, replies, elapsed)
}

// TestRedisCluster: two gateways on a 3-master Redis Cluster
// (redis+cluster://), 20 concurrent clients, 200 requests for each of two
// keys, one GCRA at 20 a minute and one sliding window at 10 a minute:
// exactly 20 and 10 pass. Each key's counter sits on the node its hash
// tag names.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cfg := writeConfig(t, "store: redis+cluster://"+strings.Join(cl.Addrs(), ",")+"\n"+`
redis: {key_prefix: "gw:"}
policies:
  - {id: g, rate: {requests: 20, per: 1m}}
  - {id: w, rate: {requests: 10, per: 1m, algorithm: sliding_window}}
keys:
  - {key: k-gcra, policies: [g]}
  - {key: k-window, policies: [w]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`)
	e := frozen()
	gw1, gw2 := start(t, e, "-config", cfg), start(t, e, "-config", cfg)
	urls := []string{gw1.base + "/echo/", gw2.base + "/echo/"}
	for _, tc := range []struct {
		key     string
		allowed int
	}{{"k-gcra", 20}, {"k-window", 10}} {
		n := 0
		remaining := map[string]bool{}
		for _, r := range hammerAll(t, urls, 20, 200, "X-API-Key", tc.key) {
			switch r.status {
			case http.StatusOK:
				n++
				remaining[r.header.Get("RateLimit")] = true
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s: status %d: %s", tc.key, r.status, r.body)
			}
		}
		if n != tc.allowed || len(remaining) != tc.allowed {
			t.Errorf("%s: %d allowed with %d different RateLimit values, want exactly %d of each", tc.key, n, len(remaining), tc.allowed)
		}
	}
	checkKeys(t, cl.Client(t, nil), redisKey("gw:", keyConsumer("k-gcra"), "gcra"), redisKey("gw:", keyConsumer("k-window"), "sw"))
}

// TestRedisWindowAlgorithms: with Redis the window algorithms are valid
// and enforced: 3 a minute, the 4th is refused until the window allows
// one more.
func TestRedisWindowAlgorithms(t *testing.T) {
	srv := redistest.Start(t)
	gw := start(t, frozen(), "-config", writeConfig(t, "store: redis://"+srv.Addr+"\n"+slowRedisOK+`
policies:
  - {id: fixed, rate: {requests: 3, per: 1m, algorithm: fixed_window}}
  - {id: sliding, rate: {requests: 3, per: 1m, algorithm: sliding_window}}
  - {id: log, rate: {requests: 3, per: 1m, algorithm: sliding_log}}
keys:
  - {key: kf, policies: [fixed]}
  - {key: ks, policies: [sliding]}
  - {key: kl, policies: [log]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`))
	for _, tc := range []struct {
		key, policy string
		t, retry    int // RateLimit t while allowed; Retry-After of the 4th
	}{
		// The window opens at the first request and closes a minute later.
		{"kf", "fixed", 60, 60},
		// The frozen clock sits at a window boundary: the three requests
		// weigh on the next window too, fading out over its minute; a 4th
		// fits once the estimate 3×(1 − x/60) is at most 2, x = 20s into it.
		{"ks", "sliding", 120, 80},
		// The oldest entry leaves the log a minute after it was written.
		{"kl", "log", 60, 60},
	} {
		for i := 2; i >= 0; i-- {
			r := get(t, nil, gw.base+"/echo/", "X-API-Key", tc.key)
			if r.status != 200 {
				t.Fatalf("%s: status %d %s", tc.policy, r.status, r.body)
			}
			checkHeaders(t, tc.policy, r.header, map[string]string{
				"RateLimit-Policy": fmt.Sprintf(`"%s";q=3;w=60`, tc.policy),
				"RateLimit":        fmt.Sprintf(`"%s";r=%d;t=%d`, tc.policy, i, tc.t),
			})
		}
		r := get(t, nil, gw.base+"/echo/", "X-API-Key", tc.key)
		if r.status != 429 {
			t.Fatalf("%s: 4th request: status %d, want 429", tc.policy, r.status)
		}
		checkHeaders(t, tc.policy+" 4th", r.header, map[string]string{
			"Retry-After": strconv.Itoa(tc.retry),
			"RateLimit":   fmt.Sprintf(`"%s";r=0;t=%d`, tc.policy, tc.retry),
		})
	}
	rc := srv.Client(t, nil)
	checkKeys(t, rc, redisKey("limitplane:", keyConsumer("kf"), "fw"), redisKey("limitplane:", keyConsumer("ks"), "sw"),
		redisKey("limitplane:", keyConsumer("kl"), "sl"))
}

// faultConfig is the config of the fault tests: keys a..d with 3 a
// minute, and a probe key with room to spare.
const faultConfig = `
failure_policy: %s
redis: {timeout: 500ms, breaker_failures: 3, breaker_cooldown: 50ms}
policies:
  - {id: p, rate: {requests: 3, per: 1m}}
  - {id: probe, rate: {requests: 1000, per: 1m}}
keys:
  - {key: a, policies: [p]}
  - {key: b, policies: [p]}
  - {key: c, policies: [p]}
  - {key: probe, policies: [probe]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`

// exactly3 checks that key gets 3 passes with r=2, 1, 0 from policy p and
// then a 429.
func exactly3(t *testing.T, what, base, key string) {
	t.Helper()
	for i := 2; i >= 0; i-- {
		r := get(t, nil, base+"/echo/", "X-API-Key", key)
		if r.status != 200 || r.header.Get("RateLimit") != fmt.Sprintf(`"p";r=%d;t=%d`, i, (3-i)*20) {
			t.Fatalf("%s: key %s: %d RateLimit %q, want 200 with r=%d", what, key, r.status, r.header.Get("RateLimit"), i)
		}
	}
	r := get(t, nil, base+"/echo/", "X-API-Key", key)
	if r.status != 429 || r.header.Get("Retry-After") != "20" {
		t.Fatalf("%s: key %s: 4th request %d Retry-After %q, want 429 and 20", what, key, r.status, r.header.Get("Retry-After"))
	}
}

// recovered sends probe requests until one has reached the restarted
// Redis (which starts empty), i.e. until the store is back.
func recovered(t *testing.T, base string, rc *redis.Client) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		get(t, nil, base+"/echo/", "X-API-Key", "probe")
		if n, err := rc.DBSize(context.Background()).Result(); err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway did not go back to Redis within 15s of its restart")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRedisFailurePolicies kills redis-server under a running gateway:
// fail-closed answers 503 with a JSON body (never 429), fail-open lets
// everything through without rate-limit fields, fallback keeps limiting in
// memory, from the state of the gateway's last Redis replies. After a restart on the same port limiting resumes through Redis
// without restarting the gateway.
func TestRedisFailurePolicies(t *testing.T) {
	for _, pol := range []string{"closed", "open", "fallback"} {
		t.Run(pol, func(t *testing.T) {
			srv := redistest.Start(t)
			rc := srv.Client(t, nil)
			gw := start(t, frozen(), "-config", writeConfig(t, "store: redis://"+srv.Addr+"\n"+fmt.Sprintf(faultConfig, pol)))
			exactly3(t, "before the kill", gw.base, "a")
			checkKeys(t, rc, redisKey("limitplane:", keyConsumer("a"), "gcra"))

			srv.Kill()
			for i := 0; i < 10; i++ { // enough to open the breaker and fail fast
				switch r := get(t, nil, gw.base+"/echo/", "X-API-Key", "a"); pol {
				case "closed":
					if r.status != 503 || r.body != `{"error":"rate limit store unavailable"}`+"\n" {
						t.Fatalf("request %d while down: %d %q, want 503 JSON", i, r.status, r.body)
					}
					checkHeaders(t, "503", r.header, map[string]string{"Content-Type": "application/json", "RateLimit": "", "Retry-After": ""})
				case "open":
					if r.status != 200 {
						t.Fatalf("request %d while down: %d %q, want 200", i, r.status, r.body)
					}
					checkHeaders(t, "open", r.header, map[string]string{"RateLimit": "", "RateLimit-Policy": "", "Retry-After": ""})
				case "fallback":
					// a spent its 3 through Redis, and the fallback store
					// carries on from that: 429 (a fresh key gets 3, below).
					if r.status != 429 {
						t.Fatalf("request %d while down: %d, want 429", i, r.status)
					}
				}
			}
			if pol == "fallback" {
				exactly3(t, "fallback while down", gw.base, "b")
			}
			if out := gw.stderr.String(); !strings.Contains(out, "limit store failed") || !strings.Contains(out, `msg="redis circuit breaker opened: deciding by failure_policy until Redis answers" from=closed to=open`) {
				t.Errorf("stderr does not log the failures and the open breaker:\n%s", out)
			}

			srv.Restart(t)
			recovered(t, gw.base, rc)
			exactly3(t, "after the restart", gw.base, "c")
			checkKeys(t, rc, redisKey("limitplane:", keyConsumer("probe"), "gcra"), redisKey("limitplane:", keyConsumer("c"), "gcra"))
		})
	}
}

// TestRedisDownAtStartup: with Redis unreachable, failure_policy closed
// refuses to start; open and fallback start (saying so on stderr) and go
// over to Redis once it answers.
func TestRedisDownAtStartup(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	url := "redis://" + srv.Addr + "/0"

	err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-config", writeConfig(t, "store: "+url+"\n"+fmt.Sprintf(faultConfig, "closed"))},
		env{stdout: newOutput(), stderr: newOutput()})
	want := "gateway: store " + url + ": redis is unreachable: dial tcp " + srv.Addr + ": connect: connection refused (failure_policy closed: not starting)"
	if err == nil || err.Error() != want {
		t.Fatalf("closed:\n got %v\nwant %s", err, want)
	}

	for _, pol := range []string{"open", "fallback"} {
		t.Run(pol, func(t *testing.T) {
			gw := start(t, frozen(), "-config", writeConfig(t, "store: "+url+"\n"+fmt.Sprintf(faultConfig, pol)))
			if out := gw.stderr.String(); !strings.Contains(out, `msg="redis is unreachable; starting degraded until it answers" store=`+url+" failure_policy="+pol+
				` err="redis is unreachable: dial tcp `+srv.Addr+`: connect: connection refused"`) {
				t.Errorf("stderr:\n%s", out)
			}
			r := get(t, nil, gw.base+"/echo/", "X-API-Key", "a")
			if want := map[string]string{"open": "", "fallback": `"p";r=2;t=20`}[pol]; r.status != 200 || r.header.Get("RateLimit") != want {
				t.Fatalf("while down: %d RateLimit %q, want 200 and %q", r.status, r.header.Get("RateLimit"), want)
			}
		})
	}
	srv.Restart(t)
	rc := srv.Client(t, nil)
	gw := start(t, frozen(), "-config", writeConfig(t, "store: "+url+"\n"+fmt.Sprintf(faultConfig, "closed")))
	exactly3(t, "closed, Redis up", gw.base, "a")
	checkKeys(t, rc, redisKey("limitplane:", keyConsumer("a"), "gcra"))
}

// TestRedisPasswordFromEnv: a password-protected Redis, its password given
// by redis.password_env; without it, or with a wrong one, Redis refuses the
// gateway, which does not start under any failure_policy and says
// "authentication failed"; the password never shows in the banner or an
// error.
func TestRedisPasswordFromEnv(t *testing.T) {
	const pw = "s3cret/p@ss"
	srv := redistest.Start(t)
	// Set the password once the server is up (redistest's readiness check
	// does not authenticate).
	if err := srv.Client(t, nil).ConfigSet(context.Background(), "requirepass", pw).Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LP_TEST_REDIS_PW", pw)
	withPW := writeConfig(t, "store: redis://"+srv.Addr+"/0\n"+
		strings.Replace(fmt.Sprintf(faultConfig, "closed"), "redis: {", "redis: {password_env: LP_TEST_REDIS_PW, ", 1))
	gw := start(t, frozen(), "-config", withPW)
	exactly3(t, "with the password", gw.base, "a")
	if strings.Contains(gw.stdout.String(), pw) || strings.Contains(gw.stderr.String(), pw) {
		t.Errorf("the password shows in the gateway's output")
	}

	t.Setenv("LP_TEST_REDIS_BAD_PW", "not-"+pw)
	for _, pol := range []string{"closed", "open", "fallback"} {
		cfg := "store: redis://" + srv.Addr + "/0\n" + fmt.Sprintf(faultConfig, pol)
		wrong := strings.Replace(cfg, "redis: {", "redis: {password_env: LP_TEST_REDIS_BAD_PW, ", 1)
		for _, tc := range []struct{ name, cfg, want string }{
			{"without the password", cfg, "NOAUTH Authentication required."},
			{"with a wrong password", wrong, "WRONGPASS invalid username-password pair or user is disabled."},
		} {
			err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-config", writeConfig(t, tc.cfg)}, env{stdout: newOutput(), stderr: newOutput()})
			want := "gateway: store redis://" + srv.Addr + "/0: redis authentication failed: " + tc.want + " (not starting, whatever failure_policy says)"
			if err == nil || err.Error() != want {
				t.Errorf("%s, failure_policy %s:\n got %v\nwant %s", tc.name, pol, err, want)
			}
		}
	}
}

// TestRedisBadDatabase: a database number the server lacks is refused by
// Redis with "ERR DB index is out of range"; the gateway says so and does
// not start, even under failure_policy open or fallback.
func TestRedisBadDatabase(t *testing.T) {
	srv := redistest.Start(t) // 16 databases, the default
	for _, pol := range []string{"closed", "open", "fallback"} {
		err := run(context.Background(), []string{"-listen", "127.0.0.1:0", "-config", writeConfig(t, "store: redis://"+srv.Addr+"/99\n"+fmt.Sprintf(faultConfig, pol))},
			env{stdout: newOutput(), stderr: newOutput()})
		want := "gateway: store redis://" + srv.Addr + "/99: redis refused the database number: ERR DB index is out of range (not starting, whatever failure_policy says)"
		if err == nil || err.Error() != want {
			t.Errorf("failure_policy %s:\n got %v\nwant %s", pol, err, want)
		}
	}
}

// TestRedisSchemeCase: URL schemes are case-insensitive (RFC 3986 §3.1):
// store: REDIS://... limits through that Redis, and the banner shows the
// URL as the file wrote it.
func TestRedisSchemeCase(t *testing.T) {
	srv := redistest.Start(t)
	store := "REDIS://" + srv.Addr + "/0"
	gw := start(t, frozen(), "-config", writeConfig(t, "store: "+store+"\n"+fmt.Sprintf(faultConfig, "closed")))
	if want := ", store: " + store + engineNote() + ")\n"; !strings.Contains(gw.stdout.String(), want) {
		t.Errorf("banner %q lacks %q", gw.stdout, want)
	}
	exactly3(t, "REDIS://", gw.base, "a")
	checkKeys(t, srv.Client(t, nil), redisKey("limitplane:", keyConsumer("a"), "gcra"))
}

// TestRunRedisYAML runs cmd/limitplane-gateway/redis.yaml as the README's "Run
// it against Redis" does, on a test redis-server instead of
// 127.0.0.1:6380: two gateways, six requests alternating between them,
// the sixth refused. The README shows this output and the banner, and its
// commands use port 6380 throughout and a built binary.
func TestRunRedisYAML(t *testing.T) {
	b, err := os.ReadFile("redis.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data := string(b)
	const fileURL = "redis://127.0.0.1:6380/0"
	if !strings.Contains(data, "store: "+fileURL+"\n") {
		t.Fatalf("redis.yaml does not use %s", fileURL)
	}
	srv := redistest.Start(t)
	cfg := writeConfig(t, strings.Replace(data, fileURL, "redis://"+srv.Addr+"/0", 1))
	e := frozen()
	gws := map[string]*running{"8080": start(t, e, "-config", cfg), "8081": start(t, e, "-config", cfg)}
	var out strings.Builder
	for i, port := range []string{"8080", "8081", "8080", "8081", "8080", "8081"} {
		r := get(t, nil, gws[port].base+"/echo/hello", "X-API-Key", "demo-key-1")
		fmt.Fprintf(&out, "%s %d\n", port, r.status)
		if want := map[bool]int{true: 200, false: 429}[i < 5]; r.status != want {
			t.Errorf("request %d to %s: status %d, want %d", i+1, port, r.status, want)
		}
	}
	b, err = os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if !strings.Contains(readme, "```\n"+out.String()+"```\n") {
		t.Errorf("README.md does not show:\n%s", out.String())
	}
	banner := strings.Replace(gws["8080"].stdout.String(), gws["8080"].base, "http://127.0.0.1:8080", 1)
	banner = strings.Replace(banner, "config: "+cfg+", store: redis://"+srv.Addr+"/0"+engineNote(), "config: cmd/limitplane-gateway/redis.yaml, store: "+fileURL, 1)
	if !strings.Contains(readme, "```\n"+banner+"```\n") {
		t.Errorf("README.md does not show the banner:\n%s", banner)
	}
	for _, cmd := range []string{
		"redis-server --port 6380 --save '' --appendonly no &",
		"go build -o /tmp/gw ./cmd/limitplane-gateway",
		"/tmp/gw -config cmd/limitplane-gateway/redis.yaml &",
		"/tmp/gw -config cmd/limitplane-gateway/redis.yaml -listen 127.0.0.1:8081 &",
		"kill %2 %3; wait %2 %3; kill %1",
	} {
		if !strings.Contains(readme, "\n"+cmd) {
			t.Errorf("README.md's walk-through lacks %q", cmd)
		}
	}
	if strings.Contains(readme, "6379:6379") || strings.Contains(readme, "--port 6379") {
		t.Errorf("README.md still starts a Redis on 6379")
	}
	demo := keyConsumer("demo-key-1")
	checkKeys(t, srv.Client(t, nil), redisKey("limitplane:demo:", demo, "gcra"), redisKey("limitplane:demo:", demo, "quota"))
}
