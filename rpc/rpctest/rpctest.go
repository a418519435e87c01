// Package rpctest holds the helpers that the tests of leaseq's front ends
// (rpc, rpc/dispatch, rpc/queueber, rpc/httpapi, rpc/webui) and of the
// binary (package main) share: a logger into t.Log, a bounded wait for a
// condition, a goroutine's result with a timeout, and a throwaway
// certificate authority. Only _test.go files import it (imports_test.go).
package rpctest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Logger returns a logger that writes every record, debug included, to
// t.Log until the test's cleanup runs and drops them after: go-capnp and
// servers report a connection's end from goroutines that may outlive the
// test by a moment, and t.Log after the end panics.
func Logger(t testing.TB) *slog.Logger {
	return LoggerAt(t, slog.LevelDebug)
}

// LoggerAt is Logger for records at level and above.
func LoggerAt(t testing.TB, level slog.Level) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type logWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// Eventually polls cond until it holds, and fails the test if timeout
// passes first (real time: it waits on the system under test, never on a
// mock clock). msgAndArgs, if given, is a format and its arguments saying
// what did not happen. The polling interval is a retry delay, not
// synchronisation.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("condition not met within %v", timeout)
			if len(msgAndArgs) > 0 {
				if f, ok := msgAndArgs[0].(string); ok {
					msg = fmt.Sprintf(f, msgAndArgs[1:]...) + " (within " + timeout.String() + ")"
				}
			}
			t.Fatal(msg)
		}
		time.Sleep(time.Millisecond)
	}
}

// Go runs fn in a goroutine and returns a channel that receives its result.
func Go[T any](fn func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	return ch
}

// Recv waits up to timeout for a value from ch and fails the test if none
// comes.
func Recv[T any](t testing.TB, ch <-chan T, timeout time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("nothing received within %v", timeout)
		var zero T
		return zero
	}
}

// CA is a throwaway certificate authority (ECDSA P-256, valid for an hour
// around now).
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert
	key  *ecdsa.PrivateKey
}

// NewCA creates a CA whose certificate's common name is name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
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
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Pool: pool, key: key}
}

// Issue signs a leaf certificate for name with the given extended key
// usage, valid for 127.0.0.1 and localhost.
func (ca *CA) Issue(t testing.TB, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	must(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WriteCert writes the CA's certificate to file as PEM.
func (ca *CA) WriteCert(t testing.TB, file string) {
	t.Helper()
	writePEM(t, file, "CERTIFICATE", ca.Cert.Raw)
}

// WriteKeyPair writes a certificate from Issue and its key to certFile and
// keyFile as PEM (mode 0600), as `leaseq serve --tls-cert/--tls-key` and
// the client flags read them.
func WriteKeyPair(t testing.TB, c tls.Certificate, certFile, keyFile string) {
	t.Helper()
	writePEM(t, certFile, "CERTIFICATE", c.Certificate[0])
	key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("rpctest: key of type %T, want *ecdsa.PrivateKey", c.PrivateKey)
	}
	der, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	writePEM(t, keyFile, "EC PRIVATE KEY", der)
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	must(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
