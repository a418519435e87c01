package rpc

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawIO moves bytes both ways on a TCP socket, reports the peer's close
// as io.EOF, and allocates nothing per read or write (rawIO.readFn).
func TestRawIO_ReadWriteWithoutAllocations(t *testing.T) {
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
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer a.Close()
	b := <-accepted
	defer b.Close()
	ra, rb := newRawIO(a), newRawIO(b)
	require.NotNil(t, ra)
	require.NotNil(t, rb)

	out, in := []byte("ping, 12 b.."), make([]byte, 64)
	allocs := testing.AllocsPerRun(200, func() {
		n, err := ra.Write(out)
		if err != nil || n != len(out) {
			t.Fatalf("write: %d, %v", n, err)
		}
		got := 0
		for got < len(out) {
			n, err := rb.Read(in[got:])
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			got += n
		}
		if string(in[:got]) != string(out) {
			t.Fatalf("read %q", in[:got])
		}
	})
	require.Zero(t, allocs)

	n, err := ra.writeNow(out)
	require.NoError(t, err)
	require.Equal(t, len(out), n)
	_, err = rb.Read(in)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	_, err = rb.Read(in)
	require.ErrorIs(t, err, io.EOF)
}
