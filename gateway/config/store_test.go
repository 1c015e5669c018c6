package config_test

import (
	"testing"

	"github.com/limitplane/limitplane/gateway/config"
)

// TestStorePorts: a port outside 1..65535, or not a number, in any host of
// any Redis URL form is a configuration error at the store field's line
// and column (go-redis would otherwise fail only when it dials, and the
// gateway would start with no limiting under failure_policy open); ports
// in range, empty ports (go-redis's default) and IPv6 hosts pass.
func TestStorePorts(t *testing.T) {
	for _, tc := range []struct{ store, want string }{
		{"redis://127.0.0.1:99999", `t.yaml:1:8: store: host "127.0.0.1:99999": port "99999" is not a number from 1 to 65535`},
		{"redis://127.0.0.1:0/1", `t.yaml:1:8: store: host "127.0.0.1:0": port "0" is not a number from 1 to 65535`},
		{"REDIS://h:65536", `t.yaml:1:8: store: host "h:65536": port "65536" is not a number from 1 to 65535`},
		{"rediss://h:70000", `t.yaml:1:8: store: host "h:70000": port "70000" is not a number from 1 to 65535`},
		{"redis://[::1]:99999", `t.yaml:1:8: store: host "[::1]:99999": port "99999" is not a number from 1 to 65535`},
		{"redis+cluster://a:7000,b:99999,c:7002", `t.yaml:1:8: store: host "b:99999": port "99999" is not a number from 1 to 65535`},
		{"redis+cluster://a:x,b:7001", `t.yaml:1:8: store: host "a:x": port "x" is not a number from 1 to 65535`},
		{"rediss+cluster://a:7000,b:0", `t.yaml:1:8: store: host "b:0": port "0" is not a number from 1 to 65535`},
		{"redis+sentinel://m@s1:26379,s2:123456/0", `t.yaml:1:8: store: host "s2:123456": port "123456" is not a number from 1 to 65535`},
		{"redis+sentinel://m@s1:-1,s2:26379", `t.yaml:1:8: store: host "s1:-1": port "-1" is not a number from 1 to 65535`},
		{"redis+sentinel://m@s1:+5,s2:26379", `t.yaml:1:8: store: host "s1:+5": port "+5" is not a number from 1 to 65535`},
	} {
		_, err := config.Parse("t.yaml", []byte("store: "+tc.store+"\n"+api))
		if err == nil || err.Error() != tc.want {
			t.Errorf("store %s:\n got %v\nwant %s", tc.store, err, tc.want)
		}
	}
	for _, store := range []string{
		"redis://127.0.0.1:1", "redis://127.0.0.1:65535/2", `"redis://h:"`, "redis://[::1]:6379", "rediss://h",
		"unix:///run/redis.sock?db=1", "redis+cluster://a:7000,b:7001,c:7002", "redis+sentinel://m@s1:26379,s2:26380/0",
	} {
		if _, err := config.Parse("t.yaml", []byte("store: "+store+"\n"+api)); err != nil {
			t.Errorf("store %s: %v", store, err)
		}
	}
}
