package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// FuzzLeanClientReplies: a node that answers the bootstrap properly and
// then sends arbitrary bytes must never crash the lean client or leave a
// call waiting forever: every call ends, with an answer or an error, once
// the connection closes.
func FuzzLeanClientReplies(f *testing.F) {
	ret := func(qid uint32, fill func(rpccp.Return) error) []byte {
		return rpcMessageBytes(f, func(m rpccp.Message) error {
			r, err := m.NewReturn()
			if err != nil {
				return err
			}
			r.SetAnswerId(qid)
			return fill(r)
		})
	}
	f.Add([]byte{})
	f.Add(ret(1, func(r rpccp.Return) error { _, err := r.NewResults(); return err })) // null content
	f.Add(ret(1, func(r rpccp.Return) error {
		e, err := r.NewException()
		if err != nil {
			return err
		}
		return e.SetReason("boom")
	}))
	f.Add(ret(7, func(r rpccp.Return) error { r.SetCanceled(); return nil })) // unknown question
	f.Add(ret(1, func(r rpccp.Return) error { r.SetCanceled(); return nil }))
	f.Add(rpcMessageBytes(f, func(m rpccp.Message) error {
		a, err := m.NewAbort()
		if err != nil {
			return err
		}
		return a.SetReason("go away")
	}))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}) // a huge segment

	f.Fuzz(func(t *testing.T, reply []byte) {
		// Over a pipe the reader goroutine reads; over TCP the caller
		// reads its own Return (frameReader).
		for _, transport := range []string{"pipe", "tcp"} {
			cc, sc := connPair(t, transport)
			served := make(chan struct{})
			go func() {
				defer close(served)
				defer sc.Close()
				fakeBootstrap(t, sc)
				_, _ = sc.Write(reply)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
			require.NoError(t, err)
			require.Equal(t, transport == "tcp", l.callersRead)
			c := &Client{lean: l, log: discardLogger(), limit: DefaultMaxMessageBytes, readLimit: DefaultMaxReplyBytes, closed: make(chan struct{})}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = c.NodeInfo(ctx) // an answer or an error: either is fine
			}()
			<-served
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatalf("%s: a call still waits after the connection closed", transport)
			}
			_ = c.Close()
			_ = cc.Close()
			cancel()
		}
	})
}

// connPair returns the two ends of a connection: a net.Pipe or a TCP
// connection over loopback. The caller closes both.
func connPair(t *testing.T, transport string) (client, server net.Conn) {
	t.Helper()
	if transport == "pipe" {
		return net.Pipe()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	return client, server
}

// fakeBootstrap plays a node's side of the bootstrap on conn: it reads the
// Bootstrap, answers it with export 0, and reads the Finish, then drains
// whatever the client sends next in the background.
func fakeBootstrap(t *testing.T, conn net.Conn) {
	dec := capnp.NewDecoder(conn)
	msg, err := dec.Decode()
	require.NoError(t, err)
	msg.Release()
	_, err = conn.Write(bootstrapReturnBytes(t, 0))
	require.NoError(t, err)
	msg, err = dec.Decode() // the Finish
	require.NoError(t, err)
	msg.Release()
	go func() {
		for {
			m, err := dec.Decode()
			if err != nil {
				return
			}
			m.Release()
		}
	}()
}
