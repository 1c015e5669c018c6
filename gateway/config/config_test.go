package config_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// api is a valid one-line API list, appended to cases that need one.
const api = "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n"

// TestRefusals checks the exact message for every kind of bad
// configuration the gateway refuses to start with.
func TestRefusals(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		// Decoding: syntax, shape, unknown and repeated fields.
		{"empty file", "", `t.yaml: empty configuration`},
		{"comments only", "# nothing\n", `t.yaml: empty configuration`},
		// yaml's syntax errors give at most a line, sometimes the line
		// where the enclosing block starts and none on the first line:
		// the position is where yaml noticed the problem.
		{"syntax error", "apis: [\n", `t.yaml:1:7: YAML syntax: did not find expected node content`},
		{"tab indentation", "apis:\n\t- id: a\n", `t.yaml:2:1: YAML syntax: found character that cannot start any token (a tab: YAML indents with spaces)`},
		{"tab on the first line", "\tlisten: :80\n" + api, `t.yaml:1:1: YAML syntax: found character that cannot start any token (a tab: YAML indents with spaces)`},
		{"tab after the first column", "policies:\n  - id: p\n  \t rate: {}\n" + api, `t.yaml:3:3: YAML syntax: found a tab character that violates indentation`},
		{"tab indenting a continued value", "policies:\n  - id: p\n\trate: {}\n" + api, `t.yaml:3:1: YAML syntax: found a tab character that violates indentation`},
		{"mapping inside a plain value", "listen: a: b\n" + api, `t.yaml:1:10: YAML syntax: mapping values are not allowed in this context`},
		{"key indented too little", "policies:\n  - id: p\n   rate: {}\n" + api, `t.yaml:3:4: YAML syntax: did not find expected '-' indicator`},
		{"unknown escape after a wide character", "listen: x\nstore: \"é\\q\"\n", `t.yaml:2:10: YAML syntax: found unknown escape character`},
		{"a control character", "listen: :80\n\x01\n", `t.yaml:2:1: YAML syntax: control characters are not allowed`},
		{"unclosed quote", "apis: []\nlisten: \"abc\n", `t.yaml:2:9: YAML syntax: found unexpected end of stream`},
		// When only the whole file fails with yaml's message, yaml's line
		// (here the one after the end) is all there is.
		{"unclosed quote on the first line", "listen: \"abc\n", `t.yaml:2: YAML syntax: found unexpected end of stream`},
		{"top level is a list", "- a\n", `t.yaml:1:1: want a mapping, got a list`},
		{"unknown top-level field", "listen: 127.0.0.1:1\nlimits: {}\n" + api,
			`t.yaml:2:1: limits: unknown field (known here: listen, store, failure_policy, store_timeout, redis, memory, shadow, client_ip, server, response, admin, control_plane, drl, threshold_webhook, policies, keys, apis)`},
		{"unknown nested field", "policies:\n  - id: p\n    rate: {requests: 5, per: 1s, bust: 5}\n" + api,
			`t.yaml:3:34: policies[0].rate.bust: unknown field (known here: requests, per, burst, algorithm)`},
		{"unknown api field", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", upstream: x}\n",
			`t.yaml:2:55: apis[0].upstream: unknown field (known here: id, listen_path, target, auth, policies, jwt, failure_limit, strip_listen_path, strip_auth_data, tags, endpoints, cost_header, max_cost, settle_header)`},
		{"field given twice", "policies:\n  - id: p\n    rate:\n      requests: 5\n      requests: 6\n" + api,
			`t.yaml:5:7: policies[0].rate.requests: given twice (first at line 4)`},
		{"negative quota_epoch", "keys:\n  - key: k\n    api_limits: {a: {quota: {max: 1, renewal: 1h}}}\n    quota_epoch: -1\n" + api,
			`t.yaml:4:18: keys[0].quota_epoch: want an integer ≥ 0, got -1`},
		{"fractional api_limits quota_epoch", "keys:\n  - key: k\n    api_limits:\n      a: {quota: {max: 1, renewal: 1h}, quota_epoch: 1.5}\n" + api,
			`t.yaml:4:54: keys[0].api_limits.a.quota_epoch: want an integer, got 1.5`},
		{"api_limits key given twice", "keys:\n  - key: k\n    api_limits:\n      a: {rate: {requests: 1, per: 1s}}\n      a: {rate: {requests: 2, per: 1s}}\n" + api,
			`t.yaml:5:7: keys[0].api_limits.a: given twice (first at line 4)`},
		{"requests not a number", "policies:\n  - id: p\n    rate: {requests: five, per: 1s}\n" + api,
			`t.yaml:3:22: policies[0].rate.requests: want an integer, got "five"`},
		{"requests a fraction", "policies:\n  - id: p\n    rate: {requests: 2.5, per: 1s}\n" + api,
			`t.yaml:3:22: policies[0].rate.requests: want an integer, got 2.5`},
		{"apis is a mapping", "apis: {a: 1}\n", `t.yaml:1:7: apis: want a list, got a mapping`},
		{"policies of a key is a string", "keys:\n  - key: k\n    policies: gold\n" + api,
			`t.yaml:3:15: keys[0].policies: want a list of strings, got "gold"`},
		{"rate is a list", "policies:\n  - id: p\n    rate: [5, 1s]\n" + api,
			`t.yaml:3:11: policies[0].rate: want a mapping, got a list`},
		{"shadow not a bool", "shadow: maybe\n" + api, `t.yaml:1:9: shadow: want true or false, got "maybe"`},

		// Top-level settings.
		{"listen without port", "listen: 127.0.0.1\n" + api, `t.yaml:1:9: listen: "127.0.0.1" is not host:port (like 127.0.0.1:8080 or :8080)`},
		{"listen port out of range", "listen: \":70000\"\n" + api, `t.yaml:1:9: listen: ":70000": port "70000" is not a number from 0 to 65535`},
		{"unknown store", "store: etcd\n" + api,
			`t.yaml:1:8: store: unknown store "etcd" (want memory, or a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL)`},
		{"unknown store scheme", "store: \"http://u:pw@r:6379\"\n" + api,
			`t.yaml:1:8: store: unknown store "http://u:xxxxx@r:6379" (want memory, or a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL)`},
		{"unknown store in upper case", "store: \"ETCD://U:pw@Host:1?Password=pw2&x=1\"\n" + api,
			`t.yaml:1:8: store: unknown store "ETCD://U:xxxxx@Host:1?Password=xxxxx&x=1" (want memory, or a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL)`},
		{"upper-case redis URL not a URL", "store: \"REDIS://:pa/ss@r:port\"\n" + api,
			`t.yaml:1:8: store: "REDIS://:xxxxx@r:port" is not a URL`},
		{"upper-case redis URL without host", "store: \"REDIS+CLUSTER://\"\n" + api, `t.yaml:1:8: store: "REDIS+CLUSTER://" names no host`},
		{"redis db not a number", "store: redis://r:6379/x\n" + api, `t.yaml:1:8: store: invalid database number: "x"`},
		{"unknown redis URL option", "store: redis://r:6379?pool=3\n" + api, `t.yaml:1:8: store: unexpected option: pool`},
		{"redis URL not a URL", "store: redis://r:port\n" + api, `t.yaml:1:8: store: "redis://r:port" is not a URL: invalid port ":port" after host`},
		{"negative pool size", "store: redis+cluster://a,b?pool_size=-1\n" + api, `t.yaml:1:8: store: pool_size=-1: want 0 (go-redis's default) to 2147483647`},
		{"password in a redis URL", "store: redis://:hunter2@r:6379\n" + api,
			`t.yaml:1:8: store: the URL carries a password; give it with redis.password_env or redis.password_file instead`},
		{"password in a sentinel URL", "store: redis+sentinel://m@s1?password=hunter2\n" + api,
			`t.yaml:1:8: store: the URL carries a password; give it with redis.password_env or redis.password_file instead`},
		{"cluster URL without hosts", "store: redis+cluster://\n" + api, `t.yaml:1:8: store: "redis+cluster://" names no host`},
		{"unix URL without path", "store: unix://\n" + api, `t.yaml:1:8: store: "unix://" names no socket path (like unix:///run/redis.sock)`},
		{"sentinel URL without master", "store: redis+sentinel://s1,s2:26380\n" + api,
			`t.yaml:1:8: store: "redis+sentinel://s1,s2:26380" needs the master's name: redis+sentinel://master@host:26379,...`},
		{"redis section with the memory store", "redis: {timeout: 1s}\n" + api, `t.yaml:1:8: redis: only used with a redis store (store: redis://host:port/db)`},
		{"zero redis timeout", "store: redis://r\nredis: {timeout: 0s}\n" + api, `t.yaml:2:18: redis.timeout: 0s must be > 0`},
		{"bad breaker cooldown", "store: redis://r\nredis: {breaker_cooldown: 1}\n" + api,
			`t.yaml:2:27: redis.breaker_cooldown: "1" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"key prefix with a hash tag", "store: redis://r\nredis: {key_prefix: \"lp{x}:\"}\n" + api,
			`t.yaml:2:21: redis.key_prefix: "lp{x}:" must not contain "{" or "}" (they would move the Cluster hash tag)`},
		{"negative pipeline", "store: redis://r\nredis: {pipeline: -1}\n" + api, `t.yaml:2:19: redis.pipeline: -1 must be >= 0 (0 turns batching off)`},
		{"negative breaker failures", "store: redis://r\nredis: {breaker_failures: -2}\n" + api,
			`t.yaml:2:27: redis.breaker_failures: -2 must be >= 0 (0 turns the breaker off)`},
		{"redis password from an unset variable", "store: redis://r\nredis: {password_env: LIMITPLANE_TEST_UNSET}\n" + api,
			`t.yaml:2:23: redis.password_env: environment variable LIMITPLANE_TEST_UNSET is not set`},
		{"redis password from env and file", "store: redis://r\nredis: {password_env: A, password_file: b}\n" + api,
			`t.yaml:2:8: redis: set password_env or password_file, not both`},
		{"redis password file missing", "store: redis://r\nredis: {password_file: /nonexistent/redis.pw}\n" + api,
			`t.yaml:2:24: redis.password_file: cannot read /nonexistent/redis.pw: no such file or directory`},
		{"unknown failure policy", "failure_policy: retry\n" + api, `t.yaml:1:17: failure_policy: unknown policy "retry" (want open, closed or fallback)`},
		{"bad store timeout", "store_timeout: 50\n" + api, `t.yaml:1:16: store_timeout: "50" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"bad trusted proxy", "client_ip: {trusted_proxies: [10.0.0.0/8, 10.0.0.0/33]}\n" + api,
			`t.yaml:1:43: client_ip.trusted_proxies[1]: "10.0.0.0/33" is not an address or CIDR`},
		{"unknown forwarding header", "client_ip: {header: x-real-ip}\n" + api,
			`t.yaml:1:21: client_ip.header: unknown header "x-real-ip" (want x-forwarded-for or forwarded)`},
		{"ipv4 prefix too long", "client_ip: {ipv4_prefix_len: 33}\n" + api, `t.yaml:1:30: client_ip.ipv4_prefix_len: 33: want 1 to 32`},
		{"ipv6 prefix zero", "client_ip: {ipv6_prefix_len: 0}\n" + api, `t.yaml:1:30: client_ip.ipv6_prefix_len: 0: want 1 to 128`},
		{"negative server timeout", "server: {read_timeout: -1s}\n" + api, `t.yaml:1:24: server.read_timeout: -1s must be > 0`},
		{"zero max header bytes", "server: {max_header_bytes: 0}\n" + api, `t.yaml:1:28: server.max_header_bytes: 0 must be > 0`},
		{"bad reset format", "response: {x_ratelimit_reset: iso}\n" + api, `t.yaml:1:31: response.x_ratelimit_reset: unknown format "iso" (want epoch or seconds)`},
		{"bad quota status", "response: {quota_status: 402}\n" + api, `t.yaml:1:26: response.quota_status: 402: want 429 or 403`},
		{"429 for store failures", "response: {store_failure_status: 429}\n" + api, `t.yaml:1:34: response.store_failure_status: 429: want a 5xx status`},

		// Policies.
		{"policy without id", "policies:\n  - rate: {requests: 5, per: 1s}\n" + api, `t.yaml:2:5: policies[0].id: missing`},
		{"duplicate policy id", "policies:\n  - id: p\n  - id: q\n  - id: p\n" + api,
			`t.yaml:4:9: policies[2].id: duplicate policy id "p" (first at policies[0].id on line 2)`},
		{"requests missing", "policies:\n  - id: p\n    rate: {per: 1s}\n" + api,
			`t.yaml:3:11: policies[0].rate.requests: missing (requests per period, or -1 for unlimited)`},
		{"zero requests", "policies:\n  - id: p\n    rate: {requests: 0, per: 1s}\n" + api,
			`t.yaml:3:22: policies[0].rate.requests: 0 must be > 0 (or -1 for unlimited)`},
		{"negative requests", "policies:\n  - id: p\n    rate: {requests: -5, per: 1s}\n" + api,
			`t.yaml:3:22: policies[0].rate.requests: -5 must be > 0 (or -1 for unlimited)`},
		{"per missing", "policies:\n  - id: p\n    rate: {requests: 5}\n" + api,
			`t.yaml:3:11: policies[0].rate.per: missing (the period, like 1s, 1m or 24h)`},
		{"per not a duration", "policies:\n  - id: p\n    rate: {requests: 5, per: 5 mins}\n" + api,
			`t.yaml:3:30: policies[0].rate.per: "5 mins" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"per without unit", "policies:\n  - id: p\n    rate: {requests: 5, per: 60}\n" + api,
			`t.yaml:3:30: policies[0].rate.per: "60" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"zero per", "policies:\n  - id: p\n    rate: {requests: 5, per: 0s}\n" + api,
			`t.yaml:3:30: policies[0].rate.per: 0s must be > 0`},
		{"zero burst", "policies:\n  - id: p\n    rate: {requests: 5, per: 1s, burst: 0}\n" + api,
			`t.yaml:3:41: policies[0].rate.burst: 0 must be > 0 (leave it out to use requests)`},
		{"negative burst", "policies:\n  - id: p\n    rate: {requests: 5, per: 1s, burst: -1}\n" + api,
			`t.yaml:3:41: policies[0].rate.burst: -1 must be > 0 (leave it out to use requests)`},
		{"burst of an unlimited rate", "policies:\n  - id: p\n    rate: {requests: -1, per: 1m, burst: 3}\n" + api,
			`t.yaml:3:42: policies[0].rate.burst: an unlimited rate (requests -1) has no burst; leave burst out`},
		{"unknown algorithm", "policies:\n  - id: p\n    rate: {requests: 5, per: 1s, algorithm: leaky}\n" + api,
			`t.yaml:3:45: policies[0].rate.algorithm: unknown algorithm "leaky" (want gcra, sliding_window, fixed_window or sliding_log)`},
		{"algorithm the memory store lacks", "policies:\n  - id: p\n    rate: {requests: 5, per: 1s, algorithm: fixed_window}\n" + api,
			`t.yaml:3:45: policies[0].rate.algorithm: fixed_window is not supported by the memory store (only gcra)`},
		{"burst for a window algorithm", "store: redis://r\npolicies:\n  - id: p\n    rate: {requests: 5, per: 1s, burst: 2, algorithm: sliding_log}\n" + api,
			`t.yaml:4:41: policies[0].rate.burst: sliding_log has no burst (it counts up to requests per per); leave burst out`},
		{"rate finer than a nanosecond", "policies:\n  - id: p\n    rate: {requests: 2000000000, per: 1s}\n" + api,
			`t.yaml:3:11: policies[0].rate: rate 2000000000 per 1s is finer than one event per nanosecond`},
		{"burst overflows", "policies:\n  - id: p\n    rate: {requests: 1, per: 8760h, burst: 1000}\n" + api,
			`t.yaml:3:11: policies[0].rate: burst 1000 × emission interval 8760h0m0s overflows`},
		// Counts above 2^53 − 1 (core.MaxCount) no store keeps exactly
		// (issue 9): refused for every algorithm and for quotas.
		{"quota max above 2^53 - 1", "policies:\n  - id: p\n    quota: {max: 9007199254740992, renewal: 720h}\n" + api,
			`t.yaml:3:12: policies[0].quota: quota max 9007199254740992 is above 9007199254740991 (2^53 − 1), the largest count every store keeps exactly`},
		{"fixed window above 2^53 - 1", "store: redis://r\npolicies:\n  - id: p\n    rate: {requests: 9007199254740992, per: 3000h, algorithm: fixed_window}\n" + api,
			`t.yaml:4:11: policies[0].rate: rate 9007199254740992 is above 9007199254740991 (2^53 − 1), the largest count every store keeps exactly`},
		{"gcra burst above 2^53 - 1", "policies:\n  - id: p\n    rate: {requests: 1, per: 1ns, burst: 9007199254740992}\n" + api,
			`t.yaml:3:11: policies[0].rate: burst 9007199254740992 is above 9007199254740991 (2^53 − 1), the largest count every store keeps exactly`},
		{"quota max missing", "policies:\n  - id: p\n    quota: {renewal: 1h}\n" + api,
			`t.yaml:3:12: policies[0].quota.max: missing (requests per renewal period, or -1 for unlimited)`},
		{"zero quota", "policies:\n  - id: p\n    quota: {max: 0, renewal: 1h}\n" + api,
			`t.yaml:3:18: policies[0].quota.max: 0 must be > 0 (or -1 for unlimited)`},
		{"negative quota", "policies:\n  - id: p\n    quota: {max: -2, renewal: 1h}\n" + api,
			`t.yaml:3:18: policies[0].quota.max: -2 must be > 0 (or -1 for unlimited)`},
		{"renewal missing", "policies:\n  - id: p\n    quota: {max: 10}\n" + api,
			`t.yaml:3:12: policies[0].quota.renewal: missing (the period, like 1h or 720h)`},
		// time.ParseDuration says "invalid duration" for both; the file's
		// author needs to know which.
		{"per out of range", "policies:\n  - id: p\n    rate: {requests: 5, per: 9999999999h}\n" + api,
			`t.yaml:3:30: policies[0].rate.per: "9999999999h" is out of range (durations go up to 2562047h47m16.854775807s, about 292 years)`},
		{"renewal out of range in nanoseconds", "policies:\n  - id: p\n    quota: {max: 10, renewal: 9223372036854775808ns}\n" + api,
			`t.yaml:3:31: policies[0].quota.renewal: "9223372036854775808ns" is out of range (durations go up to 2562047h47m16.854775807s, about 292 years)`},
		{"the longest duration is in range", "store_timeout: 2562047h47m16.854775807s\nserver: {idle_timeout: 1.5.s}\n" + api,
			`t.yaml:2:24: server.idle_timeout: "1.5.s" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"renewal not a duration", "policies:\n  - id: p\n    quota: {max: 10, renewal: 1d}\n" + api,
			`t.yaml:3:31: policies[0].quota.renewal: "1d" is not a duration (like 500ms, 10s, 1m or 24h)`},
		{"renewal too long", "policies:\n  - id: p\n    quota: {max: 10, renewal: 1000000h}\n" + api,
			`t.yaml:3:12: policies[0].quota: quota renewal 1000000h0m0s is too long`},
		{"policy for an unknown API", "policies:\n  - id: p\n    apis: [a, b]\n" + api,
			`t.yaml:3:15: policies[0].apis[1]: unknown API "b"`},

		// Keys.
		{"key without key", "keys:\n  - policies: [p]\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:5: keys[0]: needs key (plaintext) or key_hash (sha256:<hex>)`},
		{"key and key_hash", "keys:\n  - {key: k, key_hash: \"sha256:00\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:5: keys[0]: set key or key_hash, not both`},
		{"bad key_hash", "keys:\n  - {key_hash: \"md5:abc\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:16: keys[0].key_hash: "md5:abc" is not sha256:<64 hex digits>`},
		{"short key_hash", "keys:\n  - {key_hash: \"sha256:abcd\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:16: keys[0].key_hash: "sha256:abcd" is not sha256:<64 hex digits>`},
		{"duplicate plaintext key", "keys:\n  - {key: k, policies: [p]}\n  - {key: j, policies: [p]}\n  - {key: k, policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:4:11: keys[2].key: same key as keys[0] on line 2`},
		{"key given as plaintext and hash", "keys:\n  - {key: k, policies: [p]}\n  - {key_hash: \"" + identity.HashKey("k").String() + "\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:3:16: keys[1].key_hash: same key as keys[0] on line 2`},
		{"over-long key", "keys:\n  - {key: " + strings.Repeat("x", 513) + ", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:11: keys[0].key: longer than 512 bytes; the gateway refuses such keys`},
		{"key with CR LF", "keys:\n  - {key: \"a\\r\\nb\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:11: keys[0].key: holds the control character '\r' at byte 1; no request header can carry it`},
		{"key with NUL", "keys:\n  - {key: \"a\\0\", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:11: keys[0].key: holds the control character '\x00' at byte 1; no request header can carry it`},
		{"key with a trailing space", "keys:\n  - {key: \"k \", policies: [p]}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:11: keys[0].key: starts or ends with white space, which the gateway trims from a presented key`},
		{"policy id ..", "policies:\n  - id: \"..\"\n" + api,
			`t.yaml:2:9: policies[0].id: "..": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{"key names unknown policy", "keys:\n  - key: k\n    policies: [p, gold]\npolicies:\n  - id: p\n" + api,
			`t.yaml:3:19: keys[0].policies[1]: unknown policy "gold"`},
		{"key without policies", "keys:\n  - key: k\n" + api,
			`t.yaml:2:5: keys[0].policies: a key needs at least one policy (or api_limits)`},
		{"bad expiry", "keys:\n  - {key: k, policies: [p], expires: 2027-01-31}\npolicies:\n  - id: p\n" + api,
			`t.yaml:2:38: keys[0].expires: "2027-01-31" is not an RFC 3339 time (like 2027-01-31T00:00:00Z)`},
		{"api_limits for unknown API", "keys:\n  - key: k\n    api_limits:\n      b: {rate: {requests: 1, per: 1s}}\n" + api,
			`t.yaml:4:10: keys[0].api_limits.b: unknown API "b"`},
		{"api_limits for keyless API", "keys:\n  - key: k\n    api_limits:\n      a: {rate: {requests: 1, per: 1s}}\npolicies:\n  - id: p\n" +
			"apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless, policies: [p]}\n",
			`t.yaml:4:10: keys[0].api_limits.a: API "a" is keyless; api_limits only apply to api_key APIs`},
		{"empty api_limits", "keys:\n  - key: k\n    api_limits:\n      a: {}\n" + api,
			`t.yaml:4:10: keys[0].api_limits.a: needs rate or quota`},
		{"bad api_limits rate", "keys:\n  - key: k\n    api_limits:\n      a: {rate: {requests: 1, per: -1m}}\n" + api,
			`t.yaml:4:36: keys[0].api_limits.a.rate.per: -1m0s must be > 0`},

		// APIs.
		{"no apis", "listen: 127.0.0.1:1\n", `t.yaml:1:1: apis: at least one API is required`},
		{"api without id", "apis:\n  - {listen_path: /a/, target: \"builtin:echo\"}\n", `t.yaml:2:5: apis[0].id: missing`},
		{"duplicate api id", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n  - {id: a, listen_path: /b/, target: \"builtin:echo\"}\n",
			`t.yaml:3:10: apis[1].id: duplicate API id "a" (first at apis[0].id on line 2)`},
		{"duplicate listen path", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n  - {id: b, listen_path: /a, target: \"builtin:echo\"}\n",
			`t.yaml:3:26: apis[1].listen_path: "/a" is the same path as apis[0].listen_path on line 2`},
		{"listen path missing", "apis:\n  - {id: a, target: \"builtin:echo\"}\n",
			`t.yaml:2:5: apis[0].listen_path: missing (a path prefix like "/orders/")`},
		{"relative listen path", "apis:\n  - {id: a, listen_path: a/, target: \"builtin:echo\"}\n",
			`t.yaml:2:26: apis[0].listen_path: "a/" must start with "/"`},
		{"listen path with a space", "apis:\n  - {id: a, listen_path: \"/a b/\", target: \"builtin:echo\"}\n",
			`t.yaml:2:26: apis[0].listen_path: "/a b/" may only contain letters, digits, "-", ".", "_", "~" and "/"`},
		{"listen path with a wildcard", "apis:\n  - {id: a, listen_path: \"/a/*\", target: \"builtin:echo\"}\n",
			`t.yaml:2:26: apis[0].listen_path: "/a/*" may only contain letters, digits, "-", ".", "_", "~" and "/"`},
		{"unclean listen path", "apis:\n  - {id: a, listen_path: /a//b/../c, target: \"builtin:echo\"}\n",
			`t.yaml:2:26: apis[0].listen_path: "/a//b/../c" is not a clean path (want "/a/c/")`},
		{"target missing", "apis:\n  - {id: a, listen_path: /a/}\n",
			`t.yaml:2:5: apis[0].target: missing (builtin:echo or an http:// or https:// URL)`},
		{"unknown builtin", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:mirror\"}\n",
			`t.yaml:2:39: apis[0].target: unknown builtin "builtin:mirror" (want builtin:echo)`},
		{"target scheme", "apis:\n  - {id: a, listen_path: /a/, target: \"ftp://files:21\"}\n",
			`t.yaml:2:39: apis[0].target: "ftp://files:21" is not builtin:echo or an http:// or https:// URL`},
		{"target without scheme", "apis:\n  - {id: a, listen_path: /a/, target: \"localhost:9000\"}\n",
			`t.yaml:2:39: apis[0].target: "localhost:9000" is not builtin:echo or an http:// or https:// URL`},
		{"target without host", "apis:\n  - {id: a, listen_path: /a/, target: \"http:///x\"}\n",
			`t.yaml:2:39: apis[0].target: "http:///x" has no host`},
		{"target with query", "apis:\n  - {id: a, listen_path: /a/, target: \"http://up:80/?v=1\"}\n",
			`t.yaml:2:39: apis[0].target: "http://up:80/?v=1" must not have a query or fragment`},
		{"target with credentials", "apis:\n  - {id: a, listen_path: /a/, target: \"http://u:p@up:80\"}\n",
			`t.yaml:2:39: apis[0].target: "http://u:p@up:80" must not carry credentials`},
		{"unknown auth", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: oauth}\n",
			`t.yaml:2:61: apis[0].auth: unknown auth "oauth" (want api_key, keyless or jwt)`},
		{"keyless API without policies", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless}\n",
			`t.yaml:2:5: apis[0].policies: a keyless API needs at least one policy (applied per client IP)`},
		{"api_key API with policies", "policies:\n  - id: p\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", policies: [p]}\n",
			`t.yaml:4:65: apis[0].policies: only keyless APIs take policies; an api_key API applies each key's own policies`},
		{"keyless API stripping credentials", "policies:\n  - id: p\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless, policies: [p], strip_auth_data: true}\n",
			`t.yaml:4:102: apis[0].strip_auth_data: a keyless API reads no credentials, so there are none to strip`},
		{"keyless API with unknown policy", "apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless, policies: [anon]}\n",
			`t.yaml:2:81: apis[0].policies[0]: unknown policy "anon"`},
		{"keyless policy scoped elsewhere", "policies:\n  - {id: anon, apis: [b]}\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless, policies: [anon]}\n" +
			"  - {id: b, listen_path: /b/, target: \"builtin:echo\"}\n",
			`t.yaml:4:81: apis[0].policies[0]: policy "anon" does not cover API "a" (its apis list leaves it out)`},

		// Several problems at once, reported in file order.
		{"every problem is reported", "policies:\n  - id: p\n    rate: {requests: 0, per: 1x}\nkeys:\n  - {key: k, policies: [gold]}\nstore: redis://r:6379/x\n" + api,
			"t.yaml:3:22: policies[0].rate.requests: 0 must be > 0 (or -1 for unlimited)\n" +
				"t.yaml:3:30: policies[0].rate.per: \"1x\" is not a duration (like 500ms, 10s, 1m or 24h)\n" +
				"t.yaml:5:25: keys[0].policies[0]: unknown policy \"gold\"\n" +
				"t.yaml:6:8: store: invalid database number: \"x\""},
		{"decoding and semantic problems in one run",
			"listen: [a]\nstore_timeout: 50\npolicies:\n  - id: p\n    rate: {requests: 1.5, per: 1s}\n  - id: p\n    rate: {requests: five, per: 5 mins}\n" +
				"    quota: {max: -3, renewal: 1h}\nkeys:\n  - {key: k, policies: [gold]}\n" +
				"apis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: [keyless], policies: [p]}\nfailure_policy: retry\n",
			"t.yaml:1:9: listen: want a string, got a list\n" +
				"t.yaml:2:16: store_timeout: \"50\" is not a duration (like 500ms, 10s, 1m or 24h)\n" +
				"t.yaml:5:22: policies[0].rate.requests: want an integer, got 1.5\n" +
				"t.yaml:6:9: policies[1].id: duplicate policy id \"p\" (first at policies[0].id on line 4)\n" +
				"t.yaml:7:22: policies[1].rate.requests: want an integer, got \"five\"\n" +
				"t.yaml:7:33: policies[1].rate.per: \"5 mins\" is not a duration (like 500ms, 10s, 1m or 24h)\n" +
				"t.yaml:8:18: policies[1].quota.max: -3 must be > 0 (or -1 for unlimited)\n" +
				"t.yaml:10:25: keys[0].policies[0]: unknown policy \"gold\"\n" +
				"t.yaml:12:61: apis[0].auth: want a string, got a list\n" +
				"t.yaml:13:17: failure_policy: unknown policy \"retry\" (want open, closed or fallback)"},
		{"every fraction is reported", "policies:\n  - {id: p, rate: {requests: 0.5, per: 1s, burst: 2.5}, quota: {max: 1e3, renewal: 1h}}\n" + api,
			"t.yaml:2:30: policies[0].rate.requests: want an integer, got 0.5\n" +
				"t.yaml:2:51: policies[0].rate.burst: want an integer, got 2.5\n" +
				"t.yaml:2:70: policies[0].quota.max: want an integer, got 1e3"},
		// What a decoding problem explains is not reported again.
		{"a misspelled field is not also missing", "policies:\n  - id: p\n    rate: {reqests: 5, per: 1s}\n" + api,
			`t.yaml:3:12: policies[0].rate.reqests: unknown field (known here: requests, per, burst, algorithm)`},
		{"a refused key is not also missing", "policies:\n  - id: p\nkeys:\n  - {key: [k], policies: [p]}\n" + api,
			`t.yaml:4:11: keys[0].key: want a string, got a list`},
		{"a refused store is not taken for memory", "store: [redis]\nredis: {timeout: 1s}\npolicies:\n  - {id: p, rate: {requests: 1, per: 1s, algorithm: sliding_window}}\n" + api,
			`t.yaml:1:8: store: want a string, got a list`},
		{"references to a refused policy id are not unknown", "policies:\n  - {id: [p], rate: {requests: 1, per: 1s}}\nkeys:\n  - {key: k, policies: [p]}\n" + api,
			`t.yaml:2:10: policies[0].id: want a string, got a list`},
		{"a mapping with a repeated key is not also empty", "keys:\n  - key: k\n    api_limits: {a: {rate: {requests: 1, per: 1s}}, a: {quota: {max: 1, renewal: 1h}}}\n" + api,
			`t.yaml:3:53: keys[0].api_limits.a: given twice (first at line 3)`},
		{"every decoding problem is reported", "listen: [a]\npolicies:\n  - id: p\n    rate: {requests: x, per: 1s, extra: 1}\n" + api,
			"t.yaml:1:9: listen: want a string, got a list\n" +
				"t.yaml:4:22: policies[0].rate.requests: want an integer, got \"x\"\n" +
				"t.yaml:4:34: policies[0].rate.extra: unknown field (known here: requests, per, burst, algorithm)"},
		{"two values on one line that fail alike", "policies:\n  - {id: p, rate: {requests: x, per: 1s, burst: x}}\n" + api,
			"t.yaml:2:30: policies[0].rate.requests: want an integer, got \"x\"\n" +
				"t.yaml:2:49: policies[0].rate.burst: want an integer, got \"x\""},

		// Anchors and aliases: yaml decodes an anchor's text again at
		// every alias, but each problem is reported once, where the text
		// is; a problem of the alias itself at each alias.
		{"a problem in an anchor used nine times", "policies:\n  - {id: p, rate: {requests: 1, per: 1s}}\n" +
			"keys:\n  - key: k1\n    policies: [p]\n    api_limits: &l\n      a: &r {rate: {requests: x, per: 1s}}\n      b: *r\n      c: *r\n" +
			"  - {key: k2, policies: [p], api_limits: *l}\n  - {key: k3, policies: [p], api_limits: *l}\n" +
			"apis: [{id: a, listen_path: /a/, target: \"builtin:echo\"}, {id: b, listen_path: /b/, target: \"builtin:echo\"}, {id: c, listen_path: /c/, target: \"builtin:echo\"}]\n",
			`t.yaml:7:31: keys[0].api_limits.a.rate.requests: want an integer, got "x"`},
		{"a value problem in an anchor", "policies:\n  - {id: p, rate: &r {requests: 0, per: 1s}}\n  - {id: q, rate: *r}\n  - {id: s, rate: *r}\n" + api,
			`t.yaml:2:33: policies[0].rate.requests: 0 must be > 0 (or -1 for unlimited)`},
		{"a fraction in an anchor", "policies:\n  - {id: q, quota: &u {max: 2.5, renewal: 1h}}\n  - {id: r, quota: *u}\n" + api,
			"t.yaml:2:29: policies[0].quota.max: want an integer, got 2.5"},
		{"keys an alias brings to another kind of mapping", "policies:\n  - &q {id: q, quota: {max: 2, renewal: 1h}}\n  - {id: r, quota: *q}\n" + api,
			"t.yaml:2:9: policies[1].quota.id: unknown field (known here: max, renewal, global)\n" +
				"t.yaml:2:16: policies[1].quota.quota: unknown field (known here: max, renewal, global)"},
		{"an anchor outside the schema is named by where it is used", "x-rate: &d {requests: five, per: 1s, burst: 2.5, bust: 1}\npolicies:\n  - {id: p, rate: *d}\n  - {id: q, rate: *d}\n" + api,
			"t.yaml:1:1: x-rate: unknown field (known here: listen, store, failure_policy, store_timeout, redis, memory, shadow, client_ip, server, response, admin, control_plane, drl, threshold_webhook, policies, keys, apis)\n" +
				"t.yaml:1:23: policies[0].rate.requests: want an integer, got \"five\"\n" +
				"t.yaml:1:45: policies[0].rate.burst: want an integer, got 2.5\n" +
				"t.yaml:1:50: policies[0].rate.bust: unknown field (known here: requests, per, burst, algorithm)"},
		{"an alias whose value does not fit, at each use", "policies:\n  - {id: p, rate: {requests: 1, per: 1s}}\nkeys:\n  - {key: k1, policies: &l [p]}\n  - {key: k2, policies: [*l, *l]}\n" + api,
			"t.yaml:5:26: keys[1].policies[0]: want a string, got a list\n" +
				"t.yaml:5:30: keys[1].policies[1]: want a string, got a list"},
		{"a policy given twice through an alias", "policies:\n  - &q {id: q, quota: {max: 2, renewal: 1h}}\n  - *q\n" + api,
			`t.yaml:3:5: policies[1].id: duplicate policy id "q" (first at policies[0].id on line 2)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("t.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with its error")
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error:\n got: %s\nwant: %s", got, tc.want)
			}
			var errs config.Errors
			if !errors.As(err, &errs) || len(errs) != strings.Count(tc.want, "\n")+1 {
				t.Errorf("error is %T with %d entries, want config.Errors with one per line", err, len(errs))
			}
		})
	}
}

// TestDemoConfig checks that the built-in demo config parses to exactly
// the values the README and the banner describe.
func TestDemoConfig(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "cmd", "limitplane-gateway", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	gold, err := identity.ParseKeyHash("sha256:fb26de5bd8d2479f8dff2c28ddb73a4617bd9d89d91800a592c056bff6f6cdb2")
	if err != nil {
		t.Fatal(err)
	}
	if gold != identity.HashKey("demo-key-2") {
		t.Errorf("the demo's key_hash is not the SHA-256 of demo-key-2")
	}
	want := &config.Config{
		Listen: "127.0.0.1:8080",
		Store:  "memory",
		Server: config.Server{
			Engine: config.EngineNetHTTP, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second,
			IdleTimeout: 120 * time.Second, ShutdownTimeout: 10 * time.Second, MaxHeaderBytes: 65536,
		},
		Response: response.Options{XRateLimit: true, XRateLimitReset: response.ResetEpoch, QuotaExceededStatus: 429, StoreFailureStatus: 503},
		Snapshot: spec.Snapshot{
			Policies: []spec.Policy{
				{ID: "default", Rate: &spec.Rate{Requests: 5, Per: spec.Duration(time.Minute), Burst: 5}, Quota: &spec.Quota{Max: 100, Renewal: spec.Duration(24 * time.Hour)}},
				{ID: "gold", Rate: &spec.Rate{Requests: core.Unlimited}, Quota: &spec.Quota{Max: 10000, Renewal: spec.Duration(24 * time.Hour)}},
				{ID: "anon", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute)}},
			},
			Keys: []spec.Key{
				{KeyHash: identity.HashKey("demo-key-1").String(), Policies: []string{"default"}},
				{KeyHash: gold.String(), Policies: []string{"gold"}},
			},
			APIs: []spec.API{
				{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho, Auth: spec.AuthAPIKey},
				{ID: "open", ListenPath: "/open/", Target: spec.BuiltinEcho, Auth: spec.AuthKeyless, Policies: []string{"anon"}},
			},
		},
		Resolver: config.FileResolver{Dir: filepath.Join("..", "..", "cmd", "limitplane-gateway")},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("demo config:\n got %+v\nwant %+v", cfg, want)
	}
	wantPolicies := []core.Policy{
		{ID: "default", Rate: core.Limit{Rate: 5, Period: time.Minute, Burst: 5}, Quota: core.Quota{Max: 100, Renewal: 24 * time.Hour}},
		{ID: "gold", Rate: core.Limit{Rate: core.Unlimited}, Quota: core.Quota{Max: 10000, Renewal: 24 * time.Hour}},
		{ID: "anon", Rate: core.Limit{Rate: 10, Period: time.Minute}},
	}
	wantKeys := []identity.KeyRecord{
		{Hash: identity.HashKey("demo-key-1"), Policies: []string{"default"}},
		{Hash: gold, Policies: []string{"gold"}},
	}
	wantAPIs := []route{
		{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho, Auth: "api_key", StripListenPath: true, StripAuthData: true},
		{ID: "open", ListenPath: "/open/", Target: spec.BuiltinEcho, Auth: "keyless", Policies: []string{"anon"}, StripListenPath: true},
	}
	checkTravelling(t, cfg.Snapshot, wantPolicies, wantKeys, wantAPIs)
}

// route is what a gateway makes of a spec.API.
type route struct {
	ID, ListenPath, Target, Auth   string
	Policies                       []string
	StripListenPath, StripAuthData bool
}

// checkTravelling checks what the engine, the key registry and the router
// take from a snapshot: its policies, keys and APIs as spec converts them.
func checkTravelling(t *testing.T, s spec.Snapshot, policies []core.Policy, keys []identity.KeyRecord, apis []route) {
	t.Helper()
	if got := s.CorePolicies(); !reflect.DeepEqual(got, policies) {
		t.Errorf("policies:\n got %+v\nwant %+v", got, policies)
	}
	if got, err := s.KeyRecords(); err != nil || !reflect.DeepEqual(got, keys) {
		t.Errorf("keys:\n got %+v, %v\nwant %+v", got, err, keys)
	}
	var got []route
	for _, a := range s.APIs {
		got = append(got, route{a.ID, a.ListenPath, a.Target, a.AuthOrDefault(), a.Policies, a.StripsListenPath(), a.StripsAuthData()})
	}
	if !reflect.DeepEqual(got, apis) {
		t.Errorf("APIs:\n got %+v\nwant %+v", got, apis)
	}
}

// TestEveryField parses a file that sets every field to a non-default
// value and checks each one arrives.
func TestEveryField(t *testing.T) {
	const doc = `
listen: ":9000"
store: memory
failure_policy: closed
store_timeout: 50ms
shadow: true
client_ip:
  trusted_proxies: [10.0.0.0/8, "192.0.2.7"]
  header: Forwarded
  ipv4_prefix_len: 24
  ipv6_prefix_len: 48
server:
  engine: fasthttp
  read_header_timeout: 1s
  read_timeout: 2s
  write_timeout: 3s
  idle_timeout: 4s
  shutdown_timeout: 5s
  max_header_bytes: 4096
response:
  ratelimit_headers: false
  x_ratelimit: true
  x_ratelimit_reset: seconds
  quota_status: 403
  store_failure_status: 500
policies:
  - id: p
    rate: {requests: 10, per: 1s, burst: 20, algorithm: gcra}
    quota: {max: -1}
    apis: [svc]
    shadow: true
    distributed: true
  - id: free
    rate: {requests: -1}
keys:
  - key: k1
    policies: [p]
    expires: 2027-01-31T12:00:00+01:00
    inactive: true
    quota_epoch: 2
    api_limits:
      svc:
        rate: {requests: 3, per: 1m}
        quota: {max: 1000, renewal: 720h}
        quota_epoch: 7
  - key_hash: SHA256:ABC
    policies: [free]
apis:
  - id: svc
    listen_path: /svc
    target: https://api.internal:8443/v1
    auth: api_key
    strip_listen_path: false
    strip_auth_data: false
    tags: [eu, edge]
  - id: all
    listen_path: /
    target: http://127.0.0.1:9001
    auth: keyless
    policies: [free]
`
	// key_hash prefixes are case-sensitive: the one above is refused.
	if _, err := config.Parse("t.yaml", []byte(doc)); err == nil || err.Error() != `t.yaml:46:15: keys[1].key_hash: "SHA256:ABC" is not sha256:<64 hex digits>` {
		t.Fatalf("err = %v", err)
	}
	h := identity.HashKey("k2")
	if _, err := config.Parse("t.yaml", []byte(strings.Replace(doc, "SHA256:ABC", strings.ToUpper(h.String()[7:]), 1))); err == nil {
		t.Fatalf("a bare hex key_hash was accepted")
	}
	cfg, err := config.Parse("t.yaml", []byte(strings.Replace(doc, "SHA256:ABC", h.String(), 1)))
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Config{
		Listen:        ":9000",
		Store:         "memory",
		FailurePolicy: core.FailClosed,
		StoreTimeout:  50 * time.Millisecond,
		Shadow:        true,
		ClientIP: identity.ClientIPOptions{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")},
			Header:         identity.Forwarded, IPv4PrefixLen: 24, IPv6PrefixLen: 48,
		},
		Server:   config.Server{Engine: config.EngineFastHTTP, ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, ShutdownTimeout: 5 * time.Second, MaxHeaderBytes: 4096},
		Response: response.Options{NoRateLimitFields: true, XRateLimit: true, XRateLimitReset: response.ResetSeconds, QuotaExceededStatus: 403, StoreFailureStatus: 500},
	}
	wantPolicies := []core.Policy{
		{ID: "p", Rate: core.Limit{Rate: 10, Period: time.Second, Burst: 20}, Quota: core.Quota{Max: core.Unlimited}, APIs: []string{"svc"}, Shadow: true, Distributed: true},
		{ID: "free", Rate: core.Limit{Rate: core.Unlimited}},
	}
	wantKeys := []identity.KeyRecord{
		{
			Hash: identity.HashKey("k1"), Policies: []string{"p"}, Inactive: true, QuotaEpoch: 2,
			Expires: time.Date(2027, 1, 31, 11, 0, 0, 0, time.UTC),
			APILimits: map[string]core.Limits{"svc": {
				Rate:       core.Limit{Rate: 3, Period: time.Minute},
				Quota:      core.Quota{Max: 1000, Renewal: 720 * time.Hour},
				QuotaEpoch: 7,
			}},
		},
		{Hash: h, Policies: []string{"free"}},
	}
	wantAPIs := []route{
		{ID: "svc", ListenPath: "/svc/", Target: "https://api.internal:8443/v1", Auth: "api_key"},
		{ID: "all", ListenPath: "/", Target: "http://127.0.0.1:9001", Auth: "keyless", Policies: []string{"free"}, StripListenPath: true},
	}
	if got := *cfg.Snapshot.Keys[0].Expires; !got.Equal(wantKeys[0].Expires) {
		t.Errorf("expires = %v, want %v", got, wantKeys[0].Expires)
	}
	keys, _ := cfg.Snapshot.KeyRecords()
	wantKeys[0].Expires = keys[0].Expires
	checkTravelling(t, cfg.Snapshot, wantPolicies, wantKeys, wantAPIs)
	// The travelling part, as a control plane would send it: the file's
	// names, the key by its hash, the listen path normalised.
	snap, err := json.Marshal(cfg.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	wantSnap := `{"revision":0,"policies":[` +
		`{"id":"p","rate":{"requests":10,"per":"1s","burst":20,"algorithm":"gcra"},"quota":{"max":-1},"apis":["svc"],"shadow":true,"distributed":true},` +
		`{"id":"free","rate":{"requests":-1}}],"keys":[` +
		`{"key_hash":"` + identity.HashKey("k1").String() + `","policies":["p"],"api_limits":{"svc":{"rate":{"requests":3,"per":"1m0s"},"quota":{"max":1000,"renewal":"720h0m0s"},"quota_epoch":7}},"expires":"2027-01-31T12:00:00+01:00","inactive":true,"quota_epoch":2},` +
		`{"key_hash":"` + h.String() + `","policies":["free"]}],"apis":[` +
		`{"id":"svc","listen_path":"/svc/","target":"https://api.internal:8443/v1","auth":"api_key","strip_listen_path":false,"strip_auth_data":false,"tags":["eu","edge"]},` +
		`{"id":"all","listen_path":"/","target":"http://127.0.0.1:9001","auth":"keyless","policies":["free"]}]}`
	if string(snap) != wantSnap {
		t.Errorf("snapshot JSON:\n got %s\nwant %s", snap, wantSnap)
	}
	cfg.Snapshot = spec.Snapshot{}
	if cfg.Resolver != (config.FileResolver{Dir: "."}) {
		t.Errorf("Resolver = %+v, want the file's directory, .", cfg.Resolver)
	}
	cfg.Resolver = config.FileResolver{}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config:\n got %+v\nwant %+v", cfg, want)
	}
}

// TestLoad checks file reading and that file names appear in messages.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(p, []byte("store: redis://r:6379/x\n"+api), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(p)
	if want := p + `:1:8: store: invalid database number: "x"`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	_, err = config.Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want os.ErrNotExist", err)
	}
}

// TestCheckListen covers the -listen flag's check.
func TestCheckListen(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:0", ":8080", "[::1]:9000", "localhost:80"} {
		if err := config.CheckListen(ok); err != nil {
			t.Errorf("CheckListen(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"8080", "127.0.0.1", "[::1]"} {
		want := `"` + bad + `" is not host:port (like 127.0.0.1:8080 or :8080)`
		if err := config.CheckListen(bad); err == nil || err.Error() != want {
			t.Errorf("CheckListen(%q) = %v, want %s", bad, err, want)
		}
	}
	for bad, port := range map[string]string{":http": "http", ":-1": "-1", "127.0.0.1:99999": "99999"} {
		want := `"` + bad + `": port "` + port + `" is not a number from 0 to 65535`
		if err := config.CheckListen(bad); err == nil || err.Error() != want {
			t.Errorf("CheckListen(%q) = %v, want %s", bad, err, want)
		}
	}
}

// FuzzParse checks that no input makes Parse panic, and that every refusal
// is a non-empty Errors whose entries name the file.
func FuzzParse(f *testing.F) {
	demo, err := os.ReadFile(filepath.Join("..", "..", "cmd", "limitplane-gateway", "demo.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(demo)
	f.Add([]byte(api))
	f.Add([]byte("policies:\n  - id: p\n    rate: {requests: 2.5, per: x, bust: 1}\n    rate: {}\n" + api))
	f.Add([]byte("a: &x [*x]\n"))
	redis, err := os.ReadFile(filepath.Join("..", "..", "cmd", "limitplane-gateway", "redis.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(redis)
	f.Add([]byte("store: redis+cluster://a:1,b:2?pool_size=3\nredis: {timeout: 1s, pipeline: 8, breaker_failures: 0, password_env: LP_FUZZ_UNSET}\n" +
		"policies:\n  - {id: w, rate: {requests: 3, per: 1m, algorithm: fixed_window, burst: 2}}\n" + api))
	f.Add([]byte("store: redis+sentinel://m@s1,s2/1?password=x\n" + api))
	f.Add([]byte("policies: [{id: p, rate: {requests: 1, per: 1s}}, {id: f, quota: {max: 3, renewal: 1h}}]\napis:\n" +
		"  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt, failure_limit: {policy: f}, jwt: {algorithms: [ES256, none, HS256], " +
		"jwks: {url: \"https://idp/jwks\", refresh_interval: 1h}, issuer: i, audience: [a], leeway: 30s, consumer_claim: user.id, policy_claim: pol, default_policies: [p]}}\n"))
	f.Add([]byte("policies: [{id: p}]\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt, jwt: {algorithms: [HS256, RS256], " +
		"keys: [{id: h, secret_env: LP_FUZZ_UNSET}, {id: h, secret_file: missing.secret}, {pem_file: missing.pem, secret_env: X}], default_policies: [p, q]}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse("f.yaml", data)
		if err == nil {
			if cfg == nil || len(cfg.Snapshot.APIs) == 0 {
				t.Fatalf("accepted without APIs: %+v", cfg)
			}
			return
		}
		var errs config.Errors
		if !errors.As(err, &errs) || len(errs) == 0 {
			t.Fatalf("error %T %v is not a non-empty config.Errors", err, err)
		}
		for _, e := range errs {
			if e.File != "f.yaml" || e.Problem == "" {
				t.Fatalf("bad entry %+v", e)
			}
		}
	})
}

// TestMemoryConfig: memory.max_keys reaches Config.Memory for the memory
// store and for the fallback store of failure_policy fallback; it is
// refused where no in-process store runs, and below 0.
func TestMemoryConfig(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       int
	}{
		{"left out", "", 0},
		{"memory store", "memory: {max_keys: 100000}\n", 100000},
		{"explicitly unbounded", "store: memory\nmemory: {max_keys: 0}\n", 0},
		{"redis with fallback", "store: redis://r\nfailure_policy: fallback\nmemory:\n  max_keys: 5000\n", 5000},
	} {
		cfg, err := config.Parse("t.yaml", []byte(tc.yaml+api))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if cfg.Memory.MaxKeys != tc.want {
			t.Errorf("%s: MaxKeys %d, want %d", tc.name, cfg.Memory.MaxKeys, tc.want)
		}
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"negative", "memory: {max_keys: -1}\n", `t.yaml:1:20: memory.max_keys: -1 must be >= 0 (0 means unbounded)`},
		{"redis without fallback", "store: redis://r\nmemory: {max_keys: 10}\n", `t.yaml:2:9: memory: only used with the memory store or failure_policy: fallback`},
		{"unknown field", "memory: {keys: 10}\n", `t.yaml:1:10: memory.keys: unknown field (known here: max_keys)`},
	} {
		_, err := config.Parse("t.yaml", []byte(tc.yaml+api))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: error %v, want %s", tc.name, err, tc.want)
		}
	}
}

// TestMergeKeys: a mapping takes the fields its merge keys (<<) bring and
// may override them, and booleans may be YAML 1.1's words, as the YAML
// library decodes them; a merge key that brings no mapping is refused.
func TestMergeKeys(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte("policies:\n  - &base {id: a, rate: {requests: 5, per: 1s}}\n  - <<: *base\n    id: b\n    shadow: yes\n"+api))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg.Snapshot.Policies)
	if err != nil {
		t.Fatal(err)
	}
	if w := `[{"id":"a","rate":{"requests":5,"per":"1s"}},{"id":"b","rate":{"requests":5,"per":"1s"},"shadow":true}]`; string(b) != w {
		t.Errorf("policies:\n got %s\nwant %s", b, w)
	}
	_, err = config.Parse("t.yaml", []byte("policies:\n  - <<: [1]\n    id: b\n"+api))
	if want := `t.yaml:2:10: policies[0]: want a mapping (or a list of them) to merge, got 1`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}

// TestMergedFieldsPlace: a problem of a field a merge key brings is placed
// where the merge names its text, as one an alias brings is at the alias.
func TestMergedFieldsPlace(t *testing.T) {
	_, err := config.Parse("t.yaml", []byte("policies:\n  - &base {id: a, rate: {requests: 5, per: 1s}}\n  - {<<: *base}\n"+api))
	if want := `t.yaml:3:10: policies[1].id: duplicate policy id "a" (first at policies[0].id on line 2)`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}
