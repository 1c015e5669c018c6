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
// The binaries are found in $PG_BIN, then on PATH, then in the newest
// /usr/lib/postgresql/*/bin (where Debian puts them, off PATH). A test
// that uses this package fails, never skips, when they are missing: .ci/run
// installs Debian's postgresql package.
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
