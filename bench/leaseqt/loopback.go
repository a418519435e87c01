package leaseqt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// Loopback is the RPC server and an in-process store inside the harness's
// own process, reached over loopback TCP with the rpc client: the RPC path
// without a process boundary, so a -cpuprofile of the harness shows
// leaseq's RPC and storage costs side by side. Lease expiry is the
// in-process system's sweeper, which wakes the server's long polls. It runs only
// when named (-systems leaseq-loopback), to keep default runs short.
type Loopback struct {
	Sync rocksstore.SyncMode
}

// Name implements target.System.
func (l Loopback) Name() string { return "leaseq-loopback-" + l.Sync.String() }

// Family implements target.System.
func (Loopback) Family() string { return "leaseq" }

// OnlyWhenNamed keeps this system out of runs that do not name it.
func (Loopback) OnlyWhenNamed() bool { return true }

// Durability implements target.System.
func (l Loopback) Durability() target.Durability {
	return InProcess{Backend: BackendRocks, Sync: l.Sync}.Durability()
}

// Available implements target.System.
func (Loopback) Available() error { return nil }

// Start implements target.System.
func (l Loopback) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	inst, err := InProcess{Backend: BackendRocks, Sync: l.Sync}.Start(ctx, o)
	if err != nil {
		return nil, err
	}
	in := inst.(*inprocInstance)
	srv, err := rpc.NewServer(rpc.ServerConfig{Store: in.store, Clock: o.Clock})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("leaseqt: rpc server: %w", err), in.Close())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("leaseqt: listen: %w", err), in.Close())
	}
	if err := srv.Start(context.Background(), ln); err != nil {
		return nil, errors.Join(fmt.Errorf("leaseqt: rpc start: %w", err), ln.Close(), in.Close())
	}
	in.setOnReady(srv.Wake)
	return &loopbackInstance{in: in, srv: srv, addr: ln.Addr().String()}, nil
}

type loopbackInstance struct {
	in   *inprocInstance
	srv  *rpc.Server
	addr string
}

func (l *loopbackInstance) PID() int { return os.Getpid() }

func (l *loopbackInstance) Connect(ctx context.Context) (target.Client, error) {
	return dialRPC(ctx, l.addr, l.in.lease)
}

func (l *loopbackInstance) Close() error {
	l.srv.Stop()
	return l.in.Close()
}
