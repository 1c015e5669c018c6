package main

import (
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/limitplane/limitplane/internal/pgtest"
	"github.com/limitplane/limitplane/spec"
)

// TestTwoControlPlanesOnOnePostgres runs two control-plane processes on
// one PostgreSQL database (A with the password in its URL, B by
// LP_CP_STORE with the password in LP_CP_STORE_PASSWORD): a key created
// through A's admin API is in B's GET /api/keys and in the snapshot of a
// data plane following B, and a policy put through A then reaches that
// data plane through B as Changes. Neither process shows the password.
func TestTwoControlPlanesOnOnePostgres(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	const password = "pg-s3cret-for-tests"
	// The test server trusts loopback, so the password is carried, not
	// checked.
	urlA := strings.Replace(srv.ConnString(), "postgres@", "postgres:"+password+"@", 1)
	a := startSync(t, "-store", urlA)
	b := startSyncEnv(t, []string{"LP_CP_STORE=" + srv.ConnString(), "LP_CP_STORE_PASSWORD=" + password})
	for name, p := range map[string]*process{"A": a, "B": b} {
		if !strings.Contains(p.banner, "(data: postgres postgres://postgres") {
			t.Fatalf("%s's banner %q does not name the database", name, p.banner)
		}
	}
	if !strings.Contains(a.banner, "postgres:xxxxx@127.0.0.1") {
		t.Fatalf("A's banner %q: want the URL with its password redacted", a.banner)
	}

	h, rev := putDemo(t, a)
	st, body := do(t, "GET", b.base+"/api/keys", "")
	var keys struct {
		Revision uint64     `json:"revision"`
		Keys     []spec.Key `json:"keys"`
	}
	if st != 200 || json.Unmarshal([]byte(body), &keys) != nil {
		t.Fatal(st, body)
	}
	if keys.Revision != rev || len(keys.Keys) != 1 || keys.Keys[0].KeyHash != h {
		t.Fatalf("B's GET /api/keys: %s; want revision %d with key %s", body, rev, h)
	}

	conn := dial(t, b.sync, insecure.NewCredentials())
	stream := openSync(t, conn, "dp1", dp1Token, "dp1")
	snap, _ := recvSnapshot(t, stream)
	if snap.Revision != rev || len(snap.Keys) != 1 || snap.Keys[0].KeyHash != h {
		t.Fatalf("snapshot through B %+v, want revision %d with key %s", snap, rev, h)
	}
	if st, body := do(t, "PUT", a.base+"/api/policies/silver", `{"rate":{"requests":1,"per":"1s"}}`); st != 200 {
		t.Fatal(st, body)
	}
	m, err := stream.Recv()
	if err != nil || m.GetChanges() == nil || m.GetChanges().Revision != rev+1 {
		t.Fatalf("got %v, %v; want Changes to revision %d through B", m, err, rev+1)
	}
	for name, p := range map[string]*process{"A": a, "B": b} {
		if out := p.whole + p.stderr.String(); strings.Contains(out, password) {
			t.Fatalf("%s shows the password:\n%s", name, out)
		}
	}
}

// TestStoreFlagRefusals: a -store that is not a PostgreSQL URL is refused
// with status 2, and an unreachable database stops the start with status
// 1; neither message shows the password.
func TestStoreFlagRefusals(t *testing.T) {
	code, out := runExit(t, nil, "-store", "mysql://u:pw-in-url@db/lp")
	if code != 2 || !strings.Contains(out, "want a postgres:// or postgresql:// URL") || strings.Contains(out, "pw-in-url") {
		t.Fatalf("-store mysql://…: status %d, output %q; want 2, the URL refused without its password", code, out)
	}
	// No host: libpq's defaults would pick a server; refused.
	for _, u := range []string{"postgres://", "postgresql:///lp", "postgres://u:pw-in-url@/lp"} {
		code, out = runExit(t, nil, "-store", u)
		if code != 2 || !strings.Contains(out, "the URL names no host") || strings.Contains(out, "pw-in-url") {
			t.Fatalf("-store %s: status %d, output %q; want 2, no host, without the password", u, code, out)
		}
	}
	// A password that is not valid percent-encoding: the URL does not
	// parse, and the password is still cut from the message.
	code, out = runExit(t, nil, "-store", "postgres://u:s%zzpw-in-url@127.0.0.1:1/lp")
	if code == 0 || strings.Contains(out, "pw-in-url") || !strings.Contains(out, "postgres://u:xxxxx@127.0.0.1:1/lp") {
		t.Fatalf("-store with a bad %%-escape in the password: status %d, output %q; want a failure without the password", code, out)
	}
	// Port 1 on loopback: nothing listens there.
	code, out = runExit(t, nil, "-store", "postgres://u:pw-in-url@127.0.0.1:1/lp?connect_timeout=2")
	if code != 1 || !strings.Contains(out, "store postgres://u:xxxxx@127.0.0.1:1/lp") || !strings.Contains(out, "database is unavailable") || strings.Contains(out, "pw-in-url") {
		t.Fatalf("-store to a closed port: status %d, output %q; want 1, the database unavailable, without the password", code, out)
	}
}
