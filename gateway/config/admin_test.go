package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/limitplane/limitplane/gateway/config"
)

// TestAdmin covers the admin section: off when absent, its defaults, the
// token's two sources, and the refusals, each at its line and column.
func TestAdmin(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty.token"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LP_TEST_ADMIN_TOKEN", "env-token")
	t.Setenv("LP_TEST_EMPTY", "")
	name := filepath.Join(dir, "t.yaml")
	parse := func(yaml string) (*config.Config, error) { return config.Parse(name, []byte(yaml+api)) }

	ok := []struct {
		name, yaml string
		want       *config.Admin
	}{
		{"absent", "", nil},
		{"empty section", "admin: {}\n", &config.Admin{Listen: "127.0.0.1:8090", Loopback: true}},
		{"loopback, no token", "admin: {listen: \"127.0.0.1:0\"}\n", &config.Admin{Listen: "127.0.0.1:0", Loopback: true}},
		{"localhost", "admin: {listen: \"localhost:9\"}\n", &config.Admin{Listen: "localhost:9", Loopback: true}},
		{"IPv6 loopback", "admin: {listen: \"[::1]:9\"}\n", &config.Admin{Listen: "[::1]:9", Loopback: true}},
		{"token from env", "admin:\n  listen: \":9100\"\n  token_env: LP_TEST_ADMIN_TOKEN\n", &config.Admin{Listen: ":9100", Token: "env-token"}},
		{"token from file", "admin:\n  listen: 10.0.0.1:9100\n  token_file: admin.token\n", &config.Admin{Listen: "10.0.0.1:9100", Token: "file-token"}},
	}
	for _, c := range ok {
		cfg, err := parse(c.yaml)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		switch {
		case c.want == nil && cfg.Admin != nil:
			t.Errorf("%s: Admin = %+v, want nil", c.name, *cfg.Admin)
		case c.want != nil && (cfg.Admin == nil || *cfg.Admin != *c.want):
			t.Errorf("%s: Admin = %+v, want %+v", c.name, cfg.Admin, *c.want)
		}
	}

	bad := []struct{ name, yaml, want string }{
		{"every interface without a token", "admin:\n  listen: \":9100\"\n",
			name + `:2:11: admin.listen: ":9100" is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token`},
		{"public address without a token", "admin: {listen: \"192.0.2.1:9100\"}\n",
			name + `:1:17: admin.listen: "192.0.2.1:9100" is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token`},
		{"a host name is not loopback", "admin: {listen: \"gw.example:9100\"}\n",
			name + `:1:17: admin.listen: "gw.example:9100" is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token`},
		{"bad listen", "admin: {listen: \"9100\"}\n",
			name + `:1:17: admin.listen: "9100" is not host:port (like 127.0.0.1:8080 or :8080)`},
		{"both sources", "admin:\n  token_env: LP_TEST_ADMIN_TOKEN\n  token_file: admin.token\n",
			name + `:2:3: admin: set token_env or token_file, not both`},
		{"token file missing", "admin:\n  listen: \":9100\"\n  token_file: nope.token\n",
			name + `:3:15: admin.token_file: cannot read ` + filepath.Join(dir, "nope.token") + `: no such file or directory`},
		{"token file empty", "admin:\n  token_file: empty.token\n",
			name + `:2:15: admin.token_file: empty.token is empty`},
		{"token env unset", "admin:\n  token_env: LP_TEST_UNSET_TOKEN\n",
			name + `:2:14: admin.token_env: environment variable LP_TEST_UNSET_TOKEN is not set`},
		{"token env empty", "admin:\n  token_env: LP_TEST_EMPTY\n",
			name + `:2:14: admin.token_env: environment variable LP_TEST_EMPTY is empty`},
		{"unknown field", "admin: {token: x}\n",
			name + `:1:9: admin.token: unknown field (known here: listen, token_env, token_file)`},
	}
	for _, c := range bad {
		_, err := parse(c.yaml)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s:\n got %v\nwant %s", c.name, err, c.want)
		}
	}
}
