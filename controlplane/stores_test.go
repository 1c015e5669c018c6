package controlplane_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/internal/pgtest"
)

// storeCase is one Store implementation the conformance suite runs
// against: every test of this file's suite runs once per case, as a
// subtest named after it.
type storeCase struct {
	name string
	// open returns a new, empty store whose change log keeps logRevs
	// revisions (0: the default), closed at the end of the test, and a
	// function that opens another store on its state (after the first is
	// closed: a restart), closed at the end too.
	open func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store)
}

// storeCases are Bolt, on a file in a temporary directory, and Postgres,
// on a server of its own (pgtest).
var storeCases = []storeCase{
	{"bolt", func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store) {
		path := filepath.Join(t.TempDir(), "cp.db")
		o := controlplane.BoltOptions{ChangeLogRevisions: logRevs}
		open := func() controlplane.Store {
			t.Helper()
			s, err := controlplane.OpenBolt(path, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return open(), open
	}},
	{"postgres", func(t testing.TB, logRevs int) (controlplane.Store, func() controlplane.Store) {
		srv := pgtest.Start(t, pgtest.Options{})
		o := controlplane.PostgresOptions{ChangeLogRevisions: logRevs}
		open := func() controlplane.Store {
			t.Helper()
			return openPostgres(t, srv.ConnString(), o)
		}
		return open(), open
	}},
}

// openPostgres opens a Postgres store on connString, closed at the end of
// the test.
func openPostgres(t testing.TB, connString string, o controlplane.PostgresOptions) *controlplane.Postgres {
	t.Helper()
	s, err := controlplane.OpenPostgres(context.Background(), connString, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// eachStore runs test once per store case, as subtests.
func eachStore(t *testing.T, test func(t *testing.T, sc storeCase)) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) { test(t, sc) })
	}
}
