package rpc

import (
	"errors"
	"sync/atomic"
	"testing"

	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"
)

// panickyTransport hands out Finish messages whose Release panics, as
// go-capnp's importClient.Shutdown did once in a fuzz run (guardMsg), and
// counts its Closes.
type panickyTransport struct {
	transport.Transport // nil: only RecvMessage and Close are called
	closes              atomic.Int32
	recvs               atomic.Int32
}

type panickyMsg struct{ m rpccp.Message }

func (p panickyMsg) Message() rpccp.Message { return p.m }
func (panickyMsg) Release()                 { panic("nil import entry") }

func (p *panickyTransport) RecvMessage() (transport.IncomingMessage, error) {
	p.recvs.Add(1)
	if p.closes.Load() > 0 {
		return nil, errors.New("read on closed transport")
	}
	msg, m, err := newRPCMessage()
	if err != nil {
		return nil, err
	}
	_ = msg // the message lives as long as the test
	if _, err := m.NewFinish(); err != nil {
		return nil, err
	}
	return panickyMsg{m}, nil
}

func (p *panickyTransport) Close() error {
	p.closes.Add(1)
	return nil
}

func TestGuardTransport_ReleasePanicEndsTheConnectionNotTheProcess(t *testing.T) {
	t.Parallel()
	under := &panickyTransport{}
	g := newGuardTransport(under)

	first, err := g.RecvMessage()
	require.NoError(t, err)
	second, err := g.RecvMessage()
	require.NoError(t, err, "nothing is wrong before a release panics")
	require.Equal(t, rpccp.Message_Which_finish, first.Message().Which())

	require.NotPanics(t, first.Release)
	require.Equal(t, int32(1), under.closes.Load(), "the underlying transport is closed, so a waiting reader returns")

	recvs := under.recvs.Load()
	_, err = g.RecvMessage()
	require.ErrorIs(t, err, errReleasePanic)
	require.ErrorContains(t, err, "nil import entry", "the panic's value is in the reason")
	require.Equal(t, recvs, under.recvs.Load(), "a broken connection reads nothing more")

	// A second panicking release changes nothing: one close, the first reason.
	require.NotPanics(t, second.Release)
	require.Equal(t, int32(1), under.closes.Load())
	_, err = g.RecvMessage()
	require.ErrorIs(t, err, errReleasePanic)
}
