// The bench command, and what every client command shares: connection
// flags, dialing, argument parsing and output formats.

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/bench"
	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

var benchCommand = &command{
	name:    "bench",
	args:    "[WORKLOAD...] [flags]",
	summary: "run benchmark workloads against leaseq (and peers when installed)",
	help:    `Run the benchmark harness; 'leaseq bench -h' lists its workloads and flags.`,
	raw:     true,
	setup: func(_ *flag.FlagSet, e *env) func(context.Context, []string) error {
		return func(ctx context.Context, args []string) error {
			return bench.Main(ctx, e.clock, args, e.stdout, e.stderr)
		}
	},
}

// clientFlags are the connection flags of every client command. The
// client certificate flags are --tls-client-cert/--tls-client-key, not
// serve's --tls-cert/--tls-key: each flag reads the variable named after
// it, and LEASEQ_TLS_CERT exported for a node (its server certificate) must
// not also become the certificate every client command in the same shell
// presents. --tls-ca (verify the node) and serve's --tls-client-ca (verify
// clients) are distinct for the same reason.
type clientFlags struct {
	addr       *string
	tlsCert    *string
	tlsKey     *string
	tlsCA      *string
	serverName *string
	timeout    *time.Duration
	clk        clock.Clock // bounds the calls by --timeout (env.clock)
}

// defaultClientTimeout is the default --timeout of the client commands,
// and how long work waits to connect.
const defaultClientTimeout = 10 * time.Second

func addClientFlags(fs *flag.FlagSet, e *env) *clientFlags {
	cf := addConnFlags(fs, e)
	// A choice, not fs.Duration: a bad value ("10", "0") is refused
	// saying what is wanted, where the flag package says "parse error"
	// (found by review, session 74).
	timeout := newChoice(defaultClientTimeout.String(), positiveDuration)
	fs.Var(timeout, "timeout", "give up on the node after this `duration` (a poll's --wait comes on top)")
	cf.timeout = &timeout.val
	return cf
}

// addConnFlags defines the connection flags without --timeout, for a
// command that runs until stopped (work, whose --timeout is per item).
// Its timeout is defaultClientTimeout, for dialing only.
func addConnFlags(fs *flag.FlagSet, e *env) *clientFlags {
	timeout := defaultClientTimeout
	return &clientFlags{
		clk:        e.clock,
		addr:       fs.String("addr", defaultAddr, "node `address`: host:port or unix:/path"),
		tlsCA:      fs.String("tls-ca", "", "CA bundle `file` (PEM) to verify the node; enables TLS"),
		tlsCert:    fs.String("tls-client-cert", "", "client certificate `file` (PEM) for mutual TLS; enables TLS"),
		tlsKey:     fs.String("tls-client-key", "", "client private key `file` (PEM)"),
		serverName: fs.String("tls-server-name", "", "`name` expected in the node's certificate (default: the host of --addr; required with TLS over a unix socket)"),
		timeout:    &timeout,
	}
}

func (cf *clientFlags) tlsConfig() (*tls.Config, error) {
	if *cf.tlsCA == "" && *cf.tlsCert == "" && *cf.tlsKey == "" {
		return nil, nil
	}
	if (*cf.tlsCert == "") != (*cf.tlsKey == "") {
		return nil, usagef("--tls-client-cert and --tls-client-key go together")
	}
	if strings.HasPrefix(*cf.addr, "unix:") && *cf.serverName == "" {
		// Found by review (session 70): a unix address has no host to
		// verify the node's certificate against, and the dial failed
		// before a byte was sent with a hint about client certificates.
		return nil, usagef("TLS over a unix socket needs --tls-server-name: the name the node's certificate is for")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: *cf.serverName}
	if *cf.tlsCA != "" {
		pool, err := loadCertPool(*cf.tlsCA)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if *cf.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*cf.tlsCert, *cf.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("load TLS client certificate %s and key %s: %w", *cf.tlsCert, *cf.tlsKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// with dials the node within --timeout, runs fn with a context bounded by
// --timeout plus extra (a poll's --wait: how long the node may hold the
// call, not more time to connect) in all, and closes the connection.
func (cf *clientFlags) with(ctx context.Context, extra time.Duration, fn func(ctx context.Context, c *rpc.Client) error) error {
	ctx, cancel := cf.clk.WithTimeout(ctx, *cf.timeout+extra)
	defer cancel()
	// Found by review (session 74): the dial had --timeout plus --wait,
	// and the error then said "within --timeout".
	dctx, dcancel := cf.clk.WithTimeout(ctx, *cf.timeout)
	c, err := cf.dial(dctx)
	dcancel()
	if err != nil {
		return err
	}
	defer c.Close()
	return cf.explain(fn(ctx, c), *cf.timeout+extra)
}

// callFunc runs one call of a command that makes several as its input
// comes (clientFlags.withCalls), within --timeout.
type callFunc func(fn func(ctx context.Context) error) error

// withCalls is with for a command that makes its calls as its input
// comes (enqueue --lines): the dial and each call made through call get
// --timeout of their own, and the time between calls, spent waiting for
// input, is not bounded.
func (cf *clientFlags) withCalls(ctx context.Context, fn func(c *rpc.Client, call callFunc) error) error {
	dctx, cancel := cf.clk.WithTimeout(ctx, *cf.timeout)
	c, err := cf.dial(dctx)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c, func(call func(ctx context.Context) error) error {
		cctx, cancel := cf.clk.WithTimeout(ctx, *cf.timeout)
		defer cancel()
		return cf.explain(call(cctx), *cf.timeout)
	})
}

// explain words a call's failure for the user: no answer within timeout,
// or the connection closed during it.
func (cf *clientFlags) explain(err error, timeout time.Duration) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer from %s within %v: %w", *cf.addr, timeout, err)
	case rpc.IsDisconnected(err):
		return fmt.Errorf("the node at %s closed the connection during the call, so its outcome is unknown (a request over the node's --max-message, or the node stopped): %w", *cf.addr, err)
	}
	return err
}

// dial connects to the node within ctx, explaining a failure.
func (cf *clientFlags) dial(ctx context.Context) (*rpc.Client, error) {
	tc, err := cf.tlsConfig()
	if err != nil {
		return nil, err
	}
	c, err := rpc.Dial(ctx, *cf.addr, rpc.ClientOptions{TLS: tc})
	if err != nil {
		return nil, cf.dialError(tc, err)
	}
	return c, nil
}

// dialError explains a failed Dial: nothing listening, a TLS certificate
// the client cannot verify, or a node that hung up during setup (most
// often a TLS mismatch, which the client only learns as a closed
// connection under TLS 1.3).
func (cf *clientFlags) dialError(tc *tls.Config, err error) error {
	addr := *cf.addr
	var opErr *net.OpError
	var verifyErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var hostErr x509.HostnameError
	switch {
	case errors.As(err, &recErr):
		// Found by review (session 70): the hint was about client
		// certificates.
		return fmt.Errorf("the node at %s does not speak TLS (drop --tls-ca, --tls-client-cert and --tls-client-key): %w", addr, err)
	case errors.As(err, &hostErr):
		return fmt.Errorf("the TLS certificate of the node at %s is not for the name asked (give --tls-server-name with a name it is for): %w", addr, err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		// The dial sets the socket's deadline from ctx's: a read that
		// meets it ends with "i/o timeout" just before ctx ends (found
		// in CI, session 74: the CLI then said the node had closed the
		// connection).
		return fmt.Errorf("cannot reach a leaseq node at %s within %v (is 'leaseq serve' running there?)", addr, *cf.timeout)
	case errors.Is(err, rpc.ErrTooManyConns):
		return fmt.Errorf("the node at %s refused the connection: it is at its --max-conns limit: %w", addr, err)
	case errors.As(err, &verifyErr):
		return fmt.Errorf("cannot verify the TLS certificate of the node at %s (give --tls-ca with the CA that signed it): %w", addr, err)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("cannot connect to a leaseq node at %s (is 'leaseq serve' running there?): %w", addr, err)
	}
	hint := "does the node require TLS? then give --tls-ca"
	switch {
	case tc != nil && len(tc.Certificates) == 0:
		hint = "does the node require client certificates (--tls-client-ca)? then give --tls-client-cert and --tls-client-key"
	case tc != nil:
		hint = "is the client certificate signed by the CA of the node's --tls-client-ca?"
	}
	return fmt.Errorf("the node at %s closed the connection during setup (%s): %w", addr, hint, err)
}

// batchSize is how many items or ids the CLI sends per call: at most 500
// (well under the default limit of 1000, so a call stays a modest
// transaction), and never more than the node's --max-batch. Only a call
// that needs more than one item asks the node.
func batchSize(ctx context.Context, c *rpc.Client, n int) (int, error) {
	const batch = 500
	if n <= 1 {
		return batch, nil
	}
	ni, err := c.NodeInfo(ctx)
	if err != nil {
		return 0, err
	}
	if ni.MaxBatch > 0 && ni.MaxBatch < batch {
		return ni.MaxBatch, nil
	}
	return batch, nil
}

// argsBetween checks the number of positional arguments.
func argsBetween(args []string, lo, hi int, what string) error {
	switch {
	case len(args) < lo:
		return usagef("missing arguments: want %s", what)
	case hi >= 0 && len(args) > hi:
		return usagef("unexpected argument %q (want %s)", args[hi], what)
	}
	return nil
}

func parseLease(s string) (storage.LeaseID, error) {
	l, err := storage.ParseLeaseID(s)
	if err != nil {
		return l, usagef("bad lease %q: want the 32 hex digits printed by poll", s)
	}
	return l, nil
}

func parseIDs(ss []string) ([]storage.ItemID, error) {
	ids := make([]storage.ItemID, 0, len(ss))
	for _, s := range ss {
		id, err := storage.ParseItemID(s)
		if err != nil {
			return nil, usagef("bad item id %q: want 32 hex digits", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// itemJSON is one line of poll, peek and dlq ls output. Times are RFC 3339
// in UTC with milliseconds; payload is standard base64 (encoding/json's
// []byte).
type itemJSON struct {
	ID          string `json:"id"`
	Queue       string `json:"queue"`
	Lease       string `json:"lease,omitempty"`
	ExpiresAt   string `json:"expires_at,omitempty"`
	State       string `json:"state,omitempty"`
	Attempts    uint32 `json:"attempts"`
	MaxAttempts uint32 `json:"max_attempts,omitempty"`
	Priority    uint8  `json:"priority"`
	EnqueuedAt  string `json:"enqueued_at"`
	VisibleAt   string `json:"visible_at,omitempty"`
	DedupKey    string `json:"dedup_key,omitempty"`
	LastError   string `json:"last_error,omitempty"`
	Reason      string `json:"reason,omitempty"`
	DeadAt      string `json:"dead_at,omitempty"`
	Payload     []byte `json:"payload"`
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeFormat)
}

func toJSON(it storage.Item) itemJSON {
	j := itemJSON{
		ID:          it.ID.String(),
		Queue:       it.Queue,
		Attempts:    it.Attempts,
		MaxAttempts: it.MaxAttempts,
		Priority:    it.Priority,
		EnqueuedAt:  fmtTime(it.EnqueuedAt),
		VisibleAt:   fmtTime(it.VisibleAt),
		DedupKey:    it.DedupKey,
		LastError:   it.LastError,
		Payload:     it.Payload,
	}
	if it.State != storage.StateUnknown {
		j.State = it.State.String()
	}
	if j.Payload == nil {
		j.Payload = []byte{}
	}
	return j
}

// printCodes prints one "ID RESULT" line per id and returns how many ids
// did not succeed.
func printCodes(w io.Writer, ids []storage.ItemID, codes []storage.Code) (bad int) {
	for i, id := range ids {
		c := storage.CodeInvalid
		if i < len(codes) {
			c = codes[i]
		}
		if c != storage.CodeOK {
			bad++
		}
		fmt.Fprintf(w, "%s %s\n", id, c)
	}
	return bad
}

// notAll is the error of a batch command some of whose ids failed.
func notAll(bad, total int, verb string) error {
	if bad > 0 {
		return fmt.Errorf("%d of %d ids not %s", bad, total, verb)
	}
	return nil
}

// leased is one lease and the ids to settle under it.
type leased struct {
	lease storage.LeaseID
	ids   []storage.ItemID
}

// parseLeased reads the "LEASE ID..." arguments of ack and nack, or, when
// they are just "-", poll's JSON lines from stdin (so `leaseq poll q -n 10 |
// leaseq ack q -` acks a whole poll, none if it was empty), grouped by
// lease in input order.
func parseLeased(args []string, stdin io.Reader) ([]leased, error) {
	if len(args) == 1 && args[0] == "-" {
		var out []leased
		dec := json.NewDecoder(stdin)
		for {
			var it itemJSON
			err := dec.Decode(&it)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, usagef("stdin: want poll's JSON lines: %v", err)
			}
			l, err := parseLease(it.Lease)
			if err != nil {
				return nil, err
			}
			ids, err := parseIDs([]string{it.ID})
			if err != nil {
				return nil, err
			}
			if len(out) == 0 || out[len(out)-1].lease != l {
				out = append(out, leased{lease: l})
			}
			out[len(out)-1].ids = append(out[len(out)-1].ids, ids[0])
		}
		// An empty poll prints nothing: `poll | ack -` of an empty
		// queue settles nothing and succeeds.
		return out, nil
	}
	if len(args) < 2 {
		return nil, usagef("missing arguments: want QUEUE LEASE ID... (or QUEUE - to read poll output from stdin)")
	}
	l, err := parseLease(args[0])
	if err != nil {
		return nil, err
	}
	ids, err := parseIDs(args[1:])
	if err != nil {
		return nil, err
	}
	return []leased{{lease: l, ids: ids}}, nil
}
