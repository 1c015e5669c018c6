// Command limitplane-controlplane is limitplane's control plane: it keeps the
// policies, API keys and APIs of every data plane in a bbolt file, serves
// the admin REST API (see controlplane.Admin) to change them, and serves
// the data planes' gRPC sync stream (see controlplane.SyncServer).
//
// Usage:
//
//	LP_CP_ADMIN_TOKEN=$(openssl rand -hex 32) go run ./cmd/limitplane-controlplane -dataplanes dataplanes.yaml
//	go run ./cmd/limitplane-controlplane -admin-token-file token.txt -data /var/lib/limitplane/cp.db \
//		-dataplanes dataplanes.yaml -sync-listen 10.0.0.5:7071 -tls-cert cp.pem -tls-key cp-key.pem
//
// Flags, each with an environment variable for its default:
//
//	-admin-listen ADDR     LP_CP_ADMIN_LISTEN  (127.0.0.1:7070; loopback only unless TLS or -admin-insecure)
//	-admin-tls-cert FILE   LP_CP_ADMIN_TLS_CERT TLS on the admin API (with -admin-tls-key)
//	-admin-tls-key FILE    LP_CP_ADMIN_TLS_KEY
//	-admin-insecure        LP_CP_ADMIN_INSECURE plaintext admin API on an address other than loopback
//	-data FILE             LP_CP_DATA          (controlplane.db) the bbolt file of the state
//	-store URL             LP_CP_STORE         a postgres:// or postgresql:// URL: the state in PostgreSQL instead
//	-store-password-file FILE LP_CP_STORE_PASSWORD_FILE; or the password itself in LP_CP_STORE_PASSWORD
//	-admin-token-file FILE LP_CP_ADMIN_TOKEN_FILE; or the token itself in LP_CP_ADMIN_TOKEN
//	-change-log N          revisions kept in the change log (10000)
//	-sync-listen ADDR      LP_CP_SYNC_LISTEN   (127.0.0.1:7071)
//	-dataplanes FILE       LP_CP_DATAPLANES    data-plane tokens; without it the sync port is not served
//	-tls-cert FILE         LP_CP_TLS_CERT      TLS on the sync port (with -tls-key)
//	-tls-key FILE          LP_CP_TLS_KEY
//	-tls-client-ca FILE    LP_CP_TLS_CLIENT_CA mutual TLS: client certificates must chain to it
//	-sync-insecure         LP_CP_SYNC_INSECURE plaintext sync on an address other than loopback
//	-keepalive D           LP_CP_KEEPALIVE     (10s) see below
//	-hello-timeout D       LP_CP_HELLO_TIMEOUT (10s) a sync stream without its Hello by then is ended
//	-sync-max-streams N    LP_CP_SYNC_MAX_STREAMS (10000) open sync streams, all connections together
//	-sync-max-streams-per-conn N  LP_CP_SYNC_MAX_STREAMS_PER_CONN (16) concurrent streams on one connection
//	-sync-max-pending-hellos N    LP_CP_SYNC_MAX_PENDING_HELLOS (1024) streams waiting for their Hello
//	-dataplane-expiry D    LP_CP_DATAPLANE_EXPIRY (1h) a gateway gone this long leaves GET /api/dataplanes
//
// The -dataplanes file lists the data-plane tokens, each bound to the one
// group it may open streams for and the tags it may ask for:
//
//	# dataplanes.yaml
//	- group: dp1
//	  tags: [dp1]
//	  token_hash: "sha256:<64 hex digits>"   # the token's SHA-256: the file holds no secret
//	- group: dp2
//	  tags: [dp2, shared]
//	  token_env: LP_DP2_TOKEN                # or token_file: dp2.token (relative to the file)
//
// The admin token must be at least 32 bytes (controlplane.MinTokenBytes;
// e.g. openssl rand -hex 32), and the admin API, like the sync port,
// serves plaintext only on a loopback address unless -admin-insecure is
// given (the token would cross the network in plaintext); with
// -admin-tls-cert and -admin-tls-key it serves HTTPS. The program refuses
// to start otherwise (exit status 2). Every admin write is logged (INFO
// "controlplane: admin write": the token's hash prefix, the method and
// path, the new revision).
//
// Plaintext tokens are hashed as the file is read and never kept. A wrong
// token is refused with Unauthenticated, a group or tag outside its scope
// with PermissionDenied, and both are logged.
//
// Without TLS the sync port must listen on a loopback address (the tokens
// would cross the network in plaintext) unless -sync-insecure is given;
// the program refuses to start otherwise (exit status 2). Keepalive: the
// server pings each connection every -keepalive and closes one that does
// not answer within half of it, and accepts client pings every half of it
// or more, with or without a stream.
//
// A stream that sends no Hello within -hello-timeout is ended with
// DeadlineExceeded; one more stream than -sync-max-streams, or than
// -sync-max-pending-hellos waiting for their Hello, is refused with
// ResourceExhausted; a connection's streams beyond
// -sync-max-streams-per-conn wait (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS).
// Refused sync streams and refused admin calls are logged at most once
// per 5s, each line with how many it stands for.
//
// The admin listener also serves, without the bearer token (probes and
// scrapers hold no secret; these reveal counts and the revision only):
// GET /healthz (liveness), GET /readyz (200 when the store is open and
// takes a write, else 503; see controlplane.Health) and GET /metrics, the
// control plane's Prometheus metrics (controlplane.Metrics) and the Go
// runtime's and the process's, from a registry of its own.
//
// A write is answered only once it is on disk, so every acknowledged
// write survives kill -9. SIGINT or SIGTERM stops the program and exits 0:
// sync streams are ended with Unavailable (gateways reconnect with
// backoff), the gRPC server stops (at most 5s), admin calls in flight
// finish (at most 10s), and the file is closed.
//
// PostgreSQL: with -store postgres://user@host:5432/db (or postgresql://)
// the state lives in that database instead of the -data file
// (controlplane.Postgres), and any number of control planes may share it:
// each serves the admin API and the sync port, a write through one
// reaches the data planes of every other within milliseconds
// (LISTEN/NOTIFY, with a poll every second as a backstop). The program
// creates and migrates the schema, and refuses a database whose schema is
// newer than it knows. Give the password in -store-password-file or
// LP_CP_STORE_PASSWORD rather than in the URL (a password in the URL
// draws a warning at start); the first of -store-password-file,
// LP_CP_STORE_PASSWORD and the URL's password that is given is used. The
// URL is shown (banner, errors) without its password either way. While
// the database is unreachable, admin writes answer 503 and the sync
// streams stay open; a control plane started while it is unreachable
// exits 1 ("the database of -store … is unavailable").
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(os.Stderr, err))
}

// usageError is a mistake on the command line (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode writes err to w and returns the exit status: 0 for nil or -h,
// 2 for a usage error, 1 otherwise.
func exitCode(w io.Writer, err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(w, "controlplane:", err)
		return 2
	}
	fmt.Fprintln(w, "controlplane:", strings.TrimPrefix(err.Error(), "controlplane: "))
	return 1
}

// adminConfig is the admin API's listener part of the command line.
type adminConfig struct {
	listen, cert, key string
	insecure          bool
}

// check refuses an admin listener that cannot be served safely: a
// certificate without its key (or the reverse), and plaintext on an
// address other than loopback without -admin-insecure.
func (c *adminConfig) check() error {
	if (c.cert == "") != (c.key == "") {
		return errors.New("-admin-tls-cert and -admin-tls-key go together")
	}
	if c.cert != "" || c.insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("-admin-listen %q: %v", c.listen, err)
	}
	if !identity.IsLoopbackHost(host) {
		return fmt.Errorf("-admin-listen %s is not a loopback address and the admin API has no TLS: the admin token would cross the network in plaintext; give -admin-tls-cert and -admin-tls-key, or -admin-insecure to accept that", c.listen)
	}
	return nil
}

// tlsConfig is the admin API's TLS configuration; nil for plaintext.
func (c *adminConfig) tlsConfig() (*tls.Config, error) {
	if c.cert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("admin TLS: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// envBool is the boolean in environment variable name, false when it is
// empty.
func envBool(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &usageError{fmt.Errorf("%s=%q: want true or false", name, v)}
	}
	return b, nil
}

// syncConfig is the sync port's part of the command line.
type syncConfig struct {
	listen, dataplanes, cert, key, clientCA  string
	insecure                                 bool
	keepalive, helloTimeout                  time.Duration
	maxStreams, maxStreamsPerConn, maxHellos int
}

// tlsMode is the banner's word for the sync port's TLS.
func (c *syncConfig) tlsMode() string {
	switch {
	case c.clientCA != "":
		return "mutual"
	case c.cert != "":
		return "on"
	}
	return "off"
}

// check refuses a sync configuration that cannot be served safely: a
// certificate without its key (or the reverse), a client CA without a
// certificate, a keepalive under a second, and plaintext on an address
// other than loopback without -sync-insecure.
func (c *syncConfig) check() error {
	switch {
	case (c.cert == "") != (c.key == ""):
		return errors.New("-tls-cert and -tls-key go together")
	case c.clientCA != "" && c.cert == "":
		return errors.New("-tls-client-ca needs -tls-cert and -tls-key (mutual TLS is TLS first)")
	case c.keepalive < time.Second:
		return fmt.Errorf("-keepalive %s: want at least 1s", c.keepalive)
	case c.helloTimeout <= 0:
		return fmt.Errorf("-hello-timeout %s: want more than 0", c.helloTimeout)
	case c.maxStreams < 1 || c.maxStreamsPerConn < 1 || c.maxHellos < 1:
		return fmt.Errorf("-sync-max-streams %d, -sync-max-streams-per-conn %d, -sync-max-pending-hellos %d: want at least 1", c.maxStreams, c.maxStreamsPerConn, c.maxHellos)
	}
	if c.cert != "" || c.insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("-sync-listen %q: %v", c.listen, err)
	}
	if !identity.IsLoopbackHost(host) {
		return fmt.Errorf("-sync-listen %s is not a loopback address and the sync port has no TLS: data-plane tokens would cross the network in plaintext; give -tls-cert and -tls-key (and -tls-client-ca for mutual TLS), or -sync-insecure to accept that", c.listen)
	}
	return nil
}

// serverOptions are the gRPC server's options: TLS as configured, and
// keepalive: a ping every keepalive (10s by default), a peer that does not
// answer within half of it is closed; clients may ping every half of it or
// more, also without a stream.
func (c *syncConfig) serverOptions() ([]grpc.ServerOption, error) {
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: c.keepalive, Timeout: c.keepalive / 2}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.keepalive / 2, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(uint32(c.maxStreamsPerConn)),
	}
	if c.cert == "" {
		return opts, nil
	}
	cert, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("sync TLS: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.clientCA != "" {
		pem, err := os.ReadFile(c.clientCA)
		if err != nil {
			return nil, fmt.Errorf("sync TLS: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("sync TLS: client CA %s: no PEM certificate in it", c.clientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return append(opts, grpc.Creds(credentials.NewTLS(tc))), nil
}

// Memory release: every releaseEvery, when the heap holds more free
// memory not yet returned to the system than a quarter of the memory its
// objects use, and at least releaseMinFree, the program returns it
// (debug.FreeOSMemory, a forced collection). A burst of streams or calls
// (an attack on the sync port, thousands of gateways reconnecting)
// leaves the heap large, and the runtime alone returns little of it:
// without this, 5,000 Hello-less streams left the RSS at 110 MB, against
// 16 MB at the start, minutes after they ended. A control plane whose
// heap is large and busy does not qualify, so it is not collected every
// releaseEvery.
const (
	releaseEvery   = 10 * time.Second
	releaseMinFree = 4 << 20
)

// releaseMemory runs the memory release until ctx is done.
func releaseMemory(ctx context.Context) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	t := time.NewTicker(releaseEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 || sample[1].Value.Kind() != metrics.KindUint64 {
			continue
		}
		if free := sample[0].Value.Uint64(); free > releaseMinFree && free > sample[1].Value.Uint64()/4 {
			debug.FreeOSMemory()
		}
	}
}

// envDuration is the duration in environment variable name, or def when
// it is empty.
func envDuration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, &usageError{fmt.Errorf("%s=%q: %v", name, v, err)}
	}
	return d, nil
}

// envInt is the integer in environment variable name, or def when it is
// empty.
func envInt(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &usageError{fmt.Errorf("%s=%q: want an integer", name, v)}
	}
	return n, nil
}

// run parses args (defaults from getenv), opens the store and serves the
// admin API, and the sync port when a -dataplanes file is given, until
// ctx is done; then it shuts down in order: the sync streams (ended with
// Unavailable), the gRPC server (GracefulStop, at most 5s), the admin API
// (at most 10s), the store.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	or := func(env, def string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("limitplane-controlplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var ac adminConfig
	fs.StringVar(&ac.listen, "admin-listen", or("LP_CP_ADMIN_LISTEN", "127.0.0.1:7070"), "admin API `address` (env LP_CP_ADMIN_LISTEN)")
	fs.StringVar(&ac.cert, "admin-tls-cert", getenv("LP_CP_ADMIN_TLS_CERT"), "admin API TLS certificate `file`, PEM (env LP_CP_ADMIN_TLS_CERT)")
	fs.StringVar(&ac.key, "admin-tls-key", getenv("LP_CP_ADMIN_TLS_KEY"), "admin API TLS key `file`, PEM (env LP_CP_ADMIN_TLS_KEY)")
	adminInsecureDefault, err := envBool(getenv, "LP_CP_ADMIN_INSECURE")
	if err != nil {
		return err
	}
	fs.BoolVar(&ac.insecure, "admin-insecure", adminInsecureDefault, "serve the admin API in plaintext on an address other than loopback (env LP_CP_ADMIN_INSECURE)")
	data := fs.String("data", or("LP_CP_DATA", "controlplane.db"), "bbolt data `file` (env LP_CP_DATA); unused with a PostgreSQL -store")
	storeURL := fs.String("store", getenv("LP_CP_STORE"), "PostgreSQL `URL` (postgres://user@host:5432/db): keep the state there instead of the -data file (env LP_CP_STORE). The password: -store-password-file, else LP_CP_STORE_PASSWORD, else the URL's")
	storePasswordFile := fs.String("store-password-file", getenv("LP_CP_STORE_PASSWORD_FILE"), "`file` holding the PostgreSQL password (env LP_CP_STORE_PASSWORD_FILE; or the password in LP_CP_STORE_PASSWORD)")
	tokenFile := fs.String("admin-token-file", getenv("LP_CP_ADMIN_TOKEN_FILE"), "`file` holding the admin bearer token (env LP_CP_ADMIN_TOKEN_FILE; or the token in LP_CP_ADMIN_TOKEN)")
	changeLog := fs.Int("change-log", controlplane.DefaultChangeLogRevisions, "revisions kept in the change log")
	var sc syncConfig
	fs.StringVar(&sc.listen, "sync-listen", or("LP_CP_SYNC_LISTEN", "127.0.0.1:7071"), "sync gRPC `address` (env LP_CP_SYNC_LISTEN)")
	fs.StringVar(&sc.dataplanes, "dataplanes", getenv("LP_CP_DATAPLANES"), "YAML `file` of data-plane tokens; without it the sync port is not served (env LP_CP_DATAPLANES)")
	fs.StringVar(&sc.cert, "tls-cert", getenv("LP_CP_TLS_CERT"), "sync port TLS certificate `file`, PEM (env LP_CP_TLS_CERT)")
	fs.StringVar(&sc.key, "tls-key", getenv("LP_CP_TLS_KEY"), "sync port TLS key `file`, PEM (env LP_CP_TLS_KEY)")
	fs.StringVar(&sc.clientCA, "tls-client-ca", getenv("LP_CP_TLS_CLIENT_CA"), "CA `file` (PEM) that data planes' client certificates must chain to: mutual TLS (env LP_CP_TLS_CLIENT_CA)")
	insecureDefault, err := envBool(getenv, "LP_CP_SYNC_INSECURE")
	if err != nil {
		return err
	}
	fs.BoolVar(&sc.insecure, "sync-insecure", insecureDefault, "serve the sync port in plaintext on an address other than loopback (env LP_CP_SYNC_INSECURE)")
	keepaliveDefault, err := envDuration(getenv, "LP_CP_KEEPALIVE", 10*time.Second)
	if err != nil {
		return err
	}
	fs.DurationVar(&sc.keepalive, "keepalive", keepaliveDefault, "sync keepalive: a ping every `interval`, answered within half of it; clients may ping every half of it (env LP_CP_KEEPALIVE)")
	helloDefault, err := envDuration(getenv, "LP_CP_HELLO_TIMEOUT", controlplane.DefaultHelloTimeout)
	if err != nil {
		return err
	}
	fs.DurationVar(&sc.helloTimeout, "hello-timeout", helloDefault, "a sync stream without its Hello after this `duration` is ended (env LP_CP_HELLO_TIMEOUT)")
	maxDefault, err := envInt(getenv, "LP_CP_SYNC_MAX_STREAMS", controlplane.DefaultMaxStreams)
	if err != nil {
		return err
	}
	fs.IntVar(&sc.maxStreams, "sync-max-streams", maxDefault, "open sync streams, all connections together; one more is refused (env LP_CP_SYNC_MAX_STREAMS)")
	perConnDefault, err := envInt(getenv, "LP_CP_SYNC_MAX_STREAMS_PER_CONN", controlplane.DefaultMaxStreamsPerConn)
	if err != nil {
		return err
	}
	fs.IntVar(&sc.maxStreamsPerConn, "sync-max-streams-per-conn", perConnDefault, "concurrent sync streams on one connection (env LP_CP_SYNC_MAX_STREAMS_PER_CONN)")
	hellosDefault, err := envInt(getenv, "LP_CP_SYNC_MAX_PENDING_HELLOS", controlplane.DefaultMaxPendingHellos)
	if err != nil {
		return err
	}
	fs.IntVar(&sc.maxHellos, "sync-max-pending-hellos", hellosDefault, "sync streams waiting for their Hello; one more is refused (env LP_CP_SYNC_MAX_PENDING_HELLOS)")
	expiryDefault, err := envDuration(getenv, "LP_CP_DATAPLANE_EXPIRY", controlplane.DefaultDataPlaneExpiry)
	if err != nil {
		return err
	}
	expiry := fs.Duration("dataplane-expiry", expiryDefault, "a gateway whose stream ended this `long` ago leaves GET /api/dataplanes (env LP_CP_DATAPLANE_EXPIRY)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *storeURL != "" && !isPostgresURL(*storeURL) {
		return &usageError{fmt.Errorf("-store %s: want a postgres:// or postgresql:// URL (leave -store out to keep the state in the -data file)", controlplane.RedactURL(*storeURL))}
	}
	// A URL without a host would reach whatever server libpq's defaults
	// name (the local socket, as the current user): an empty control plane
	// under a new history, whose snapshot every gateway would apply.
	if u, err := url.Parse(*storeURL); *storeURL != "" && err == nil && u.Host == "" && !u.Query().Has("host") {
		return &usageError{fmt.Errorf("-store %s: the URL names no host (postgres://user@host:5432/db; for a unix socket, postgres:///db?host=/run/postgresql)", controlplane.RedactURL(*storeURL))}
	}
	if hasPassword(*storeURL) {
		fmt.Fprintln(stderr, "controlplane: warning: -store carries a password in the URL; use -store-password-file or LP_CP_STORE_PASSWORD so it stays out of process listings")
	}
	token := getenv("LP_CP_ADMIN_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("admin token: %w", err)
		}
		token = strings.TrimRight(string(b), "\r\n")
	}
	if token == "" {
		return &usageError{errors.New("no admin token: set LP_CP_ADMIN_TOKEN or -admin-token-file")}
	}
	if *expiry <= 0 {
		return &usageError{fmt.Errorf("-dataplane-expiry %s: want more than 0", *expiry)}
	}
	if *changeLog <= 0 {
		return &usageError{fmt.Errorf("-change-log %d: want at least 1 revision", *changeLog)}
	}
	if err := controlplane.CheckToken(token); err != nil {
		return &usageError{fmt.Errorf("the admin token %w", err)}
	}
	if err := ac.check(); err != nil {
		return &usageError{err}
	}
	adminTLS, err := ac.tlsConfig()
	if err != nil {
		return err
	}
	var tokens []controlplane.DataPlaneToken
	var grpcOpts []grpc.ServerOption
	if sc.dataplanes != "" {
		if err := sc.check(); err != nil {
			return &usageError{err}
		}
		var err error
		if tokens, err = loadDataPlanes(sc.dataplanes, getenv); err != nil {
			return err
		}
		if grpcOpts, err = sc.serverOptions(); err != nil {
			return err
		}
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	store, where, err := openStore(ctx, *storeURL, *storePasswordFile, *data, *changeLog, getenv)
	if err != nil {
		return err
	}
	defer store.Close()
	dps := &controlplane.DataPlanes{Expiry: *expiry}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cpm, err := controlplane.NewMetrics(reg, dps)
	if err != nil {
		return err
	}
	admin, err := controlplane.Admin(controlplane.AdminOptions{Store: store, Token: token, DataPlanes: dps, Metrics: cpm, Log: log})
	if err != nil {
		return err
	}
	var rev uint64
	if err := store.View(ctx, func(r controlplane.Reader) error { rev = r.Revision(); return nil }); err != nil {
		return err
	}
	cpm.SetRevision(rev)
	probes, err := controlplane.Health(controlplane.HealthOptions{Store: store})
	if err != nil {
		return err
	}
	metricsH := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
	// Routed by exact path, not by an http.ServeMux: a ServeMux answers a
	// path with ".." (PUT /api/keys/../policies/x) with a redirect that a
	// client follows with its PUT, where the admin handler answers 400.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			metricsH.ServeHTTP(w, r)
		case "/healthz", "/readyz":
			probes.ServeHTTP(w, r) // GET only: its own mux answers 405 otherwise
		default:
			admin.ServeHTTP(w, r)
		}
	})
	ln, err := net.Listen("tcp", ac.listen)
	if err != nil {
		return err
	}
	scheme := "http"
	if adminTLS != nil {
		ln, scheme = tls.NewListener(ln, adminTLS), "https"
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	var syncSrv *controlplane.SyncServer
	var gs *grpc.Server
	syncLine := "  sync: not served (no -dataplanes file)\n"
	grpcServed := make(chan error, 1)
	if tokens != nil {
		syncSrv, err = controlplane.NewSyncServer(controlplane.SyncOptions{Store: store, DataPlanes: dps, Tokens: tokens,
			HelloTimeout: sc.helloTimeout, MaxStreams: sc.maxStreams, MaxPendingHellos: sc.maxHellos, Metrics: cpm, Log: log})
		if err != nil {
			ln.Close()
			return err
		}
		sln, err := net.Listen("tcp", sc.listen)
		if err != nil {
			ln.Close()
			return err
		}
		quotaSrv, err := controlplane.NewQuotaServer(controlplane.QuotaOptions{Store: store, Tokens: tokens, Metrics: cpm, Log: log})
		if err != nil {
			ln.Close()
			sln.Close()
			return err
		}
		gs = grpc.NewServer(grpcOpts...)
		syncpb.RegisterSyncServiceServer(gs, syncSrv)
		syncpb.RegisterQuotaServiceServer(gs, quotaSrv)
		go func() { grpcServed <- gs.Serve(sln) }()
		syncLine = fmt.Sprintf("  sync listening on %s (tls: %s; data-plane tokens: %d)\n", sln.Addr(), sc.tlsMode(), len(tokens))
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	rctx, stopRelease := context.WithCancel(ctx)
	released := make(chan struct{})
	go func() { releaseMemory(rctx); close(released) }()
	defer func() { stopRelease(); <-released }()
	fmt.Fprintf(stdout, "limitplane control plane: admin API listening on %s://%s (data: %s, revision %d; bearer token required)\n"+
		syncLine+
		"  GET /healthz, /readyz, /metrics without the token;\n"+
		"  PUT/GET/DELETE /api/policies/{id}, /api/apis/{id}, /api/keys/{hash}; POST /api/keys, /api/keys:batch, /api/keys/{hash}/reset-quota;\n"+
		"  GET /api/export, POST /api/import (the whole state);\n"+
		"  GET /api/revision, /api/dataplanes (DELETE /api/dataplanes/{id}), /api/policies, /api/apis, /api/keys?after=&limit=;\n"+
		"  GET /api/usage/keys/{hash}, /api/usage/dataplanes (global quotas' ledger, threshold events)\n", scheme, ln.Addr(), where, rev)

	var failed error
	httpDone := false
	select {
	case failed = <-served:
		httpDone = true
	case err := <-grpcServed:
		failed = fmt.Errorf("sync server: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(stdout, "shutting down")
	if gs != nil {
		// Streams never end by themselves: end them first, so
		// GracefulStop has only calls in flight to wait for.
		syncSrv.Shutdown()
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			gs.Stop()
			<-stopped
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if !httpDone {
		if err := <-served; failed == nil && !errors.Is(err, http.ErrServerClosed) {
			failed = err
		}
	}
	if err := store.Close(); failed == nil {
		failed = err
	}
	return failed
}

// wrappedError is an error with context; see wrap.
type wrappedError struct {
	msg string
	err error
}

func (e *wrappedError) Error() string { return e.msg }
func (e *wrappedError) Unwrap() error { return e.err }

// wrap returns err with context: "<context>: <err>", err's leading
// "controlplane: " dropped, since exitCode prints that prefix before the
// whole message.
func wrap(context string, err error) error {
	return &wrappedError{msg: context + ": " + strings.TrimPrefix(err.Error(), "controlplane: "), err: err}
}

// hasPassword reports whether the PostgreSQL URL store holds a password,
// in its user information or as a password parameter.
func hasPassword(store string) bool {
	if !isPostgresURL(store) {
		return false
	}
	u, err := url.Parse(store)
	if err != nil {
		// Unparsable (a stray % in the password, say): RedactURL cut
		// something after a colon before the @.
		return strings.Contains(controlplane.RedactURL(store), ":xxxxx@")
	}
	_, ok := u.User.Password()
	return ok || u.Query().Has("password")
}

// isPostgresURL reports whether store is a PostgreSQL URL.
func isPostgresURL(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// openStore opens the PostgreSQL store of storeURL when it is one (the
// password from passwordFile, which must not be empty, else
// LP_CP_STORE_PASSWORD, else the URL: OpenPostgres's Password overrides
// the URL's),
// the bbolt file data otherwise. It returns the store and what to call
// it in the banner: the file, or the URL without its password.
func openStore(ctx context.Context, storeURL, passwordFile, data string, changeLog int, getenv func(string) string) (controlplane.Store, string, error) {
	if !isPostgresURL(storeURL) {
		s, err := controlplane.OpenBolt(data, controlplane.BoltOptions{ChangeLogRevisions: changeLog})
		return s, data, err
	}
	password := getenv("LP_CP_STORE_PASSWORD")
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return nil, "", fmt.Errorf("store password: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
		if password == "" {
			// Empty, it would let the URL's password (or none) through
			// unnoticed.
			return nil, "", fmt.Errorf("store password: %s is empty", passwordFile)
		}
	}
	where := "postgres " + controlplane.RedactURL(storeURL)
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := controlplane.OpenPostgres(octx, storeURL, controlplane.PostgresOptions{Password: password, ChangeLogRevisions: changeLog})
	switch {
	case errors.Is(err, controlplane.ErrStoreUnavailable):
		// A first line that says what happens, the database's error
		// under it.
		return nil, "", fmt.Errorf("the database of -store %s is unavailable: a control plane starts only once its database answers (replicas already running ride out the outage)\n%w", controlplane.RedactURL(storeURL), err)
	case err != nil:
		return nil, "", wrap("store "+controlplane.RedactURL(storeURL), err)
	}
	return s, where, nil
}
