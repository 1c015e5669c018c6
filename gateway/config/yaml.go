package config

import (
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/limitplane/limitplane/internal/yamlfile"
	"github.com/limitplane/limitplane/spec"
)

// The file's shape. Its travelling part (policies, keys, apis) is spec's
// own types; the local part is below. Local enumerations are strings,
// parsed by the validator so that its messages explain them; pointers
// tell "left out" from zero. Field names are the json tags: a
// file is decoded by walking its YAML nodes against these types
// (yamlfile) into JSON, which spec's types read as a control plane's
// snapshot.

type rawConfig struct {
	Listen        string               `json:"listen"`
	Store         string               `json:"store"`
	FailurePolicy string               `json:"failure_policy"`
	StoreTimeout  *time.Duration       `json:"store_timeout"`
	Redis         *rawRedis            `json:"redis"`
	Memory        *rawMemory           `json:"memory"`
	Shadow        bool                 `json:"shadow"`
	ClientIP      rawClientIP          `json:"client_ip"`
	Server        Server               `json:"server"`
	Response      rawResponse          `json:"response"`
	Admin         *fileAdmin           `json:"admin"`
	ControlPlane  *rawControlPlane     `json:"control_plane"`
	DRL           *rawDRL              `json:"drl"`
	Webhook       *rawThresholdWebhook `json:"threshold_webhook"`
	Policies      []spec.Policy        `json:"policies"`
	Keys          []rawKey             `json:"keys"`
	APIs          []spec.API           `json:"apis"`
}

type rawRedis struct {
	Timeout         *time.Duration `json:"timeout"`
	KeyPrefix       string         `json:"key_prefix"`
	Pipeline        *int           `json:"pipeline"`
	BreakerFailures *int           `json:"breaker_failures"`
	BreakerCooldown *time.Duration `json:"breaker_cooldown"`
	InFlightLease   *time.Duration `json:"in_flight_lease"`
	SyncSettle      bool           `json:"sync_settle"`
	PasswordEnv     string         `json:"password_env"`
	PasswordFile    string         `json:"password_file"`
}

type rawMemory struct {
	MaxKeys *int `json:"max_keys"`
}

// fileAdmin is the admin section: Admin, and its token's sources.
type fileAdmin struct {
	Admin
	TokenEnv  string `json:"token_env"`
	TokenFile string `json:"token_file"`
}

type rawControlPlane struct {
	Address   string              `json:"address"`
	TokenEnv  string              `json:"token_env"`
	TokenFile string              `json:"token_file"`
	Group     string              `json:"group"`
	Tags      []string            `json:"tags"`
	GatewayID string              `json:"gateway_id"`
	TLS       *rawControlPlaneTLS `json:"tls"`
	MaxStale  *time.Duration      `json:"max_stale"`
	OnStale   string              `json:"on_stale"`
	StateFile string              `json:"state_file"`
}

type rawControlPlaneTLS struct {
	CAFile     string `json:"ca_file"`
	CertFile   string `json:"cert_file"`
	KeyFile    string `json:"key_file"`
	ServerName string `json:"server_name"`
}

type rawDRL struct {
	Group       string         `json:"group"`
	Interval    *time.Duration `json:"interval"`
	MaxGateways *int           `json:"max_gateways"`
	JoinReserve *int           `json:"join_reserve"`
	Headroom    *float64       `json:"headroom"`
}

type rawClientIP struct {
	TrustedProxies []string `json:"trusted_proxies"`
	Header         string   `json:"header"`
	IPv4PrefixLen  *int     `json:"ipv4_prefix_len"`
	IPv6PrefixLen  *int     `json:"ipv6_prefix_len"`
}

type rawResponse struct {
	RateLimitHeaders   *bool  `json:"ratelimit_headers"`
	XRateLimit         bool   `json:"x_ratelimit"`
	XRateLimitReset    string `json:"x_ratelimit_reset"`
	QuotaStatus        *int   `json:"quota_status"`
	StoreFailureStatus *int   `json:"store_failure_status"`
}

// rawKey is a key as a file gives it: spec's, or in plaintext (key),
// hashed while loading.
type rawKey struct {
	Plain string `json:"key"`
	spec.Key
}

// loader decodes a file and checks what decoded, collecting every
// problem but those that echo another: decoding reports every problem of
// shape at its node, and the checks place theirs by field path
// (yamlfile.File.Report).
type loader struct {
	*yamlfile.File
	memory bool         // the store is the in-process one (GCRA only), for sure
	files  FileResolver // the file's: what it names is read from its directory
}

// newLoader returns the loader of the file name: spec's durations are
// kept as text (spec parses them again), local ones are decoded, and a
// JWT key's inline pem and secret are not offered.
func newLoader(name string) *loader {
	return &loader{files: FileResolver{Dir: filepath.Dir(name)}, File: &yamlfile.File{Name: name, Empty: "empty configuration",
		Omit: map[reflect.Type][]string{reflect.TypeFor[spec.JWTKey](): {"pem", "secret"}},
		Scalars: map[reflect.Type]yamlfile.Scalar{
			reflect.TypeFor[spec.Duration](): {Parse: func(path, s string) (any, string) {
				_, problem := parseDuration(s, durationExamples(path))
				return s, problem
			}},
			// A local setting's: a bad one leaves no field uncertain.
			reflect.TypeFor[time.Duration](): {Alone: true, Parse: func(path, s string) (any, string) {
				return parseDuration(s, durationExamples(path))
			}},
		}}}
}

// durationExamples are the examples a "not a duration" problem at path
// gives.
func durationExamples(path string) string {
	switch {
	case strings.HasSuffix(path, ".leeway"):
		return "30s or 1m"
	case path == "control_plane.max_stale":
		return "30m, 1h or 24h"
	case path == "drl.interval":
		return "500ms, 1s or 2s"
	}
	return "500ms, 10s, 1m or 24h"
}
