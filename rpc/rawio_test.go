package rpc

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawIO moves bytes both ways on a TCP socket, reports the peer's close
// as io.EOF, and allocates nothing per read or write (rawIO.readFn).
func TestRawIO_ReadWriteWithoutAllocations(t *testing.T) {
	a, b := connPair(t, "tcp")
	defer a.Close()
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
