// Package pgtest starts throwaway PostgreSQL servers for tests, as
// redistest does Redis: initdb into a new temporary directory, postgres on
// a free loopback port (and a unix socket in that directory), a database
// made for the test, and everything stopped and removed by t.Cleanup.
// Nothing here ever talks to a PostgreSQL the test did not start (in
// particular not the one a machine may run on port 5432).
//
// For speed the server runs with fsync and full_page_writes off unless
// Options.Durable is set (benchmarks of durable writes set it): a crash of
// the machine can lose its data, which a test's throwaway server does not
// mind. A crash of the server (StopImmediate) loses nothing committed.
//
// PostgreSQL refuses to run as root. When the test runs as root (CI does),
// initdb, postgres and pg_ctl run as the "postgres" user (its uid and gid,
// set on the child process, as `runuser -u postgres` would), in a
// directory chowned to it.
//
// Server.StartStandby adds a streaming standby (pg_basebackup -R, on a port
// of its own, optionally the primary's synchronous standby) and
// Server.Promote promotes it, for failover tests.
//
// The binaries are found in $PG_BIN, then on PATH (a symlink followed to
// its directory), then in the newest /usr/lib/postgresql/*/bin (where
// Debian puts them, off PATH). A test that uses this package fails, never
// skips, when they are missing: .ci/run installs Debian's postgresql
// package.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 30 * time.Second

// Database is the name of the database Start creates for the test.
const Database = "limitplane_test"

// Options configure Start. The zero value is usable.
type Options struct {
	// Durable keeps fsync on, so a commit waits for its WAL to reach the
	// disk (for benchmarks of durable writes).
	Durable bool
}

// Server is one PostgreSQL server started by Start.
type Server struct {
	// Port is the loopback TCP port it listens on; Start after
	// StopImmediate keeps it.
	Port int
	// Dir is its temporary directory: the data directory is Dir/data, the
	// unix socket is in Dir, the log is Dir/postgres.log.
	Dir string

	t    testing.TB
	o    Options
	bin  string
	cred *syscall.Credential // nil unless the test runs as root
	name string              // a standby's application_name; "" for a primary

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start runs initdb and postgres, creates Database, and registers the
// server's shutdown and the removal of its directory with t.Cleanup. It
// calls t.Fatal when PostgreSQL is not installed (saying to install
// Debian's postgresql package) or does not come up within 30 s.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s := &Server{t: t, o: o, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root, PostgreSQL must run as the postgres user: %v (install Debian's postgresql package, which makes it)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parent is private to root, out of the postgres
	// user's reach. A short path also keeps the socket's within 107 bytes.
	if s.Dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(s.Dir) })
	if s.cred != nil {
		if err := os.Chown(s.Dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	if out, err := s.command("initdb", "-D", s.dataDir(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // a freed port can be taken again before postgres binds it
		s.Port = freePort(t)
		if lastErr = s.launch(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("pgtest: start postgres: %v", lastErr)
	}
	t.Cleanup(s.stop)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.connString("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+Database); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return s
}

// binDir returns the directory of initdb and postgres.
func binDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			// A symlink on PATH (as /usr/local/bin/initdb to Debian's)
			// leads to the directory of the other programs too
			// (pg_basebackup).
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL is not installed: initdb and postgres are neither on PATH nor in /usr/lib/postgresql/*/bin (install Debian's postgresql package: apt-get install postgresql, or set PG_BIN)")
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

func freePort(t testing.TB) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("pgtest: find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port != 5432 {
			return port
		}
	}
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }

// command returns the PostgreSQL program name with args, run as the
// postgres user when the test runs as root, killed if the test process
// dies.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	return cmd
}

// ConnString is a connection string (a URL) to Database as the superuser
// postgres, over loopback TCP.
func (s *Server) ConnString() string { return s.connString(Database) }

func (s *Server) connString(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// launch starts postgres on s.Port and waits until it accepts connections.
func (s *Server) launch() error {
	args := []string{"-D", s.dataDir(), "-p", strconv.Itoa(s.Port), "-k", s.Dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
		"-c", "logging_collector=off", "-c", "shared_buffers=64MB"}
	if !s.o.Durable {
		// synchronous_commit stays on: a commit still waits for its WAL to
		// be written (to the OS, not the disk), so StopImmediate loses
		// nothing acknowledged.
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	cmd := s.command("postgres", args...)
	logf, err := os.OpenFile(filepath.Join(s.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.connString("postgres"))
		if err == nil {
			conn.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-done:
			return fmt.Errorf("postgres exited; log:\n%s", s.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("not ready after %v: %v; log:\n%s", startTimeout, err, s.Log())
		}
	}
}

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "postgres.log"))
	return string(b)
}

// StopImmediate stops the server at once (pg_ctl stop -m immediate: no
// checkpoint, every connection dropped, as a crash) and waits for it to
// exit. Start brings it back on the same data directory and port.
func (s *Server) StopImmediate() {
	s.t.Helper()
	if out, err := s.command("pg_ctl", "-D", s.dataDir(), "stop", "-m", "immediate", "-w").CombinedOutput(); err != nil {
		s.t.Fatalf("pgtest: pg_ctl stop -m immediate: %v\n%s", err, out)
	}
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
	case <-time.After(startTimeout):
		s.t.Fatalf("pgtest: postgres still running %v after pg_ctl stop", startTimeout)
	}
}

// Start starts the server again after StopImmediate, on the same data
// directory and port (crash recovery replays its WAL), and waits until
// it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatalf("pgtest: restart postgres: %v", err)
	}
}

// stop shuts the server down (fast shutdown, then SIGKILL after 10 s).
func (s *Server) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	select {
	case <-done:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// StandbyOptions configure StartStandby. The zero value is usable: an
// asynchronous standby.
type StandbyOptions struct {
	// Synchronous makes the standby the primary's synchronous standby
	// (synchronous_standby_names names it, and synchronous_commit stays
	// on): a commit on the primary returns once the standby has its WAL
	// (written to its OS; flushed to its disk too when Options.Durable),
	// so the standby has every acknowledged commit when it is promoted.
	Synchronous bool
}

// StartStandby starts a streaming standby of s: pg_basebackup -R (as
// the postgres user when root) from s into a new temporary directory,
// postgres on a free port of its own, waited for until it is in recovery
// and its WAL receiver streams from s (and, with o.Synchronous, until s
// reports it as its synchronous standby, sync_state = 'sync'). The
// standby is a *Server (read-only until Promote) with its own Dir, Port
// and ConnString, stopped and removed by t.Cleanup (before s, being
// registered after it). It inherits s's Options. It calls t.Fatal when
// any step fails or the standby does not stream within 30 s.
//
// The primary needs nothing set beforehand: PostgreSQL's defaults have
// wal_level = replica and max_wal_senders = 10, and initdb --auth=trust
// (as Start runs it) lets loopback replication connections in.
func (s *Server) StartStandby(t testing.TB, o StandbyOptions) *Server {
	t.Helper()
	sb := &Server{t: t, o: s.o, bin: s.bin, cred: s.cred}
	var err error
	if sb.Dir, err = os.MkdirTemp("", "pgtest-standby-"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	sb.name = filepath.Base(sb.Dir) // unique while it runs
	t.Cleanup(func() { os.RemoveAll(sb.Dir) })
	if sb.cred != nil {
		if err := os.Chown(sb.Dir, int(sb.cred.Uid), int(sb.cred.Gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	// -R writes primary_conninfo (with this application_name, which
	// synchronous_standby_names matches) and standby.signal; -X stream
	// copies the WAL written meanwhile; -c fast starts at once.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", s.Port, sb.name)
	if out, err := sb.command("pg_basebackup", "-D", sb.dataDir(), "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	// The copy has the primary's postgresql.auto.conf: a promoted standby
	// must not wait for the primary's synchronous standby.
	if err := appendFile(filepath.Join(sb.dataDir(), "postgresql.auto.conf"), "synchronous_standby_names = ''\n"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ { // as Start: a freed port can be taken again
		sb.Port = freePort(t)
		if lastErr = sb.launch(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("pgtest: start the standby: %v", lastErr)
	}
	t.Cleanup(sb.stop)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if o.Synchronous {
		if err := s.exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%q'", sb.name), "SELECT pg_reload_conf()"); err != nil {
			t.Fatalf("pgtest: make %s synchronous: %v", sb.name, err)
		}
	}
	want := "async"
	if o.Synchronous {
		want = "sync"
	}
	err = waitFor(ctx, func() (bool, error) {
		var inRecovery bool
		if err := sb.queryRow(ctx, "SELECT pg_is_in_recovery()", &inRecovery); err != nil || !inRecovery {
			return false, err
		}
		var receiving bool
		if err := sb.queryRow(ctx, "SELECT count(*) = 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'", &receiving); err != nil || !receiving {
			return false, err
		}
		var state string
		err := s.queryRow(ctx, "SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'", &state, sb.name)
		return state == want, err
	})
	if err != nil {
		t.Fatalf("pgtest: standby %s not streaming (sync_state %s) after %v: %v; its log:\n%s", sb.name, want, startTimeout, err, sb.Log())
	}
	return sb
}

// Promote promotes a standby started by StartStandby (pg_ctl promote)
// and waits until it accepts writes (pg_is_in_recovery() is false and
// transaction_read_only off), within 30 s, or calls t.Fatal.
func (s *Server) Promote() {
	s.t.Helper()
	if out, err := s.command("pg_ctl", "-D", s.dataDir(), "promote", "-w", "-t", strconv.Itoa(int(startTimeout/time.Second))).CombinedOutput(); err != nil {
		s.t.Fatalf("pgtest: pg_ctl promote: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	err := waitFor(ctx, func() (bool, error) {
		var readOnly string
		if err := s.queryRow(ctx, "SELECT CASE WHEN pg_is_in_recovery() THEN 'on' ELSE current_setting('transaction_read_only') END", &readOnly); err != nil {
			return false, err
		}
		return readOnly == "off", nil
	})
	if err != nil {
		s.t.Fatalf("pgtest: promoted server not accepting writes after %v: %v; its log:\n%s", startTimeout, err, s.Log())
	}
}

// MultiHostConnString is a connection string (a URL) to Database on every
// one of servers, in order, with target_session_attrs=read-write: pgx
// (as libpq) connects to the first of them that accepts writes, so a
// client follows a promoted standby by connecting again.
func MultiHostConnString(servers ...*Server) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(s.Port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), Database)
}

// exec runs each statement on the postgres database, in order.
func (s *Server) exec(ctx context.Context, sqls ...string) error {
	conn, err := pgx.Connect(ctx, s.connString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range sqls {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// queryRow scans the one row of sql on the postgres database into dst.
func (s *Server) queryRow(ctx context.Context, sql string, dst any, args ...any) error {
	conn, err := pgx.Connect(ctx, s.connString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, sql, args...).Scan(dst)
}

// waitFor calls cond every 50 ms until it reports true or ctx ends; it
// returns ctx's error with cond's last error.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// appendFile appends text to the existing file path (keeping its owner).
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
