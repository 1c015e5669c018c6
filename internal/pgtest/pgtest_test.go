package pgtest_test

import (
	"context"
	"errors"
	"testing"

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
