package rocksstore

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/linxGnu/grocksdb"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// maxViolations caps the report so a badly broken database does not
// produce gigabytes of text.
const maxViolations = 1000

type checkEntry struct {
	ns  byte
	rec dbkeys.ItemRecord
	vis int // visibility entries seen (available items)
	del bool
	// leases listing this id (in_progress items)
	listed int
}

type checkKey struct {
	q  string
	id storage.ItemID
}

// Check implements storage.Store: a full scan of one consistent snapshot
// verifying the invariants of DESIGN.md: (1) every item is in exactly one
// of available, in_progress, dlq; (2) available items and visibility (and
// delayed) entries match one to one; (3) every in_progress item is listed
// by exactly one lease, every lease has exactly one expiry entry and lists
// no missing item; (4) persisted counters equal the scan; (5) attempts do
// not exceed an item's own max_attempts outside the dlq. It also checks
// external payloads and that every item's queue exists.
func (s *Store) Check(ctx context.Context) (storage.CheckReport, error) {
	if err := s.enter("check"); err != nil {
		return storage.CheckReport{}, err
	}
	defer s.exit()
	snap := s.rd.NewSnapshot()
	ro := grocksdb.NewDefaultReadOptions()
	ro.SetSnapshot(snap)
	defer func() {
		ro.Destroy()
		s.rd.ReleaseSnapshot(snap)
	}()
	c := &checker{s: s, ro: ro, snap: snap, items: map[checkKey]*checkEntry{}, counts: map[string]*dbkeys.Counters{}, queues: map[string]bool{}}
	if err := c.run(ctx); err != nil {
		return storage.CheckReport{}, fmt.Errorf("rocksstore: check: %w", err)
	}
	return c.rep, nil
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
	o := grocksdb.NewDefaultOptions()
	o.SetMergeOperator(countersMerge{})
	o.SetWALRecoveryMode(walRecoveryMode(false))
	o.SetDbLogDir(logDir)
	o.SetInfoLogLevel(grocksdb.WarnInfoLogLevel)
	db, err := grocksdb.OpenDbForReadOnly(o, dir, false)
	if err != nil {
		return storage.CheckReport{}, walOpenError(dir, translate("check: open "+dir+" read-only", err))
	}
	defer db.Close()
	s := &Store{dir: dir, rd: db, log: slog.New(slog.DiscardHandler)}
	s.ro = grocksdb.NewDefaultReadOptions()
	defer s.ro.Destroy()
	return s.Check(ctx)
}

type checker struct {
	s      *Store
	ro     *grocksdb.ReadOptions // point reads at snap
	snap   *grocksdb.Snapshot
	rep    storage.CheckReport
	items  map[checkKey]*checkEntry
	counts map[string]*dbkeys.Counters
	queues map[string]bool
}

func (c *checker) bad(format string, args ...any) {
	if len(c.rep.Violations) < maxViolations {
		c.rep.Violations = append(c.rep.Violations, fmt.Sprintf(format, args...))
	}
}

func (c *checker) count(q string) *dbkeys.Counters {
	n := c.counts[q]
	if n == nil {
		n = &dbkeys.Counters{}
		c.counts[q] = n
	}
	return n
}

func (c *checker) ns(ctx context.Context, ns byte, fn func(k, v []byte) error) error {
	lower := dbkeys.NamespacePrefix(ns)
	return c.s.scanAt(c.snap, lower, dbkeys.PrefixEnd(lower), nil, func(k, v []byte) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		return true, fn(k, v)
	})
}

func (c *checker) run(ctx context.Context) error {
	// Queues and their configs.
	cfgs := map[string]storage.QueueConfig{}
	if err := c.s.scanAt(c.snap, dbkeys.QueueConfigPrefix(), dbkeys.PrefixEnd(dbkeys.QueueConfigPrefix()), nil, func(k, v []byte) (bool, error) {
		q, err := dbkeys.DecodeQueueConfigKey(k)
		if err != nil {
			c.bad("meta: bad queue config key %x: %v", k, err)
			return true, nil
		}
		r, err := dbkeys.DecodeQueueConfig(v)
		if err != nil {
			c.bad("queue %q: bad config: %v", q, err)
		}
		c.queues[q] = true
		cfgs[q] = configFromRecord(r)
		return true, nil
	}); err != nil {
		return err
	}

	// Items in the three namespaces (invariant 1).
	for _, ns := range []struct {
		b    byte
		name string
		dec  func([]byte) (string, [16]byte, error)
	}{{dbkeys.NsAvailable, "available", dbkeys.DecodeAvailableKey}, {dbkeys.NsInProgress, "in_progress", dbkeys.DecodeInProgressKey}, {dbkeys.NsDLQ, "dlq", dbkeys.DecodeDLQKey}} {
		err := c.ns(ctx, ns.b, func(k, v []byte) error {
			q, id, err := ns.dec(k)
			if err != nil {
				c.bad("%s: bad key %x: %v", ns.name, k, err)
				return nil
			}
			rec, err := dbkeys.DecodeItem(v)
			if err != nil {
				c.bad("%s: item %s of %q: bad record: %v", ns.name, storage.ItemID(id), q, err)
				return nil
			}
			c.rep.Items++
			if !c.queues[q] {
				c.bad("%s: item %s belongs to unknown queue %q", ns.name, storage.ItemID(id), q)
			}
			key := checkKey{q, id}
			if prev := c.items[key]; prev != nil {
				c.bad("invariant 1: item %s of %q is in both %s and %s", storage.ItemID(id), q, nsName(prev.ns), ns.name)
				return nil
			}
			c.items[key] = &checkEntry{ns: ns.b, rec: rec}
			n := c.count(q)
			switch ns.b {
			case dbkeys.NsAvailable:
				n.Ready++ // corrected by delayed entries below
				if rec.HasLease || rec.Dead {
					c.bad("available: item %s of %q carries a lease or death record", storage.ItemID(id), q)
				}
			case dbkeys.NsInProgress:
				n.Inflight++
				if !rec.HasLease {
					c.bad("invariant 3: in_progress item %s of %q has no lease", storage.ItemID(id), q)
				}
			case dbkeys.NsDLQ:
				n.Dead++
				if !rec.Dead {
					c.bad("dlq: item %s of %q has no death record", storage.ItemID(id), q)
				}
			}
			// Invariant 5: a queue's max_attempts may be lowered by
			// SetQueueConfig, so only an item's own limit is binding.
			if m := rec.MaxAttempts; m > 0 && ns.b != dbkeys.NsDLQ && rec.Attempts > m {
				c.bad("invariant 5: item %s of %q has %d attempts, max %d", storage.ItemID(id), q, rec.Attempts, m)
			}
			if rec.PayloadExternal {
				_, ok, err := c.s.getAt(c.ro, dbkeys.PayloadKey(q, id))
				if err != nil {
					return err
				}
				if !ok {
					c.bad("item %s of %q: external payload missing", storage.ItemID(id), q)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}

	// Invariant 2: visibility entries.
	if err := c.ns(ctx, dbkeys.NsVisibility, func(k, v []byte) error {
		q, prio, vis, id, err := dbkeys.DecodeVisibilityKey(k)
		if err != nil {
			c.bad("visibility: bad key %x: %v", k, err)
			return nil
		}
		it := c.items[checkKey{q, id}]
		switch {
		case it == nil || it.ns != dbkeys.NsAvailable:
			c.bad("invariant 2: visibility entry for %s of %q, which is not available", storage.ItemID(id), q)
		case it.rec.Priority != prio || it.rec.VisibleAt != vis:
			c.bad("invariant 2: visibility entry of %s of %q does not match its record", storage.ItemID(id), q)
		default:
			it.vis++
		}
		return nil
	}); err != nil {
		return err
	}
	// Delayed entries: each names a delayed available item.
	if err := c.ns(ctx, dbkeys.NsDelayed, func(k, v []byte) error {
		vis, q, id, err := dbkeys.DecodeDelayedKey(k)
		if err != nil {
			c.bad("delayed: bad key %x: %v", k, err)
			return nil
		}
		it := c.items[checkKey{q, id}]
		switch {
		case it == nil || it.ns != dbkeys.NsAvailable:
			c.bad("delayed entry for %s of %q, which is not available", storage.ItemID(id), q)
		case !it.rec.Delayed || it.rec.VisibleAt != vis:
			c.bad("delayed entry of %s of %q does not match its record", storage.ItemID(id), q)
		case it.del:
			c.bad("item %s of %q has two delayed entries", storage.ItemID(id), q)
		default:
			it.del = true
			n := c.count(q)
			n.Ready--
			n.Delayed++
		}
		return nil
	}); err != nil {
		return err
	}

	// Invariant 3: leases and expiry entries.
	leaseExp := map[storage.LeaseID]int64{}
	if err := c.ns(ctx, dbkeys.NsLeases, func(k, v []byte) error {
		token, err := dbkeys.DecodeLeaseKey(k)
		if err != nil {
			c.bad("leases: bad key %x: %v", k, err)
			return nil
		}
		lr, err := dbkeys.DecodeLease(v)
		if err != nil {
			c.bad("lease %s: bad record: %v", storage.LeaseID(token), err)
			return nil
		}
		c.rep.Leases++
		leaseExp[token] = lr.ExpiresAt
		c.count(lr.Queue).Leases++
		if len(lr.IDs) == 0 {
			c.bad("invariant 3: lease %s lists no items", storage.LeaseID(token))
		}
		for _, id := range lr.IDs {
			it := c.items[checkKey{lr.Queue, id}]
			switch {
			case it == nil || it.ns != dbkeys.NsInProgress:
				c.bad("invariant 3: lease %s lists %s of %q, which is not in progress", storage.LeaseID(token), storage.ItemID(id), lr.Queue)
			case it.rec.Lease != token:
				c.bad("invariant 3: lease %s lists %s of %q, which is held by lease %s", storage.LeaseID(token), storage.ItemID(id), lr.Queue, storage.LeaseID(it.rec.Lease))
			default:
				it.listed++
			}
		}
		return nil
	}); err != nil {
		return err
	}
	seenExp := map[storage.LeaseID]int{}
	if err := c.ns(ctx, dbkeys.NsLeaseExpiry, func(k, v []byte) error {
		exp, token, err := dbkeys.DecodeLeaseExpiryKey(k)
		if err != nil {
			c.bad("lease_expiry: bad key %x: %v", k, err)
			return nil
		}
		want, ok := leaseExp[token]
		switch {
		case !ok:
			c.bad("invariant 3: expiry entry of missing lease %s", storage.LeaseID(token))
		case want != exp:
			c.bad("invariant 3: expiry entry of lease %s does not match its record", storage.LeaseID(token))
		default:
			seenExp[token]++
		}
		return nil
	}); err != nil {
		return err
	}
	for token := range leaseExp {
		if seenExp[token] != 1 {
			c.bad("invariant 3: lease %s has %d expiry entries, want 1", token, seenExp[token])
		}
	}

	for key, it := range c.items {
		switch it.ns {
		case dbkeys.NsAvailable:
			if it.vis != 1 {
				c.bad("invariant 2: available item %s of %q has %d visibility entries, want 1", key.id, key.q, it.vis)
			}
		case dbkeys.NsInProgress:
			if it.listed != 1 {
				c.bad("invariant 3: in_progress item %s of %q is listed by %d leases, want 1", key.id, key.q, it.listed)
			}
		}
	}

	// Orphan payloads.
	if err := c.ns(ctx, dbkeys.NsPayload, func(k, v []byte) error {
		q, id, err := dbkeys.DecodePayloadKey(k)
		if err != nil {
			c.bad("payload: bad key %x: %v", k, err)
			return nil
		}
		if it := c.items[checkKey{q, id}]; it == nil || !it.rec.PayloadExternal {
			c.bad("payload of %s of %q has no item", storage.ItemID(id), q)
		}
		return nil
	}); err != nil {
		return err
	}

	// Invariant 4: persisted counters against the scan. (An available item
	// with the Delayed flag but no delayed entry was promoted by the
	// sweeper, which does not rewrite records: it counts as ready.)
	for q := range c.queues {
		persisted, err := c.s.readCounters(c.ro, q)
		if err != nil {
			return err
		}
		want := c.count(q)
		got := dbkeys.Counters{Ready: persisted.Ready, Delayed: persisted.Delayed, Inflight: persisted.Inflight, Dead: persisted.Dead, Leases: persisted.Leases}
		scan := dbkeys.Counters{Ready: want.Ready, Delayed: want.Delayed, Inflight: want.Inflight, Dead: want.Dead, Leases: want.Leases}
		if got != scan {
			c.bad("invariant 4: queue %q: persisted counters %+v, scan counts %+v", q, got, scan)
		}
	}
	for q := range c.counts {
		if !c.queues[q] {
			c.bad("counts for unknown queue %q", q)
		}
	}
	return nil
}

func nsName(b byte) string {
	switch b {
	case dbkeys.NsAvailable:
		return "available"
	case dbkeys.NsInProgress:
		return "in_progress"
	case dbkeys.NsDLQ:
		return "dlq"
	}
	return fmt.Sprintf("namespace 0x%02x", b)
}
