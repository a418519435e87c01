package fdbsync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Marker result kinds for one enqueued item. Part of the on-disk format.
const (
	enqNew     byte = 1 // new item; followed by its u16 order in the commit
	enqDup     byte = 2 // duplicate; followed by the first item's id
	enqDupHere byte = 3 // duplicate of an item of this commit; followed by its u16 order
)

// pending is one valid item of an Enqueue call with its upload done.
type pending struct {
	idx int // index in the call
	rec record
}

// Enqueue implements storage.Store. Items are written in as few
// transactions as the size budget allows (one for ordinary batches); large
// payloads are uploaded to chunk keys first, in their own transactions, and
// referenced by the item's record. Item ids are the commit's versionstamp
// plus the item's order in that commit, so ids from every node are unique
// and increase in commit order without coordination. A batch too large for
// one transaction is written in several, in order; if one of them fails,
// the earlier ones stay written and the error means "outcome unknown", as
// storage.Store allows for I/O errors (retry with dedup keys to avoid
// duplicates).
func (s *Store) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	res := make([]storage.EnqueueResult, len(p.Items))
	var todo []pending
	for i, it := range p.Items {
		if err := s.limits.ValidateItem(it); err != nil {
			res[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: storage.ItemReason(err)}
			continue
		}
		r := record{
			prio: it.Priority, maxAttempts: it.MaxAttempts, enqueuedAt: p.Now,
			visibleAt: p.Now.Add(it.Delay), dedupKey: it.DedupKey,
		}
		if len(it.Payload) > inlineMax {
			if err := s.upload(ctx, p.Now, &r, it.Payload); err != nil {
				return nil, fmt.Errorf("fdbsync: enqueue %q: %w", p.Queue, err)
			}
		} else {
			r.inline = append([]byte{}, it.Payload...)
		}
		todo = append(todo, pending{idx: i, rec: r})
	}
	if len(todo) == 0 {
		// No valid item: the queue still comes into being, as with any
		// enqueue (one transaction that writes only its config).
		if err := s.enqueueTxn(ctx, p, nil, res); err != nil {
			return nil, fmt.Errorf("fdbsync: enqueue %q: %w", p.Queue, err)
		}
	}
	for len(todo) > 0 {
		n, size := 0, 0
		for n < len(todo) && (n == 0 || size+enqueueSize(&todo[n].rec, p.Queue) <= txnBudget) {
			size += enqueueSize(&todo[n].rec, p.Queue)
			n++
		}
		err := s.enqueueTxn(ctx, p, todo[:n], res)
		for tries := 1; errors.Is(err, errUploadGone) && tries < maxUploads; tries++ {
			// Another node collected an upload of this group before the
			// group committed (its clock ran over uploadTTL ahead of
			// the caller's): upload those payloads again.
			if err = s.reupload(ctx, p, todo[:n]); err == nil {
				err = s.enqueueTxn(ctx, p, todo[:n], res)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("fdbsync: enqueue %q: %w", p.Queue, err)
		}
		todo = todo[n:]
	}
	return res, nil
}

// errUploadGone: an item's chunk upload was collected before its enqueue
// committed; maxUploads bounds how often Enqueue uploads such a payload.
var errUploadGone = errors.New("a payload's upload was collected before its item committed (is a node's clock over an hour ahead?)")

const maxUploads = 3

// reupload uploads the chunked payloads of items again, under fresh ids.
func (s *Store) reupload(ctx context.Context, p storage.EnqueueParams, items []pending) error {
	for i := range items {
		if r := &items[i].rec; r.chunked {
			if err := s.upload(ctx, p.Now, r, p.Items[items[i].idx].Payload); err != nil {
				return err
			}
		}
	}
	return nil
}

// upload writes a large payload to chunk keys under a fresh payload id, in
// transactions of at most uploadBudget bytes, with an upload entry the
// sweeper uses to drop chunks whose item never committed. Plain sets of
// fixed values: safe to apply twice.
func (s *Store) upload(ctx context.Context, now time.Time, r *record, payload []byte) error {
	pid, err := randomToken()
	if err != nil {
		return err
	}
	r.chunked, r.pid, r.size = true, pid, uint32(len(payload))
	r.nchunks = uint16((len(payload) + chunkSize - 1) / chunkSize)
	for first := 0; first < int(r.nchunks); {
		last := first
		err := s.blind(ctx, func(tx kv.Tx) {
			tx.Set(s.k.upload(now, pid), nil)
			n, bytes := first, 0
			for ; n < int(r.nchunks) && bytes < uploadBudget; n++ {
				lo, hi := n*chunkSize, min((n+1)*chunkSize, len(payload))
				tx.Set(s.k.chunk(pid, n), payload[lo:hi])
				bytes += hi - lo
			}
			last = n
		})
		s.uploads.Add(1)
		if err != nil {
			return fmt.Errorf("upload payload: %w", err)
		}
		first = last
	}
	return nil
}

// enqueueSize estimates the commit bytes of enqueueing r into queue: as
// recordSize, and a dedup key six more times (its dedup entry and expiry
// entry, each with its write conflict range, and the entry's read
// conflict range).
func enqueueSize(r *record, queue string) int {
	return recordSize(r, 64+len(queue)) + 6*len(r.dedupKey)
}

// enqueueTxn writes one group of items in one idempotent transaction.
func (s *Store) enqueueTxn(ctx context.Context, p storage.EnqueueParams, items []pending, res []storage.EnqueueResult) error {
	q := p.Queue
	v, last, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		outs := make([]enqOutcome, len(items))
		if c.prior != nil {
			b, err := c.result()
			if err != nil {
				return nil, err
			}
			return decodeEnqueueMarker(b, outs)
		}
		cfg, created, ok, err := s.queueConfig(tx, q)
		if err != nil {
			return nil, err
		}
		if !ok {
			if err := s.checkNewQueue(tx); err != nil {
				return nil, err
			}
			cfg = s.limits.DefaultQueueConfig()
			createConfig(tx, s.k.queue(q), cfg)
		}
		// Dedup lookups, one batched read; a read conflict on each key
		// makes two concurrent enqueues of one key serialize.
		var dkeys [][]byte
		for _, it := range items {
			if it.rec.dedupKey != "" {
				dkeys = append(dkeys, s.k.dedup(q, it.rec.dedupKey))
			}
		}
		var dvals [][]byte
		if len(dkeys) > 0 {
			if dvals, err = tx.GetMany(dkeys, false); err != nil {
				return nil, err
			}
		}
		// The uploads of chunked payloads must still be there: read
		// without snapshot, so a garbage pass that collects one meanwhile
		// aborts this commit rather than leave an item without its
		// payload.
		var ukeys [][]byte
		for _, it := range items {
			if it.rec.chunked {
				ukeys = append(ukeys, s.k.upload(p.Now, it.rec.pid))
			}
		}
		if len(ukeys) > 0 {
			uvals, err := tx.GetMany(ukeys, false)
			if err != nil {
				return nil, err
			}
			for _, v := range uvals {
				if v == nil {
					return nil, errUploadGone
				}
			}
		}
		here := map[string]int{} // dedup key -> order of its item in this commit
		order, ready, delayed, dups := 0, 0, 0, 0
		var earliest time.Time
		di := 0
		for i := range items {
			r := items[i].rec
			var staleExp []byte // the expiry entry of a dedup record that no longer holds, which this item replaces
			if r.dedupKey != "" {
				cur := dvals[di]
				di++
				if o, ok := here[r.dedupKey]; ok {
					outs[i] = enqOutcome{kind: enqDupHere, order: o}
					dups++
					continue
				}
				if cur != nil {
					d, err := decodeDedup(cur)
					if err != nil {
						return nil, err
					}
					// A record from before the queue came to be (or from
					// before this commit creates it) is a removed queue's.
					if ok && !dedupBefore(d, created) && d.holds(p.Now, cfg.DedupWindow) {
						outs[i] = enqOutcome{kind: enqDup, dup: d.id}
						dups++
						continue
					}
					staleExp = s.k.dedupExp(d.expires, q, r.dedupKey)
				}
				if cfg.DedupWindow > 0 {
					here[r.dedupKey] = order
				}
			}
			id := placeholderID(order)
			r.delayed = r.visibleAt.After(p.Now)
			tx.SetVersionstampedKey(vsKey(s.k.available(q, id)), r.encode())
			if r.delayed {
				tx.SetVersionstampedKey(vsKey(s.k.delayed(q, r.visibleAt, id)), []byte{r.prio})
				tx.SetVersionstampedKey(vsKey(s.k.delayAll(r.visibleAt, q, id)), nil)
				delayed++
				if earliest.IsZero() || r.visibleAt.Before(earliest) {
					earliest = r.visibleAt
				}
			} else {
				tx.SetVersionstampedKey(vsKey(s.k.ready(q, r.prio, r.visibleAt, id)), nil)
				ready++
			}
			if r.dedupKey != "" && cfg.DedupWindow > 0 {
				// Replace the old record's expiry entry: one entry
				// per key, as in rocksstore (a rule of storage/check). The
				// sweeper would skip a stale one, but DeleteQueue, which
				// clears the current one, would leave it behind.
				if staleExp != nil {
					tx.Clear(staleExp)
				}
				exp := p.Now.Add(cfg.DedupWindow)
				tx.SetVersionstampedValue(s.k.dedup(q, r.dedupKey), withOffset(dedupRec{id: id, expires: exp, seen: p.Now}.encode(), dedupIDOffset))
				tx.Set(s.k.dedupExp(exp, q, r.dedupKey), nil)
			}
			if r.chunked {
				// The item now references its chunks: they are no longer
				// an orphan upload.
				tx.Clear(s.k.upload(p.Now, r.pid))
			}
			outs[i] = enqOutcome{kind: enqNew, order: order}
			order++
		}
		s.add(tx, q, ctrReady, int64(ready))
		s.add(tx, q, ctrDelayed, int64(delayed))
		s.add(tx, q, ctrEnqueued, int64(ready+delayed))
		s.add(tx, q, ctrDuplicates, int64(dups))
		if ready > 0 {
			s.wakeQueue(tx, q)
		}
		if order > 0 {
			c.setStamped(tx, encodeEnqueueMarker(outs))
		} else {
			// Only duplicates: no versionstamp to record, but the counter
			// add must still not apply twice.
			c.set(tx, append(make([]byte, kv.VersionstampSize), encodeEnqueueMarker(outs)...))
		}
		return enqueueOutcome{outs: outs, stamped: order > 0, earliest: earliest}, nil
	})
	if err != nil {
		return err
	}
	out, err := as[enqueueOutcome](v)
	if err != nil {
		return err
	}
	vs := out.vs
	if out.stamped && !out.replayed {
		if vs, err = last.Versionstamp(); err != nil {
			return fmt.Errorf("%w: %w", errNoVersionstamp, err)
		}
	}
	for i, o := range out.outs {
		r := &res[items[i].idx]
		r.Code = storage.CodeOK
		switch o.kind {
		case enqNew:
			r.ID = stampID(vs, o.order)
			s.enqueued.Add(1)
			if v := items[i].rec.visibleAt; out.replayed && v.After(p.Now) && (out.earliest.IsZero() || v.Before(out.earliest)) {
				// Found by review (session 74): a call replayed from its
				// marker after commit_unknown_result reported no deadline,
				// so the sweeper learned of its delayed items only at its
				// next capped wake-up. The items it wrote are these.
				out.earliest = v
			}
		case enqDupHere:
			r.ID, r.Duplicate = stampID(vs, o.order), true
		case enqDup:
			r.ID, r.Duplicate = o.dup, true
		}
	}
	s.deadline(out.earliest)
	return nil
}

// enqueueOutcome is what one enqueue transaction decided.
type enqueueOutcome struct {
	outs     []enqOutcome
	stamped  bool
	replayed bool
	vs       kv.Versionstamp
	earliest time.Time
}

// enqOutcome is the fate of one item of an enqueue transaction.
type enqOutcome struct {
	kind  byte
	order int // order in the commit, for enqNew and enqDupHere
	dup   storage.ItemID
}

func encodeEnqueueMarker(outs []enqOutcome) []byte {
	var b []byte
	for _, o := range outs {
		b = append(b, o.kind)
		switch o.kind {
		case enqNew, enqDupHere:
			b = binary.BigEndian.AppendUint16(b, uint16(o.order))
		case enqDup:
			b = append(b, o.dup[:]...)
		}
	}
	return b
}

// decodeEnqueueMarker rebuilds an enqueue's outcome from its marker: the
// versionstamp of the commit that wrote it, then one entry per item.
func decodeEnqueueMarker(b []byte, outs []enqOutcome) (any, error) {
	if len(b) < kv.VersionstampSize {
		return nil, errBadValue
	}
	var out enqueueOutcome
	copy(out.vs[:], b)
	b = b[kv.VersionstampSize:]
	for i := range outs {
		if len(b) < 1 {
			return nil, errBadValue
		}
		outs[i].kind = b[0]
		b = b[1:]
		switch outs[i].kind {
		case enqNew, enqDupHere:
			if len(b) < 2 {
				return nil, errBadValue
			}
			outs[i].order = int(binary.BigEndian.Uint16(b))
			b = b[2:]
		case enqDup:
			if len(b) < 16 {
				return nil, errBadValue
			}
			copy(outs[i].dup[:], b)
			b = b[16:]
		default:
			return nil, errBadValue
		}
	}
	out.outs, out.stamped, out.replayed = outs, true, true
	return out, nil
}
