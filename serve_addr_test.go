package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServe_BadAddressFlagsAreUsageErrors: a malformed --listen,
// --http, --queueber-listen or --metrics is a bad command line, like a
// bad --socket-mode or --pprof unix:/path (exit 2, before anything is
// opened). Found by review (session 70): serve --check-config accepted
// them (exit 0), and serve itself failed with exit 1 only after it had
// created and opened the database in --data.
func TestServe_BadAddressFlagsAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"ListenNoPort", []string{"--listen", "localhost"}},
		{"ListenBadPort", []string{"--listen", "127.0.0.1:99999"}},
		{"HTTPNoPort", []string{"--http", "localhost"}},
		{"QueueberNoPort", []string{"--queueber-listen", "localhost", "--queueber-queue", "q"}},
		{"MetricsUnix", []string{"--metrics", "unix:/tmp/leaseq-test-metrics.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tmp := t.TempDir()
			data := filepath.Join(tmp, "data")
			// Never the default 127.0.0.1:7700: a unix socket unless the
			// case is about --listen.
			args := tc.args
			if args[0] != "--listen" {
				args = append([]string{"--listen", "unix:" + filepath.Join(tmp, "s.sock")}, args...)
			}
			r := runCLI(t, nil, "", append([]string{"serve", "--data", data, "--check-config"}, args...)...)
			assert.Equal(t, exitUsage, r.code, "--check-config %v: stdout %q stderr %q", tc.args, r.stdout, r.stderr)
			r = runCLI(t, nil, "", append([]string{"serve", "--data", data}, args...)...)
			assert.Equal(t, exitUsage, r.code, "serve %v: stderr %q", tc.args, r.stderr)
			_, err := os.Stat(data)
			assert.True(t, os.IsNotExist(err), "serve %v created the database before refusing its flags", tc.args)
		})
	}
}

// TestServe_CheckConfigRefusesAnExpiredCert: serve --check-config
// promises to "validate ... TLS files"; an expired server certificate
// fails it (and serve warns in its log). Found by review (session 70): it
// passed, and serve started without a word while every client failed with
// "certificate has expired".
func TestServe_CheckConfigRefusesAnExpiredCert(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server"},
		NotBefore: time.Now().Add(-24 * time.Hour), NotAfter: time.Now().Add(-time.Hour), // expired
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))

	r := runCLI(t, nil, "", "serve", "--data", filepath.Join(dir, "data"), "--check-config", "--tls-cert", certFile, "--tls-key", keyFile)
	require.NotZero(t, r.code, "--check-config passed an expired --tls-cert")
	require.Contains(t, r.stderr, "the certificate expired at")
}
