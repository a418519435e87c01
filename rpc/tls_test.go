package rpc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLS_ClientCertificates(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "leaseq test CA")
	rogue := newTestCA(t, "rogue CA")
	serverCert := ca.issue(t, "leaseq server", x509.ExtKeyUsageServerAuth)
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca.pool,
			MinVersion:   tls.VersionTLS12,
		}
	}})

	t.Run("NoClientCertRefused", func(t *testing.T) {
		t.Parallel()
		_, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.pool}})
		require.Error(t, err)
	})

	t.Run("UntrustedClientCertRefused", func(t *testing.T) {
		t.Parallel()
		cert := rogue.issue(t, "intruder", x509.ExtKeyUsageClientAuth)
		_, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{cert}}})
		require.Error(t, err)
	})

	t.Run("PlaintextClientRefused", func(t *testing.T) {
		t.Parallel()
		_, err := b.dialErr(ClientOptions{})
		require.Error(t, err)
	})

	t.Run("ValidClientCertServed", func(t *testing.T) {
		t.Parallel()
		cert := ca.issue(t, "worker", x509.ExtKeyUsageClientAuth)
		c, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{cert}}})
		require.NoError(t, err)
		res, err := c.Enqueue(ctxT(t), "secure", payloads(1, 32))
		require.NoError(t, err)
		pr, err := c.Poll(ctxT(t), "secure", 1, time.Second, 0)
		require.NoError(t, err)
		require.Equal(t, res[0].ID, pr.Items[0].ID)
	})
}
