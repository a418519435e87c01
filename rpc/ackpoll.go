package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Ack and AckPoll, and what their callers learn of an ack whose answer
// did not come (ErrOutcomeUnknown).

// Ack deletes items held under lease; one Code per id, in order. An ack
// that was sent but whose answer did not come (ctx ended, or the
// connection was lost, first) fails with an error that wraps
// ErrOutcomeUnknown as well as the cause: the node may have applied it.
// One whose ctx has ended already is not sent (and is no unknown). Every
// call that changes the node's state reports so (invokeMut).
func (c *Client) Ack(ctx context.Context, queue string, lease storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error) {
	if err := c.checkSize("ack", 24*len(ids)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("leaseq ack: %w", err)
	}
	if c.lean == nil {
		f, release := invokeMut(ctx, c, mAck, ackParams(queue, lease, ids))
		defer release()
		return codesResult("ack", len(ids), f.Struct)
	}
	l := c.lean
	lc, err := l.prepare(ctx, mAck.id, leanBuild(mAck, ackParams(queue, lease, ids)))
	if err != nil {
		return nil, fmt.Errorf("leaseq ack: %w", err)
	}
	st, err := l.send(ctx, lc.msg)
	lc.msg.Release()
	if sent, err := l.afterSend(st, err, lc); err != nil {
		return nil, unknownIfSent(sent, fmt.Errorf("leaseq ack: %w", err))
	}
	return l.ackAnswer(ctx, lc, len(ids))
}

func ackParams(queue string, lease storage.LeaseID, ids []storage.ItemID) func(schema.Queue_ack_Params) error {
	return func(p schema.Queue_ack_Params) error {
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		if err := p.SetLease(lease[:]); err != nil {
			return err
		}
		l, err := p.NewIds(int32(len(ids)))
		if err != nil {
			return err
		}
		return writeIDs(l, ids)
	}
}

// AckPoll acks ids held under lease (as Ack) and polls queue for up to
// max ready items (as Poll) in one round trip: both calls go out in one
// write without the poll waiting for the ack's answer, and on a node with
// --sync=always they usually share one fsync. A consumer that acks each
// batch as it polls for the next pays one round trip per batch instead of
// two. The node promises no order between the two (an item being acked is
// in flight, so the poll cannot return it anyway). The poll may wait up to
// wait for its first item, and AckPoll returns when both are answered, or
// when ctx ends: a node that holds the ack holds the poll's items (leased,
// their lease running) until then, so give ctx a deadline well short of
// the lease.
//
// On error, codes and res hold what did succeed: a poll that succeeded
// leased its items even when the ack failed, so check res.Items whatever
// err says. err wraps the ack's failure, the poll's, or both (errors.Join);
// an ack sent whose answer did not come wraps ErrOutcomeUnknown (as Ack).
func (c *Client) AckPoll(ctx context.Context, queue string, lease storage.LeaseID, ids []storage.ItemID, max int, leaseDur, wait time.Duration) (codes []storage.Code, res storage.PollResult, err error) {
	ack, res, errP := c.ackPollSplit(ctx, ctx, queue, lease, ids, max, leaseDur, wait)
	codes, errA := ack()
	return codes, res, errors.Join(errA, errP)
}

// ackPollSplit is AckPoll with the poll's answer handed over as it comes,
// whatever the ack's: the ack's answer is ack's, which must be called
// once, and waits for it under actx (on the go-capnp engine actx is the
// ack call's context from the start). The poll runs under pctx, and is
// written with the ack under it. Found by review (session 74): with one
// ctx for both, a node that held the ack held the poll's answer, its
// items' lease running unextended, until that ctx ended.
//
// An ack given up before it is sent (actx ended) leaves the poll to go
// alone, and a poll given up so (pctx ended) leaves the ack to go alone
// (when ack is called). Bad arguments send nothing, and are reported once,
// as the ack's error.
func (c *Client) ackPollSplit(pctx, actx context.Context, queue string, lease storage.LeaseID, ids []storage.ItemID, max int, leaseDur, wait time.Duration) (ack func() ([]storage.Code, error), res storage.PollResult, errP error) {
	if err := c.checkSize("ack", 24*len(ids)); err != nil {
		return ackFailed(err), res, nil
	}
	if max < 0 || leaseDur < 0 || wait < 0 {
		return ackFailed(fmt.Errorf("leaseq poll: %w: negative max, lease or wait", storage.ErrInvalidArgument)), res, nil
	}
	if err := checkLeaseMs("poll", leaseDur); err != nil {
		return ackFailed(err), res, nil
	}
	errA, errP := actx.Err(), pctx.Err()
	switch {
	case errA != nil && errP != nil:
		return ackFailed(fmt.Errorf("leaseq ack: %w", errA)), res, fmt.Errorf("leaseq poll: %w", errP)
	case errA != nil:
		res, errP = c.Poll(pctx, queue, max, leaseDur, wait)
		return ackFailed(fmt.Errorf("leaseq ack: %w", errA)), res, errP
	case errP != nil:
		return func() ([]storage.Code, error) { return c.Ack(actx, queue, lease, ids) }, res, fmt.Errorf("leaseq poll: %w", errP)
	}
	if c.lean == nil {
		fa, releaseA := invokeMut(actx, c, mAck, ackParams(queue, lease, ids))
		fp, releaseP := c.invokePoll(pctx, pollParams(queue, max, leaseDur, wait))
		res, errP = pollAnswer(fp, max)
		releaseP()
		return func() ([]storage.Code, error) {
			defer releaseA()
			return codesResult("ack", len(ids), fa.Struct)
		}, res, errP
	}
	l := c.lean
	ca, cp, err := l.preparePair(pctx, mAck.id, leanBuild(mAck, ackParams(queue, lease, ids)), mPoll.id, leanBuild(mPoll, pollParams(queue, max, leaseDur, wait)))
	if err != nil {
		return ackFailed(fmt.Errorf("leaseq ack: %w", err)), res, fmt.Errorf("leaseq poll: %w", err)
	}
	st, err := l.send(pctx, ca.msg, cp.msg)
	ca.msg.Release()
	cp.msg.Release()
	if sent, err := l.afterSend(st, err, ca, cp); err != nil {
		return ackFailed(unknownIfSent(sent, fmt.Errorf("leaseq ack: %w", err))), res, fmt.Errorf("leaseq poll: %w", err)
	}
	// The poll's Return usually comes last: waiting for it first reads
	// both on this goroutine (callPair).
	r, release, err := l.await(pctx, cp)
	fp, releaseP := leanFuture(mPoll, leanResult{res: r, release: release, err: err})
	res, errP = pollAnswer(fp, max)
	releaseP()
	return func() ([]storage.Code, error) { return l.ackAnswer(actx, ca, len(ids)) }, res, errP
}

// ackFailed is ackPollSplit's ack when the ack failed already.
func ackFailed(err error) func() ([]storage.Code, error) {
	return func() ([]storage.Code, error) { return nil, err }
}

// afterSend settles calls whose send ended with st and err (sendFailed),
// and tells pollSent of those sent. A nil error: the calls went out, to
// be awaited. Else sent says whether they may have reached the node.
func (l *leanClient) afterSend(st sendStatus, err error, calls ...outCall) (sent bool, _ error) {
	if st != notSent {
		for _, lc := range calls {
			l.pollSent(lc)
		}
	}
	if err := l.sendFailed(st, err, calls...); err != nil {
		return st != notSent, err
	}
	return true, nil
}

// ackAnswer waits under ctx for the answer of lc, a sent ack of n ids.
func (l *leanClient) ackAnswer(ctx context.Context, lc outCall, n int) ([]storage.Code, error) {
	r, release, err := l.await(ctx, lc)
	f, rel := leanFuture(mAck, leanResult{res: r, release: release, err: err})
	defer rel()
	codes, err := codesResult("ack", n, f.Struct)
	return codes, outcomeUnknown(err)
}

// unknownIfSent is outcomeUnknown(err) for a call that may have been
// sent, else err.
func unknownIfSent(sent bool, err error) error {
	if !sent {
		return err
	}
	return outcomeUnknown(err)
}

// outcomeUnknown wraps err, the error of a mutating call that was sent,
// with ErrOutcomeUnknown when it says the answer did not come: the call's
// context ended, the connection was lost, or the answer was too large
// to read. Any answer, a refusal too, is no unknown. (On the go-capnp
// engine a call may be taken as sent that was not: see invokeMut.)
func outcomeUnknown(err error) error {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	if se := (*StatusError)(nil); errors.As(err, &se) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || isDisconnect(err) || errors.Is(err, ErrReplyTooLarge) {
		return fmt.Errorf("%w (%w)", err, ErrOutcomeUnknown)
	}
	return err
}
