package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/limitplane/limitplane/internal/pgtest"
)

// TestStartStopImmediateStart starts a server, writes a row, stops it at
// once (connections fail), starts it again and reads the row back.
func TestStartStopImmediateStart(t *testing.T) {
	s := pgtest.Start(t, pgtest.Options{})
	if s.Port == 5432 {
		t.Fatal("started on 5432")
	}
	ctx := context.Background()
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, s.ConnString())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE t (v int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	s.StopImmediate()
	var ce *pgconn.ConnectError
	if err := exec("SELECT 1"); !errors.As(err, &ce) {
		t.Fatalf("query while stopped: %v, want a connect error", err)
	}
	s.Start()
	conn, err := pgx.Connect(ctx, s.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != 42 {
		t.Fatalf("read %d after restart, want 42", v)
	}
}

// connExec runs sql on connString.
func connExec(ctx context.Context, connString, sql string) error {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// connInt returns the integer sql answers on connString.
func connInt(t *testing.T, connString, sql string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestSynchronousStandbyPromote: a synchronous standby refuses writes
// (25006), has every row the primary acknowledged when the primary
// crashes (StopImmediate), and accepts writes once promoted; a
// multi-host connection string with target_session_attrs=read-write
// reaches the primary first and the promoted standby after.
func TestSynchronousStandbyPromote(t *testing.T) {
	p := pgtest.Start(t, pgtest.Options{})
	sb := p.StartStandby(t, pgtest.StandbyOptions{Synchronous: true})
	if sb.Port == p.Port || sb.Port == 5432 || sb.Dir == p.Dir {
		t.Fatalf("standby on port %d in %s, primary on %d in %s", sb.Port, sb.Dir, p.Port, p.Dir)
	}
	ctx := context.Background()
	multi := pgtest.MultiHostConnString(p, sb)
	if got := connInt(t, multi, "SELECT current_setting('port')::int"); got != int64(p.Port) {
		t.Fatalf("multi-host string reached port %d, want the primary's %d", got, p.Port)
	}
	if err := connExec(ctx, p.ConnString(), "CREATE TABLE t (v int)"); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := connExec(ctx, p.ConnString(), fmt.Sprintf("INSERT INTO t VALUES (%d)", i)); err != nil {
			t.Fatal(err)
		}
	}
	var pe *pgconn.PgError
	if err := connExec(ctx, sb.ConnString(), "INSERT INTO t VALUES (-1)"); !errors.As(err, &pe) || pe.Code != "25006" {
		t.Fatalf("write on the standby: %v, want SQLSTATE 25006 (read-only transaction)", err)
	}
	p.StopImmediate()
	var ce *pgconn.ConnectError
	if err := connExec(ctx, multi, "SELECT 1"); !errors.As(err, &ce) {
		t.Fatalf("multi-host string with the primary down, the standby not promoted: %v, want a connect error", err)
	}
	sb.Promote()
	if got := connInt(t, sb.ConnString(), "SELECT count(*) FROM t"); got != 100 {
		t.Fatalf("promoted standby has %d rows, want the 100 acknowledged", got)
	}
	if err := connExec(ctx, multi, "INSERT INTO t VALUES (100)"); err != nil {
		t.Fatalf("write through the multi-host string after the promotion: %v", err)
	}
	if got := connInt(t, multi, "SELECT current_setting('port')::int"); got != int64(sb.Port) {
		t.Fatalf("multi-host string reached port %d, want the promoted standby's %d", got, sb.Port)
	}
	if got := connInt(t, sb.ConnString(), "SELECT count(*) FROM t"); got != 101 {
		t.Fatalf("promoted standby has %d rows, want 101", got)
	}
}

// TestSynchronousStandbyHoldsCommits: with the synchronous standby
// stopped, a commit on the primary does not return (it waits for the
// standby) until the standby is back.
func TestSynchronousStandbyHoldsCommits(t *testing.T) {
	p := pgtest.Start(t, pgtest.Options{})
	sb := p.StartStandby(t, pgtest.StandbyOptions{Synchronous: true})
	ctx := context.Background()
	if err := connExec(ctx, p.ConnString(), "CREATE TABLE t (v int)"); err != nil {
		t.Fatal(err)
	}
	sb.StopImmediate()
	conn, err := pgx.Connect(ctx, p.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("commit returned (%v) with the synchronous standby down", err)
	case <-time.After(time.Second):
	}
	sb.Start()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("commit after the standby came back: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("commit still waiting 30s after the standby came back")
	}
}

// TestAsynchronousStandbyStreams: an asynchronous standby receives the
// primary's rows (within 10 s) and is read-only until promoted.
func TestAsynchronousStandbyStreams(t *testing.T) {
	p := pgtest.Start(t, pgtest.Options{})
	sb := p.StartStandby(t, pgtest.StandbyOptions{})
	ctx := context.Background()
	if err := connExec(ctx, p.ConnString(), "CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 50)"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		conn, err := pgx.Connect(ctx, sb.ConnString())
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n)
			conn.Close(ctx)
		}
		if err == nil && n == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby has %d rows (%v) after 10s, want 50", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := connInt(t, sb.ConnString(), "SELECT pg_is_in_recovery()::int"); got != 1 {
		t.Fatalf("pg_is_in_recovery() = %d on the standby, want 1", got)
	}
	sb.Promote()
	if err := connExec(ctx, sb.ConnString(), "INSERT INTO t VALUES (51)"); err != nil {
		t.Fatalf("write on the promoted standby: %v", err)
	}
	if got := connInt(t, p.ConnString(), "SELECT count(*) FROM t"); got != 50 {
		t.Fatalf("old primary has %d rows, want 50 (the promoted standby's write is its own)", got)
	}
}
