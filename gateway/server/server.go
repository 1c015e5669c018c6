// Package server runs limitplane's gateway from its file settings: one
// call, Open, builds what the gateway program (cmd/limitplane-gateway)
// runs, so a program that embeds the gateway writes only its flags and
// signals.
//
// Open reads the YAML file (gateway/config), opens the store it names
// (in-process memory, or Redis, with the in-process fallback store under
// failure_policy fallback and the Distributed Rate Limiter with a drl
// section), makes the gateway over it and applies the file's policies,
// keys and APIs or, with a control_plane section, starts the data-plane
// agent that takes them from the control plane and persists what it
// applies. It listens on the gateway's address and, with an admin section,
// on the operations endpoint's (metrics, health, readiness, quota resets,
// reload). Serve serves both; Reload reads the file again (what the
// program does on SIGHUP); Shutdown drains the servers within
// server.shutdown_timeout; Close releases the agent, the gateway and the
// store.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/internal/seams"
)

// DefaultVersion is what a data-plane gateway tells its control plane it
// runs when Options.Version is "".
const DefaultVersion = "limitplane-gateway"

// Options say where the gateway's settings come from and what Open
// takes from the world outside them. The zero value of every field but
// ConfigPath and Config is a sensible default.
type Options struct {
	// ConfigPath is the gateway's YAML file: Open reads it (config.Load)
	// when Config is nil, and Reload reads it again. "" means the
	// configuration was not read from a file (Config then must be set)
	// and Reload refuses.
	ConfigPath string
	// Config is the configuration already read from ConfigPath (or
	// parsed by config.Parse, e.g. a built-in one); nil means Open reads
	// ConfigPath. Open does not modify it.
	Config *config.Config
	// Listen, when not "", overrides the configuration's listen address
	// (host:port; port 0 takes a free port, see (*Server).URL). Reload
	// compares the file's own listen address with the one the server
	// started from, not with Listen.
	Listen string
	// Logger receives the gateway's log: start-up notes, store failures
	// (rate-limited), reloads, the data-plane agent's events, shutdown.
	// nil means slog.Default().
	Logger *slog.Logger
	// Seams freeze the clocks and timers in this module's tests
	// (internal/seams; only this module can make one); nil means the
	// system's. Seams.Clock is the limit store's monotonic clock (also the
	// Redis scripts' and the DRL's, instead of Redis TIME, and Redis keys
	// then live a minute longer than their limits need); Seams.Now the
	// wall clock for X-RateLimit-Reset, key expiry and the agent's
	// staleness; Seams.AfterFunc times the store-failure log's intervals.
	Seams *seams.Seams
	// StartTimeout is how long a data-plane gateway waits for its control
	// plane before it starts from its persisted configuration
	// (dataplane.AgentOptions.StartTimeout); 0 means the agent's default,
	// 5 s.
	StartTimeout time.Duration
	// Version is sent to the control plane in the agent's Hello, for
	// operators; "" means DefaultVersion.
	Version string
}

// Server is a gateway opened by Open: its store, gateway, data-plane
// agent (with a control_plane section), metrics and listeners. Its
// methods are safe for concurrent use.
type Server struct {
	cfg *config.Config
	log *slog.Logger

	gw        *gateway.Gateway
	release   func() error // closes the gateway, then the store
	agent     *dataplane.Agent
	stopAgent context.CancelFunc
	agentDone chan error
	// quotaDone is closed when the global-quota runner (started with the
	// agent and stopped by stopAgent) has stopped; nil without one.
	quotaDone  chan struct{}
	persisted  string
	metrics    *opsMetrics
	reloader   *reloader
	ln         net.Listener
	active     *inFlight
	http       engine       // the gateway listener's server, net/http's or fasthttp's
	admin      *http.Server // nil without an admin section
	adminLn    net.Listener
	closeOnce  sync.Once
	closeErr   error
	serveOnce  sync.Once
	shutdownMu sync.Mutex
}

// Open builds a running gateway from its file settings: it reads the
// configuration (see Options.ConfigPath and Options.Config), opens the
// store it names, makes the gateway, applies the file's policies, keys
// and APIs (or, with a control_plane section, starts the data-plane agent,
// and the gateway answers 503 until the agent has applied a
// configuration), and listens on the gateway's and the admin endpoint's
// addresses. Nothing is served until Serve is called; connections made
// before wait in the listen backlog.
//
// ctx bounds the opening (the store's start-up ping, JWKS fetches of the
// first Apply); the running server does not depend on it.
//
// A configuration that does not load is returned as config.Load returns
// it (a config.Errors lists every problem with its line and column).
// Other errors name what failed: the store (a Redis that does not answer
// at start-up under failure_policy closed), the first Apply, the listen
// address, or the admin endpoint (prefixed "admin: "). Whatever Open
// opened before the error is closed again.
func Open(ctx context.Context, o Options) (*Server, error) {
	cfg := o.Config
	if cfg == nil {
		if o.ConfigPath == "" {
			return nil, errors.New("gateway server: neither Options.ConfigPath nor Options.Config is set")
		}
		var err error
		if cfg, err = config.Load(o.ConfigPath); err != nil {
			return nil, err
		}
	}
	c := *cfg // Listen may change: the caller's stays as it is
	cfg = &c
	fileListen := cfg.Listen
	if o.Listen != "" {
		cfg.Listen = o.Listen
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	s := &Server{cfg: cfg, log: o.Logger, metrics: newOpsMetrics()}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	gw, store, release, err := open(ctx, cfg, o, s.metrics)
	if err != nil {
		return nil, err
	}
	s.gw, s.release = gw, release
	s.metrics.registerKeys(store)
	if cfg.ControlPlane != nil {
		if s.agent, s.persisted, err = newAgent(cfg, gw, store, o); err != nil {
			return nil, err
		}
		s.metrics.registerSync(s.agent)
		actx, stop := context.WithCancel(context.Background())
		s.stopAgent, s.agentDone = stop, make(chan error, 1)
		go func() { s.agentDone <- s.agent.Run(actx) }()
		qr, err := newQuotaRunner(cfg, store, o)
		if err != nil {
			return nil, err
		}
		if qr != nil {
			s.quotaDone = make(chan struct{})
			go func() { defer close(s.quotaDone); _ = qr.Run(actx) }()
		}
	}
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, err
	}
	s.active = &inFlight{h: gw}
	s.reloader = &reloader{gw: gw, running: cfg, fileListen: fileListen, file: o.ConfigPath, log: s.log, stats: s.metrics.gateway}
	if err := s.listenAdmin(); err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	if cfg.Server.Engine == config.EngineFastHTTP {
		s.http = s.newFastEngine(s.active, s.ln)
	} else {
		s.http = netEngine{s.newHTTPServer(s.active)}
	}
	ok = true
	return s, nil
}

// newHTTPServer is an HTTP server for h with the file's server settings.
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	sc := s.cfg.Server
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: sc.ReadHeaderTimeout,
		ReadTimeout:       sc.ReadTimeout,
		WriteTimeout:      sc.WriteTimeout,
		IdleTimeout:       sc.IdleTimeout,
		MaxHeaderBytes:    sc.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// Serve serves the gateway on its listener and the admin endpoint on its
// own, and blocks until Shutdown or Close is called, when it returns
// http.ErrServerClosed, or until a server fails, when it returns that
// server's error (the admin endpoint's prefixed "admin: "; call Close
// then). Serve is called once; a second call returns an error at once.
func (s *Server) Serve() error {
	first := false
	s.serveOnce.Do(func() { first = true })
	if !first {
		return errors.New("gateway server: Serve called twice")
	}
	served := make(chan error, 1)
	go func() { served <- s.http.serve(s.ln) }()
	var adminServed chan error // nil, never ready, without an admin endpoint
	if s.admin != nil {
		adminServed = make(chan error, 1)
		go func() { adminServed <- s.admin.Serve(s.adminLn) }()
	}
	select {
	case err := <-served:
		return err
	case err := <-adminServed:
		if errors.Is(err, http.ErrServerClosed) {
			// Shutdown stops the admin endpoint first; the gateway's
			// server follows.
			return <-served
		}
		return fmt.Errorf("admin: %w", err)
	}
}

// Reload reads the configuration file (Options.ConfigPath) again and
// applies its policies, keys and APIs: what the gateway program does on
// SIGHUP and the admin endpoint on POST /reload. A file with problems is
// refused, each problem logged with its line and column, and the running
// configuration stays; the error returned says why (a config.Errors lists
// one problem per line). Without a ConfigPath, Reload refuses. Local
// settings (listen address, store, failure policy, timeouts, response
// format, client IP, admin, control_plane, drl) take effect only at a
// restart: each one the file changed is logged as such and the running
// value is kept. A gateway whose configuration comes from a control plane
// applies nothing: it checks the file and logs the local settings it
// changed (a file that drops or adds the control_plane section is
// refused: that takes a restart). ctx bounds the Apply (JWKS fetches).
func (s *Server) Reload(ctx context.Context) error { return s.reloader.reload(ctx) }

// Shutdown stops serving gracefully: the admin endpoint first, then the
// gateway, each closing its listener and waiting for the requests in
// flight, for at most the file's server.shutdown_timeout in all (less if
// ctx ends first). Then it closes the connections still busy (their
// clients see the connection closed without a response, or a cut-off
// body) and logs how many requests it cut: cutting what outlives the
// bound is the end of a shutdown, not a failure, and Shutdown returns nil
// then. It returns an error only if a server failed to shut down for
// another reason. Serve returns http.ErrServerClosed once Shutdown has
// begun. Shutdown does not release the agent, the gateway or the store:
// call Close after it.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownMu.Lock()
	defer s.shutdownMu.Unlock()
	timeout := s.cfg.Server.ShutdownTimeout
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if s.admin != nil {
		// The admin endpoint's calls are short: it stops first, within
		// the same bound, and the gateway's requests keep going meanwhile.
		if err := s.admin.Shutdown(sctx); err != nil {
			s.admin.Close()
		}
	}
	switch err := s.http.shutdown(sctx); {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		cut := s.active.n.Load()
		s.http.close()
		if ctx.Err() != nil {
			s.log.Warn("shutdown context ended; closed the connections of requests still in flight",
				"err", ctx.Err(), "requests_cut", cut)
		} else {
			s.log.Warn("shutdown_timeout passed; closed the connections of requests still in flight",
				"shutdown_timeout", timeout, "requests_cut", cut)
		}
	case err != nil:
		s.http.close()
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// Close closes the listeners and every connection at once (cutting what
// Shutdown has not drained), then stops the data-plane agent (its Run
// error is logged), then closes the gateway (JWKS refreshes stop) and the
// store: the Distributed Rate Limiter first (it leaves its group: its
// report and, if it is the allocator, its lease are deleted), then the
// Redis store and client, then the fallback store. The agent stops
// before the gateway and store it writes to close. It returns the errors
// of closing the gateway and the store, joined; later calls return nil.
func (s *Server) Close() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		if s.admin != nil {
			s.admin.Close()
		}
		if s.http != nil {
			s.http.close()
		}
		// An http.Server's Close closes only the listeners it serves.
		for _, ln := range []net.Listener{s.adminLn, s.ln} {
			if ln != nil {
				ln.Close()
			}
		}
		if s.stopAgent != nil {
			s.stopAgent()
			if err := <-s.agentDone; err != nil {
				s.log.Error("dataplane agent", "err", err)
			}
			if s.quotaDone != nil {
				<-s.quotaDone
			}
		}
		if s.release != nil {
			s.closeErr = s.release()
		}
	})
	if !first {
		return nil
	}
	return s.closeErr
}

// Gateway is the running gateway, for Snapshot, Key and the other
// methods of *gateway.Gateway.
func (s *Server) Gateway() *gateway.Gateway { return s.gw }

// Agent is the data-plane agent (its Status, for one), or nil without a
// control_plane section.
func (s *Server) Agent() *dataplane.Agent { return s.agent }

// Config is the configuration the server started from, with
// Options.Listen applied. Reloads do not change it. The caller must not
// modify it.
func (s *Server) Config() *config.Config { return s.cfg }

// Registry is the registry of the gateway's Prometheus metrics, served by
// the admin endpoint's GET /metrics: decisions, the gateway's own
// counters, the DRL's and the agent's when they run, and the Go runtime
// and process collectors. Register more collectors with it to serve them
// there too.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.registry }

// Addr is the gateway's listen address (with the port the system chose
// for port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is the base URL clients reach the gateway at: http://host:port,
// with the loopback address for a wildcard listen address (127.0.0.1, or
// ::1 for an IPv6 one).
func (s *Server) URL() string { return baseURL(s.ln.Addr()) }

// AdminURL is the base URL of the admin endpoint, as URL is the
// gateway's, or "" without an admin section.
func (s *Server) AdminURL() string {
	if s.adminLn == nil {
		return ""
	}
	return baseURL(s.adminLn.Addr())
}

// PersistedIn says where a data-plane gateway persists the last
// configuration it applied: "redis key <key>" when the store is Redis
// (dataplane.RedisConfigKey of its group), else "state file <path>". It
// is "" without a control_plane section.
func (s *Server) PersistedIn() string { return s.persisted }

// inFlight counts the requests its handler is serving, for the shutdown
// log line.
type inFlight struct {
	n atomic.Int64
	h *gateway.Gateway
}

// ServeHTTP implements http.Handler.
func (f *inFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.n.Add(1)
	defer f.n.Add(-1)
	f.h.ServeHTTP(w, r)
}

// engine is the server of the gateway's listener: net/http's (netEngine)
// or fasthttp's (fastEngine, server.engine: fasthttp).
type engine interface {
	// serve serves ln until shutdown or close, then returns
	// http.ErrServerClosed, or the error that stopped it.
	serve(ln net.Listener) error
	// shutdown closes the listener and waits for the requests in flight,
	// until ctx ends: it returns ctx's error then, with requests still
	// running.
	shutdown(ctx context.Context) error
	// close closes the listener and every connection at once.
	close()
}

// netEngine is net/http's server as an engine.
type netEngine struct{ s *http.Server }

func (e netEngine) serve(ln net.Listener) error        { return e.s.Serve(ln) }
func (e netEngine) shutdown(ctx context.Context) error { return e.s.Shutdown(ctx) }
func (e netEngine) close()                             { e.s.Close() }

// baseURL returns the URL clients reach addr at (a wildcard address is
// reached on the loopback).
func baseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
