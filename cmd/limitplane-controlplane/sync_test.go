package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/dataplane/syncpb"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

const (
	dp1Token = "dp1-token-for-tests"
	dp2Token = "dp2-token-for-tests"
)

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// dataPlanesFile lists dp1 (token in LP_TEST_DP1_TOKEN, tags dp1) and dp2
// (by hash, tags dp2 and shared).
func dataPlanesFile(t *testing.T, dir string) string {
	t.Helper()
	return writeFile(t, dir, "dataplanes.yaml", `
- group: dp1
  tags: [dp1]
  token_env: LP_TEST_DP1_TOKEN
- group: dp2
  tags: [dp2, shared]
  token_hash: "`+controlplane.HashToken(dp2Token)+`"
`)
}

// startSync starts the control plane with the sync port on a free
// loopback port, dp1's and dp2's tokens, and args.
func startSync(t *testing.T, args ...string) *process {
	t.Helper()
	return startSyncEnv(t, nil, args...)
}

// startSyncEnv is startSync with more environment variables.
func startSyncEnv(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	dir := t.TempDir()
	args = append([]string{"-data", filepath.Join(dir, "cp.db"), "-dataplanes", dataPlanesFile(t, dir), "-sync-listen", "127.0.0.1:0"}, args...)
	p := startEnv(t, append([]string{"LP_TEST_DP1_TOKEN=" + dp1Token}, env...), args...)
	if p.sync == "" {
		t.Fatalf("no sync line in the banner:\n%s", p.whole)
	}
	return p
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

type syncStream = grpc.BidiStreamingClient[syncpb.ClientMessage, syncpb.ServerMessage]

// openSync opens a stream with a Hello for group and tags with token.
func openSync(t *testing.T, conn *grpc.ClientConn, group, tok string, tags ...string) syncStream {
	t.Helper()
	// The deadline only bounds a broken server; nothing waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello := &syncpb.Hello{Group: group, Tags: tags, Token: tok, GatewayId: "gw-" + group, Version: "test"}
	if err := stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return stream
}

// recvSnapshot receives one whole snapshot and its nonce.
func recvSnapshot(t *testing.T, stream syncStream) (*spec.Snapshot, string) {
	t.Helper()
	a := protocol.NewAssembler(protocol.AssemblerOptions{})
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("receiving a snapshot: %v", err)
		}
		c := m.GetSnapshotChunk()
		if c == nil {
			t.Fatalf("got %v, want a snapshot chunk", m)
		}
		snap, err := a.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		if snap != nil {
			return snap, c.GetNonce()
		}
	}
}

func wantCode(t *testing.T, stream syncStream, code codes.Code) {
	t.Helper()
	m, err := stream.Recv()
	if status.Code(err) != code {
		t.Fatalf("got %v, %v; want status %s", m, err, code)
	}
}

// wantRefused opens a stream and expects it refused with code, when it
// opens or at its first message; it returns the error.
func wantRefused(t *testing.T, conn *grpc.ClientConn, code codes.Code, group, tok string, tags ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := syncpb.NewSyncServiceClient(conn).Sync(ctx)
	var m *syncpb.ServerMessage
	if err == nil {
		hello := &syncpb.Hello{Group: group, Tags: tags, Token: tok, GatewayId: "gw-" + group}
		if err = stream.Send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Hello{Hello: hello}}); err == nil || errors.Is(err, io.EOF) {
			m, err = stream.Recv()
		}
	}
	if status.Code(err) != code {
		t.Fatalf("got %v, %v; want status %s", m, err, code)
	}
	return err
}

// eventually polls cond every 10ms until it holds, for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
	}
}

// putDemo stores policy gold and the key "demo-key" through the admin
// API and returns the key's hash and the revision.
func putDemo(t *testing.T, p *process) (string, uint64) {
	t.Helper()
	if st, b := do(t, "PUT", p.base+"/api/policies/gold", `{"rate":{"requests":5,"per":"1m"}}`); st != 200 {
		t.Fatal(st, b)
	}
	st, b := do(t, "POST", p.base+"/api/keys", `{"key":"demo-key","policies":["gold"]}`)
	var w struct {
		KeyHash  string `json:"key_hash"`
		Revision uint64 `json:"revision"`
	}
	if st != 201 || json.Unmarshal([]byte(b), &w) != nil || w.KeyHash != identity.HashKey("demo-key").String() {
		t.Fatal(st, b)
	}
	return w.KeyHash, w.Revision
}

// A gateway-side client with the right token gets the snapshot with the
// key put through the admin API; its Ack and a Nack show in GET
// /api/dataplanes. A wrong token is refused with Unauthenticated, foreign
// tags with PermissionDenied, each with a log line.
func TestSyncServesDataPlanes(t *testing.T) {
	p := startSync(t)
	if m := syncLineRE.FindStringSubmatch(p.whole); m[2] != "off" || m[3] != "2" {
		t.Fatalf("sync line %q, want tls off and 2 tokens", m[0])
	}
	h, rev := putDemo(t, p)
	conn := dial(t, p.sync, insecure.NewCredentials())
	stream := openSync(t, conn, "dp1", dp1Token, "dp1")
	snap, nonce := recvSnapshot(t, stream)
	if snap.Revision != rev || len(snap.Keys) != 1 || snap.Keys[0].KeyHash != h || !reflect.DeepEqual(snap.Keys[0].Policies, []string{"gold"}) {
		t.Fatalf("snapshot %+v, want revision %d with key %s", snap, rev, h)
	}

	type dataPlane struct {
		GatewayID       string   `json:"gateway_id"`
		Group           string   `json:"group"`
		Tags            []string `json:"tags"`
		Connected       bool     `json:"connected"`
		AppliedRevision uint64   `json:"applied_revision"`
		LastRejection   *struct {
			Revision uint64 `json:"revision"`
			Problem  string `json:"problem"`
		} `json:"last_rejection"`
	}
	list := func() []dataPlane {
		t.Helper()
		st, b := do(t, "GET", p.base+"/api/dataplanes", "")
		var out struct{ DataPlanes []dataPlane }
		if st != 200 || json.Unmarshal([]byte(b), &out) != nil {
			t.Fatal(st, b)
		}
		return out.DataPlanes
	}
	send := func(m *syncpb.ClientMessage) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Ack{Ack: &syncpb.Ack{Revision: rev, Nonce: nonce}}})
	eventually(t, "applied revision in /api/dataplanes", func() bool {
		dps := list()
		return len(dps) == 1 && dps[0].AppliedRevision == rev
	})
	if st, b := do(t, "PUT", p.base+"/api/policies/silver", `{"rate":{"requests":1,"per":"1s"}}`); st != 200 {
		t.Fatal(st, b)
	}
	// With no API, dp1's view is the whole state: the policy comes as
	// Changes.
	m, err := stream.Recv()
	if err != nil || m.GetChanges() == nil || m.GetChanges().Revision != rev+1 {
		t.Fatalf("got %v, %v; want Changes to revision %d", m, err, rev+1)
	}
	nonce2 := m.GetChanges().Nonce
	send(&syncpb.ClientMessage{Kind: &syncpb.ClientMessage_Nack{Nack: &syncpb.Nack{Revision: rev + 1, Nonce: nonce2, Error: "spec: policies[1].rate: refused for the test"}}})
	eventually(t, "the rejection in /api/dataplanes", func() bool {
		dps := list()
		return len(dps) == 1 && dps[0].LastRejection != nil
	})
	want := []dataPlane{{GatewayID: "gw-dp1", Group: "dp1", Tags: []string{"dp1"}, Connected: true, AppliedRevision: rev}}
	want[0].LastRejection = &struct {
		Revision uint64 `json:"revision"`
		Problem  string `json:"problem"`
	}{rev + 1, "spec: policies[1].rate: refused for the test"}
	if got := list(); !reflect.DeepEqual(got, want) {
		t.Fatalf("/api/dataplanes:\n got %+v\nwant %+v", got, want)
	}

	// Refusals are logged rate-limited: the first at once, the next two
	// counted in one line at the end of the 5s interval.
	wantCode(t, openSync(t, conn, "dp1", "not-a-token", "dp1"), codes.Unauthenticated)
	eventually(t, "the refusal logged", func() bool {
		return strings.Contains(p.stderr.String(), `msg="controlplane: sync stream refused" err="controlplane: unknown data-plane token group=\"dp1\" gateway=\"gw-dp1\" peer=`)
	})
	wantCode(t, openSync(t, conn, "dp1", dp1Token, "dp1", "dp2"), codes.PermissionDenied)
	wantCode(t, openSync(t, conn, "dp2", dp1Token, "dp1"), codes.PermissionDenied)
	eventually(t, "the other two refusals logged in one line", func() bool {
		return strings.Contains(p.stderr.String(), `msg="controlplane: sync stream refused" err="controlplane: the token is not for group \"dp2\" token_group=\"dp1\" gateway=\"gw-dp2\" peer=`) &&
			strings.Contains(p.stderr.String(), " failures=2 total=3\n")
	})
	if n := strings.Count(p.stderr.String(), "sync stream refused"); n != 2 {
		t.Fatalf("%d lines of refusals, want 2:\n%s", n, p.stderr)
	}
}

// SIGTERM while a gateway's stream is open ends the stream with
// Unavailable and the process with status 0.
func TestSIGTERMWithOpenStream(t *testing.T) {
	p := startSync(t)
	conn := dial(t, p.sync, insecure.NewCredentials())
	stream := openSync(t, conn, "dp2", dp2Token, "shared")
	recvSnapshot(t, stream)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wantCode(t, stream, codes.Unavailable)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v; stderr: %s", err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
}

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, written as PEM files in a temporary directory.
type pki struct {
	caFile, certFile, keyFile string
	roots                     *x509.CertPool
	client                    tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "limitplane test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, tmpl *x509.Certificate) ([]byte, []byte) {
		k := newKey()
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(serial), now.Add(-time.Hour), now.Add(time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM(k)
	}
	srvCert, srvKey := issue(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "control plane"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	cliCert, cliKey := issue(3, &x509.Certificate{
		Subject: pkix.Name{CommonName: "gw-dp1"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	p := &pki{
		caFile:   writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))),
		certFile: writeFile(t, dir, "cp.pem", string(srvCert)),
		keyFile:  writeFile(t, dir, "cp-key.pem", string(srvKey)),
		roots:    x509.NewCertPool(),
	}
	p.roots.AddCert(ca)
	if p.client, err = tls.X509KeyPair(cliCert, cliKey); err != nil {
		t.Fatal(err)
	}
	return p
}

// On a TLS sync port a client that trusts the CA gets its snapshot and a
// plaintext client gets nothing.
func TestSyncTLS(t *testing.T) {
	ca := newPKI(t)
	p := startSync(t, "-tls-cert", ca.certFile, "-tls-key", ca.keyFile)
	if m := syncLineRE.FindStringSubmatch(p.whole); m[2] != "on" {
		t.Fatalf("sync line %q, want tls on", m[0])
	}
	_, rev := putDemo(t, p)
	tlsConn := dial(t, p.sync, credentials.NewTLS(&tls.Config{RootCAs: ca.roots}))
	if snap, _ := recvSnapshot(t, openSync(t, tlsConn, "dp1", dp1Token, "dp1")); snap.Revision != rev || len(snap.Keys) != 1 {
		t.Fatalf("over TLS: snapshot of revision %d with %d keys, want %d and 1", snap.Revision, len(snap.Keys), rev)
	}
	plain := dial(t, p.sync, insecure.NewCredentials())
	wantRefused(t, plain, codes.Unavailable, "dp1", dp1Token, "dp1")
}

// On a mutual-TLS sync port a client without a certificate is refused
// and one with a certificate from the client CA gets its snapshot.
func TestSyncMutualTLS(t *testing.T) {
	ca := newPKI(t)
	p := startSync(t, "-tls-cert", ca.certFile, "-tls-key", ca.keyFile, "-tls-client-ca", ca.caFile)
	if m := syncLineRE.FindStringSubmatch(p.whole); m[2] != "mutual" {
		t.Fatalf("sync line %q, want tls mutual", m[0])
	}
	_, rev := putDemo(t, p)
	noCert := dial(t, p.sync, credentials.NewTLS(&tls.Config{RootCAs: ca.roots}))
	// The handshake fails: the client sees the server's alert or the
	// connection closed, as timing has it.
	wantRefused(t, noCert, codes.Unavailable, "dp1", dp1Token, "dp1")
	withCert := dial(t, p.sync, credentials.NewTLS(&tls.Config{RootCAs: ca.roots, Certificates: []tls.Certificate{ca.client}}))
	if snap, _ := recvSnapshot(t, openSync(t, withCert, "dp1", dp1Token, "dp1")); snap.Revision != rev {
		t.Fatalf("with a client certificate: snapshot of revision %d, want %d", snap.Revision, rev)
	}
}

// runExit runs the command with args to its end and returns its exit
// status and output.
func runExit(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1", "LP_CP_ADMIN_TOKEN="+token), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatal(err)
	return 0, ""
}

// TestChangeLogFlag: -change-log 0 or below is refused with status 2
// (they once meant the default, 10000, without a word).
func TestChangeLogFlag(t *testing.T) {
	for _, v := range []string{"0", "-1"} {
		code, out := runExit(t, nil, "-change-log", v)
		if want := "-change-log " + v + ": want at least 1 revision"; code != 2 || !strings.Contains(out, want) {
			t.Errorf("-change-log %s: status %d, output %q; want 2 and %q", v, code, out, want)
		}
	}
}

// A sync port in plaintext on an address other than loopback is refused
// at start with exit status 2, unless -sync-insecure says so; a bad
// -dataplanes file stops the start with status 1 and names the file.
func TestSyncStartRefusals(t *testing.T) {
	dir := t.TempDir()
	dps := dataPlanesFile(t, dir)
	env := []string{"LP_TEST_DP1_TOKEN=" + dp1Token}
	code, out := runExit(t, env, "-data", filepath.Join(dir, "cp.db"), "-admin-listen", "127.0.0.1:0", "-dataplanes", dps, "-sync-listen", "0.0.0.0:0")
	if want := "controlplane: -sync-listen 0.0.0.0:0 is not a loopback address and the sync port has no TLS: data-plane tokens would cross the network in plaintext; give -tls-cert and -tls-key (and -tls-client-ca for mutual TLS), or -sync-insecure to accept that\n"; code != 2 || out != want {
		t.Fatalf("exit %d, output %q; want 2 and %q", code, out, want)
	}
	code, out = runExit(t, env, "-data", filepath.Join(dir, "cp.db"), "-dataplanes", dps, "-tls-client-ca", dps)
	if want := "controlplane: -tls-client-ca needs -tls-cert and -tls-key (mutual TLS is TLS first)\n"; code != 2 || out != want {
		t.Fatalf("exit %d, output %q; want 2 and %q", code, out, want)
	}
	code, out = runExit(t, env, "-data", filepath.Join(dir, "cp.db"), "-dataplanes", dps, "-keepalive", "500ms")
	if want := "controlplane: -keepalive 500ms: want at least 1s\n"; code != 2 || out != want {
		t.Fatalf("exit %d, output %q; want 2 and %q", code, out, want)
	}
	bad := writeFile(t, dir, "bad.yaml", "- group: dp1\n  token_hash: sha256:abc\n")
	code, out = runExit(t, env, "-data", filepath.Join(dir, "cp.db"), "-dataplanes", bad)
	if want := "controlplane: dataplanes file: invalid, not starting:\n" + bad + `:2:15: [0].token_hash: "sha256:abc" is not "sha256:" and 64 hex digits` + "\n"; code != 1 || out != want {
		t.Fatalf("exit %d, output %q; want 1 and %q", code, out, want)
	}

	p := startEnv(t, env, "-data", filepath.Join(dir, "cp.db"), "-dataplanes", dps, "-sync-listen", "0.0.0.0:0", "-sync-insecure")
	if m := syncLineRE.FindStringSubmatch(p.whole); m == nil || !strings.HasPrefix(m[1], "[::]:") && !strings.HasPrefix(m[1], "0.0.0.0:") || m[2] != "off" {
		t.Fatalf("with -sync-insecure:\n%s", p.whole)
	}
}

// loadDataPlanes reads every way of giving a token and refuses each
// mistake with the file, the entry and what is wrong.
func TestLoadDataPlanes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "dp3.token", "dp3-secret\n")
	writeFile(t, dir, "empty.token", "\n")
	env := map[string]string{"DP1": "dp1-secret"}
	getenv := func(k string) string { return env[k] }
	h2 := controlplane.HashToken("dp2-secret")
	path := writeFile(t, dir, "ok.yaml", `
- group: dp1
  tags: [eu]
  token_env: DP1
- group: dp2
  token_hash: "sha256:`+strings.ToUpper(h2[7:])+`"
- group: dp3
  tags: [us, shared]
  token_file: dp3.token
`)
	got, err := loadDataPlanes(path, getenv)
	if err != nil {
		t.Fatal(err)
	}
	want := []controlplane.DataPlaneToken{
		{Hash: controlplane.HashToken("dp1-secret"), Group: "dp1", Tags: []string{"eu"}},
		{Hash: h2, Group: "dp2"},
		{Hash: controlplane.HashToken("dp3-secret"), Group: "dp3", Tags: []string{"us", "shared"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// @ stands for the file's name.
	for _, c := range []struct{ yaml, want string }{
		{"- tags: [eu]\n  token_env: DP1\n", `@:1:3: [0].group: missing`},
		{"- group: g\n  token_env: DP1\n  token_hash: " + h2 + "\n", `@:1:3: [0]: give exactly one of token_hash, token_env and token_file`},
		{"- group: g\n", `@:1:3: [0]: give exactly one of token_hash, token_env and token_file`},
		{"- group: g\n  token_hash: " + h2 + "x\n", `@:2:15: [0].token_hash: "` + h2 + `x" is not "sha256:" and 64 hex digits`},
		{"- group: g\n  token_env: NOPE\n", `@:2:14: [0].token_env: the environment variable NOPE is unset or empty`},
		{"- group: g\n  token_file: empty.token\n", `@:2:15: [0].token_file: ` + filepath.Join(dir, "empty.token") + ` is empty`},
		{"- group: g\n  token_file: missing.token\n", `@:2:15: [0].token_file: open ` + filepath.Join(dir, "missing.token") + `: no such file or directory`},
		{"- group: g\n  tags: [eu, \"\"]\n  token_env: DP1\n", `@:2:14: [0].tags[1]: empty`},
		{"- group: a\n  token_env: DP1\n\n- group: b\n  token_hash: " + controlplane.HashToken("dp1-secret") + "\n",
			`@:4:3: [1]: the same token as [0] (line 1); each token has one group and scope`},
		{"- group: g\n  token_env: DP1\n  tag: [eu]\n", "@:3:3: [0].tag: unknown field (known here: group, tags, token_hash, token_env, token_file)"},
		{"", "@: no data-plane tokens (want a list of entries with group, tags and token_hash, token_env or token_file)"},
		{"[]", "@:1:1: no data-plane tokens (want a list of entries with group, tags and token_hash, token_env or token_file)"},
		{"group: g\n", "@:1:1: want a list, got a mapping"},
		{"- group: g\n  tags: dp1\n  token_env: DP1\n- group: [x]\n  colour: red\n  tags: [a, [b]]\n- just-a-string\n",
			"@:2:9: [0].tags: want a list of strings, got \"dp1\"\n@:4:3: [1]: give exactly one of token_hash, token_env and token_file\n@:4:10: [1].group: want a string, got a list\n" +
				"@:5:3: [1].colour: unknown field (known here: group, tags, token_hash, token_env, token_file)\n@:6:13: [1].tags[1]: want a string, got a list\n" +
				"@:7:3: [2]: want a mapping, got \"just-a-string\""},
		{"- group:\n  token_env: DP1\n", "@:1:9: [0].group: missing"},
		{"- group: \"a}b{c\"\n  token_env: DP1\n- group: \"a b\"\n  token_hash: " + h2 + "\n",
			"@:1:10: [0].group: \"a}b{c\": want 1 to 128 characters without spaces, control characters, \"{\" or \"}\" (it names a Cluster hash tag)\n" +
				"@:3:10: [1].group: \"a b\": want 1 to 128 characters without spaces, control characters, \"{\" or \"}\" (it names a Cluster hash tag)"},
		// An empty entry is refused at its line; the entry after it keeps
		// its index.
		{"- ~\n- group: g\n  token_env: NOPE\n", "@:1:3: [0]: an empty entry (a lone \"-\" or ~): remove it or give it a value\n" +
			"@:3:14: [1].token_env: the environment variable NOPE is unset or empty"},
		{"- group: g\n  token_env: DP1\n---\n- group: h\n", "@:4:1: a second YAML document (after ---): a file holds one"},
		{"- group: g\n  token_env: DP1\n  nested: {a: [1, *x]}\n", "@:3:20: YAML syntax: unknown anchor 'x' referenced"},
		// Every problem of every entry, not the first only.
		{"- group: g\n  token_env: NOPE\n- tags: [\"\"]\n  token_env: DP1\n", "@:2:14: [0].token_env: the environment variable NOPE is unset or empty\n" +
			"@:3:3: [1].group: missing\n@:3:10: [1].tags[0]: empty"},
	} {
		p := writeFile(t, dir, "bad.yaml", c.yaml)
		_, err := loadDataPlanes(p, getenv)
		if want := "dataplanes file: invalid, not starting:\n" + strings.ReplaceAll(c.want, "@", p); err == nil || err.Error() != want {
			t.Errorf("%q:\n got %v\nwant %s", c.yaml, err, want)
		}
	}
	if _, err := loadDataPlanes(filepath.Join(dir, "none.yaml"), getenv); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("dataplanes file: open %s", filepath.Join(dir, "none.yaml"))) {
		t.Errorf("missing file: %v", err)
	}
}

// http2Conn opens a raw HTTP/2 connection to addr (the client preface
// and an empty SETTINGS sent) and returns its framer.
func http2Conn(t *testing.T, addr string) (*http2.Framer, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second)) // bounds a broken server only
	return fr, c
}

// Keepalive with -keepalive 1s: the server pings an idle connection and
// closes it when the ping is not answered within half a second (a dead
// peer); a client that pings faster than every half second is told
// ENHANCE_YOUR_CALM ("too_many_pings") and cut off.
func TestSyncKeepalive(t *testing.T) {
	p := startSync(t, "-keepalive", "1s")

	fr, _ := http2Conn(t, p.sync)
	start := time.Now()
	var pinged time.Duration
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if pinged == 0 {
				t.Fatalf("connection ended without a ping: %v", err)
			}
			break // closed after the unanswered ping
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() && pinged == 0 {
				pinged = time.Since(start)
			}
		case *http2.GoAwayFrame:
			if pinged == 0 {
				t.Fatalf("GOAWAY %v before any ping", f.ErrCode)
			}
		}
	}
	closed := time.Since(start)
	t.Logf("pinged after %s, closed %s after the ping", pinged, closed-pinged)
	if pinged < 900*time.Millisecond || pinged > 5*time.Second || closed-pinged > 5*time.Second {
		t.Fatalf("pinged after %s, closed %s later; want a ping after about 1s and the close about 0.5s later", pinged, closed-pinged)
	}

	fr, _ = http2Conn(t, p.sync)
	for i := range 5 {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // already cut off
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY for too many pings: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeEnhanceYourCalm || string(g.DebugData()) != "too_many_pings" {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", g.ErrCode, g.DebugData())
			}
			break
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			fr.WriteSettingsAck()
		}
	}
}
