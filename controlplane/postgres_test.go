package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// pgExec runs sql on the test's server.
func pgExec(t testing.TB, connString, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// pgInt returns the integer sql answers.
func pgInt(t *testing.T, connString, sql string) int64 {
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

// waitClosed fails the test unless ch is closed within 10 s.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: RevisionChanged not closed after 10s", what)
	}
}

// TestPostgresReplicasGapFree: 16 writers, 8 through each of two Postgres
// stores on one database, make 400 writes: every write gets its own
// revision, 2 to 401, both stores read 401, and the change log from 0
// lists each revision once, in order.
func TestPostgresReplicasGapFree(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	a := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	b := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
	const writers, each = 16, 25
	putKeysConcurrently(t, writers, each, a, b)
	for name, s := range map[string]controlplane.Store{"a": a, "b": b} {
		if got := revision(t, s); got != writers*each+1 {
			t.Fatalf("store %s at revision %d, want %d", name, got, writers*each+1)
		}
	}
	cs, err := b.ChangesSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != writers*each+1 {
		t.Fatalf("%d changes since 0, want %d", len(cs), writers*each+1)
	}
	for i, c := range cs {
		if c.Revision != uint64(i+1) {
			t.Fatalf("change %d has revision %d, want %d", i, c.Revision, i+1)
		}
	}
	snap, err := a.Snapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Keys) != writers*each || snap.Revision != writers*each+1 {
		t.Fatalf("%d keys at revision %d, want %d at %d", len(snap.Keys), snap.Revision, writers*each, writers*each+1)
	}
}

// listenAppName is the application_name of a Postgres store's LISTEN
// connection.
const listenAppName = "limitplane-controlplane-listen"

// TestPostgresRevisionChangedAcrossReplicas: a store's RevisionChanged
// fires for a write through another store on the database, by LISTEN
// (the poll is an hour); after its LISTEN backend is terminated, the
// store reconnects and fires again; a store without LISTEN learns of the
// write by its poll.
func TestPostgresRevisionChangedAcrossReplicas(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	a := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{PollInterval: time.Hour})
	b := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{PollInterval: time.Hour})
	c := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{PollInterval: 50 * time.Millisecond, DisableListen: true})
	listeners := "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + listenAppName + "' AND query LIKE 'LISTEN%'"
	waitListeners := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for pgInt(t, srv.ConnString(), listeners) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d listening connections after 10s, want %d", pgInt(t, srv.ConnString(), listeners), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitListeners(2) // a's and b's; c has none

	chB, chC := b.RevisionChanged(), c.RevisionChanged()
	update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
	waitClosed(t, chB, "b, by LISTEN")
	waitClosed(t, chC, "c, by its poll")

	pgExec(t, srv.ConnString(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", listenAppName)
	waitListeners(2) // both reconnected
	chB = b.RevisionChanged()
	select {
	case <-chB:
		// The reconnection itself may announce once more: take it again.
		chB = b.RevisionChanged()
	default:
	}
	update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 20)) })
	waitClosed(t, chB, "b, after its LISTEN connection was terminated")
	if got := revision(t, b); got != 2 {
		t.Fatalf("b at revision %d, want 2", got)
	}
}

// TestPostgresNewerSchemaRefused: a database whose schema_version is above
// SchemaVersion is refused with ErrSchemaTooNew; one at SchemaVersion
// opens again without migrating twice.
func TestPostgresNewerSchemaRefused(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	s, err := controlplane.OpenPostgres(ctx, srv.ConnString(), controlplane.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = controlplane.OpenPostgres(ctx, srv.ConnString(), controlplane.PostgresOptions{})
	if err != nil {
		t.Fatalf("second open: %v", err)
	}
	s.Close()
	if n := pgInt(t, srv.ConnString(), "SELECT count(*) FROM schema_version"); n != controlplane.SchemaVersion {
		t.Fatalf("%d schema_version rows, want %d", n, controlplane.SchemaVersion)
	}
	pgExec(t, srv.ConnString(), "INSERT INTO schema_version (version) VALUES ($1)", controlplane.SchemaVersion+1)
	_, err = controlplane.OpenPostgres(ctx, srv.ConnString(), controlplane.PostgresOptions{})
	if !errors.Is(err, controlplane.ErrSchemaTooNew) {
		t.Fatalf("open of a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if want := fmt.Sprintf("schema version %d, this program knows up to %d", controlplane.SchemaVersion+1, controlplane.SchemaVersion); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

// TestPostgresOutage: the server stopped (pg_ctl stop -m immediate) in the
// middle of a write of two objects fails it with ErrStoreUnavailable;
// writes and reads meanwhile fail so too; after the server is back,
// writes succeed, and neither object of the failed write is there.
func TestPostgresOutage(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	s := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	update(t, s, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
	k1, k2 := hash("outage-1"), hash("outage-2")
	_, err := s.Update(ctx, func(tx controlplane.Tx) error {
		if err := tx.PutKey(spec.Key{KeyHash: k1, Policies: []string{"gold"}}); err != nil {
			return err
		}
		if _, err := tx.Keys("", 10); err != nil { // the key reaches the database
			return err
		}
		srv.StopImmediate()
		return tx.PutKey(spec.Key{KeyHash: k2, Policies: []string{"gold"}})
	})
	if !errors.Is(err, controlplane.ErrStoreUnavailable) {
		t.Fatalf("write cut by the outage: %v, want ErrStoreUnavailable", err)
	}
	if _, err := s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 1)) }); !errors.Is(err, controlplane.ErrStoreUnavailable) {
		t.Fatalf("write while stopped: %v, want ErrStoreUnavailable", err)
	}
	if _, err := s.Snapshot(ctx, nil); !errors.Is(err, controlplane.ErrStoreUnavailable) {
		t.Fatalf("Snapshot while stopped: %v, want ErrStoreUnavailable", err)
	}
	if _, err := s.ChangesSince(ctx, 0); !errors.Is(err, controlplane.ErrStoreUnavailable) {
		t.Fatalf("ChangesSince while stopped: %v, want ErrStoreUnavailable", err)
	}
	srv.Start()
	var rev uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		rev, err = s.Update(ctx, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("silver", 1)) })
		if err == nil {
			break
		}
		if !errors.Is(err, controlplane.ErrStoreUnavailable) || time.Now().After(deadline) {
			t.Fatalf("write after the server came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rev != 2 {
		t.Fatalf("first write after the outage at revision %d, want 2", rev)
	}
	snap, err := s.Snapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Keys) != 0 || len(snap.Policies) != 2 || snap.Revision != 2 {
		t.Fatalf("after the outage: %d keys, %d policies at revision %d; want 0, 2 at 2", len(snap.Keys), len(snap.Policies), snap.Revision)
	}
	cs, err := s.ChangesSince(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := summary(cs), []string{"1 put policy gold", "2 put policy silver"}; !slices.Equal(got, want) {
		t.Fatalf("changes %q, want %q", got, want)
	}
}

// TestRedactURL: the password of a URL, in its user part or its query, is
// never in what RedactURL returns.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://lp:s3cret@db:5432/lp?sslmode=disable":    "postgres://lp:xxxxx@db:5432/lp?sslmode=disable",
		"postgresql://lp@db/lp?password=s3cret&sslmode=none": "postgresql://lp@db/lp?password=xxxxx&sslmode=none",
		"postgres://lp@db/lp":                                "postgres://lp@db/lp",
		"host=db user=lp password=s3cret":                    "(connection string)",
	} {
		if got := controlplane.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
	_, err := controlplane.OpenPostgres(context.Background(), "postgres://lp:s3cret@127.0.0.1:1/lp?connect_timeout=bogus", controlplane.PostgresOptions{})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error of a bad connection string: %v; want one without the password", err)
	}
}

// TestPostgresReplicasIncrementsLoseNothing: the read-modify-writes of
// TestConcurrentIncrementsLoseNothing through two Postgres stores on one
// database: a store's reads, speculative or prefetched before it locks
// the revision, never hide a write the other store committed.
func TestPostgresReplicasIncrementsLoseNothing(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	a := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	b := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	update(t, a, func(tx controlplane.Tx) error { return tx.PutPolicy(policy("gold", 10)) })
	incrementKeysConcurrently(t, 16, 25, 4, a, b)
}

// TestPostgresConnectionLostInCommit: a write whose connection dies in
// the round trip that commits it (a trigger on the revision row ends the
// backend there) fails with ErrCommitUnknown beside ErrStoreUnavailable,
// and the admin API's 503 says the change may have been made instead of
// "nothing was changed". Here it was not: the key is absent and the next
// write takes revision 2.
func TestPostgresConnectionLostInCommit(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	s := openPostgres(t, srv.ConnString(), controlplane.PostgresOptions{})
	base := adminOver(t, s, controlplane.AdminOptions{})
	if a := call(t, "PUT", base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); a.status != 200 {
		t.Fatal(a.status, a.body)
	}
	pgExec(t, srv.ConnString(), `CREATE FUNCTION lp_test_die() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$`)
	pgExec(t, srv.ConnString(), `CREATE TRIGGER lp_test_die BEFORE UPDATE ON lp_meta FOR EACH ROW
		WHEN (NEW.revision > OLD.revision) EXECUTE FUNCTION lp_test_die()`)
	_, err := s.Update(context.Background(), func(tx controlplane.Tx) error {
		return tx.PutKey(spec.Key{KeyHash: hash("lost"), Policies: []string{"gold"}})
	})
	if !errors.Is(err, controlplane.ErrCommitUnknown) || !errors.Is(err, controlplane.ErrStoreUnavailable) {
		t.Fatalf("Update: %v, want ErrCommitUnknown and ErrStoreUnavailable", err)
	}
	a := call(t, "POST", base+"/api/keys", `{"key":"lost-too","policies":["gold"]}`)
	const want = `{"error":"the control plane's database is unavailable; the change may have been made (the connection was lost during its commit): read the state before making it again; retry in a few seconds (controlplane: the connection to the store's database was lost during the commit; the write may have been made: postgres: log the changes and commit: the store's database is unavailable: `
	if a.status != 503 || !strings.HasPrefix(a.body, want) {
		t.Fatalf("POST /api/keys: %d %s\nwant 503 %s...", a.status, a.body, want)
	}
	pgExec(t, srv.ConnString(), "DROP TRIGGER lp_test_die ON lp_meta")
	if got := revision(t, s); got != 1 {
		t.Fatalf("revision %d after the lost commits, want 1", got)
	}
	if n := pgInt(t, srv.ConnString(), "SELECT count(*) FROM lp_keys"); n != 0 {
		t.Fatalf("%d keys after the lost commits, want 0", n)
	}
	if a := call(t, "POST", base+"/api/keys", `{"key":"lost-too","policies":["gold"]}`); a.status != 201 {
		t.Fatal(a.status, a.body)
	}
	if got := revision(t, s); got != 2 {
		t.Fatalf("revision %d, want 2", got)
	}
}
