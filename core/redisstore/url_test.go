package redisstore

import (
	"context"
	"reflect"
	"strings"
	"testing"

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
	if err := s.ResetQuota(ctx, "c", ""); err != nil {
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

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"redis://u:pw@h:1/0":                       "redis://u:xxxxx@h:1/0",
		"redis+sentinel://m@h1,h2?password=pw&x=1": "redis+sentinel://m@h1,h2?password=xxxxx&x=1",
		"redis://h:1/0":                            "redis://h:1/0",
	}
	for in, want := range cases {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
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
