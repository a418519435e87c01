package rpc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// maxUnixPath is the longest unix socket path Linux binds or connects to
// (sun_path holds 108 bytes, the last a NUL).
const maxUnixPath = 107

// splitAddr maps "unix:/path" to ("unix", "/path") and anything else to
// ("tcp", addr), refusing what no listen or dial could use.
func splitAddr(addr string) (network, address string, err error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if p == "" {
			return "", "", fmt.Errorf("rpc: address %q: empty unix socket path", addr)
		}
		if len(p) > maxUnixPath {
			// Found by review (session 70): bind and connect said only
			// "invalid argument".
			return "", "", fmt.Errorf("rpc: address %q: unix socket path of %d bytes is too long (at most %d)", addr, len(p), maxUnixPath)
		}
		return "unix", p, nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("rpc: address %q: want host:port or unix:/path: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
		return "", "", fmt.Errorf("rpc: address %q: port %d out of range (0-65535)", addr, n)
	}
	return "tcp", addr, nil
}

// CheckAddr reports whether addr is one Listen and Dial take: host:port
// (a port of 0-65535 or a service name) or unix:/path (at most 107
// bytes). `leaseq serve --check-config` checks its addresses with it.
func CheckAddr(addr string) error {
	_, _, err := splitAddr(addr)
	return err
}

// Listen opens a listener on "host:port" or "unix:/path". A unix socket file
// left behind by a dead process is removed first; one that a live process
// still accepts on is an error. The socket file's mode is whatever the
// process umask gives; ListenMode sets it.
func Listen(addr string) (net.Listener, error) { return ListenMode(addr, 0) }

// ListenMode is Listen that, for a unix socket, sets the socket file's
// permission bits to mode (0: leave them to the umask). Connecting to a
// unix socket needs write permission on it, so mode decides who may be a
// client.
func ListenMode(addr string, mode fs.FileMode) (net.Listener, error) {
	network, address, err := splitAddr(addr)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		if err := removeStaleSocket(address); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("rpc: listen %s: %w", addr, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		// Close removes the socket file: the default, but say it.
		ul.SetUnlinkOnClose(true)
		if mode != 0 {
			if err := os.Chmod(address, mode.Perm()); err != nil {
				_ = ln.Close()
				return nil, fmt.Errorf("rpc: listen %s: set socket mode %#o: %w", addr, mode.Perm(), err)
			}
		}
	}
	return ln, nil
}

func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rpc: listen unix:%s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("rpc: listen unix:%s: exists and is not a socket", path)
	}
	var d net.Dialer
	c, err := d.DialContext(context.Background(), "unix", path)
	switch {
	case err == nil:
		_ = c.Close()
		return fmt.Errorf("rpc: listen unix:%s: a live server is listening on it", path)
	case errors.Is(err, syscall.EAGAIN):
		return fmt.Errorf("rpc: listen unix:%s: a live server is listening on it (its backlog is full)", path)
	case !errors.Is(err, syscall.ECONNREFUSED):
		// Only a refused connect says nobody listens: a permission
		// error, say, may hide a live server, whose socket must not be
		// taken from it.
		return fmt.Errorf("rpc: listen unix:%s: cannot tell whether a server listens on it: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rpc: remove stale socket %s: %w", path, err)
	}
	return nil
}
