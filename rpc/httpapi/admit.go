package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
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
}

// refuseTimeout bounds how long a refused connection may take to send its
// request and read the refusal; maxRefusedRequest bounds what is read of
// the request.
const (
	refuseTimeout     = 5 * time.Second
	maxRefusedRequest = 64 << 10
)

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
		go func() {
			// A peer that neither sends nor reads cannot hold the goroutine.
			t := l.clock.AfterFunc(refuseTimeout, func() { _ = conn.Close() })
			defer t.Stop()
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
