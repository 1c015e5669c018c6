package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/identity"
)

// ControlPlane is the control_plane section: the gateway takes its
// policies, keys and APIs from a control plane (package dataplane's
// Agent) instead of the file, which then holds only local settings.
type ControlPlane struct {
	// AgentOptions are the agent's options the section gives, the rest
	// left zero: Address as the file writes it (one "host:port", or
	// several replicas' as a comma-separated list), Token read from
	// token_env or token_file (a secret: never print it), Group, Tags,
	// GatewayID, TLS (a CA pool from ca_file, a client certificate from
	// cert_file and key_file, server_name; nil means plaintext, allowed
	// only to a loopback Address), MaxStale and OnStale.
	dataplane.AgentOptions
	// StateFile is where the last applied configuration is persisted
	// when the store is in-process (with a Redis store it is kept in
	// Redis): state_file taken from the configuration file's directory,
	// or by default the configuration file's name with its extension
	// replaced by ".state.json" (gateway.yaml → gateway.state.json).
	StateFile string
}

// DefaultStateFile returns the state file of a configuration file that
// names none: beside it, its extension replaced by ".state.json".
func DefaultStateFile(configFile string) string {
	return strings.TrimSuffix(configFile, filepath.Ext(configFile)) + ".state.json"
}

// controlPlane validates the control_plane section. The file must then
// leave policies, keys and apis out.
func (v *loader) controlPlane(r *rawControlPlane, raw *rawConfig) *ControlPlane {
	cp := &ControlPlane{AgentOptions: dataplane.AgentOptions{Group: r.Group, Tags: r.Tags, GatewayID: r.GatewayID}}
	for _, f := range []struct {
		name string
		set  bool
	}{{"policies", raw.Policies != nil}, {"keys", raw.Keys != nil}, {"apis", raw.APIs != nil}} {
		if f.set {
			v.fail(f.name, "not allowed with control_plane: the control plane sends the policies, keys and APIs, and the file keeps only local settings")
		}
	}
	loopback := false
	if r.Address == "" {
		v.require("control_plane.address", "the control plane's sync address is required (host:port, like cp.example:7071)")
	} else if lb, ok := v.replicas(r.Address); ok {
		cp.Address, loopback = r.Address, lb
	}
	token, set := v.secret("control_plane", "token", r.TokenEnv, r.TokenFile)
	if cp.Token = token; !set {
		v.require("control_plane.token_env", "the data-plane token is required: set token_env or token_file")
	}
	if r.Group == "" {
		v.require("control_plane.group", "the data-plane group is required")
	} else if !dataplane.ValidGroup(r.Group) {
		v.fail("control_plane.group", "%q: want %s", r.Group, dataplane.GroupRule)
	}
	if r.GatewayID != "" {
		if err := protocol.CheckGatewayID(r.GatewayID); err != nil {
			v.fail("control_plane.gateway_id", "%s", strings.TrimPrefix(err.Error(), "gateway_id "))
		}
	}
	for i, tag := range r.Tags {
		if tag == "" {
			v.fail(fmt.Sprintf("control_plane.tags[%d]", i), "a tag must not be empty")
		}
	}
	if r.TLS != nil {
		cp.TLS = v.controlPlaneTLS(r.TLS)
	} else if cp.Address != "" && !loopback {
		v.fail("control_plane.address", "%q is not a loopback address: set control_plane.tls (the token and the configuration must not cross a network in plaintext)", r.Address)
	}
	cp.MaxStale = number(v, "control_plane.max_stale", r.MaxStale, 0, func(d time.Duration) bool { return d >= 0 }, " must be >= 0 (0: never stale)")
	stale := []dataplane.OnStale{dataplane.StaleKeep, dataplane.StaleFailClosed}
	cp.OnStale = oneOf(v, "control_plane.on_stale", "policy", r.OnStale, []string{string(stale[0]), string(stale[1])}, stale...)
	if r.StateFile != "" {
		cp.StateFile = r.StateFile
		if !filepath.IsAbs(cp.StateFile) {
			cp.StateFile = filepath.Join(v.files.Dir, cp.StateFile)
		}
	} else {
		cp.StateFile = DefaultStateFile(v.Name)
	}
	return cp
}

// replicas checks control_plane.address, a comma-separated list of
// replicas, each host:port, and reports whether every one is a loopback
// address (plaintext is allowed only then).
func (v *loader) replicas(address string) (loopback, ok bool) {
	loopback = true
	for i, part := range strings.Split(address, ",") {
		part = strings.TrimSpace(part)
		what, like := fmt.Sprintf("%q", address), "cp.example:7071"
		if strings.Contains(address, ",") {
			what, like = fmt.Sprintf("%q: part %d, %q,", address, i+1, part), "cp1.example:7071,cp2.example:7071"
		}
		host, port, err := net.SplitHostPort(part)
		n, nerr := strconv.Atoi(port)
		switch {
		case err != nil || host == "" || port == "":
			v.fail("control_plane.address", "%s is not host:port (like %s)", what, like)
			return false, false
		case nerr == nil && (n < 1 || n > 65535):
			v.fail("control_plane.address", "%s has port %s, which names no server (want a port from 1 to 65535)", what, port)
			return false, false
		}
		loopback = loopback && identity.IsLoopbackHost(host)
	}
	return loopback, true
}

// controlPlaneTLS loads the tls section's files into a client TLS
// configuration.
func (v *loader) controlPlaneTLS(r *rawControlPlaneTLS) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.ServerName}
	if r.CAFile != "" {
		if pem, ok := v.read("control_plane.tls.ca_file", r.CAFile); ok {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				v.fail("control_plane.tls.ca_file", "%s holds no PEM certificate", r.CAFile)
			}
			c.RootCAs = pool
		}
	}
	switch {
	case r.CertFile != "" && r.KeyFile != "":
		cert, certOK := v.read("control_plane.tls.cert_file", r.CertFile)
		key, keyOK := v.read("control_plane.tls.key_file", r.KeyFile)
		if certOK && keyOK {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				v.fail("control_plane.tls.cert_file", "%s and %s: %v", r.CertFile, r.KeyFile, err)
			} else {
				c.Certificates = []tls.Certificate{pair}
			}
		}
	case r.CertFile != "":
		v.fail("control_plane.tls.cert_file", "a client certificate needs key_file too")
	case r.KeyFile != "":
		v.fail("control_plane.tls.key_file", "a client key needs cert_file too")
	}
	return c
}
