package rocksstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
)

// layout: the visibility namespace holds every available item (ready and
// delayed); the delayed namespace the delayed ones.
var layout = check.Layout{ServeIndexHoldsDelayed: true, DelayedIndexes: []string{"delayed"}}

// Check implements storage.Store: it scans one consistent snapshot into
// check.Facts, reporting keys and values that do not decode, and lets
// storage/check judge them. An available record keeps its Delayed flag
// after the sweeper promotes it (the sweeper only deletes the delayed
// entry), so an available item is delayed while it has the flag and a
// delayed entry.
func (s *Store) Check(ctx context.Context) (storage.CheckReport, error) {
	if err := s.enter("check"); err != nil {
		return storage.CheckReport{}, err
	}
	defer s.exit()
	if err := s.giveBackAll(s.queuesWithPrefetch()...); err != nil {
		return storage.CheckReport{}, fmt.Errorf("rocksstore: check: %w", err)
	}
	snap := s.db.snapshot()
	defer s.db.release(snap)
	c := &checker{s: s, snap: snap}
	if err := c.run(ctx); err != nil {
		return storage.CheckReport{}, fmt.Errorf("rocksstore: check: %w", err)
	}
	return check.Run(layout, &c.f), nil
}

// CheckDir checks the database in dir like Check, without writing to it:
// the database is opened read-only (the WAL is replayed into memory only)
// and RocksDB's info log goes to a temporary directory, so no file in dir
// is created or changed. The database must not be open elsewhere for a
// consistent result. A WAL damaged before its end fails with
// ErrWALDamaged, naming the file and the range that recovery would drop.
func CheckDir(ctx context.Context, dir string) (storage.CheckReport, error) {
	logDir, err := os.MkdirTemp("", "leaseq-check-log-")
	if err != nil {
		return storage.CheckReport{}, fmt.Errorf("rocksstore: check: %w", err)
	}
	defer os.RemoveAll(logDir)
	// What Open refuses before it writes (a newer format, another
	// program's RocksDB database) check names the same way, not as
	// damage (found by review, session 71: a foreign database read as
	// "column family meta missing").
	if err := checkFamilies(dir); err != nil {
		return storage.CheckReport{}, err
	}
	// Read-only, RocksDB opens exactly the families the database has.
	names, err := listFamilies(dir)
	if err != nil {
		return storage.CheckReport{}, walOpenError(dir, translate("check: open "+dir+" read-only", err))
	}
	db, _, err := openRDBPastTornTail(dir, rdbOptions{mode: readOnly, logDir: logDir}, names)
	if err != nil {
		return storage.CheckReport{}, walOpenError(dir, translate("check: open "+dir+" read-only", err))
	}
	defer db.close()
	s := &Store{dir: dir, db: db, fams: newFamilies(db, names), log: slog.New(slog.DiscardHandler)}
	if err := s.checkLayout(); err != nil {
		return storage.CheckReport{}, err
	}
	return s.Check(ctx)
}

// checker scans one snapshot into facts.
type checker struct {
	s    *Store
	snap *rdbSnap
	f    check.Facts
}

// ns calls fn for every key of a namespace, in key order. k and v are
// valid only during fn (what the facts keep is decoded into copies). The
// scan reads each block once, so it does not fill the block cache.
func (c *checker) ns(ctx context.Context, prefix []byte, fn func(k, v []byte)) error {
	return c.s.scanViewAt(c.snap, true, prefix, dbkeys.PrefixEnd(prefix), nil, func(k, v []byte) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		fn(k, v)
		return true, nil
	})
}

type itemKey struct {
	q  string
	id [16]byte
}

func (c *checker) run(ctx context.Context) error {
	f := &c.f
	// Found by review (session 71): a format 1 database (CheckDir reads
	// it from default alone, every namespace routed there) with a key
	// outside every namespace passed, since the scans below read only the
	// namespaces' prefixes; yet Open's move to format 2 refuses that key.
	if fams := c.s.fams; fams.byNs[dbkeys.NsMeta]-1 == fams.def {
		if err := strayKeys(c.s.db, c.snap, fams.def, func(k []byte) bool {
			f.Corruptf("default: key %x is in no namespace: the move to format 2 (Open) refuses it", k)
			return ctx.Err() == nil
		}); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	// Every meta key is one of five kinds, and each must decode as Open
	// reads it (found by review, session 69: a format version or id
	// sequence that Open refuses, or any other key, passed).
	var idSeq uint64 // the id sequence's high-water mark; 0: none
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsMeta), func(k, v []byte) {
		kind := byte(0)
		if len(k) >= 2 {
			kind = k[1]
		}
		switch {
		case kind == dbkeys.MetaFormat && len(k) == 2:
			// CheckDir reads a format 1 database as it is (checkLayout).
			if n, err := dbkeys.DecodeUint64(v); err != nil || (n != formatVersion && n != format1) {
				f.Corruptf("meta: format version %x: want %d or %d (%v)", v, format1, formatVersion, err)
			}
		case kind == dbkeys.MetaIDSeq && len(k) == 2:
			n, err := dbkeys.DecodeUint64(v)
			if err != nil {
				f.Corruptf("meta: id sequence %x: %v", v, err)
				return
			}
			idSeq = n
		case kind == dbkeys.MetaQueueConfig:
			q, err := dbkeys.DecodeQueueConfigKey(k)
			if err != nil {
				f.Corruptf("meta: bad queue config key %x: %v", k, err)
				return
			}
			if _, err := dbkeys.DecodeQueueConfig(v); err != nil {
				f.Corruptf("queue %q: bad config: %v", q, err)
			}
			f.Queues = append(f.Queues, q)
		case kind == dbkeys.MetaCounters:
			q, err := dbkeys.DecodeCountersKey(k)
			if err != nil {
				f.Corruptf("meta: bad counters key %x: %v", k, err)
				return
			}
			n, err := dbkeys.DecodeCounters(v)
			if err != nil {
				f.Corruptf("queue %q: bad counters: %v", q, err)
				return
			}
			f.Counters = append(f.Counters, check.Counters{Queue: q, Ready: n.Ready, Delayed: n.Delayed, Inflight: n.Inflight, Dead: n.Dead, Leases: n.Leases})
		case kind == dbkeys.MetaDeleting:
			// A queue whose delete a crash cut short; Open finishes it.
			// The mark is written and deleted with the queue's config
			// there (configs sort before marks, so f.Queues is full).
			q, err := dbkeys.DecodeDeletingKey(k)
			if err != nil {
				f.Corruptf("meta: bad delete mark key %x: %v", k, err)
				return
			}
			if err := dbkeys.DecodeMarker(v); err != nil {
				f.Corruptf("queue %q: bad delete mark: %v", q, err)
			}
			if !slices.Contains(f.Queues, q) {
				f.Corruptf("queue %q: delete mark without a config (removeQueue deletes both in one batch; Open drops it)", q)
			}
		default:
			f.Corruptf("meta: unknown key %x", k)
		}
	}); err != nil {
		return err
	}
	defer func() {
		// Ids are issued below the stored high-water mark (allocIDs
		// stores a block's end before it issues from the block): an item
		// at or above it would be issued again after a restart, and its
		// record overwritten.
		for i := range f.Items {
			if n := dbkeys.IDSeq(f.Items[i].ID); n >= idSeq {
				f.Corruptf("meta: id sequence high-water mark %d is not above item %s of %q (sequence %d): ids issued after a restart would overwrite items", idSeq, f.Items[i].ID, f.Items[i].Queue, n)
				return
			}
		}
	}()
	// Delayed entries first: they decide which available items are delayed.
	delayed := map[itemKey]bool{}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsDelayed), func(k, _ []byte) {
		vis, q, id, err := dbkeys.DecodeDelayedKey(k)
		if err != nil {
			f.Corruptf("delayed: bad key %x: %v", k, err)
			return
		}
		delayed[itemKey{q, id}] = true
		f.Delayed = append(f.Delayed, check.DelayedEntry{Index: "delayed", Queue: q, ID: id, VisibleAt: instant(vis)})
	}); err != nil {
		return err
	}
	for _, ns := range []struct {
		b     byte
		name  string
		dec   func([]byte) (string, [16]byte, error)
		state storage.State
	}{
		{dbkeys.NsAvailable, "available", dbkeys.DecodeAvailableKey, storage.StateReady},
		{dbkeys.NsInProgress, "in_progress", dbkeys.DecodeInProgressKey, storage.StateInflight},
		{dbkeys.NsDLQ, "dlq", dbkeys.DecodeDLQKey, storage.StateDead},
	} {
		if err := c.ns(ctx, dbkeys.NamespacePrefix(ns.b), func(k, v []byte) {
			q, id, err := ns.dec(k)
			if err != nil {
				f.Corruptf("%s: bad key %x: %v", ns.name, k, err)
				return
			}
			rec, err := dbkeys.DecodeItem(v)
			if err != nil {
				f.Corruptf("%s: item %s of %q: bad record: %v", ns.name, storage.ItemID(id), q, err)
				return
			}
			it := check.Item{Queue: q, ID: id, State: ns.state, Priority: rec.Priority, VisibleAt: instant(rec.VisibleAt),
				Attempts: rec.Attempts, MaxAttempts: rec.MaxAttempts, DeathRecord: rec.Dead}
			if ns.state == storage.StateReady && rec.Delayed && delayed[itemKey{q, id}] {
				it.State = storage.StateDelayed
			}
			if rec.HasLease {
				it.Lease = rec.Lease
			}
			if rec.PayloadExternal {
				it.Payload, it.PayloadParts = string(dbkeys.PayloadKey(q, id)), 1
			}
			f.Items = append(f.Items, it)
		}); err != nil {
			return err
		}
	}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsVisibility), func(k, _ []byte) {
		q, prio, vis, id, err := dbkeys.DecodeVisibilityKey(k)
		if err != nil {
			f.Corruptf("visibility: bad key %x: %v", k, err)
			return
		}
		f.Serve = append(f.Serve, check.ServeEntry{Queue: q, Priority: prio, VisibleAt: instant(vis), ID: id})
	}); err != nil {
		return err
	}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsLeases), func(k, v []byte) {
		token, err := dbkeys.DecodeLeaseKey(k)
		if err != nil {
			f.Corruptf("leases: bad key %x: %v", k, err)
			return
		}
		lr, err := dbkeys.DecodeLease(v)
		if err != nil {
			f.Corruptf("lease %s: bad record: %v", storage.LeaseID(token), err)
			return
		}
		l := check.Lease{Token: token, Queue: lr.Queue, ExpiresAt: instant(lr.ExpiresAt), IDs: make([]storage.ItemID, len(lr.IDs))}
		for i, id := range lr.IDs {
			l.IDs[i] = id
		}
		f.Leases = append(f.Leases, l)
	}); err != nil {
		return err
	}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsLeaseExpiry), func(k, _ []byte) {
		exp, token, err := dbkeys.DecodeLeaseExpiryKey(k)
		if err != nil {
			f.Corruptf("lease_expiry: bad key %x: %v", k, err)
			return
		}
		f.LeaseExpiries = append(f.LeaseExpiries, check.LeaseExpiry{Token: token, ExpiresAt: instant(exp)})
	}); err != nil {
		return err
	}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsDedup), func(k, v []byte) {
		q, key, err := dbkeys.DecodeDedupKey(k)
		if err != nil {
			f.Corruptf("dedup: bad key %x: %v", k, err)
			return
		}
		rec, err := dbkeys.DecodeDedup(v)
		if err != nil {
			f.Corruptf("dedup key %q of %q: bad record: %v", key, q, err)
			return
		}
		f.Dedups = append(f.Dedups, check.Dedup{Queue: q, Key: key, ID: rec.ID, ExpiresAt: instant(rec.ExpiresAt)})
	}); err != nil {
		return err
	}
	if err := c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsDedupExpiry), func(k, _ []byte) {
		exp, q, key, err := dbkeys.DecodeDedupExpiryKey(k)
		if err != nil {
			f.Corruptf("dedup_expiry: bad key %x: %v", k, err)
			return
		}
		f.DedupExpiries = append(f.DedupExpiries, check.DedupExpiry{Queue: q, Key: key, ExpiresAt: instant(exp)})
	}); err != nil {
		return err
	}
	return c.ns(ctx, dbkeys.NamespacePrefix(dbkeys.NsPayload), func(k, v []byte) {
		if _, _, err := dbkeys.DecodePayloadKey(k); err != nil {
			f.Corruptf("payload: bad key %x: %v", k, err)
			return
		}
		if _, err := dbkeys.DecodePayload(v); err != nil {
			// A poll of its item would fail every time.
			f.Corruptf("payload %x: bad value: %v", k, err)
		}
		f.Payloads = append(f.Payloads, check.Payload{Ref: string(k), Parts: 1})
	})
}

// strayKeys calls fn with a copy of each key of family fam, read at snap
// (nil: the latest), whose first byte is no namespace of dbkeys, in key
// order, until fn returns false. It seeks past each namespace's keys, so
// it reads the stray keys and about one key per namespace, not the whole
// family: the move to format 2 runs it before its first write, and check
// on a format 1 database.
func strayKeys(db *rdb, snap *rdbSnap, fam int, fn func(k []byte) bool) error {
	it := db.iter(snap, fam, nil, nil, true)
	defer it.close()
	for ok := it.seek(nil); ok; {
		k := it.key
		if len(k) > 0 && familyNames[k[0]] != "" {
			if k[0] == 0xff {
				break
			}
			ok = it.seek([]byte{k[0] + 1})
			continue
		}
		if !fn(bytes.Clone(k)) {
			return nil
		}
		ok = it.next()
	}
	return translate("iterate", it.err)
}
