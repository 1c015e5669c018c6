// Command controlplane is limitplane's control plane: it keeps the
// policies, API keys and APIs of every data plane in a bbolt file and
// serves the admin REST API (see controlplane.Admin) to change them.
//
// Usage:
//
//	LP_CP_ADMIN_TOKEN=secret go run ./examples/controlplane
//	go run ./examples/controlplane -admin-token-file token.txt -data /var/lib/limitplane/cp.db
//
// Flags, each with an environment variable for its default:
//
//	-admin-listen ADDR     LP_CP_ADMIN_LISTEN  (127.0.0.1:7070; loopback only unless told)
//	-data FILE             LP_CP_DATA          (controlplane.db)
//	-admin-token-file FILE LP_CP_ADMIN_TOKEN_FILE; or the token itself in LP_CP_ADMIN_TOKEN
//	-change-log N          revisions kept in the change log (10000)
//
// A write is answered only once it is on disk, so every acknowledged
// write survives kill -9. SIGINT or SIGTERM stops the server (calls in
// flight finish, for up to 10s), closes the file and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/limitplane/limitplane/controlplane"
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

// run parses args (defaults from getenv), opens the store and serves the
// admin API until ctx is done.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	or := func(env, def string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("admin-listen", or("LP_CP_ADMIN_LISTEN", "127.0.0.1:7070"), "admin API `address` (env LP_CP_ADMIN_LISTEN)")
	data := fs.String("data", or("LP_CP_DATA", "controlplane.db"), "bbolt data `file` (env LP_CP_DATA)")
	tokenFile := fs.String("admin-token-file", getenv("LP_CP_ADMIN_TOKEN_FILE"), "`file` holding the admin bearer token (env LP_CP_ADMIN_TOKEN_FILE; or the token in LP_CP_ADMIN_TOKEN)")
	changeLog := fs.Int("change-log", controlplane.DefaultChangeLogRevisions, "revisions kept in the change log")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
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

	log := slog.New(slog.NewTextHandler(stderr, nil))
	store, err := controlplane.OpenBolt(*data, controlplane.BoltOptions{ChangeLogRevisions: *changeLog})
	if err != nil {
		return err
	}
	defer store.Close()
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: store, Token: token, DataPlanes: &controlplane.DataPlanes{}, Log: log})
	if err != nil {
		return err
	}
	var rev uint64
	if err := store.View(ctx, func(r controlplane.Reader) error { rev = r.Revision(); return nil }); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "limitplane control plane: admin API listening on http://%s (data: %s, revision %d; bearer token required)\n"+
		"  PUT/GET/DELETE /api/policies/{id}, /api/apis/{id}, /api/keys/{hash}; POST /api/keys, /api/keys/{hash}/reset-quota;\n"+
		"  GET /api/revision, /api/dataplanes\n", ln.Addr(), *data, rev)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	fmt.Fprintln(stdout, "shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return store.Close()
}
