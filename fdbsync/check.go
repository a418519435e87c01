package fdbsync

import (
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Check implements storage.Store with one consistent full scan (one read
// version). On a real cluster a database too large to scan within 5 s
// fails with transaction_too_old; Check is for tests and small deployments.
func (s *Store) Check(ctx context.Context) (storage.CheckReport, error) {
	if err := s.checkOpen(); err != nil {
		return storage.CheckReport{}, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) { return s.check(tx) })
	if err != nil {
		return storage.CheckReport{}, fmt.Errorf("fdbsync: check: %w", err)
	}
	return as[storage.CheckReport](v)
}

type itemRef struct {
	q  string
	id storage.ItemID
}

func (s *Store) scan(tx kv.Tx, tag byte) ([]kv.KeyValue, []byte, error) {
	pre := s.k.ns(tag)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true})
	return rows, pre, err
}

func (s *Store) check(tx kv.Tx) (storage.CheckReport, error) {
	var rep storage.CheckReport
	bad := func(f string, a ...any) { rep.Violations = append(rep.Violations, fmt.Sprintf(f, a...)) }

	queues, err := s.queueNames(tx)
	if err != nil {
		return rep, err
	}
	cfgs := map[string]storage.QueueConfig{}
	for _, q := range queues {
		c, _, err := s.config(tx, q)
		if err != nil {
			return rep, err
		}
		cfgs[q] = c
	}
	type counts struct{ ready, delayed, inflight, dead, leases int64 }
	cnt := map[string]*counts{}
	get := func(q string) *counts {
		if cnt[q] == nil {
			cnt[q] = &counts{}
		}
		return cnt[q]
	}
	where := map[itemRef]string{}
	records := map[itemRef]record{}
	// Per-queue id namespaces: a, i, x.
	for _, ns := range []struct {
		tag  byte
		name string
	}{{nsAvailable, "available"}, {nsInflight, "in_progress"}, {nsDead, "dlq"}} {
		rows, pre, err := s.scan(tx, ns.tag)
		if err != nil {
			return rep, err
		}
		for _, row := range rows {
			q, tail, err := readStr(row.Key[len(pre):])
			if err != nil || len(tail) != 16 {
				bad("%s: malformed key %x", ns.name, row.Key)
				continue
			}
			var id storage.ItemID
			copy(id[:], tail)
			ref := itemRef{q, id}
			if prev, ok := where[ref]; ok {
				bad("item %s/%s in both %s and %s", q, id, prev, ns.name)
			}
			where[ref] = ns.name
			r, err := decodeRecord(row.Value)
			if err != nil {
				bad("item %s/%s in %s: %v", q, id, ns.name, err)
				continue
			}
			rep.Items++
			switch ns.tag {
			case nsAvailable:
				records[ref] = r
			case nsInflight:
				records[ref] = r
				get(q).inflight++
			case nsDead:
				get(q).dead++
			}
			if ns.tag != nsDead {
				if max := maxAttempts(&r, cfgs[q]); r.maxAttempts != 0 && r.attempts > max {
					bad("item %s/%s has %d attempts over max %d", q, id, r.attempts, max)
				}
			}
			if _, ok := cfgs[q]; !ok {
				bad("item %s/%s in unknown queue", q, id)
			}
		}
	}
	// Index entries must match available records one to one.
	indexed := map[itemRef]int{}
	rows, pre, err := s.scan(tx, nsReady)
	if err != nil {
		return rep, err
	}
	for _, row := range rows {
		q, tail, err := readStr(row.Key[len(pre):])
		if err != nil || len(tail) != 1+8+16 {
			bad("visibility_index: malformed key %x", row.Key)
			continue
		}
		vis, _, _ := readTime(tail[1:])
		var id storage.ItemID
		copy(id[:], tail[9:])
		ref := itemRef{q, id}
		indexed[ref]++
		get(q).ready++
		r, ok := records[ref]
		if !ok || where[ref] != "available" || r.delayed || r.prio != tail[0] || !r.visibleAt.Equal(vis) {
			bad("ready index entry %s/%s does not match an available ready item", q, id)
		}
	}
	rows, pre, err = s.scan(tx, nsDelayed)
	if err != nil {
		return rep, err
	}
	for _, row := range rows {
		q, tail, err := readStr(row.Key[len(pre):])
		if err != nil || len(tail) != 8+16 {
			bad("delayed index: malformed key %x", row.Key)
			continue
		}
		vis, _, _ := readTime(tail)
		var id storage.ItemID
		copy(id[:], tail[8:])
		ref := itemRef{q, id}
		indexed[ref]++
		get(q).delayed++
		r, ok := records[ref]
		if !ok || where[ref] != "available" || !r.delayed || !r.visibleAt.Equal(vis) {
			bad("delayed index entry %s/%s does not match an available delayed item", q, id)
		}
		if v, err := tx.Get(s.k.delayAll(vis, q, id), true); err != nil {
			return rep, err
		} else if v == nil {
			bad("delayed item %s/%s missing from the global delayed index", q, id)
		}
	}
	rows, _, err = s.scan(tx, nsDelayAll)
	if err != nil {
		return rep, err
	}
	delayedCount := 0
	for _, c := range cnt {
		delayedCount += int(c.delayed)
	}
	if len(rows) != delayedCount {
		bad("global delayed index has %d entries, per-queue index %d", len(rows), delayedCount)
	}
	for ref, name := range where {
		if name == "available" && indexed[ref] != 1 {
			bad("available item %s/%s has %d index entries", ref.q, ref.id, indexed[ref])
		}
	}
	// Leases: each inflight item listed by exactly its lease; each lease
	// has one expiry entry and lists no missing item.
	listed := map[itemRef]int{}
	rows, pre, err = s.scan(tx, nsLease)
	if err != nil {
		return rep, err
	}
	expiries := map[storage.LeaseID]time.Time{}
	for _, row := range rows {
		var lease storage.LeaseID
		copy(lease[:], row.Key[len(pre):])
		lr, err := decodeLease(row.Value)
		if err != nil {
			bad("lease %s: %v", lease, err)
			continue
		}
		rep.Leases++
		get(lr.queue).leases++
		expiries[lease] = lr.expiry
		if len(lr.ids) == 0 {
			bad("lease %s lists no items", lease)
		}
		for _, id := range lr.ids {
			ref := itemRef{lr.queue, id}
			listed[ref]++
			r, ok := records[ref]
			if !ok || where[ref] != "in_progress" || r.lease != lease {
				bad("lease %s lists %s/%s which it does not hold", lease, lr.queue, id)
			}
		}
	}
	for ref, name := range where {
		if name == "in_progress" && listed[ref] != 1 {
			bad("inflight item %s/%s listed by %d leases", ref.q, ref.id, listed[ref])
		}
	}
	rows, pre, err = s.scan(tx, nsExpiry)
	if err != nil {
		return rep, err
	}
	seenExp := map[storage.LeaseID]int{}
	for _, row := range rows {
		at, tail, err := readTime(row.Key[len(pre):])
		if err != nil || len(tail) != 16 {
			bad("lease_expiry: malformed key %x", row.Key)
			continue
		}
		var lease storage.LeaseID
		copy(lease[:], tail)
		seenExp[lease]++
		if exp, ok := expiries[lease]; !ok || !exp.Equal(at) {
			bad("lease_expiry entry for %s does not match a lease", lease)
		}
	}
	for lease := range expiries {
		if seenExp[lease] != 1 {
			bad("lease %s has %d expiry entries", lease, seenExp[lease])
		}
	}
	// Counters equal the scan.
	for _, q := range queues {
		c, err := s.counters(tx, q)
		if err != nil {
			return rep, err
		}
		want := get(q)
		for _, x := range []struct {
			name      string
			got, want int64
		}{
			{"ready", c[ctrReady], want.ready}, {"delayed", c[ctrDelayed], want.delayed},
			{"inflight", c[ctrInflight], want.inflight}, {"dead", c[ctrDead], want.dead},
			{"leases", c[ctrLeases], want.leases},
		} {
			if x.got != x.want {
				bad("queue %s: %s counter %d, scan %d", q, x.name, x.got, x.want)
			}
		}
	}
	return rep, nil
}
