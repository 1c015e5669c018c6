package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/spec"
)

// redis validates a Redis store URL and the redis section. The URL must
// carry no password (the file gives it apart) and is checked by
// redisstore.CheckURL as far as that needs no client;
// redisstore.NewClientFromURL checks the rest when the gateway starts.
func (v *loader) redis(store string, r *rawRedis) *Redis {
	if r == nil {
		r = &rawRedis{}
	}
	scheme := redisstore.Scheme(store)
	// The client is given the scheme in lower case; messages quote the
	// file.
	client := scheme + store[len(scheme):]
	out := &Redis{URL: client, Options: redisstore.Options{
		KeyPrefix: redisstore.DefaultKeyPrefix,
		Timeout:   number(v, "redis.timeout", r.Timeout, redisstore.DefaultTimeout, positive, mustBePositive),
		// 0 turns batching or the breaker off: the store's -1.
		Pipeline:        cmp.Or(number(v, "redis.pipeline", r.Pipeline, redisstore.DefaultPipeline, nonNegative, " must be >= 0 (0 turns batching off)"), -1),
		BreakerFailures: cmp.Or(number(v, "redis.breaker_failures", r.BreakerFailures, redisstore.DefaultBreakerFailures, nonNegative, " must be >= 0 (0 turns the breaker off)"), -1),
		BreakerCooldown: number(v, "redis.breaker_cooldown", r.BreakerCooldown, redisstore.DefaultBreakerCooldown, positive, mustBePositive),
		InFlightLease:   number(v, "redis.in_flight_lease", r.InFlightLease, redisstore.DefaultInFlightLease, positive, mustBePositive),
		SyncSettle:      r.SyncSettle,
	}}
	if r.KeyPrefix != "" {
		if strings.ContainsAny(r.KeyPrefix, "{}") {
			v.fail("redis.key_prefix", "%q must not contain \"{\" or \"}\" (they would move the Cluster hash tag)", r.KeyPrefix)
		}
		out.Options.KeyPrefix = r.KeyPrefix
	}

	u, err := url.Parse(client)
	if err == nil {
		if _, set := u.User.Password(); set || u.Query().Has("password") {
			v.fail("store", "the URL carries a password; give it with redis.password_env or redis.password_file instead")
			return out
		}
	}
	var ue *redisstore.URLError
	if err := redisstore.CheckURL(store); errors.As(err, &ue) {
		v.fail("store", "%s", ue.Problem)
		return out
	}
	if pw, _ := v.secret("redis", "password", r.PasswordEnv, r.PasswordFile); pw != "" {
		out.URL, _ = redisstore.WithPassword(store, pw) // it parsed above
		out.Password = pw
	}
	return out
}

// secret returns the secret the section at path gives with <kind>_env
// or <kind>_file (see spec.Secret), and whether it gives one; it may not
// give both.
func (v *loader) secret(path, kind, env, file string) (string, bool) {
	field := path + "." + kind + "_file"
	switch {
	case env != "" && file != "":
		v.fail(path, "set %s_env or %s_file, not both", kind, kind)
		return "", true
	case env != "":
		field = path + "." + kind + "_env"
	case file == "":
		return "", false
	}
	s, err := spec.Secret(v.files, env, file)
	if err != nil {
		v.fail(field, "%v", err)
	}
	return s, true
}

// maxFileSize bounds the files a config refers to (keys and secrets).
const maxFileSize = 1 << 20

// read reads a small regular file named in the config (see
// FileResolver.ReadFile), reporting at path why it cannot.
func (v *loader) read(path, p string) ([]byte, bool) {
	b, err := v.files.ReadFile(p)
	if err != nil {
		v.fail(path, "%v", err)
	}
	return b, err == nil
}

// FileResolver resolves a snapshot's secret references as the file they
// came from does (spec.Resolver): files relative to Dir, the
// configuration file's directory, and the process environment. Config's
// Resolver is the one for its file.
type FileResolver struct {
	// Dir is where relative file names start.
	Dir string
}

// ReadFile reads a small regular file; a relative path is taken from Dir.
// Devices, pipes and directories are refused without being opened, and
// files over 1 MiB are refused, so a mistyped path cannot block or exhaust
// the loader.
func (r FileResolver) ReadFile(p string) ([]byte, error) {
	full := p
	if !filepath.IsAbs(p) {
		full = filepath.Join(r.Dir, p)
	}
	fi, err := os.Stat(full)
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	} else if err == nil && fi.Size() > maxFileSize {
		err = errors.New("larger than 1 MiB")
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(full)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("cannot read %s: %w", full, err)
	}
	return b, nil
}

// LookupEnv returns the process environment's variable name.
func (FileResolver) LookupEnv(name string) (string, bool) { return os.LookupEnv(name) }

// memoryStore validates the memory section: max_keys >= 0, and the section
// only where an in-process store runs (store memory, or failure_policy
// fallback). cfg's Store, Redis and FailurePolicy are already set.
func (v *loader) memoryStore(cfg *Config, r *rawMemory) Memory {
	var out Memory
	if r == nil {
		return out
	}
	if cfg.Redis != nil && cfg.FailurePolicy != core.FailFallback && !v.failed("failure_policy") {
		v.fail("memory", "only used with the memory store or failure_policy: fallback")
	}
	out.MaxKeys = number(v, "memory.max_keys", r.MaxKeys, 0, nonNegative, " must be >= 0 (0 means unbounded)")
	return out
}
