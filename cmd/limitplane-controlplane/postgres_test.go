package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// The same with no password in the URL: the first lines say what
	// happened, each with its prefix once.
	code, out = runExit(t, nil, "-store", "postgres://u@127.0.0.1:1/lp?connect_timeout=2&sslmode=disable")
	want := "controlplane: the database of -store postgres://u@127.0.0.1:1/lp?connect_timeout=2&sslmode=disable is unavailable: a control plane starts only once its database answers (replicas already running ride out the outage)\n" +
		"controlplane: postgres: create or migrate the schema: the store's database is unavailable: failed to connect to `user=u database=lp`: 127.0.0.1:1 (127.0.0.1): dial error: dial tcp 127.0.0.1:1: connect: connection refused\n"
	if code != 1 || out != want {
		t.Fatalf("-store to a closed port: status %d, output %q; want 1 and %q", code, out, want)
	}
	// A connection string pgx refuses: the URL once, no prefix twice.
	code, out = runExit(t, nil, "-store", "postgres://u@127.0.0.1:1/lp?sslmode=bogus")
	if want := "controlplane: store postgres://u@127.0.0.1:1/lp?sslmode=bogus: postgres: parse the connection string postgres://u@127.0.0.1:1/lp?sslmode=bogus: cannot parse `postgres://u@127.0.0.1:1/lp?sslmode=bogus`: failed to configure TLS (sslmode is invalid)\n"; code != 1 || out != want {
		t.Fatalf("-store with a bad sslmode: status %d, output %q; want 1 and %q", code, out, want)
	}
}

// urlPasswordWarning is the line the program prints on stderr at start
// when -store carries a password.
const urlPasswordWarning = "controlplane: warning: -store carries a password in the URL; use -store-password-file or LP_CP_STORE_PASSWORD so it stays out of process listings\n"

// TestStorePasswordPrecedence runs the program against a database that
// checks passwords (scram-sha-256 for the role lp_pw): the password of
// -store-password-file wins over LP_CP_STORE_PASSWORD, which wins over
// the URL's; a URL with a password draws one warning line, a URL
// without none; an empty password file is refused.
func TestStorePasswordPrecedence(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	const right, wrong = "right-pw-for-tests", "wrong-pw-for-tests"
	requirePassword(t, srv, "lp_pw", right)
	dir := t.TempDir()
	rightFile, emptyFile := filepath.Join(dir, "right"), filepath.Join(dir, "empty")
	if err := os.WriteFile(rightFile, []byte(right+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(emptyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	at := func(pw string) string {
		u := "postgres://lp_pw@127.0.0.1:" + strconv.Itoa(srv.Port) + "/lp_pw?sslmode=disable"
		if pw != "" {
			u = strings.Replace(u, "lp_pw@", "lp_pw:"+pw+"@", 1)
		}
		return u
	}
	for _, c := range []struct {
		name string
		url  string
		env  []string
		file string
	}{
		{"file over URL", at(wrong), nil, rightFile},
		{"env over URL", at(wrong), []string{"LP_CP_STORE_PASSWORD=" + right}, ""},
		{"file over env", at(""), []string{"LP_CP_STORE_PASSWORD=" + wrong}, rightFile},
		{"URL alone", at(right), nil, ""},
	} {
		args := []string{"-store", c.url}
		if c.file != "" {
			args = append(args, "-store-password-file", c.file)
		}
		p := startSyncEnv(t, c.env, args...)
		p.cmd.Process.Signal(syscall.SIGTERM)
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("%s: %v; stderr:\n%s", c.name, err, p.stderr)
		}
		warned := strings.HasPrefix(p.stderr.String(), urlPasswordWarning)
		if want := strings.Contains(c.url, ":"+wrong+"@") || strings.Contains(c.url, ":"+right+"@"); warned != want || strings.Count(p.stderr.String(), "warning") != b2i(want) {
			t.Fatalf("%s: stderr %q; want the warning line %v, once", c.name, p.stderr, want)
		}
		if out := p.whole + p.stderr.String(); strings.Contains(out, right) || strings.Contains(out, wrong) {
			t.Fatalf("%s shows a password:\n%s", c.name, out)
		}
	}
	// The environment's wrong password wins over the URL's right one.
	code, out := runExit(t, []string{"LP_CP_STORE_PASSWORD=" + wrong}, "-store", at(right), "-admin-listen", "127.0.0.1:0")
	if code != 1 || !strings.HasPrefix(out, urlPasswordWarning) || !strings.Contains(out, `password authentication failed for user "lp_pw"`) {
		t.Fatalf("wrong LP_CP_STORE_PASSWORD, right URL: status %d, output %q; want 1, the warning, the authentication failure", code, out)
	}
	code, out = runExit(t, nil, "-store", at(right), "-store-password-file", emptyFile, "-admin-listen", "127.0.0.1:0")
	if want := urlPasswordWarning + "controlplane: store password: " + emptyFile + " is empty\n"; code != 1 || out != want {
		t.Fatalf("empty password file: status %d, output %q; want 1 and %q", code, out, want)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// requirePassword makes role (LOGIN, owner of a database of its name)
// with password on srv, and makes srv check it over loopback TCP
// (scram-sha-256; every other role stays trusted), polling until a wrong
// password is refused.
func requirePassword(t *testing.T, srv *pgtest.Server, role, password string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, strings.Replace(srv.ConnString(), "/"+pgtest.Database, "/postgres", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD '" + password + "'",
		"CREATE DATABASE " + role + " OWNER " + role,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	hba := filepath.Join(srv.Dir, "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	// First match wins: the role's line goes before initdb's trust lines.
	if err := os.WriteFile(hba, append([]byte("host all "+role+" 127.0.0.1/32 scram-sha-256\n"), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	probe := "postgres://" + role + ":not-" + password + "@127.0.0.1:" + strconv.Itoa(srv.Port) + "/" + role + "?sslmode=disable"
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := pgx.Connect(ctx, probe)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "28P01" {
			return
		}
		if c != nil {
			c.Close(ctx)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still takes a wrong password for %s: %v", role, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
