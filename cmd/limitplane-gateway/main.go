// Command limitplane-gateway is limitplane's runnable API gateway: a reverse proxy
// that rate-limits and meters HTTP traffic per consumer, configured by one
// YAML file.
//
// Usage:
//
//	go run ./cmd/limitplane-gateway                       # built-in demo config on 127.0.0.1:8080
//	go run ./cmd/limitplane-gateway -config gateway.yaml  # your own config
//	go run ./cmd/limitplane-gateway -listen :9090         # override the listen address
//	go run ./cmd/limitplane-gateway -config cmd/limitplane-gateway/redis.yaml  # the demo on a local Redis
//
// Each API in the config is served under its listen path (the longest
// matching prefix wins) through limitplane's net/http middleware: API keys,
// the consumer claim of a signed JWT, or, for keyless APIs, client IPs are
// limited by their policies' rate limits and quotas, and answered with
// 401/403/429 and the RateLimit header fields. Counters live in the
// gateway process or, with store: redis://..., in Redis, shared by every
// gateway instance that uses it. Allowed requests go to the API's target:
// an http(s) upstream through net/http/httputil.ReverseProxy, or
// builtin:echo, which answers with JSON describing the request. SIGINT or
// SIGTERM shuts the gateway down cleanly, letting requests in flight
// finish (for up to server.shutdown_timeout; connections still busy then
// are closed), then closes the Redis client and stops JWKS refreshes.
// SIGHUP reads the file again and applies it (see the README).
//
// With a control_plane section the gateway is a data-plane gateway: it
// takes policies, keys and APIs from the control plane through a
// dataplane.Agent, answers 503 until the first configuration is applied,
// persists what it applies (in the store's Redis, or in the state file)
// and starts from it when the control plane does not answer within 5 s.
//
// With LP_GATEWAY_CPUPROFILE=file in its environment the gateway writes a
// CPU profile of its whole run to file, for benchmarks.
//
// The gateway itself is package gateway/server (server.Open builds it
// from the file); this command adds the flags, the signals, the banner
// and the exit status. The configuration reference is in the
// repository's README.md.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/gateway/server"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
	"github.com/redis/go-redis/v9"
)

// demoYAML is the configuration used when no -config is given.
//
//go:embed demo.yaml
var demoYAML []byte

// demoName names the built-in config in messages.
const demoName = "demo.yaml (built in)"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-hup:
				select {
				case reload <- struct{}{}:
				default: // a reload is already pending: it reads the newest file
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	stopProfile, err := startCPUProfile(os.Getenv(cpuProfileEnv))
	if err == nil {
		err = run(ctx, os.Args[1:], env{stdout: os.Stdout, stderr: os.Stderr, reload: reload})
		stopProfile()
	}
	stop()
	os.Exit(exitCode(os.Stderr, err))
}

// usageError is a mistake on the command line. main exits 2 for it, as
// the flag package's ExitOnError does.
type usageError struct {
	err error
	// printed: the flag package has already written it, with the usage.
	printed bool
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode writes run's error to w, once, and returns the exit status: 0
// after a requested shutdown (also when shutdown_timeout cut requests
// still in flight) or -h, 2 for a usage error, 1 for anything else (the
// gateway could not start, or its server failed).
func exitCode(w io.Writer, err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintln(w, "gateway:", err)
		}
		return 2
	}
	// Errors of package gateway already name it.
	fmt.Fprintln(w, "gateway:", strings.TrimPrefix(err.Error(), "gateway: "))
	return 1
}

// env is what run takes from the world outside its arguments. main passes
// the process's; tests pass their own writers and frozen clocks.
type env struct {
	stdout, stderr io.Writer
	// clock is the limit store's monotonic clock; nil means the system
	// clock.
	clock core.Clock
	// now is the wall clock for X-RateLimit-Reset and key expiry; nil
	// means time.Now.
	now func() time.Time
	// reload receives one value per reload request (main: SIGHUP); nil
	// means none.
	reload <-chan struct{}
	// afterFunc times the intervals of the store-failure log; nil means
	// time.AfterFunc.
	afterFunc gateway.AfterFunc
	// startTimeout is the data-plane agent's StartTimeout; 0 means its
	// default (5 s).
	startTimeout time.Duration
}

// run parses args, loads the configuration, serves until ctx is done, then
// shuts down gracefully: it stops accepting connections and waits up to
// server.shutdown_timeout for requests in flight, then closes the
// connections still busy (their clients see the connection closed without
// a response, or a cut-off body) and logs how many requests it cut. It
// returns nil after such a shutdown, cut requests or not,
// flag.ErrHelp after -h, and a *usageError for a bad command line (an
// unknown flag, a bad -listen, a stray argument), after printing the
// error and the usage to e.stderr.
func run(ctx context.Context, args []string, e env) error {
	if e.now == nil {
		e.now = time.Now
	}
	fs := flag.NewFlagSet("limitplane-gateway", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	// -config "" is refused, not taken for the demo: a deploy script's
	// unset variable (-config "$CONFIG") must not start the demo's keys.
	var configFile string
	fs.Func("config", "YAML configuration `file` (default: the built-in demo config)", func(s string) error {
		if s == "" {
			return errors.New("empty file name (leave -config out for the built-in demo)")
		}
		configFile = s
		return nil
	})
	var listen string
	// A bad address is a bad flag value: the flag package reports it with
	// the usage, as it does an unknown flag.
	fs.Func("listen", "`address` to listen on, host:port (overrides the config's listen)", func(s string) error {
		listen = s
		return config.CheckListen(s)
	})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: limitplane-gateway [-config FILE] [-listen ADDR]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err: err, printed: true}
	}
	if fs.NArg() > 0 {
		// Reported as the flag package reports its own errors.
		err := fmt.Errorf("unexpected argument %q", fs.Arg(0))
		fmt.Fprintln(fs.Output(), err)
		fs.Usage()
		return &usageError{err: err, printed: true}
	}

	var cfg *config.Config
	var err error
	if configFile == "" {
		cfg, err = config.Parse(demoName, demoYAML)
	} else {
		cfg, err = config.Load(configFile)
	}
	if errs := (config.Errors{}); errors.As(err, &errs) {
		return fmt.Errorf("invalid configuration, not starting:\n%w", err)
	} else if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	// go-redis's own log lines (a failed dial while Redis is down) go to
	// the gateway's log, rate-limited; its logger is process-wide, so the
	// program installs it, not the library.
	rl := gateway.NewRedisLogger(log, e.afterFunc)
	redis.SetLogger(rl)
	defer rl.Close()
	srv, err := server.Open(ctx, server.Options{
		ConfigPath:   configFile,
		Config:       cfg,
		Listen:       listen,
		Logger:       log,
		Seams:        &seams.Seams{Clock: e.clock, Now: e.now, AfterFunc: e.afterFunc},
		StartTimeout: e.startTimeout,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Error("close", "err", err)
		}
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	printBanner(e.stdout, srv.URL(), srv.AdminURL(), srv.Config(), configFile, srv.PersistedIn())

	for done := false; !done; {
		select {
		case err := <-served:
			return err
		case <-e.reload:
			srv.Reload(ctx) // logged; the running configuration stays
		case <-ctx.Done():
			done = true
		}
	}
	fmt.Fprintln(e.stdout, "shutting down")
	if err := srv.Shutdown(context.Background()); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// printBanner says where the gateway listens, where its admin endpoint
// listens (admin, "" when off), what it routes (or, for a data-plane
// gateway, its control plane and where it persists: persisted), and, for
// the demo config, three requests to try. It writes once, so a reader
// that sees the first line has the whole banner.
func printBanner(out io.Writer, base, admin string, cfg *config.Config, file, persisted string) {
	w := new(strings.Builder)
	defer func() { io.WriteString(out, w.String()) }()
	name := file
	if name == "" {
		name = "built-in demo"
	}
	store := cfg.RedactedStore()
	if e := cfg.Server.Engine; e != "" && e != config.EngineNetHTTP {
		store += ", engine: " + e // the default engine goes unsaid
	}
	if cp := cfg.ControlPlane; cp != nil {
		fmt.Fprintf(w, "limitplane gateway listening on %s (config: %s, store: %s, control plane: %s group %s)\n", base, name, store, cp.Address, cp.Group)
	} else {
		fmt.Fprintf(w, "limitplane gateway listening on %s (config: %s, store: %s)\n", base, name, store)
	}
	if admin != "" {
		token := "token required for changes"
		if !cfg.Admin.Loopback {
			token = "token required"
		}
		fmt.Fprintf(w, "  admin endpoint at %s (/metrics, /healthz, /readyz, /consumers/{id}, /reload; %s)\n", admin, token)
	}
	if cp := cfg.ControlPlane; cp != nil {
		tlsMode := "off"
		if cp.TLS != nil {
			tlsMode = "on"
			if len(cp.TLS.Certificates) > 0 {
				tlsMode = "mutual"
			}
		}
		fmt.Fprintf(w, "  policies, keys and APIs from the control plane (tags %v, tls: %s, on_stale: %s); last applied configuration persisted in %s\n",
			cp.Tags, tlsMode, cp.OnStale, persisted)
	}
	if d := cfg.DRL; d != nil {
		fmt.Fprintf(w, "  distributed rate limiter: group %s, interval %v, max_gateways %d (policies marked distributed share their limit in memory)\n",
			d.Group, d.Interval, d.MaxGateways)
	}
	for _, a := range cfg.Snapshot.APIs {
		auth := a.AuthOrDefault()
		if a.Auth == spec.AuthKeyless {
			auth += fmt.Sprintf(", policies %v per client IP", a.Policies)
		}
		if a.FailureLimit != nil {
			auth += fmt.Sprintf(", failed attempts limited by policy %s per client IP", a.FailureLimit.Policy)
		}
		fmt.Fprintf(w, "  %s -> %s (%s)\n", a.ListenPath, a.Target, auth)
	}
	if file != "" {
		return
	}
	tries := [][2]string{
		{"curl -i -H 'X-API-Key: demo-key-1' " + base + "/echo/hello", "run it 6 times: 5 a minute pass, the 6th gets 429"},
		{"curl -i " + base + "/echo/hello", "no API key: 401"},
		{"curl -i " + base + "/open/hello", "keyless API, limited per client IP"},
	}
	fmt.Fprintln(w, "\nTry it:")
	for _, t := range tries {
		fmt.Fprintf(w, "  %-*s  # %s\n", len(tries[0][0]), t[0], t[1])
	}
}
