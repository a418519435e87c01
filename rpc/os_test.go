package rpc

import (
	"errors"
	"net"
	"os"

	"capnproto.org/go/capnp/v3/rpc/transport"
)

var (
	osMkdirTemp = os.MkdirTemp
	osRemoveAll = os.RemoveAll
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

func transportNewStream(c net.Conn) transport.Transport { return transport.NewStream(c) }
