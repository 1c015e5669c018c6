package redisstore

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestNewClientFromURL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c, err := NewClientFromURL("redis://" + srv.Addr + "/3?pool_size=7")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.(*redis.Client).Options()
	if o.Addr != srv.Addr || o.DB != 3 || o.PoolSize != 7 || !o.ContextTimeoutEnabled {
		t.Fatalf("options %+v", o)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	cl := redistest.StartCluster(t, 3)
	cc, err := NewClientFromURL("redis+cluster://" + cl.Nodes[0].Addr + "," + cl.Nodes[1].Addr + "?dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if got := cc.(*redis.ClusterClient).Options().Addrs; !reflect.DeepEqual(got, []string{cl.Nodes[0].Addr, cl.Nodes[1].Addr}) {
		t.Fatalf("cluster addrs %q", got)
	}
	if err := cc.Set(ctx, "{x}k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ResetQuota(ctx, "c", "", 0); err != nil {
		t.Fatal(err)
	}

	fo, err := failoverOptions("redis", "mymaster@s1,s2:26380/2?password=pw&dial_timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	if fo.MasterName != "mymaster" || !reflect.DeepEqual(fo.SentinelAddrs, []string{"s1:26379", "s2:26380"}) || fo.DB != 2 || fo.Password != "pw" || fo.DialTimeout.Seconds() != 3 {
		t.Fatalf("failover options %+v", fo)
	}
	for _, bad := range []string{"localhost:6379", "mysql://x", "redis+sentinel://s1,s2", "redis+cluster://"} {
		if c, err := NewClientFromURL(bad); err == nil {
			c.Close()
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestNewClientFromURLRefusesBadPools(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:1/0?pool_size=-1",
		"redis://127.0.0.1:1/0?pool_size=4294967296",
		"redis+cluster://127.0.0.1:1,127.0.0.1:2?pool_size=-5",
		"redis+sentinel://m@127.0.0.1:1?pool_size=99999999&password=secret",
	} {
		c, err := NewClientFromURL(raw)
		if err == nil {
			c.Close()
			t.Errorf("%s accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"redis://u:pw@h:1/0":                       "redis://u:xxxxx@h:1/0",
		"redis+sentinel://m@h1,h2?password=pw&x=1": "redis+sentinel://m@h1,h2?password=xxxxx&x=1",
		"redis://h:1/0":                            "redis://h:1/0",
		"redis://u:p%zz/@h:1/0?PassWord=s#f":       "redis://u:xxxxx@h:1/0?PassWord=xxxxx#f", // does not parse
		"h:1":                                      "h:1",
	}
	for in, want := range cases {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewClientFromURLSchemeCase(t *testing.T) {
	c, err := NewClientFromURL("REDIS://127.0.0.1:1/2")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if db := c.(*redis.Client).Options().DB; db != 2 {
		t.Fatalf("db %d, want 2", db)
	}
}

// TestRefusedConnectionFailsFast: with Redis killed, a Take through a
// client from NewClientFromURL fails with the refused dial, not after the
// store's timeout (go-redis's defaults, 5 dial attempts 100 ms apart and
// 10 ms to 1 s pauses between command retries, would use up the whole
// second). The breaker is off, so every Take really goes to go-redis.
func TestRefusedConnectionFailsFast(t *testing.T) {
	const timeout, bound = time.Second, 100 * time.Millisecond
	srv := redistest.Start(t)
	c, err := NewClientFromURL("redis://" + srv.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.(*redis.Client).Options(); o.DialerRetries != 1 || o.MinRetryBackoff > 0 {
		t.Fatalf("DialerRetries %d, MinRetryBackoff %v; want 1 and none", o.DialerRetries, o.MinRetryBackoff)
	}
	s, err := New(c, Options{Timeout: timeout, BreakerFailures: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := request(t, s, core.Call{Consumer: "c", Rate: core.PerSecond(10), Cost: 1})
	if _, err := s.Take(ctx, req); err != nil {
		t.Fatal(err) // a pooled connection, now to be found dead
	}
	srv.Kill()
	for i := 0; i < 10; i++ {
		start := time.Now()
		_, err := s.Take(ctx, req)
		took := time.Since(start)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Take %d after the kill: %v (after %v), want connection refused", i, err, took)
		}
		if took >= bound {
			t.Fatalf("Take %d after the kill took %v, want < %v (timeout %v): %v", i, took, bound, timeout, err)
		}
	}
}

// TestNewClientFromURLKeepsRetryOptions: a URL that sets the retry options
// NewClientFromURL would otherwise choose keeps its values.
func TestNewClientFromURLKeepsRetryOptions(t *testing.T) {
	c, err := NewClientFromURL("redis://127.0.0.1:1/0?min_retry_backoff=5ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.(*redis.Client).Options(); o.MinRetryBackoff != 5*time.Millisecond || o.DialerRetries != 1 {
		t.Fatalf("MinRetryBackoff %v, DialerRetries %d; want 5ms and 1", o.MinRetryBackoff, o.DialerRetries)
	}
	cc, err := NewClientFromURL("redis+cluster://127.0.0.1:1,127.0.0.1:2?dialer_retries=3")
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if o := cc.(*redis.ClusterClient).Options(); o.DialerRetries != 3 || o.MinRetryBackoff > 0 {
		t.Fatalf("cluster: DialerRetries %d, MinRetryBackoff %v; want 3 and none", o.DialerRetries, o.MinRetryBackoff)
	}
	for raw, want := range map[string]int{"redis+sentinel://m@127.0.0.1:1": 1, "redis+sentinel://m@127.0.0.1:1?dialer_retries=2": 2} {
		fc, err := NewClientFromURL(raw)
		if err != nil {
			t.Fatal(err)
		}
		if o := fc.(*redis.Client).Options(); o.DialerRetries != want || o.MinRetryBackoff > 0 {
			t.Errorf("%s: DialerRetries %d, MinRetryBackoff %v; want %d and none", raw, o.DialerRetries, o.MinRetryBackoff, want)
		}
		fc.Close()
	}
}

// TestCheckURL: each problem CheckURL finds, as NewClientFromURL returns
// it too, the password hidden.
func TestCheckURL(t *testing.T) {
	cases := map[string]string{
		"redis://r:6379/0":                 "",
		"REDIS://h1":                       "",
		"redis+sentinel://m@s1,s2:26380/2": "",
		"h:1":                              `store URL "h:1" has no scheme`,
		"http://u:pw@r:6379":               `store URL "http://u:xxxxx@r:6379": unknown scheme "http" (want redis, rediss, unix, redis+cluster, redis+sentinel)`,
		"redis://r:port":                   `"redis://r:port" is not a URL: invalid port ":port" after host`,
		"REDIS://:pw@r:port":               `"REDIS://:xxxxx@r:port" is not a URL`,
		"unix://":                          `"unix://" names no socket path (like unix:///run/redis.sock)`,
		"redis+cluster://,":                `"redis+cluster://," names no host`,
		"redis+sentinel://:pw@s1":          `"redis+sentinel://:xxxxx@s1" needs the master's name: redis+sentinel://master@host:26379,...`,
		"redis+cluster://a:1,b:0":          `host "b:0": port "0" is not a number from 1 to 65535`,
		"redis+cluster://a,b?pool_size=-1": `pool_size=-1: want 0 (go-redis's default) to 2147483647`,
		"redis://:secret@r:6379?pool=3":    `unexpected option: pool`,
	}
	for in, want := range map[string]string{"REDIS+Cluster://a": "redis+cluster", "rediss://a": "rediss", "http://a": "", "redis:a": ""} {
		if got := Scheme(in); got != want {
			t.Errorf("Scheme(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range cases {
		err := CheckURL(in)
		var ue *URLError
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckURL(%q) = %v, want nil", in, err)
		case want == "":
		case !errors.As(err, &ue) || ue.Problem != want || err.Error() != "redisstore: "+want:
			t.Errorf("CheckURL(%q) = %v, want %q", in, err, want)
		}
		if want == "" {
			continue
		}
		if c, err := NewClientFromURL(in); err == nil || err.Error() != "redisstore: "+want {
			if c != nil {
				c.Close()
			}
			t.Errorf("NewClientFromURL(%q) = %v, want the same error", in, err)
		}
	}
}

// TestWithPassword: the password goes into the user information, or for
// the Sentinel forms into the password query parameter (the user part is
// the master's name), escaped, with the scheme in lower case; a URL that
// does not parse is refused without quoting its password.
func TestWithPassword(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"redis://h:6379/0", "redis://:p%40ss%2Fw%3Ard@h:6379/0"},
		{"REDISS://u@h:6379/0", "rediss://u:p%40ss%2Fw%3Ard@h:6379/0"},
		{"unix:///run/r.sock?db=2", "unix://:p%40ss%2Fw%3Ard@/run/r.sock?db=2"},
		{"redis+cluster://a:7000,b:7001", "redis+cluster://:p%40ss%2Fw%3Ard@a:7000,b:7001"},
		{"redis+sentinel://m@s1,s2:26380/0", "redis+sentinel://m@s1,s2:26380/0?password=p%40ss%2Fw%3Ard"},
		{"Rediss+Sentinel://m@s1/0?db=1", "rediss+sentinel://m@s1/0?db=1&password=p%40ss%2Fw%3Ard"},
	} {
		got, err := WithPassword(tc.url, "p@ss/w:rd")
		if err != nil || got != tc.want {
			t.Errorf("WithPassword(%q) = %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
	_, err := WithPassword("redis://u:secret@h:6379/%zz", "x")
	if want := `redisstore: "redis://u:xxxxx@h:6379/%zz" is not a URL`; err == nil || err.Error() != want {
		t.Errorf("bad URL: %v, want %s", err, want)
	}
}
