package httpapi

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// admitListener asks Config.Admit about every connection it accepts: a
// refused one is answered with a plain-text 503 (before any TLS: the
// bytes are written in the clear, which a TLS client reports as a
// handshake failure) and closed; an admitted one is released when it
// closes.
type admitListener struct {
	net.Listener
	admit func(net.Conn) (release func(), refused string)
	clock clock.Clock
	log   *slog.Logger
}

// refuseWriteTimeout bounds the write of a refusal to a peer that does not
// read.
const refuseWriteTimeout = time.Second

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
			// A peer that does not read cannot hold the goroutine.
			t := l.clock.AfterFunc(refuseWriteTimeout, func() { _ = conn.Close() })
			defer t.Stop()
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
