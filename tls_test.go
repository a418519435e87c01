package main

import (
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// testCA is a throwaway certificate authority (rpctest.CA) that writes
// its certificates as PEM files into dir, for the serve and client flags.
type testCA struct {
	*rpctest.CA
	t    *testing.T
	dir  string
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	ca := &testCA{CA: rpctest.NewCA(t, name), t: t, dir: dir, file: filepath.Join(dir, name+".pem")}
	ca.WriteCert(t, ca.file)
	return ca
}

// issue signs a leaf certificate for name (a server's or a client's) and
// returns its cert and key files.
func (ca *testCA) issue(name string, server bool) (certFile, keyFile string) {
	ca.t.Helper()
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	rpctest.WriteKeyPair(ca.t, ca.Issue(ca.t, name, usage), certFile, keyFile)
	return certFile, keyFile
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
