package fdbsync

import (
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
)

// layout: the ready index r holds ready items only; delayed items are in
// the per-queue delayed index d (which keeps their priority, for
// promotion) and the global one D (the sweeper's).
var layout = check.Layout{DelayedIndexes: []string{"d", "D"}}

// Check implements storage.Store: one consistent full scan (one read
// version, snapshot reads) into check.Facts, reporting keys and values
// that do not decode, judged by storage/check. On a real cluster a
// database too large to scan within 5 s fails with transaction_too_old;
// Check is for tests and small deployments.
func (s *Store) Check(ctx context.Context) (storage.CheckReport, error) {
	if err := s.checkOpen(); err != nil {
		return storage.CheckReport{}, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) { return s.checkFacts(tx) })
	if err != nil {
		return storage.CheckReport{}, fmt.Errorf("fdbsync: check: %w", err)
	}
	f, err := as[*check.Facts](v)
	if err != nil {
		return storage.CheckReport{}, err
	}
	return check.Run(layout, f), nil
}

// each calls fn with the key (after the namespace prefix) and value of
// every row of a namespace, in key order, by snapshot read.
func (s *Store) each(tx kv.Tx, tag byte, fn func(rest, v []byte)) error {
	pre := s.k.ns(tag)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true})
	if err != nil {
		return err
	}
	for _, row := range rows {
		fn(row.Key[len(pre):], row.Value)
	}
	return nil
}

// queueID decodes <queue> <id>, the tail of a per-queue item key.
func queueID(rest []byte) (string, storage.ItemID, bool) {
	var id storage.ItemID
	q, tail, err := readStr(rest)
	if err != nil || len(tail) != len(id) {
		return "", id, false
	}
	copy(id[:], tail)
	return q, id, true
}

// checkFacts scans every namespace Check looks at into facts.
func (s *Store) checkFacts(tx kv.Tx) (*check.Facts, error) {
	f := &check.Facts{}
	// created holds each queue's incarnation; removed the dedup keys left
	// from a removed queue of the same name (dedupBefore, or no queue at
	// all), which removeQueue clears after the queue is gone: neither
	// they nor their expiry entries are facts of a live queue.
	created := map[string]kv.Versionstamp{}
	type dedupRef struct{ q, key string }
	removed := map[dedupRef]time.Time{}
	steps := []struct {
		tag byte
		fn  func(rest, v []byte)
	}{
		{nsQueue, func(rest, v []byte) {
			q, tail, err := readStr(rest)
			if err != nil || len(tail) != 0 {
				f.Corruptf("q: malformed key %x", rest)
				return
			}
			if _, err := decodeConfig(v); err != nil {
				f.Corruptf("queue %q: bad config: %v", q, err)
			}
			created[q] = configCreated(v)
			f.Queues = append(f.Queues, q)
		}},
		{nsCounter, func(rest, v []byte) {
			q, tail, err := readStr(rest)
			if err != nil || len(tail) != 1 || tail[0] == 0 || tail[0] >= ctrCount {
				f.Corruptf("c: malformed key %x", rest)
				return
			}
			if n := len(f.Counters); n == 0 || f.Counters[n-1].Queue != q {
				f.Counters = append(f.Counters, check.Counters{Queue: q})
			}
			c, n := &f.Counters[len(f.Counters)-1], counterValue(v)
			switch tail[0] {
			case ctrReady:
				c.Ready = n
			case ctrDelayed:
				c.Delayed = n
			case ctrInflight:
				c.Inflight = n
			case ctrDead:
				c.Dead = n
			case ctrLeases:
				c.Leases = n
			}
		}},
		{nsAvailable, s.itemFacts(f, "a", storage.StateReady)},
		{nsInflight, s.itemFacts(f, "i", storage.StateInflight)},
		{nsDead, s.itemFacts(f, "x", storage.StateDead)},
		{nsReady, func(rest, _ []byte) {
			q, tail, err := readStr(rest)
			if err != nil || len(tail) != 1+8+16 {
				f.Corruptf("r: malformed key %x", rest)
				return
			}
			prio := tail[0]
			vis, id, _ := readTime(tail[1:])
			f.Serve = append(f.Serve, check.ServeEntry{Queue: q, Priority: prio, VisibleAt: vis, ID: storage.ItemID(id)})
		}},
		{nsDelayed, func(rest, v []byte) {
			q, tail, err := readStr(rest)
			if err != nil || len(tail) != 8+16 || len(v) != 1 {
				f.Corruptf("d: malformed key %x or value %x", rest, v)
				return
			}
			vis, tail, _ := readTime(tail)
			f.Delayed = append(f.Delayed, check.DelayedEntry{Index: "d", Queue: q, ID: storage.ItemID(tail), VisibleAt: vis, Priority: v[0], HasPriority: true})
		}},
		{nsDelayAll, func(rest, _ []byte) {
			vis, tail, err := readTime(rest)
			q, id, ok := queueID(tail)
			if err != nil || !ok {
				f.Corruptf("D: malformed key %x", rest)
				return
			}
			f.Delayed = append(f.Delayed, check.DelayedEntry{Index: "D", Queue: q, ID: id, VisibleAt: vis})
		}},
		{nsLease, func(rest, v []byte) {
			if len(rest) != 16 {
				f.Corruptf("l: malformed key %x", rest)
				return
			}
			token := storage.LeaseID(rest)
			lr, err := decodeLease(v)
			if err != nil {
				f.Corruptf("lease %s: %v", token, err)
				return
			}
			f.Leases = append(f.Leases, check.Lease{Token: token, Queue: lr.queue, ExpiresAt: lr.expiry, IDs: lr.ids})
		}},
		{nsExpiry, func(rest, _ []byte) {
			at, tail, err := readTime(rest)
			if err != nil || len(tail) != 16 {
				f.Corruptf("e: malformed key %x", rest)
				return
			}
			f.LeaseExpiries = append(f.LeaseExpiries, check.LeaseExpiry{Token: storage.LeaseID(tail), ExpiresAt: at})
		}},
		{nsDedup, func(rest, v []byte) {
			q, tail, err := readStr(rest)
			key, tail2, err2 := readStr(tail)
			if err != nil || err2 != nil || len(tail2) != 0 {
				f.Corruptf("u: malformed key %x", rest)
				return
			}
			d, err := decodeDedup(v)
			if err != nil {
				f.Corruptf("dedup key %q of %q: %v", key, q, err)
				return
			}
			if c, ok := created[q]; !ok || dedupBefore(d, c) {
				removed[dedupRef{q, key}] = d.expires
				return
			}
			f.Dedups = append(f.Dedups, check.Dedup{Queue: q, Key: key, ID: d.id, ExpiresAt: d.expires})
		}},
		{nsDedupExp, func(rest, _ []byte) {
			at, tail, err := readTime(rest)
			var q, key string
			var err2, err3 error
			if err == nil {
				q, tail, err2 = readStr(tail)
			}
			if err == nil && err2 == nil {
				key, tail, err3 = readStr(tail)
			}
			if err != nil || err2 != nil || err3 != nil || len(tail) != 0 {
				f.Corruptf("U: malformed key %x", rest)
				return
			}
			if exp, ok := removed[dedupRef{q, key}]; ok && exp.Equal(at) {
				return
			}
			f.DedupExpiries = append(f.DedupExpiries, check.DedupExpiry{Queue: q, Key: key, ExpiresAt: at})
		}},
	}
	for _, st := range steps {
		if err := s.each(tx, st.tag, st.fn); err != nil {
			return nil, err
		}
	}
	return f, s.payloadFacts(tx, f)
}

// itemFacts returns the step that reads the item records of one
// namespace.
func (s *Store) itemFacts(f *check.Facts, name string, st storage.State) func(rest, v []byte) {
	return func(rest, v []byte) {
		q, id, ok := queueID(rest)
		if !ok {
			f.Corruptf("%s: malformed key %x", name, rest)
			return
		}
		r, err := decodeRecord(v)
		if err != nil {
			f.Corruptf("%s: item %s of %q: %v", name, id, q, err)
			return
		}
		it := check.Item{Queue: q, ID: id, State: st, Priority: r.prio, VisibleAt: r.visibleAt, Attempts: r.attempts,
			MaxAttempts: r.maxAttempts, Lease: r.lease, DeathRecord: r.reason != "" || !r.deadAt.IsZero()}
		if st == storage.StateReady && r.delayed {
			it.State = storage.StateDelayed
		}
		if r.chunked {
			it.Payload, it.PayloadParts = string(r.pid[:]), int(r.nchunks)
		}
		f.Items = append(f.Items, it)
	}
}

// payloadFacts adds the chunked payloads (p), one per payload id with its
// number of chunks, each marked pending while its upload entry (P) is
// there.
func (s *Store) payloadFacts(tx kv.Tx, f *check.Facts) error {
	pending := map[string]bool{}
	if err := s.each(tx, nsUpload, func(rest, _ []byte) {
		if len(rest) != 8+16 {
			f.Corruptf("P: malformed key %x", rest)
			return
		}
		pending[string(rest[8:])] = true
	}); err != nil {
		return err
	}
	return s.each(tx, nsChunk, func(rest, _ []byte) {
		if len(rest) != 16+2 {
			f.Corruptf("p: malformed key %x", rest)
			return
		}
		pid := string(rest[:16])
		if n := len(f.Payloads); n > 0 && f.Payloads[n-1].Ref == pid {
			f.Payloads[n-1].Parts++
			return
		}
		f.Payloads = append(f.Payloads, check.Payload{Ref: pid, Parts: 1, Pending: pending[pid]})
	})
}
