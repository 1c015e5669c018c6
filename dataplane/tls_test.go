package dataplane_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/limitplane/limitplane/dataplane"
)

// issue returns a certificate for 127.0.0.1 signed by ca (self-signed
// when ca is nil) and its parsed form.
func issue(t *testing.T, name string, ca *tls.Certificate, isCA bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: isCA, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	parent, signer := tmpl, any(key)
	if ca != nil {
		parent, signer = ca.Leaf, ca.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// TestAgentMutualTLS: over mutual TLS the agent connects and applies;
// without a client certificate the server refuses it, and the agent
// keeps retrying (its last error says why).
func TestAgentMutualTLS(t *testing.T) {
	eachTarget(t, func(t *testing.T, newTarget func(t *testing.T) *testGateway) {
		ca := issue(t, "test CA", nil, true)
		server := issue(t, "cp", &ca, false)
		client := issue(t, "gw", &ca, false)
		pool := x509.NewCertPool()
		pool.AddCert(ca.Leaf)
		f, addr := newFakeCP(t, 0, grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{server}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		})))

		g := newTarget(t)
		o := agentOptions(g.tg, addr, &lockedBuffer{})
		o.TLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{client}}
		a, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a)
		s := f.next(t)
		s.sendSnapshot(t, snapshot(2, "k1"), "snap-2")
		s.wantAck(t, 2, "snap-2")
		if st, _ := g.get(t, "k1"); st != 200 {
			t.Fatalf("k1 over mTLS: %d", st)
		}

		g2 := newTarget(t)
		o = agentOptions(g2.tg, addr, &lockedBuffer{})
		o.GatewayID = "gw-no-cert"
		o.TLS = &tls.Config{RootCAs: pool}
		a2, err := dataplane.New(o)
		if err != nil {
			t.Fatal(err)
		}
		runAgent(t, a2)
		waitFor(t, "a refusal", func() bool { return a2.Status().Reconnects >= 2 })
		if st := a2.Status(); st.State == "connected" || st.AppliedRevision != 0 || !strings.Contains(st.LastError, "Unavailable") {
			t.Fatalf("without a client certificate: %+v", st)
		}
		select {
		case s := <-f.streams:
			t.Fatalf("a stream without a client certificate: %v", s.hello)
		default:
		}
	})
}
