package rpc

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// The Client's give-backs: items claimed for a caller that never received
// them (a poll given up, a subscription's batch C had no room for) go back
// with an undelivered nack, and Close waits for them.

// initGiveBacks sets up the give-backs of a new Client, their timeouts on
// clk.
func (c *Client) initGiveBacks(clk clock.Clock) {
	c.clk = clk
	c.giveBack = c.giveBackPoll(clk)
	c.deliversIdle.L = &c.gbMu
}

// addSub registers a new Subscription; false once Close has begun.
func (c *Client) addSub(s *Subscription) bool {
	c.gbMu.Lock()
	defer c.gbMu.Unlock()
	if c.closing {
		return false
	}
	if c.subs == nil {
		c.subs = make(map[*Subscription]struct{})
	}
	c.subs[s] = struct{}{}
	return true
}

// dropSub forgets a Subscription that has ended.
func (c *Client) dropSub(s *Subscription) {
	c.gbMu.Lock()
	delete(c.subs, s)
	c.gbMu.Unlock()
}

// enterDeliver counts a running Deliver; false once the Client is closed.
func (c *Client) enterDeliver() bool {
	c.gbMu.Lock()
	defer c.gbMu.Unlock()
	select {
	case <-c.closed:
		return false
	default:
	}
	c.delivers++
	return true
}

// exitDeliver ends what enterDeliver began.
func (c *Client) exitDeliver() {
	c.gbMu.Lock()
	c.delivers--
	if c.delivers == 0 {
		c.deliversIdle.Broadcast()
	}
	c.gbMu.Unlock()
}

// itemIDs returns the ids of items.
func itemIDs(items []storage.Item) []storage.ItemID {
	ids := make([]storage.ItemID, len(items))
	for i := range items {
		ids[i] = items[i].ID
	}
	return ids
}

// giveBackTimeout bounds the nack of an abandoned poll's items (and so
// how long Close waits for it): past it they stay leased until the lease
// expires, as they would without it.
const giveBackTimeout = 5 * time.Second

// giveBackPoll returns the Client's giveBack: an undelivered nack of an
// abandoned poll's items (leanClient.abandoned, capnpPolls.settleLocked), on a
// goroutine of its own, which Close waits for: a consumer that stops and
// closes its client at once still gives back what its last poll claimed.
func (c *Client) giveBackPoll(clk clock.Clock) func(pollGiveBack) {
	return func(g pollGiveBack) {
		c.gbMu.Lock()
		select {
		case <-c.closed:
			c.gbMu.Unlock()
			return // too late: the items wait for their lease
		default:
		}
		c.giveBacks.Add(1)
		c.gbMu.Unlock()
		go func() {
			defer c.giveBacks.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			t := clk.AfterFunc(giveBackTimeout, cancel)
			defer t.Stop()
			if _, err := c.nack(ctx, g.queue, g.lease, g.ids, nil, "", true); err != nil {
				c.log.Debug("items no caller received stay leased until the lease expires", "queue", g.queue, "items", len(g.ids), "err", err)
			}
		}()
	}
}

// endSubs cancels subs and waits, until expired is closed, for the node
// to end each (it drops the Consumer once its pushes have stopped), so
// that no batch is pushed after the Deliver that found C full gave its
// own back: pushed to a closed Client, it would stay leased to nobody.
func (c *Client) endSubs(subs map[*Subscription]struct{}, expired <-chan struct{}) {
	for s := range subs {
		s.Cancel()
	}
	for s := range subs {
		select {
		case <-s.ended:
		case <-expired:
			return
		}
	}
}

// isClosedChan reports whether ch is closed; a nil ch counts as closed.
func isClosedChan(ch <-chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// awaitPolls waits, until expired is closed, for the answers of the polls
// Close stopped (drained, from leanClient.drainPolls or capnpPolls.drain):
// an answer read in time has its items given back (counted in giveBacks)
// before Close goes on; one later stays leased until its lease ends.
func (c *Client) awaitPolls(drained, expired <-chan struct{}) {
	var ended <-chan struct{} // the connection ended: no answer will come
	if c.lean != nil {
		ended = c.lean.quit
	} else {
		ended = c.rc.Done() // the go-capnp engine's: set once, in NewClient
	}
	select {
	case <-drained:
	case <-ended:
	case <-expired:
	}
}
