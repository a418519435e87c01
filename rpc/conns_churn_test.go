package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// From a review (session 69): the accept loop's connection
// accounting (MaxConns, MaxConnsPerAddr) under churn and failure, and
// Stop with connections in every state. TestMain runs each test once per
// engine (go-capnp, then lean); LEASEQ_TEST_ENGINES=lean runs one.

// rvcTLS is a server TLS config requiring client certificates, and the
// CA that issued them.
type rvcTLS struct {
	ca     *rpctest.CA
	server *tls.Config
}

func newRvcTLS(t *testing.T) rvcTLS {
	ca := rpctest.NewCA(t, "connlimits CA")
	return rvcTLS{ca: ca, server: &tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "leaseq server", x509.ExtKeyUsageServerAuth)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool,
		MinVersion:   tls.VersionTLS12,
	}}
}

// client is a good client TLS config.
func (x rvcTLS) client(t *testing.T) *tls.Config {
	return &tls.Config{RootCAs: x.ca.Pool, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{x.ca.Issue(t, "worker", x509.ExtKeyUsageClientAuth)}}
}

// rvcDial opens a raw connection to b (tcp or unix); the caller closes it.
func rvcDial(t *testing.T, b *testBundle) net.Conn {
	t.Helper()
	network, addr := "tcp", b.addr
	if p, ok := strings.CutPrefix(b.addr, "unix:"); ok {
		network, addr = "unix", p
	}
	c, err := net.DialTimeout(network, addr, 10*time.Second)
	require.NoError(t, err)
	return c
}

// rvcReset closes c with a TCP RST (SO_LINGER 0); a unix conn just closes.
func rvcReset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// rvcUntilClosed reads c until the server closes it (EOF or reset); it
// reports false if nothing ends it within d of real time.
func rvcUntilClosed(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(err != nil && errors.As(err, &ne) && ne.Timeout())
}

// rvcPartialFrame is the header of a one-segment message of 1000 words
// followed by 16 bytes of its body: a message cut off in the middle.
func rvcPartialFrame() []byte {
	b := make([]byte, 8+16)
	binary.LittleEndian.PutUint32(b[0:4], 0)
	binary.LittleEndian.PutUint32(b[4:8], 1000)
	return b
}

// rvcAdvanceUntil advances the mock clock a second at a time until cond
// holds (timers may be armed after an advance).
func rvcAdvanceUntil(t *testing.T, b *testBundle, cond func() bool, what string) {
	t.Helper()
	rpctest.Eventually(t, 30*time.Second, func() bool {
		if cond() {
			return true
		}
		b.clock.Add(time.Second)
		return cond()
	}, what)
}

// rvcServed checks that a good client is admitted and served.
func rvcServed(t *testing.T, b *testBundle, opts ClientOptions) {
	t.Helper()
	c, err := b.dialErr(opts)
	require.NoError(t, err, "a good client after the churn")
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

const rvcChurn = 300 // above DefaultMaxConnsPerAddr (256)

// TestConnLimits_ChurnGivesBackEverySlot ends rvcChurn connections
// from 127.0.0.1 in each way a connection can end, with the default
// MaxConnsPerAddr (256): afterwards no slot may be held (ConnsOpen 0), a
// good client must be admitted and served, and no goroutine may be left.
func TestConnLimits_ChurnGivesBackEverySlot(t *testing.T) {
	type kind struct {
		name      string
		tls       bool
		transport string
		// one ends one connection (sequentially); held opens one and
		// returns it to keep open until after all were opened.
		one  func(t *testing.T, b *testBundle, x rvcTLS)
		held func(t *testing.T, b *testBundle, x rvcTLS) net.Conn
		// reap: advance the clock to end the held connections (silent
		// ones); else the test resets them.
		reap bool
	}
	boot := bootstrapMsg(t)
	abort := rvAbortBytes(t)
	kinds := []kind{
		{name: "SilentFirstMessageTimeout", reap: true, held: func(t *testing.T, b *testBundle, _ rvcTLS) net.Conn {
			return rvcDial(t, b)
		}},
		{name: "SilentUnix", transport: "unix", reap: true, held: func(t *testing.T, b *testBundle, _ rvcTLS) net.Conn {
			return rvcDial(t, b)
		}},
		{name: "EOFAfterBootstrap", one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			_, _ = c.Write(boot)
			_ = c.Close()
		}},
		{name: "ProtocolGarbage", one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			defer c.Close()
			_, _ = c.Write(boot)
			_, _ = c.Write([]byte(strings.Repeat("\xff", 64)))
			require.True(t, rvcUntilClosed(c, 10*time.Second), "server did not close after garbage")
		}},
		{name: "ClientAbort", one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			defer c.Close()
			_, _ = c.Write(append(append([]byte{}, boot...), abort...))
			require.True(t, rvcUntilClosed(c, 10*time.Second), "server did not close after an Abort")
		}},
		{name: "ResetMidMessage", one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			_, _ = c.Write(boot)
			_, _ = c.Write(rvcPartialFrame())
			rvcReset(c)
		}},
		{name: "ResetAtOnce", one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			rvcReset(rvcDial(t, b))
		}},
		{name: "SpokeThenResetHeld", held: func(t *testing.T, b *testBundle, _ rvcTLS) net.Conn {
			c := rvcDial(t, b)
			_, _ = c.Write(boot)
			return c
		}},
		{name: "TLSPlaintextClient", tls: true, one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			defer c.Close()
			_, _ = c.Write(boot)
			require.True(t, rvcUntilClosed(c, 10*time.Second), "server did not close a plaintext client")
		}},
		{name: "TLSUntrustedClientCert", tls: true, one: func(t *testing.T, b *testBundle, x rvcTLS) {
			rogue := rpctest.NewCA(t, "rogue")
			cfg := x.client(t)
			cfg.Certificates = []tls.Certificate{rogue.Issue(t, "intruder", x509.ExtKeyUsageClientAuth)}
			tc := tls.Client(rvcDial(t, b), cfg)
			defer tc.Close()
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			_ = tc.Handshake()
			_, _ = tc.Write(boot)
			_, _ = io.Copy(io.Discard, tc)
		}},
		{name: "TLSClientDistrustsServer", tls: true, one: func(t *testing.T, b *testBundle, x rvcTLS) {
			cfg := x.client(t)
			cfg.RootCAs = x509.NewCertPool()
			tc := tls.Client(rvcDial(t, b), cfg)
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			require.Error(t, tc.Handshake())
			_ = tc.Close()
		}},
		{name: "TLSResetMidHandshake", tls: true, one: func(t *testing.T, b *testBundle, _ rvcTLS) {
			c := rvcDial(t, b)
			_, _ = c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) // a ClientHello record cut short
			rvcReset(c)
		}},
		{name: "TLSSilentHandshakeTimeout", tls: true, reap: true, held: func(t *testing.T, b *testBundle, _ rvcTLS) net.Conn {
			return rvcDial(t, b)
		}},
		{name: "TLSHandshakeThenResetHeld", tls: true, held: func(t *testing.T, b *testBundle, x rvcTLS) net.Conn {
			tc := tls.Client(rvcDial(t, b), x.client(t))
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			_ = tc.Handshake() // TLS 1.3: the server may refuse after the client's side is done
			_, _ = tc.Write(boot)
			_ = tc.SetDeadline(time.Time{})
			return tc.NetConn()
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			x := newRvcTLS(t)
			b := setup(t, bundleOpts{transport: k.transport, mutate: func(c *ServerConfig) {
				if k.tls {
					c.TLS = x.server
				}
			}})
			settled := settledGoroutines(t)
			if k.one != nil {
				for range rvcChurn {
					k.one(t, b, x)
				}
			} else {
				conns := make([]net.Conn, 0, rvcChurn)
				for range rvcChurn {
					conns = append(conns, k.held(t, b, x))
				}
				if k.transport != "unix" {
					rpctest.Eventually(t, 30*time.Second, func() bool {
						return b.srv.Metrics().ConnsOpen == DefaultMaxConnsPerAddr
					}, "the per-address limit fills: ConnsOpen %d", b.srv.Metrics().ConnsOpen)
				}
				if k.reap {
					rvcAdvanceUntil(t, b, func() bool { return b.srv.Metrics().ConnsOpen == 0 },
						"silent connections reaped")
				}
				for _, c := range conns {
					rvcReset(c)
				}
			}
			rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 },
				"every slot given back")
			opts := ClientOptions{}
			if k.tls {
				opts.TLS = x.client(t)
			}
			rvcServed(t, b, opts)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
			// Refused connections still draining wait for their bound.
			b.clock.Add(DefaultHandshakeTimeout)
			settled()
			m := b.srv.Metrics()
			require.Zero(t, m.ConnsOpen)
			require.Zero(t, m.Waiters)
			require.Zero(t, m.ReplyBytesQueued)
		})
	}
}

// TestConnLimits_RefusedGetsAbortAndCloses: a connection over
// MaxConns or MaxConnsPerAddr gets an RPC Abort (overloaded) naming the
// limit and sees the server's end closed at once (no clock advance), and
// once the client goes, nothing is left behind.
func TestConnLimits_RefusedGetsAbortAndCloses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tls    bool
		mutate func(*ServerConfig)
		want   string
	}{
		{"MaxConns", false, func(c *ServerConfig) { c.MaxConns = 1 }, "too many connections (limit 1)"},
		{"PerAddr", false, func(c *ServerConfig) { c.MaxConnsPerAddr = 1 }, "from 127.0.0.1 (limit 1 per address)"},
		{"MaxConnsTLS", true, func(c *ServerConfig) { c.MaxConns = 1 }, "too many connections (limit 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newRvcTLS(t)
			b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
				tc.mutate(c)
				if tc.tls {
					c.TLS = x.server
				}
			}})
			opts := ClientOptions{}
			if tc.tls {
				opts.TLS = x.client(t)
			}
			good, err := b.dialErr(opts)
			require.NoError(t, err)
			settled := settledGoroutines(t)
			refusedBefore := b.srv.Metrics().ConnsRefused
			for range 20 {
				var c net.Conn = rvcDial(t, b)
				if tc.tls {
					c = tls.Client(c, x.client(t))
				}
				require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
				_, err := c.Write(bootstrapMsg(t))
				require.NoError(t, err)
				msg, err := capnp.NewDecoder(c).Decode()
				require.NoError(t, err, "the refusal's Abort")
				m, err := rpccp.ReadRootMessage(msg)
				require.NoError(t, err)
				require.Equal(t, rpccp.Message_Which_abort, m.Which())
				ab, err := m.Abort()
				require.NoError(t, err)
				require.Equal(t, rpccp.Exception_Type_overloaded, ab.Type())
				reason, _ := ab.Reason()
				require.Contains(t, reason, tc.want)
				require.True(t, rvcUntilClosed(c, 10*time.Second), "refused connection not closed by the server")
				_ = c.Close()
			}
			settled()
			m := b.srv.Metrics()
			require.Equal(t, 1, m.ConnsOpen)
			require.Equal(t, refusedBefore+20, m.ConnsRefused)
			_, err = good.Queues(ctxT(t))
			require.NoError(t, err)
		})
	}
}

// rvcStopWithin calls b.srv.Stop and reports whether it returned within d
// of real time without the mock clock moving; if not, it advances the
// clock until Stop returns so the test can end.
func rvcStopWithin(t *testing.T, b *testBundle, d time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { b.srv.Stop(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
	}
	rvcAdvanceUntil(t, b, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, "Stop returns once the clock moves")
	return false
}

// TestConnLimits_StopWithConnectionsInEveryState: Stop must close
// every connection and return promptly whatever state its connections are
// in, without the (mock) clock moving; afterwards ConnsOpen is 0 and no
// goroutine is left. Found by review (session 69): a refused connection
// whose peer stayed silent, or never began its TLS handshake, held Stop
// until HandshakeTimeout.
func TestConnLimits_StopWithConnectionsInEveryState(t *testing.T) {
	type state struct {
		name   string
		tls    bool
		mutate func(*ServerConfig)
		// open puts connections in the state; it returns the raw
		// connections whose closing by the server Stop must cause.
		open func(t *testing.T, b *testBundle, x rvcTLS) []net.Conn
	}
	var clients []*Client
	rvcClient := func(c *Client) *Client { clients = append(clients, c); return c }
	states := []state{
		{name: "TLSHandshakeStuck", tls: true, open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			c := rvcDial(t, b)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
			return []net.Conn{c}
		}},
		{name: "SilentBeforeFirstMessage", open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			c := rvcDial(t, b)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
			return []net.Conn{c}
		}},
		{name: "IdleClient", open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			c := rvcDial(t, b)
			_, err := c.Write(bootstrapMsg(t))
			require.NoError(t, err)
			_, err = capnp.NewDecoder(c).Decode() // the bootstrap's Return
			require.NoError(t, err)
			return []net.Conn{c}
		}},
		{name: "MidMessage", open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			c := rvcDial(t, b)
			_, err := c.Write(append(bootstrapMsg(t), rvcPartialFrame()...))
			require.NoError(t, err)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
			return []net.Conn{c}
		}},
		{name: "ParkedPoll", open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			cl := rvcClient(b.dial())
			go func() { _, _ = cl.Poll(context.Background(), "q", 1, 0, 20*time.Second) }()
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
			return nil
		}},
		{name: "RefusedPeerSilent", mutate: func(c *ServerConfig) { c.MaxConns = 1 }, open: func(t *testing.T, b *testBundle, _ rvcTLS) []net.Conn {
			rvcClient(b.dial())
			// Refused: it reads the Abort, then neither closes nor sends.
			c := rvcDial(t, b)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, err := capnp.NewDecoder(c).Decode()
			require.NoError(t, err, "the refusal's Abort")
			require.NoError(t, c.SetReadDeadline(time.Time{}))
			return nil
		}},
		{name: "RefusedTLSHandshakeStuck", tls: true, mutate: func(c *ServerConfig) { c.MaxConns = 1 }, open: func(t *testing.T, b *testBundle, x rvcTLS) []net.Conn {
			cl, err := b.dialErr(ClientOptions{TLS: x.client(t)})
			require.NoError(t, err)
			rvcClient(cl)
			refused := b.srv.Metrics().ConnsRefused
			c := rvcDial(t, b) // never starts its handshake
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsRefused == refused+1 })
			return []net.Conn{c}
		}},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			x := newRvcTLS(t)
			clients = nil
			settled := settledGoroutines(t)
			b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
				if st.tls {
					c.TLS = x.server
				}
				if st.mutate != nil {
					st.mutate(c)
				}
			}})
			conns := st.open(t, b, x)
			defer func() {
				for _, c := range conns {
					_ = c.Close()
				}
			}()
			if !rvcStopWithin(t, b, 5*time.Second) {
				t.Errorf("Stop did not return within 5s (it returned only once the mock clock moved)")
			}
			for _, c := range conns {
				require.True(t, rvcUntilClosed(c, 5*time.Second), "Stop did not close the connection")
			}
			require.Zero(t, b.srv.Metrics().ConnsOpen)
			for _, c := range clients {
				_ = c.Close()
			}
			settled()
		})
	}
}

// TestConnLimits_ConcurrentChurnMixed runs many failing clients at
// once from one address (mixed kinds, above the per-address limit), then
// checks that every slot comes back and a good client is served.
func TestConnLimits_ConcurrentChurnMixed(t *testing.T) {
	b := setup(t, bundleOpts{})
	settled := settledGoroutines(t)
	boot, abort := bootstrapMsg(t), rvAbortBytes(t)
	var wg sync.WaitGroup
	for i := range rvcChurn {
		wg.Add(1)
		go func() {
			defer wg.Done()
			network, addr := "tcp", b.addr
			c, err := net.DialTimeout(network, addr, 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			switch i % 4 {
			case 0:
				_, _ = c.Write(boot)
				_, _ = c.Write(rvcPartialFrame())
				rvcReset(c)
			case 1:
				_, _ = c.Write(append(append([]byte{}, boot...), abort...))
				rvcUntilClosed(c, 10*time.Second)
				_ = c.Close()
			case 2:
				_, _ = c.Write([]byte(strings.Repeat("\xff", 64)))
				rvcUntilClosed(c, 10*time.Second)
				_ = c.Close()
			case 3:
				rvcReset(c)
			}
		}()
	}
	wg.Wait()
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 }, "every slot given back")
	rvcServed(t, b, ClientOptions{})
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	b.clock.Add(DefaultHandshakeTimeout)
	settled()
}

// TestConnLimits_RefusedPeersHoldNoUnboundedResources (found by review,
// session 69): peers over the limits that neither read nor close (or never
// start their TLS handshake) each pinned a server goroutine and a file
// descriptor for HandshakeTimeout, and nothing bounded how many, so one
// address over its MaxConnsPerAddr could still make the node hold any
// number of sockets (until accept failed with EMFILE for everyone).
// Refusals under way are now bounded (maxRefusing); past it a refused
// connection is closed at once.
func TestConnLimits_RefusedPeersHoldNoUnboundedResources(t *testing.T) {
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxConnsPerAddr = 1 }})
	b.dial()
	before := runtime.NumGoroutine()
	refused := b.srv.Metrics().ConnsRefused
	const n = 300
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		conns = append(conns, rvcDial(t, b)) // silent: never reads, never closes
	}
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsRefused == refused+n })
	grown := runtime.NumGoroutine() - before
	t.Logf("%d refused connections held by silent peers: server goroutines +%d", n, grown)
	require.LessOrEqual(t, grown, maxRefusing+2, "each refused peer pinned a server goroutine until HandshakeTimeout")
}
