package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// admitListener asks Config.Admit about every connection it accepts: a
// refused one has its first request answered with a 503 JSON error (in the
// clear, before any TLS, which a TLS client reports as a handshake
// failure) and is closed; an admitted one is released when it closes.
type admitListener struct {
	net.Listener
	admit func(net.Conn) (release func(), refused string)
	clock clock.Clock
	log   *slog.Logger
	// stop ends the refusals under way, which wg counts (Stop waits for
	// them), and refusing bounds (maxRefusing).
	stop     context.Context
	wg       *sync.WaitGroup
	refusing atomic.Int32
}

// refuseTimeout bounds how long a refused connection may take to send its
// request and read the refusal; maxRefusedRequest bounds what is read of
// the request.
const (
	refuseTimeout     = 5 * time.Second
	maxRefusedRequest = 64 << 10
)

// maxRefusing bounds the refusals under way (each may take refuseTimeout
// to answer); past it a refused connection is closed at once, with no
// answer. Found by review (session 69): a peer over its limit that kept
// connecting made the node hold a goroutine and a socket per refusal,
// and Stop neither ended nor waited for them.
const maxRefusing = 64

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, refused := l.admit(conn)
		if refused == "" {
			return &admittedConn{Conn: conn, release: release}, nil
		}
		l.log.Debug("connection refused", "remote", conn.RemoteAddr().String(), "reason", refused)
		if l.refusing.Add(1) > maxRefusing {
			l.refusing.Add(-1)
			_ = conn.Close()
			continue
		}
		l.wg.Add(1) // the serve goroutine holds one: never from zero
		go func() {
			defer l.wg.Done()
			defer l.refusing.Add(-1)
			// A peer that neither sends nor reads cannot hold the
			// goroutine, nor Stop.
			t := l.clock.AfterFunc(refuseTimeout, func() { _ = conn.Close() })
			defer t.Stop()
			stop := context.AfterFunc(l.stop, func() { _ = conn.Close() })
			defer stop()
			// Read the request first: an answer that arrives before it is
			// one a client discards ("unsolicited response").
			_, _ = http.ReadRequest(bufio.NewReader(io.LimitReader(conn, maxRefusedRequest)))
			body := fmt.Sprintf(`{"error":{"code":"unavailable","message":%q}}`+"\n", refused)
			_, _ = fmt.Fprintf(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			_ = conn.Close()
		}()
	}
}

// admittedConn releases its admission once, on the first Close.
type admittedConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *admittedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
