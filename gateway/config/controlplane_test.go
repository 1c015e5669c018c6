package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway/config"
)

// writeCert writes a self-signed certificate and its key into dir as
// cert.pem and key.pem.
func writeCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cp.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"cp.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestControlPlane covers the control_plane section: what it loads, its
// defaults, and each refusal at its line and column.
func TestControlPlane(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir)
	for name, body := range map[string]string{"dp.token": "file-token\n", "empty.token": "", "junk.pem": "not a certificate\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("LP_TEST_DP_TOKEN", "env-token")
	t.Setenv("LP_TEST_EMPTY", "")
	name := filepath.Join(dir, "gw.yaml")
	parse := func(yaml string) (*config.Config, error) { return config.Parse(name, []byte(yaml)) }

	cfg, err := parse("store: memory\ncontrol_plane:\n  address: 127.0.0.1:7071\n  token_env: LP_TEST_DP_TOKEN\n  group: dp1\n  tags: [eu, gold]\n")
	if err != nil {
		t.Fatal(err)
	}
	want := &config.ControlPlane{AgentOptions: dataplane.AgentOptions{Address: "127.0.0.1:7071", Token: "env-token", Group: "dp1",
		Tags: []string{"eu", "gold"}, OnStale: dataplane.StaleKeep}, StateFile: filepath.Join(dir, "gw.state.json")}
	if !reflect.DeepEqual(cfg.ControlPlane, want) {
		t.Errorf("minimal section: %+v\nwant %+v", cfg.ControlPlane, want)
	}
	// Several replicas: a comma-separated list, passed on as it is.
	cfg, err = parse("control_plane:\n  address: \"127.0.0.1:7071, [::1]:7072,localhost:7073\"\n  token_env: LP_TEST_DP_TOKEN\n  group: dp1\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.ControlPlane.Address; got != "127.0.0.1:7071, [::1]:7072,localhost:7073" {
		t.Errorf("list address = %q", got)
	}
	if len(cfg.Snapshot.APIs)+len(cfg.Snapshot.Keys)+len(cfg.Snapshot.Policies) != 0 || cfg.Snapshot.Revision != 0 {
		t.Errorf("a control-plane file has a configuration of its own: %+v", cfg.Snapshot)
	}
	// The control plane's secret files are read beside the file too.
	if cfg.Resolver != (config.FileResolver{Dir: dir}) {
		t.Errorf("Resolver = %+v, want the file's directory %s", cfg.Resolver, dir)
	}

	cfg, err = parse(`control_plane:
  address: cp.example:7071
  token_file: dp.token
  group: dp1
  gateway_id: gw-a
  tls:
    ca_file: cert.pem
    cert_file: cert.pem
    key_file: key.pem
    server_name: cp.test
  max_stale: 1h
  on_stale: fail_closed
  state_file: state/dp.json
`)
	if err != nil {
		t.Fatal(err)
	}
	cp := cfg.ControlPlane
	if cp.Address != "cp.example:7071" || cp.Token != "file-token" || cp.GatewayID != "gw-a" || cp.MaxStale != time.Hour ||
		cp.OnStale != dataplane.StaleFailClosed || cp.StateFile != filepath.Join(dir, "state/dp.json") || cp.Tags != nil {
		t.Errorf("full section: %+v", cp)
	}
	if cp.TLS == nil || cp.TLS.ServerName != "cp.test" || cp.TLS.RootCAs == nil || len(cp.TLS.Certificates) != 1 {
		t.Errorf("tls: %+v", cp.TLS)
	}
	if got := config.DefaultStateFile("/etc/lp/gateway.yaml"); got != "/etc/lp/gateway.state.json" {
		t.Errorf("DefaultStateFile = %s", got)
	}

	for _, c := range []struct{ name, yaml, want string }{
		{"empty section", "control_plane: {}\n", strings.Join([]string{
			"gw.yaml:1:16: control_plane.address: the control plane's sync address is required (host:port, like cp.example:7071)",
			"gw.yaml:1:16: control_plane.token_env: the data-plane token is required: set token_env or token_file",
			"gw.yaml:1:16: control_plane.group: the data-plane group is required",
		}, "\n")},
		{"with apis", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g}\npolicies: []\napis:\n  - {id: a, listen_path: /a/, target: \"builtin:echo\"}\n",
			"gw.yaml:2:11: policies: not allowed with control_plane: the control plane sends the policies, keys and APIs, and the file keeps only local settings\n" +
				"gw.yaml:4:3: apis: not allowed with control_plane: the control plane sends the policies, keys and APIs, and the file keeps only local settings"},
		{"plaintext off loopback", "control_plane: {address: \"10.0.0.1:7071\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "10.0.0.1:7071" is not a loopback address: set control_plane.tls (the token and the configuration must not cross a network in plaintext)`},
		{"bad address", "control_plane: {address: cp.example, token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "cp.example" is not host:port (like cp.example:7071)`},
		{"bad part of a list", "control_plane: {address: \"127.0.0.1:1,cp2\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "127.0.0.1:1,cp2": part 2, "cp2", is not host:port (like cp1.example:7071,cp2.example:7071)`},
		{"group with a brace", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: \"a}b\"}\n",
			`gw.yaml:1:77: control_plane.group: "a}b": want 1 to 128 characters without spaces, control characters, "{" or "}" (it names a Cluster hash tag)`},
		{"gateway_id with a control character", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, gateway_id: \"gw\\t1\"}\n",
			`gw.yaml:1:92: control_plane.gateway_id: "gw\t1" has a control character`},
		{"port 0", "control_plane: {address: \"127.0.0.1:0\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "127.0.0.1:0" has port 0, which names no server (want a port from 1 to 65535)`},
		{"port 0 in a list", "control_plane: {address: \"127.0.0.1:1, 127.0.0.1:0\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "127.0.0.1:1, 127.0.0.1:0": part 2, "127.0.0.1:0", has port 0, which names no server (want a port from 1 to 65535)`},
		{"no host", "control_plane: {address: \":7071\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: ":7071" is not host:port (like cp.example:7071)`},
		{"empty part of a list", "control_plane: {address: \"127.0.0.1:1,,127.0.0.1:2\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "127.0.0.1:1,,127.0.0.1:2": part 2, "", is not host:port (like cp1.example:7071,cp2.example:7071)`},
		{"plaintext list off loopback", "control_plane: {address: \"127.0.0.1:7071,10.0.0.2:7071\", token_env: LP_TEST_DP_TOKEN, group: g}\n",
			`gw.yaml:1:26: control_plane.address: "127.0.0.1:7071,10.0.0.2:7071" is not a loopback address: set control_plane.tls (the token and the configuration must not cross a network in plaintext)`},
		{"both tokens", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, token_file: dp.token, group: g}\n",
			`gw.yaml:1:16: control_plane: set token_env or token_file, not both`},
		{"empty env token", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_EMPTY, group: g}\n",
			`gw.yaml:1:52: control_plane.token_env: environment variable LP_TEST_EMPTY is empty`},
		{"empty file token", "control_plane: {address: \"127.0.0.1:1\", token_file: empty.token, group: g}\n",
			`gw.yaml:1:53: control_plane.token_file: empty.token is empty`},
		{"empty tag", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, tags: [a, \"\"]}\n",
			`gw.yaml:1:90: control_plane.tags[1]: a tag must not be empty`},
		{"negative max_stale", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, max_stale: -1m}\n",
			`gw.yaml:1:91: control_plane.max_stale: -1m must be >= 0 (0: never stale)`},
		{"bad max_stale", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, max_stale: 1d}\n",
			`gw.yaml:1:91: control_plane.max_stale: "1d" is not a duration (like 30m, 1h or 24h)`},
		{"bad on_stale", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, on_stale: close}\n",
			`gw.yaml:1:90: control_plane.on_stale: unknown policy "close" (want keep or fail_closed)`},
		{"unreadable ca", "control_plane:\n  address: cp.example:1\n  token_env: LP_TEST_DP_TOKEN\n  group: g\n  tls: {ca_file: missing.pem}\n",
			`gw.yaml:5:18: control_plane.tls.ca_file: cannot read missing.pem: no such file or directory`},
		{"ca without certificates", "control_plane:\n  address: cp.example:1\n  token_env: LP_TEST_DP_TOKEN\n  group: g\n  tls: {ca_file: junk.pem}\n",
			`gw.yaml:5:18: control_plane.tls.ca_file: junk.pem holds no PEM certificate`},
		{"cert without key", "control_plane:\n  address: cp.example:1\n  token_env: LP_TEST_DP_TOKEN\n  group: g\n  tls: {cert_file: cert.pem}\n",
			`gw.yaml:5:20: control_plane.tls.cert_file: a client certificate needs key_file too`},
		{"unknown field", "control_plane: {address: \"127.0.0.1:1\", token_env: LP_TEST_DP_TOKEN, group: g, tag: [a]}\n",
			`gw.yaml:1:80: control_plane.tag: unknown field (known here: address, token_env, token_file, group, tags, gateway_id, tls, max_stale, on_stale, state_file)`},
	} {
		_, err := parse(c.yaml)
		got := ""
		if err != nil {
			got = strings.ReplaceAll(err.Error(), dir+"/", "")
		}
		if got != c.want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.name, got, c.want)
		}
	}
}
