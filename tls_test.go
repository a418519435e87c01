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
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testCA is a throwaway certificate authority that writes PEM files.
type testCA struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
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
	ca := &testCA{t: t, dir: dir, cert: cert, key: key, file: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue signs a leaf certificate for name and returns its cert and key
// files; server certificates are valid for 127.0.0.1.
func (ca *testCA) issue(name string, server bool) (certFile, keyFile string) {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

// TestCLI_MutualTLS: with --tls-client-ca the node refuses clients without
// a certificate from that CA, with one clear line, and serves those with one.
func TestCLI_MutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue("server", true)
	cliCert, cliKey := ca.issue("client", false)
	other := newTestCA(t, dir, "other")
	badCert, badKey := other.issue("intruder", false)

	addr := freePort(t)
	n := startNode(t, filepath.Join(dir, "data"), "--listen", addr,
		"--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", ca.file)
	require.Contains(t, n.logs.String(), "tls=mutual")

	base := []string{"LEASEQ_ADDR=" + addr, "LEASEQ_TIMEOUT=5s"}
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"NoTLS", nil, "does the node require TLS? then give --tls-ca"},
		{"NoClientCert", []string{"LEASEQ_TLS_CA=" + ca.file}, "then give --tls-client-cert and --tls-client-key"},
		{"CertFromOtherCA", []string{"LEASEQ_TLS_CA=" + ca.file, "LEASEQ_TLS_CLIENT_CERT=" + badCert, "LEASEQ_TLS_CLIENT_KEY=" + badKey}, "is the client certificate signed by the CA"},
		{"UnknownServerCA", []string{"LEASEQ_TLS_CA=" + other.file, "LEASEQ_TLS_CLIENT_CERT=" + cliCert, "LEASEQ_TLS_CLIENT_KEY=" + cliKey}, "cannot verify the TLS certificate of the node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, append(append([]string{}, base...), tc.env...), "", "enqueue", "jobs", "x")
			require.Equal(t, exitFailure, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.Empty(t, r.stdout)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			require.Contains(t, r.stderr, "leaseq enqueue: ")
			require.Contains(t, r.stderr, tc.want)
			t.Logf("refused: %s", r.stderr)
		})
	}

	t.Run("WithClientCert", func(t *testing.T) {
		t.Parallel()
		// serve's certificate variables, exported in the same shell, are
		// not the client's: the client commands read LEASEQ_TLS_CLIENT_*.
		base := append([]string{"LEASEQ_TLS_CERT=" + srvCert, "LEASEQ_TLS_KEY=" + srvKey}, base...)
		r := runCLI(t, base, "", "enqueue", "secure", "x", "--tls-ca", ca.file, "--tls-client-cert", cliCert, "--tls-client-key", cliKey)
		require.Equal(t, 0, r.code, r.stderr)
		require.Len(t, strings.TrimSpace(r.stdout), 32)
		r = runCLI(t, base, "", "stats", "secure", "--json", "--tls-ca", ca.file, "--tls-client-cert", cliCert, "--tls-client-key", cliKey)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, `"ready":1`)
	})
}
