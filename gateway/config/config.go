// Package config loads and validates the limitplane gateway's YAML
// configuration.
//
// A file is decoded strictly, by walking its YAML nodes against the
// schema, then checked as a whole: what decoded is checked even when
// other values did not, so one run reports every problem of a file,
// decoding and semantic alike, each naming the file, line and column, the
// field (as a path such as policies[1].rate.per) and what is wrong with
// it; the gateway refuses to start on any of them. The README's "Gateway
// configuration reference" documents every field.
//
// The file's travelling part, its policies, keys and APIs, is decoded into
// spec's types and judged by spec's Validate, as a control plane's
// snapshot is (Config.Snapshot); plaintext API keys are hashed with
// identity.HashKey while loading and are not kept. This package adds what
// only a file has and places spec's problems at their line and column.
// The rest of the file (listen address, store, Redis, failure policy,
// timeouts, response format, client_ip, admin, control_plane, drl) is
// local to the gateway and checked here.
package config

import (
	"fmt"
	"os"
	"time"

	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/yamlfile"
	"github.com/limitplane/limitplane/spec"
)

// Defaults for fields left out of a file.
const (
	// DefaultListen is the address the gateway listens on.
	DefaultListen = "127.0.0.1:8080"
	// DefaultReadHeaderTimeout bounds reading a request's header.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultReadTimeout bounds reading a whole request, body included.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds writing a response, from the end of the
	// request header (so it includes the upstream's time).
	DefaultWriteTimeout = 60 * time.Second
	// DefaultIdleTimeout bounds how long an idle keep-alive connection is
	// kept.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultShutdownTimeout bounds how long shutdown waits for requests
	// in flight.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header size.
	DefaultMaxHeaderBytes = 64 << 10
	// EngineNetHTTP and EngineFastHTTP are the values of server.engine:
	// the HTTP implementation serving the gateway's listener. EngineNetHTTP
	// is the default.
	EngineNetHTTP  = "net/http"
	EngineFastHTTP = "fasthttp"
	// DefaultAdminListen is the address of the operations endpoint when
	// the admin section leaves listen out: the loopback only.
	DefaultAdminListen = "127.0.0.1:8090"
)

// Config is a validated gateway configuration.
type Config struct {
	// Listen is the TCP address to listen on, "host:port".
	Listen string
	// Store is the counter store as the file names it: "memory", or a
	// Redis URL (see Redis; its scheme may be in any case). Show it with
	// RedactedStore.
	Store string
	// Redis configures the Redis store; nil for the memory store.
	Redis *Redis
	// Memory configures the in-process store: the store itself when Store
	// is "memory", and the fallback store of failure_policy fallback.
	Memory Memory
	// FailurePolicy is what the engine does when the store fails.
	FailurePolicy core.FailurePolicy
	// StoreTimeout bounds each store call; 0 means no bound.
	StoreTimeout time.Duration
	// Shadow makes every policy a shadow policy: limits are computed and
	// reported in headers, but nothing is denied.
	Shadow bool
	// ClientIP says how keyless APIs find a client's address: trusted
	// proxies, their forwarding header, and address grouping.
	ClientIP identity.ClientIPOptions
	// Server holds the HTTP server's limits.
	Server Server
	// Response configures the status codes and header fields.
	Response response.Options
	// Admin configures the operations endpoint (gateway.AdminHandler);
	// nil when the file has no admin section, and then there is none.
	Admin *Admin
	// ControlPlane, when the file has a control_plane section, says where
	// the policies, keys and APIs come from; Snapshot is then empty (the
	// file may not set them).
	ControlPlane *ControlPlane
	// DRL, when the file has a drl section, turns the Distributed Rate
	// Limiter on (core/drl): the policies marked distributed are
	// enforced in memory against this gateway's share. nil when the file
	// has none: such policies are then enforced exactly by the store.
	DRL *DRL
	// ThresholdWebhook, when the file has a threshold_webhook section,
	// sends an event when a key's spend reaches one of its quota
	// policy's thresholds (policies[].thresholds); nil when it has none.
	ThresholdWebhook *ThresholdWebhook
	// Snapshot is the file's travelling part (package spec): its
	// policies, keys (by hash: a plaintext key is hashed while loading
	// and not kept) and APIs (listen paths clean), as a control plane
	// would send them, with Revision 0. The rest of Config stays local.
	// Empty with a control_plane section.
	Snapshot spec.Snapshot
	// Resolver resolves the snapshot's secret references as the file
	// does: files relative to its directory, the process environment.
	Resolver FileResolver
}

// Redis is the Redis store's configuration: Config.Store was a redis://,
// rediss://, unix://, redis+cluster:// or redis+sentinel:// URL.
type Redis struct {
	// URL is what the client connects with (redisstore.NewClientFromURL):
	// Store with its scheme in lower case and the password from
	// password_env or password_file filled in. It may hold that secret;
	// never print it.
	URL string
	// Password is the password filled into URL, "" when none was given,
	// so messages can hide it.
	Password string
	// Options are the store's options. Clock is left nil: Redis's own
	// TIME decides.
	Options redisstore.Options
}

// Memory is the in-process store's options as the memory section gives
// them: MaxKeys is max_keys, the most keys (consumer and scope pairs) the
// store holds; at the cap a new consumer's request is a store failure,
// decided by failure_policy. 0 means unbounded. The rest is left zero.
type Memory = memory.Options

// Server holds the HTTP server's engine, timeouts and limits (each > 0).
// The file's server section decodes into it, over the defaults.
type Server struct {
	// Engine is the HTTP implementation serving the gateway's listener:
	// EngineNetHTTP (the default) or EngineFastHTTP (experimental; HTTP/1.1
	// only). The admin endpoint is served by net/http either way.
	Engine string `json:"engine"`
	// ReadHeaderTimeout bounds reading a request's header.
	ReadHeaderTimeout time.Duration `json:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration `json:"read_timeout"`
	// WriteTimeout bounds the time from the end of the request header to
	// the end of the response, the upstream's time included.
	WriteTimeout time.Duration `json:"write_timeout"`
	// IdleTimeout bounds how long an idle keep-alive connection is kept.
	IdleTimeout time.Duration `json:"idle_timeout"`
	// ShutdownTimeout bounds how long shutdown waits for requests in
	// flight.
	ShutdownTimeout time.Duration `json:"shutdown_timeout"`
	// MaxHeaderBytes bounds a request header's size in bytes.
	MaxHeaderBytes int `json:"max_header_bytes"`
}

// Admin is the operations endpoint's configuration. The file's admin
// section decodes into it, with the token's sources beside it.
type Admin struct {
	// Listen is its TCP address, "host:port"; DefaultAdminListen when the
	// file leaves it out.
	Listen string `json:"listen"`
	// Loopback reports whether Listen is a loopback address (127.0.0.0/8,
	// ::1 or localhost): only there may reads go without the token.
	Loopback bool `json:"-"`
	// Token is the bearer token read from token_env or token_file; ""
	// when neither is set (allowed on a loopback address only; calls
	// that change state are then refused). It is a secret: never print
	// it.
	Token string `json:"-"`
}

// RedactedStore returns Store for messages and banners, as the file wrote
// it except that a URL's password (in its user information or a password
// query parameter) is replaced by "xxxxx".
func (c *Config) RedactedStore() string { return redisstore.RedactURL(c.Store) }

// Load reads and parses the file at path (see Parse).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a YAML configuration. name is used in error
// messages (a file name). On failure the error is an Errors listing every
// problem found.
//
// Parse also loads what the file refers to: relative paths (pem_file,
// secret_file, password_file) are taken from name's directory, and
// secret_env and password_env are read from the process environment, so a
// missing or weak secret is reported here, at its line.
func Parse(name string, data []byte) (*Config, error) {
	v := newLoader(name)
	raw := &rawConfig{Server: Server{Engine: EngineNetHTTP, ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
		WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout, ShutdownTimeout: DefaultShutdownTimeout,
		MaxHeaderBytes: DefaultMaxHeaderBytes}}
	if !v.Decode(data, raw) {
		return nil, v.Errs
	}
	cfg := v.config(raw)
	if err := v.Err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Error is one problem in a configuration file: its File is the name
// given to Parse, its Field a path like "policies[1].rate.per" ("" for
// the file as a whole), and Error formats it as
// "file:line:column: field: problem".
type Error = yamlfile.Error

// Errors is every problem found in a file, in file order as far as
// possible, one per line. It is never empty when returned as an error.
type Errors = yamlfile.Errors
