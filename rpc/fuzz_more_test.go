package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

// FuzzClientOps drives a real server (memstore, mock clock) with
// a real Client through a fuzz-chosen sequence of enqueue, poll, ack,
// nack, extend (with the real lease token, which FuzzServerConn can never
// guess: tokens are crypto-random), clock advances and reconnects, and
// checks the queue's accounting: an id is acked OK at most once, a poll
// never hands out an acked id, and at the end every enqueued item is
// ready, delayed, inflight, dead or acked exactly once.
func FuzzClientOps(f *testing.F) {
	f.Add([]byte{0, 3, 1, 2, 2, 0})                    // enqueue 3, poll 2, ack
	f.Add([]byte{0, 2, 1, 2, 3, 0, 1, 2, 2, 0})        // nack then poll and ack
	f.Add([]byte{0, 2, 1, 2, 5, 40, 1, 2, 2, 0})       // lease expires, redelivered, ack the old lease
	f.Add([]byte{0, 2, 1, 2, 6, 0, 5, 40, 1, 2, 2, 0}) // reconnect holding a lease
	f.Add([]byte{0, 1, 1, 1, 4, 0, 5, 20, 2, 0, 7, 0}) // extend, advance, ack, forged ack
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 48 {
			prog = prog[:48]
		}
		before := runtime.NumGoroutine()
		b := setup(t, bundleOpts{transport: "pipe", factory: memFactory()})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		const q = "fz"
		c := b.dial()
		var (
			enqueued int
			acked    = map[storage.ItemID]bool{}
			lease    storage.LeaseID
			held     []storage.ItemID
		)
		arg := func(i int) byte {
			if i < len(prog) {
				return prog[i]
			}
			return 0
		}
		for i := 0; i < len(prog); i += 2 {
			a := arg(i + 1)
			switch prog[i] % 8 {
			case 0:
				n := 1 + int(a%3)
				res, err := c.Enqueue(ctx, q, payloads(n, 4))
				require.NoError(t, err)
				require.Len(t, res, n)
				enqueued += n
			case 1:
				res, err := c.Poll(ctx, q, 1+int(a%3), 30*time.Second, 0)
				require.NoError(t, err)
				for _, it := range res.Items {
					require.False(t, acked[it.ID], "poll handed out %x, which was acked", it.ID)
				}
				if len(res.Items) > 0 {
					lease, held = res.Lease, nil
					for _, it := range res.Items {
						held = append(held, it.ID)
					}
				}
			case 2, 7:
				if len(held) == 0 {
					continue
				}
				l := lease
				if prog[i]%8 == 7 {
					l[0] ^= 0xff // a lease that is not the item's
				}
				ids := held[:1+int(a)%len(held)]
				codes, err := c.Ack(ctx, q, l, ids)
				require.NoError(t, err)
				require.Len(t, codes, len(ids))
				for k, code := range codes {
					if code == storage.CodeOK {
						require.False(t, acked[ids[k]], "%x acked OK twice", ids[k])
						require.NotEqual(t, byte(7), prog[i]%8, "ack under a forged lease applied")
						acked[ids[k]] = true
					}
				}
			case 3:
				if len(held) == 0 {
					continue
				}
				var d time.Duration
				codes, err := c.Nack(ctx, q, lease, held[:1+int(a)%len(held)], &d, "fuzz")
				require.NoError(t, err)
				for k, code := range codes {
					if code == storage.CodeOK {
						require.False(t, acked[held[k]], "nack OK of acked %x", held[k])
					}
				}
			case 4:
				if len(held) == 0 {
					continue
				}
				_, _ = c.Extend(ctx, q, lease, time.Duration(1+a%60)*time.Second)
			case 5:
				b.clock.Add(time.Duration(a%64) * time.Second)
			case 6:
				require.NoError(t, c.Close())
				c = b.dial()
			}
		}
		// Every lease expires; every item is accounted for once.
		b.clock.Add(10 * time.Minute)
		if enqueued == 0 {
			return // no queue to ask about
		}
		st, err := c.Stats(ctx, q)
		require.NoError(t, err)
		var s storage.QueueStats
		if len(st) == 1 {
			s = st[0]
		}
		require.Equal(t, uint64(enqueued), s.Enqueued, "enqueued")
		require.Equal(t, uint64(len(acked)), s.Acked, "acked counter vs acks answered OK")
		require.Equal(t, int64(enqueued-len(acked)), s.Ready+s.Delayed+s.Inflight+s.Dead,
			"ready+delayed+inflight+dead vs enqueued-acked (%+v)", s)
		require.NoError(t, c.Close())
		b.srv.Stop()
		requireGoroutinesAtMost(t, func() int { return before })
	})
}

// FuzzLeanClientRepliesAfterCall is FuzzLeanClientReplies with the fake
// node writing its reply only once the client's Call has arrived (the
// original writes it right after the bootstrap, racing the call, so most
// replies meet no question and the results decoding is rarely reached),
// seeded with a well-formed NodeInfo results Return. Property: the call
// ends (answer or error) and a well-formed answer is not turned into an
// error.
func FuzzLeanClientRepliesAfterCall(f *testing.F) {
	good := returnBytes(f, 1, func(p rpccp.Payload) error {
		res, err := schema.NewQueue_nodeInfo_Results(p.Segment())
		if err != nil {
			return err
		}
		info, err := res.NewInfo()
		if err != nil {
			return err
		}
		_ = info.SetVersion("v1")
		_ = info.SetBackend("mem")
		_ = info.SetSync("always")
		info.SetMaxBatch(10)
		return p.SetContent(res.ToPtr())
	})
	f.Add(good)
	f.Add(append(append([]byte{}, good...), good...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, reply []byte) {
		for _, transport := range []string{"pipe", "tcp"} {
			cc, sc := connPair(t, transport)
			served := make(chan struct{})
			bootRet := bootstrapReturnBytes(t, 0)
			go func() {
				defer close(served)
				defer sc.Close()
				dec := capnp.NewDecoder(sc)
				m, err := dec.Decode() // the Bootstrap
				if err != nil {
					return
				}
				m.Release()
				if _, err := sc.Write(bootRet); err != nil {
					return
				}
				if m, err = dec.Decode(); err != nil { // its Finish
					return
				}
				m.Release()
				m, err = dec.Decode() // the call
				if err != nil {
					return
				}
				m.Release()
				_, _ = sc.Write(reply) // then close: every call must end
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
			require.NoError(t, err)
			c := &Client{lean: l, log: discardLogger(), limit: DefaultMaxMessageBytes, readLimit: DefaultMaxReplyBytes, closed: make(chan struct{})}
			ni, err := c.NodeInfo(ctx)
			if bytes.Equal(reply, good) {
				require.NoError(t, err, transport)
				require.Equal(t, "v1", ni.Version)
			}
			require.NoError(t, ctx.Err(), "%s: the call ended only at its deadline", transport)
			_ = c.Close()
			_ = cc.Close()
			<-served
			cancel()
		}
	})
}

// FuzzServerConnAbortReason: structured programs (as FuzzServerConn's
// fuzzStructured mode, memstore) on one connection, then nothing more; the
// client keeps the connection open for fuzzAbortGrace. Property: if the
// server ends the connection, it first sends an Abort with a non-empty
// reason (FuzzServerConn accepts any close as an answer, so it cannot
// tell a reasoned abort from a silent hang-up).
func FuzzServerConnAbortReason(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		if s.mode == fuzzStructured {
			f.Add(s.data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ms := memstore.New(memstore.Options{})
		defer func() { _ = ms.Close() }()
		logs := &fuzzLogBuffer{}
		srv, err := NewServer(ServerConfig{Store: ms, Clock: fuzzClock(), Engine: testEngine,
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		require.NoError(t, err)
		defer srv.Stop()
		cs, ss := net.Pipe()
		type result struct {
			aborted bool
			reason  string
			eof     bool
		}
		done := make(chan result, 1)
		go func() {
			var r result
			dec := capnp.NewDecoder(cs)
			for {
				msg, err := dec.Decode()
				if err != nil {
					r.eof = errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
					done <- r
					_, _ = io.Copy(io.Discard, cs)
					return
				}
				if m, err := rpccp.ReadRootMessage(msg); err == nil && m.Which() == rpccp.Message_Which_abort {
					r.aborted = true
					if ab, err := m.Abort(); err == nil {
						r.reason, _ = ab.Reason()
					}
				}
				msg.Release()
			}
		}()
		srv.admit(ss, nil)
		require.NoError(t, cs.SetWriteDeadline(time.Now().Add(fuzzBound)))
		var sentAbort bool
		for _, fr := range fuzzProgram(t, data) {
			if m, err := capnp.Unmarshal(fr); err == nil {
				if rm, err := rpccp.ReadRootMessage(m); err == nil && rm.Which() == rpccp.Message_Which_abort {
					sentAbort = true // the server may just hang up on an Abort
				}
			}
			if _, err := cs.Write(fr); err != nil {
				break
			}
		}
		var r result
		select {
		case r = <-done:
		case <-time.After(50 * time.Millisecond): // still open (or slow): not judged
			_ = cs.Close()
			r = <-done
			r.eof = false
		}
		_ = cs.Close()
		if r.eof && !sentAbort && (!r.aborted || r.reason == "") {
			t.Fatalf("the server closed the connection without an Abort with a reason (aborted=%v reason=%q); log:\n%s", r.aborted, r.reason, logs.String())
		}
	})
}
