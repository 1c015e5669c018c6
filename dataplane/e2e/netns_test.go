//go:build netns

// This file needs root and network namespaces (ip netns, veth), which a
// developer's machine may not grant, so it is built only with -tags netns:
// .ci/run (root) runs it as a step of its own; the README's test command
// does not include it. TestFreezeControlPlane covers a silent control
// plane without privileges.

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// ipCmd runs ip with args and fails the test on an error.
func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s (this test needs root and network namespaces)", strings.Join(args, " "), err, out)
	}
}

// netnsLinks is a network namespace joined to the host by two veth
// links: cp (the host side at cpHost) carries the sync traffic and can be
// cut; client (the namespace side at clientHost) carries the test's
// requests and stays up.
type netnsLinks struct {
	ns                 string
	cpLink             string // host side of the cp link
	cpHost, clientHost string
}

// newNetns makes the namespace and its links (random names and
// 10.231.x.0/30 and 10.232.x.0/30 addresses) and removes them at the end
// of the test.
func newNetns(t testing.TB) *netnsLinks {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b[:2])
	x := int(b[2])
	n := &netnsLinks{ns: "lpe2e" + id, cpLink: "lpa" + id,
		cpHost: fmt.Sprintf("10.231.%d.1", x), clientHost: fmt.Sprintf("10.232.%d.2", x)}
	ipCmd(t, "netns", "add", n.ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", n.ns).Run()
		exec.Command("ip", "link", "del", "lpa"+id).Run()
		exec.Command("ip", "link", "del", "lpc"+id).Run()
	})
	ipCmd(t, "-n", n.ns, "link", "set", "lo", "up")
	for _, l := range []struct{ host, inNS, hostAddr, nsAddr string }{
		{"lpa" + id, "lpb" + id, fmt.Sprintf("10.231.%d.1/30", x), fmt.Sprintf("10.231.%d.2/30", x)},
		{"lpc" + id, "lpd" + id, fmt.Sprintf("10.232.%d.1/30", x), fmt.Sprintf("10.232.%d.2/30", x)},
	} {
		ipCmd(t, "link", "add", l.host, "type", "veth", "peer", "name", l.inNS, "netns", n.ns)
		ipCmd(t, "addr", "add", l.hostAddr, "dev", l.host)
		ipCmd(t, "link", "set", l.host, "up")
		ipCmd(t, "-n", n.ns, "addr", "add", l.nsAddr, "dev", l.inNS)
		ipCmd(t, "-n", n.ns, "link", "set", l.inNS, "up")
	}
	return n
}

// exec returns the command that runs a program in the namespace:
// ip netns exec NS.
func (n *netnsLinks) exec() []string { return []string{"ip", "netns", "exec", n.ns} }

// run is exec as a command: the program's path and its arguments.
func (n *netnsLinks) run(args ...string) (string, []string) {
	e := n.exec()
	return e[0], append(e[1:], args...)
}

// startRedis runs a redis-server on the namespace's loopback and returns
// its address there.
func (n *netnsLinks) startRedis(t testing.TB) string {
	t.Helper()
	server, cli := "redis-server", "redis-cli"
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		server = p
	}
	if p := os.Getenv("REDIS_CLI"); p != "" {
		cli = p
	}
	const port = "6390" // the namespace's loopback is the test's own
	path, args := n.run(server, "--port", port, "--bind", "127.0.0.1",
		"--dir", t.TempDir(), "--save", "", "--appendonly", "no", "--protected-mode", "no")
	startProc(t, "redis-server in "+n.ns, path, args, nil)
	waitFor(t, "redis-server in "+n.ns, syncTimeout, func() (bool, string) {
		path, args := n.run(cli, "-p", port, "ping")
		out, err := exec.Command(path, args...).CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "PONG", fmt.Sprintf("%s %v", out, err)
	})
	return "127.0.0.1:" + port
}

// writeTLS writes a CA and a server certificate for ip, signed by it:
// ca.pem, server.pem and server-key.pem in dir.
func writeTLS(t testing.TB, dir, ip string) (ca, cert, key string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey, srvKey := newKey(), newKey()
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "limitplane e2e CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "control plane"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP(ip)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caTmpl, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestLinkCut cuts a real link instead of freezing a process: data plane
// dp2 (its own redis-server and two gateways) runs in a network namespace
// whose link to the control plane (TLS on a veth address) is set down
// while its gateways keep serving clients over another link. With a key
// whose quota of 5 both data planes spent:
//   - during the cut the control plane drops dp2's streams (keepalive),
//     a reset made then reaches dp1 at once (exactly 5 again) while dp2
//     keeps enforcing what it has (0 of 3), and a key created then is
//     unknown there;
//   - when the link is back, dp2's gateways reconnect by themselves and
//     get the reset (exactly 5 of 8 on dp2) and the new key.
func TestLinkCut(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	ca, cert, key := writeTLS(t, t.TempDir(), n.cpHost)
	tk1 := dpToken{group: "dp1", tags: []string{"dp1"}, token: "cut-token-1"}
	tk2 := dpToken{group: "dp2", tags: []string{"dp2"}, token: "cut-token-2"}
	cp := startControlPlane(t, []dpToken{tk1, tk2}, cpOptions{keepalive: "1s", syncHost: n.cpHost, args: []string{"-tls-cert", cert, "-tls-key", key}})
	tlsYAML := "tls:\n  ca_file: " + ca
	redis1 := startDataPlane(t, cp, tk1, 0, nil).redis
	dp1 := &dataPlane{group: tk1.group, tags: tk1.tags, token: tk1.token, redis: redis1, redisAddr: redis1.Addr}
	dp1.gws = []*gateway{startGateway(t, dp1, cp.syncAddr, "dp1-gw1", gwOptions{controlPlaneYAML: tlsYAML})}
	dp2 := &dataPlane{group: tk2.group, tags: tk2.tags, token: tk2.token, redisAddr: n.startRedis(t)}
	for _, id := range []string{"dp2-gw1", "dp2-gw2"} {
		dp2.gws = append(dp2.gws, startGateway(t, dp2, cp.syncAddr, id, gwOptions{controlPlaneYAML: tlsYAML, listenHost: n.clientHost, command: n.exec()}))
	}
	gws := all(dp1, dp2)
	cp.putPolicy(t, quotaPolicy("five", 5))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	hash, _ := cp.postKey(t, "cut-key", spec.Key{Policies: []string{"five"}})
	rev := waitSynced(t, cp, gws...)
	waitConnected(t, cp, rev, gws...)
	spendEach(t, "before the cut", dp1, dp2, "cut-key", 8, 5)

	ipCmd(t, "link", "set", n.cpLink, "down")
	cut := time.Now()
	restored := false
	defer func() {
		if !restored {
			exec.Command("ip", "link", "set", n.cpLink, "up").Run()
		}
	}()
	waitFor(t, "dp2's gateways dropped by the control plane", syncTimeout, func() (bool, string) {
		list := cp.dataPlanes(t)
		for _, d := range list {
			if d.Group == "dp2" && d.Connected {
				return false, fmt.Sprintf("%+v", list)
			}
		}
		return true, ""
	})
	t.Logf("the control plane dropped dp2 %v after the cut", time.Since(cut))
	rev = cp.resetQuota(t, hash, "")
	_, newRev := cp.postKey(t, "cut-new-key", spec.Key{Policies: []string{"five"}})
	waitApplied(t, newRev, dp1.gws...)
	if c := send(t, dp1.gws, "/echo/r", "cut-key", 8, 4); c.admitted != 5 {
		t.Fatalf("dp1 after the reset: admitted %d of 8, want 5", c.admitted)
	}
	if c := send(t, dp2.gws, "/echo/r", "cut-key", 3, 2); c.admitted != 0 {
		t.Fatalf("dp2 during the cut: admitted %d of 3, want 0 (its quota is spent and the reset cannot reach it)", c.admitted)
	}
	for _, g := range dp2.gws {
		if status, body := sendOne(t, g, "/echo/r", "cut-new-key"); status != 401 && status != 403 {
			t.Fatalf("dp2 gateway %s during the cut knows a key created meanwhile: %d %s", g.id, status, body)
		}
		if r, err := g.readyz(); err != nil || r.ControlPlane.AppliedRevision >= rev {
			t.Fatalf("dp2 gateway %s during the cut: %+v %v", g.id, r.ControlPlane, err)
		}
	}

	ipCmd(t, "link", "set", n.cpLink, "up")
	restored = true
	back := time.Now()
	waitApplied(t, newRev, dp2.gws...)
	t.Logf("dp2 applied what it missed %v after the link came back (cut for %v)", time.Since(back), back.Sub(cut))
	waitConnectedSince(t, cp, newRev, back, dp2.gws...)
	waitConnected(t, cp, newRev, dp1.gws...)
	if c := send(t, dp2.gws, "/echo/r", "cut-key", 8, 4); c.admitted != 5 {
		t.Fatalf("dp2 after the link came back: admitted %d of 8, want 5", c.admitted)
	}
	if status, body := sendOne(t, dp2.gws[0], "/echo/r", "cut-new-key"); status != 200 {
		t.Fatalf("dp2 after the link came back: the new key answered %d %s", status, body)
	}
}
