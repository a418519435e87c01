package rocksstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/linxGnu/grocksdb"

	"github.com/leaseq/leaseq/storage"
)

// engine hides the two RocksDB transaction flavours behind what the store
// uses: transactions, and non-transactional reads and writes.
type engine interface {
	begin(wo *grocksdb.WriteOptions, old *grocksdb.Transaction) *grocksdb.Transaction
	get(ro *grocksdb.ReadOptions, key []byte) (*grocksdb.Slice, error)
	iterator(ro *grocksdb.ReadOptions) *grocksdb.Iterator
	put(wo *grocksdb.WriteOptions, key, value []byte) error
	// write commits a batch of blind writes (keys no transaction can be
	// holding: fresh ids) without a transaction's indexing.
	write(wo *grocksdb.WriteOptions, wb *grocksdb.WriteBatch) error
	snapshot() *grocksdb.Snapshot
	releaseSnapshot(*grocksdb.Snapshot)
	// flush writes the memtables to SST files, so the next Open replays
	// no WAL.
	flush() error
	close()
}

func flushWith(f func(*grocksdb.FlushOptions) error) error {
	fo := grocksdb.NewDefaultFlushOptions()
	defer fo.Destroy()
	fo.SetWait(true)
	return f(fo)
}

type pessimisticEngine struct {
	db   *grocksdb.TransactionDB
	tdbo *grocksdb.TransactionDBOptions
	txo  *grocksdb.TransactionOptions
}

// lockTimeoutMillis bounds how long a transaction waits for a row lock
// before it is rolled back and retried. Locks are held across an fsync
// (a few hundred µs here), so waits are short; a deadlock between, say,
// purge (item then lease) and ack (lease then item) is broken by detection
// or, failing that, by this timeout.
const lockTimeoutMillis = 1000

func openPessimistic(opts *grocksdb.Options, dir string) (engine, error) {
	tdbo := grocksdb.NewDefaultTransactionDBOptions()
	tdbo.SetTransactionLockTimeout(lockTimeoutMillis)
	db, err := grocksdb.OpenTransactionDb(opts, tdbo, dir)
	if err != nil {
		tdbo.Destroy()
		return nil, err
	}
	txo := grocksdb.NewDefaultTransactionOptions()
	txo.SetDeadlockDetect(true)
	txo.SetLockTimeout(lockTimeoutMillis)
	return &pessimisticEngine{db: db, tdbo: tdbo, txo: txo}, nil
}

func (e *pessimisticEngine) begin(wo *grocksdb.WriteOptions, old *grocksdb.Transaction) *grocksdb.Transaction {
	return e.db.TransactionBegin(wo, e.txo, old)
}

func (e *pessimisticEngine) get(ro *grocksdb.ReadOptions, key []byte) (*grocksdb.Slice, error) {
	return e.db.Get(ro, key)
}

func (e *pessimisticEngine) iterator(ro *grocksdb.ReadOptions) *grocksdb.Iterator {
	return e.db.NewIterator(ro)
}

func (e *pessimisticEngine) put(wo *grocksdb.WriteOptions, key, value []byte) error {
	return e.db.Put(wo, key, value)
}

func (e *pessimisticEngine) write(wo *grocksdb.WriteOptions, wb *grocksdb.WriteBatch) error {
	// TransactionDB still locks the batch's keys (briefly, no waiting on
	// fresh keys) but skips the transaction's write-batch index.
	return e.db.Write(wo, wb)
}

func (e *pessimisticEngine) snapshot() *grocksdb.Snapshot { return e.db.NewSnapshot() }

func (e *pessimisticEngine) releaseSnapshot(s *grocksdb.Snapshot) { e.db.ReleaseSnapshot(s) }

func (e *pessimisticEngine) flush() error { return flushWith(e.db.Flush) }

func (e *pessimisticEngine) close() {
	e.db.Close()
	e.txo.Destroy()
	e.tdbo.Destroy()
}

type optimisticEngine struct {
	db   *grocksdb.OptimisticTransactionDB
	base *grocksdb.DB
	txo  *grocksdb.OptimisticTransactionOptions
}

func openOptimistic(opts *grocksdb.Options, dir string) (engine, error) {
	db, err := grocksdb.OpenOptimisticTransactionDb(opts, dir)
	if err != nil {
		return nil, err
	}
	return &optimisticEngine{db: db, base: db.GetBaseDB(), txo: grocksdb.NewDefaultOptimisticTransactionOptions()}, nil
}

func (e *optimisticEngine) begin(wo *grocksdb.WriteOptions, old *grocksdb.Transaction) *grocksdb.Transaction {
	return e.db.TransactionBegin(wo, e.txo, old)
}

func (e *optimisticEngine) get(ro *grocksdb.ReadOptions, key []byte) (*grocksdb.Slice, error) {
	return e.base.Get(ro, key)
}

func (e *optimisticEngine) iterator(ro *grocksdb.ReadOptions) *grocksdb.Iterator {
	return e.base.NewIterator(ro)
}

func (e *optimisticEngine) put(wo *grocksdb.WriteOptions, key, value []byte) error {
	return e.base.Put(wo, key, value)
}

func (e *optimisticEngine) write(wo *grocksdb.WriteOptions, wb *grocksdb.WriteBatch) error {
	return e.base.Write(wo, wb)
}

func (e *optimisticEngine) snapshot() *grocksdb.Snapshot { return e.base.NewSnapshot() }

func (e *optimisticEngine) releaseSnapshot(s *grocksdb.Snapshot) { e.base.ReleaseSnapshot(s) }

func (e *optimisticEngine) flush() error { return flushWith(e.base.Flush) }

func (e *optimisticEngine) close() {
	e.db.CloseBaseDB(e.base)
	e.db.Close()
	e.txo.Destroy()
}

// errRetry marks a transaction failure that is safe to retry: a write
// conflict (optimistic), a lock timeout or deadlock (pessimistic).
var errRetry = errors.New("rocksstore: transaction conflict")

// translate is the one place grocksdb errors become this package's errors.
// grocksdb reports a RocksDB Status only as its message text, so the Status
// code is recovered from the fixed prefix RocksDB's Status::ToString puts
// first ("Resource busy: ", "Operation timed out: ", ...). Conflicts and
// lock timeouts become errRetry; corruption becomes storage.ErrCorrupt;
// anything else is wrapped as an I/O failure.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "Resource busy"),
		strings.HasPrefix(msg, "Operation timed out"),
		strings.HasPrefix(msg, "Operation failed. Try again."),
		strings.HasPrefix(msg, "Operation aborted"),
		strings.Contains(msg, "Deadlock"):
		return fmt.Errorf("%w: %s: %v", errRetry, op, err)
	case strings.HasPrefix(msg, "Corruption"):
		return fmt.Errorf("rocksstore: %s: %w: %v", op, storage.ErrCorrupt, err)
	}
	return fmt.Errorf("rocksstore: %s: rocksdb: %v", op, err)
}
