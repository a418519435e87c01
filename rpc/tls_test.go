package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

func TestTLS_ClientCertificates(t *testing.T) {
	t.Parallel()
	ca := rpctest.NewCA(t, "leaseq test CA")
	rogue := rpctest.NewCA(t, "rogue CA")
	serverCert := ca.Issue(t, "leaseq server", x509.ExtKeyUsageServerAuth)
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca.Pool,
			MinVersion:   tls.VersionTLS12,
		}
	}})

	t.Run("NoClientCertRefused", func(t *testing.T) {
		t.Parallel()
		_, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.Pool}})
		require.Error(t, err)
	})

	t.Run("UntrustedClientCertRefused", func(t *testing.T) {
		t.Parallel()
		cert := rogue.Issue(t, "intruder", x509.ExtKeyUsageClientAuth)
		_, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}})
		require.Error(t, err)
	})

	t.Run("PlaintextClientRefused", func(t *testing.T) {
		t.Parallel()
		_, err := b.dialErr(ClientOptions{})
		require.Error(t, err)
	})

	t.Run("ValidClientCertServed", func(t *testing.T) {
		t.Parallel()
		cert := ca.Issue(t, "worker", x509.ExtKeyUsageClientAuth)
		c, err := b.dialErr(ClientOptions{TLS: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}}})
		require.NoError(t, err)
		res, err := c.Enqueue(ctxT(t), "secure", payloads(1, 32))
		require.NoError(t, err)
		pr, err := c.Poll(ctxT(t), "secure", 1, time.Second, 0)
		require.NoError(t, err)
		require.Equal(t, res[0].ID, pr.Items[0].ID)
	})
}
