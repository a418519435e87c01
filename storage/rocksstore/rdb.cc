// rdb.cc: see rdb.h. Only RocksDB's public C++ headers are used.
#include "rdb.h"

#include <map>

#include <rocksdb/env.h>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/merge_operator.h>
#include <rocksdb/perf_level.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/transaction_log.h>
#include <rocksdb/utilities/table_properties_collectors.h>
#include <rocksdb/utilities/transaction.h>
#include <rocksdb/utilities/transaction_db.h>
#include <rocksdb/utilities/write_batch_with_index.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerowal.h"

using namespace rocksdb;

namespace {

// countersMerge adds leaseq's queue counters (dbkeys.Counters: a format
// byte, then 14 big-endian int64 fields). Its name is recorded in the
// OPTIONS file: part of the on-disk format.
class CountersMerge : public MergeOperator {
 public:
  static constexpr int kFields = 14;
  static constexpr size_t kLen = 1 + kFields * 8;
  static constexpr char kFormat = 1;

  const char* Name() const override { return "leaseq.counters.v1"; }

  // Batches write counters whole since 2026-11-29; databases written
  // before hold one operand per batch that changed them. Sum a key's
  // operands in one pass, with one allocation for the result, instead of
  // pairwise.
  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    uint64_t sum[kFields] = {};
    if (in.existing_value != nullptr && !add(sum, *in.existing_value)) return false;
    for (const Slice& op : in.operand_list) {
      if (!add(sum, op)) return false;
    }
    encode(sum, &out->new_value);
    return true;
  }

  bool PartialMergeMulti(const Slice&, const std::deque<Slice>& ops, std::string* out,
                         Logger*) const override {
    uint64_t sum[kFields] = {};
    for (const Slice& op : ops) {
      if (!add(sum, op)) return false;
    }
    encode(sum, out);
    return true;
  }

 private:
  // add adds v's fields to sum (two's complement: negative deltas wrap
  // back); false if v is not a counters value.
  static bool add(uint64_t* sum, const Slice& v) {
    if (v.size() != kLen || v[0] != kFormat) return false;
    const char* p = v.data() + 1;
    for (int i = 0; i < kFields; i++) sum[i] += get(p + 8 * i);
    return true;
  }

  static void encode(const uint64_t* sum, std::string* out) {
    out->resize(kLen);
    char* p = &(*out)[0];
    p[0] = kFormat;
    for (int i = 0; i < kFields; i++) put(p + 1 + 8 * i, sum[i]);
  }

  static uint64_t get(const char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return bigEndian(v);
  }

  static void put(char* p, uint64_t v) {
    v = bigEndian(v);
    std::memcpy(p, &v, 8);
  }

  // bigEndian converts between host order and big-endian (its own
  // inverse).
  static uint64_t bigEndian(uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap64(v);
#else
    return v;
#endif
  }
};

// quiet turns RocksDB's per-thread perf context off on the calling thread
// (once per thread). It counts, by default, every key comparison and
// memtable seek into a thread-local struct that nothing here reads; a
// cgo call may run on any of Go's threads, so each entry point below that
// does real work calls this first.
void quiet() {
  static thread_local bool done = false;
  if (!done) {
    SetPerfLevel(PerfLevel::kDisable);
    done = true;
  }
}

char* dup(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = 0;
  return p;
}

int fail(const Status& s, char** err) {
  *err = dup(s.ToString());
  return -1;
}

// errOf is s's message (malloc'd), or NULL when s is ok: what the calls
// that report an error without an out-parameter return.
char* errOf(const Status& s) { return s.ok() ? nullptr : dup(s.ToString()); }

uint32_t u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// HeldLock gives RocksDB the LOCK that lq_open took before it touched
// the directory. A writable open that fails on the lock must change
// nothing; RocksDB's DB::Open takes the lock only after it has rotated
// the info log (renaming the running store's LOG), and lq_open prepares
// or removes the WAL spare (zerowal.h) before DB::Open: both would hit
// the store that holds the directory. So lq_open locks first, and DB::Open
// gets that same lock here instead of locking again (RocksDB refuses a
// lock its own process holds). Found by review (session 71): a refused
// second open deleted the running store's spare WAL.
class HeldLock : public FileSystemWrapper {
 public:
  HeldLock(const std::shared_ptr<FileSystem>& base, std::string name, FileLock* lock)
      : FileSystemWrapper(base), name_(std::move(name)), held_(lock) {}
  ~HeldLock() override {
    if (held_ != nullptr) target()->UnlockFile(held_, IOOptions(), nullptr);  // DB::Open failed before locking
  }

  static const char* kClassName() { return "leaseq.HeldLock"; }
  const char* Name() const override { return kClassName(); }

  IOStatus LockFile(const std::string& fname, const IOOptions& o, FileLock** lock, IODebugContext* dbg) override {
    if (held_ != nullptr && fname == name_) {
      *lock = held_;
      held_ = nullptr;  // RocksDB's now: it unlocks it on close
      return IOStatus::OK();
    }
    return target()->LockFile(fname, o, lock, dbg);
  }

 private:
  const std::string name_;
  FileLock* held_;
};

// lockDir takes RocksDB's LOCK of dir (nullptr in *lock if dir does not
// exist yet: DB::Open creates it, and nothing else can hold it).
Status lockDir(const std::string& dir, FileLock** lock) {
  *lock = nullptr;
  const auto& fs = FileSystem::Default();
  if (!fs->FileExists(dir, IOOptions(), nullptr).ok()) return Status::OK();
  IOStatus s = fs->LockFile(dir + "/LOCK", IOOptions(), lock, nullptr);
  if (!s.ok()) {
    *lock = nullptr;
    return Status::IOError(
        "another process holds this data directory (its RocksDB LOCK file is locked; or another store in this "
        "process has it open): stop that one first",
        s.ToString());
  }
  return Status::OK();
}

// logNumber parses a RocksDB write-ahead log's name, "<number>.log", into
// *num; other names (the spare, LOG, a name that overflows) are not logs.
bool logNumber(const std::string& name, uint64_t* num) {
  if (name.size() < 5 || name.compare(name.size() - 4, 4, ".log") != 0) return false;
  *num = 0;
  for (size_t i = 0; i + 4 < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9' || *num > (UINT64_MAX - 9) / 10) return false;
    *num = *num * 10 + uint64_t(name[i] - '0');
  }
  return true;
}

// OrderedLogs makes each write-ahead log durable, its bytes and its name,
// before RocksDB creates the next one. Found by review (session 72).
// RocksDB starts a new log at a memtable switch without syncing the one
// before it, and leaseq's pipeline writes the next batches into the new
// log before the fsync that covers both (none of them is acknowledged
// yet). The kernel may write the new log's pages back first; a power loss
// then keeps records that were built on the old log's last records
// without those records. A plain log cut at its end, or just before its
// last record, reads as a clean end, so RocksDB's
// TolerateCorruptedTailRecords replays the newer log past the hole (a
// poll applied without the enqueue whose item it leased), and no cheap
// check at Open sees it. So when RocksDB creates a log, this first
// fdatasyncs the log it created before, then, once the new log's file
// exists, fsyncs the directory: that makes the old log's name durable (a
// log made over the zeroed spare is a rename, which no fdatasync commits)
// and the new one's too before it holds a record, so a power loss never
// leaves records in a file still named LEASEQ-SPARE-WAL (a later Open
// would hand that file, records and all, to its new log; ZeroedWALs::
// Prepare refuses such a spare too, but looks only at its first block).
//
// Every byte RocksDB gave the old log is in its file when the new one is
// created: RocksDB 7.8.3's DBImpl::SwitchMemtable calls CreateWAL before
// it writes out the old log's buffer (WriteBuffer), but with
// manual_wal_flush off, as lq_open leaves it, log::Writer::AddRecord
// writes each record through to the file, so that buffer is empty; and
// SwitchMemtable runs in the write thread (the write group's leader, or
// unbatched), so no record is half-written. The new log gets its first
// record only after CreateWAL returns. A log is created once per memtable
// switch: one fdatasync (with SyncAlways most of the old log is synced
// already; with SyncNone it may write a log's worth) and one directory
// fsync per log. It wraps every read-write open, whatever the sync mode.
class OrderedLogs : public FileSystemWrapper {
 public:
  explicit OrderedLogs(const std::shared_ptr<FileSystem>& base) : FileSystemWrapper(base) {}

  static const char* kClassName() { return "leaseq.OrderedLogs"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewWritableFile(const std::string& fname, const FileOptions& o, std::unique_ptr<FSWritableFile>* r,
                           IODebugContext* dbg) override {
    if (!isLog(fname)) return target()->NewWritableFile(fname, o, r, dbg);
    std::lock_guard<std::mutex> l(mu_);
    IOStatus s = syncPrev();
    if (s.ok()) s = target()->NewWritableFile(fname, o, r, dbg);
    if (s.ok()) s = created(fname);
    return s;
  }

  IOStatus ReuseWritableFile(const std::string& fname, const std::string& old, const FileOptions& o,
                             std::unique_ptr<FSWritableFile>* r, IODebugContext* dbg) override {
    if (!isLog(fname)) return target()->ReuseWritableFile(fname, old, o, r, dbg);
    std::lock_guard<std::mutex> l(mu_);
    IOStatus s = syncPrev();
    if (s.ok()) s = target()->ReuseWritableFile(fname, old, o, r, dbg);
    if (s.ok()) s = created(fname);
    return s;
  }

  // synced reports the last log made durable as the next was created: its
  // number and its size then (0 and -1 before any). For tests.
  void synced(uint64_t* log, int64_t* size) {
    std::lock_guard<std::mutex> l(mu_);
    *log = syncedLog_;
    *size = syncedSize_;
  }

 private:
  static bool isLog(const std::string& fname) {
    uint64_t num;
    return logNumber(fname.substr(fname.rfind('/') + 1), &num);
  }

  // syncPrev fdatasyncs the last log created (by path: RocksDB's handle is
  // not ours to use). A log RocksDB has deleted meanwhile needs nothing:
  // its records are in synced tables.
  IOStatus syncPrev() {
    if (prev_.empty()) return IOStatus::OK();
    int fd = ::open(prev_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return IOStatus::OK();
    if (fd < 0) return IOStatus::IOError("sync the write-ahead log " + prev_, std::strerror(errno));
    struct stat st;
    int err = ::fstat(fd, &st) == 0 && ::fdatasync(fd) == 0 ? 0 : errno;
    ::close(fd);
    if (err != 0) return IOStatus::IOError("sync the write-ahead log " + prev_, std::strerror(err));
    logNumber(prev_.substr(prev_.rfind('/') + 1), &syncedLog_);
    syncedSize_ = int64_t(st.st_size);
    return IOStatus::OK();
  }

  // created fsyncs the directory of the log fname just made, and takes
  // fname as the log to sync before the next.
  IOStatus created(const std::string& fname) {
    size_t slash = fname.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : fname.substr(0, slash == 0 ? 1 : slash);
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int err = fd >= 0 && ::fsync(fd) == 0 ? 0 : errno;
    if (fd >= 0) ::close(fd);
    if (err != 0) return IOStatus::IOError("sync the directory of the write-ahead log " + fname, std::strerror(err));
    prev_ = fname;
    return IOStatus::OK();
  }

  std::mutex mu_;     // RocksDB creates logs one at a time; this is for synced
  std::string prev_;  // the last log created, empty before the first
  uint64_t syncedLog_ = 0;
  int64_t syncedSize_ = -1;
};

// emptyReplayedLogs truncates to nothing, durably, every write-ahead log in
// dir older than the one db writes. The TransactionDB (2PC) flushes what
// it replays at Open into synced tables and a synced MANIFEST, but keeps
// the logs it replayed, and the next Open reads them again. A log whose
// last record the replay read whole from the page cache (a batch whose
// fsync failed, then Store.Recover; a crash of the process and a quick
// restart) can be torn on the disk if the power fails before the kernel
// writes it back: the next Open would fail on that old tear, and
// walTornTail (wal.go), which takes every newer log as written after a
// torn record, would cut the log this open writes, dropping acknowledged
// writes. Emptied, an old log holds no tear to find. Nothing is lost:
// its records are in the tables (leaseq never prepares a transaction, so
// no log holds a prepared one that only the log keeps), and what a
// point-in-time recovery did not replay it meant to drop. The log db
// writes (and the zero-filled spare, which is not named <number>.log) is
// left alone: logs are made in dir, as lq_open sets no wal_dir. A crash
// before or while this empties them leaves the rest to be replayed again
// by the next Open; lq_open has not returned, so nothing in the newer log
// was acknowledged, and walTornTail may cut it. The tables the recovery
// flushed are named durably before any log is emptied: the recovery
// writes a new MANIFEST, and SetCurrentFile (RocksDB's file/filename.cc,
// called from VersionSet::ProcessManifestWrites) fsyncs the data
// directory when it points CURRENT at it, which persists the new tables'
// names too.
Status emptyReplayedLogs(DB* db, const std::string& dir) {
  std::unique_ptr<LogFile> cur;
  Status s = db->GetCurrentWalFile(&cur);
  if (!s.ok()) return s;
  std::vector<std::string> names;
  s = db->GetEnv()->GetChildren(dir, &names);
  if (!s.ok()) return s;
  for (const auto& name : names) {
    uint64_t num;
    if (!logNumber(name, &num) || num >= cur->LogNumber()) continue;
    const std::string path = dir + "/" + name;
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) continue;  // RocksDB deleted it meanwhile
    if (fd < 0) return Status::IOError("empty the replayed write-ahead log " + path, std::strerror(errno));
    int err = ::ftruncate(fd, 0) == 0 && ::fsync(fd) == 0 ? 0 : errno;
    ::close(fd);
    if (err != 0) return Status::IOError("empty the replayed write-ahead log " + path, std::strerror(err));
  }
  return Status::OK();
}

}  // namespace

struct lq_db {
  std::shared_ptr<leaseq::ZeroedWALs> walfs;  // lq_options.zeroed_wal only
  std::shared_ptr<OrderedLogs> logfs;         // writable modes: over walfs or the default file system
  std::shared_ptr<HeldLock> lockfs;           // writable modes: over logfs
  std::unique_ptr<Env> env;                   // over lockfs; outlives db
  Options opts;
  DB* db = nullptr;              // every mode; the TransactionDB itself in LQ_TXN_DB
  TransactionDB* tdb = nullptr;  // LQ_TXN_DB only
  std::vector<ColumnFamilyHandle*> cfs;
  ColumnFamilyHandle* route[256] = {};
  WriteOptions wo, swo;  // no sync, sync
  TransactionOptions txo;
  ReadOptions ro;
  ReadOptions roLive;  // lq_txn_get_for_update's: skips range tombstones
};

// progress is what tells when a marked commit's record is in d's WAL
// (nullptr without zeroed WALs).
static leaseq::WALProgress* progress(lq_db* d) { return d->walfs ? d->walfs->progress.get() : nullptr; }

struct lq_txn {
  lq_db* db;
  Transaction* t;
  WriteBatch* wb;
};

struct lq_iter {
  std::string lower, upper;
  Slice lo, up;
  ReadOptions ro;
  Iterator* it = nullptr;
  lq_entry cur{};
};

struct lq_snap {};  // stands for a const Snapshot*

static const Snapshot* snapOf(const lq_snap* s) { return reinterpret_cast<const Snapshot*>(s); }

static void apply(WriteBatch* wb, const lq_db* d, const char* p, size_t n) {
  const char* end = p + n;
  while (p < end) {
    char op = *p++;
    ColumnFamilyHandle* cf = nullptr;
    if (op == 'D') {
      cf = d->cfs[uint8_t(*p++)];
      op = 'd';
    }
    uint32_t kl = u32(p);
    p += 4;
    Slice k(p, kl);
    p += kl;
    if (cf == nullptr) cf = d->route[uint8_t(k[0])];
    if (op == 'd') {
      wb->Delete(cf, k);
      continue;
    }
    if (op == 's') {
      wb->SingleDelete(cf, k);
      continue;
    }
    uint32_t vl = u32(p);
    p += 4;
    Slice v(p, vl);
    p += vl;
    if (op == 'p') {
      wb->Put(cf, k, v);
    } else if (op == 'r') {
      wb->DeleteRange(cf, k, v);
    } else {
      wb->Merge(cf, k, v);
    }
  }
}

// HintByNamespace gives the memtable an insert hint per namespace (the
// key's first byte), as NewFixedPrefixTransform(1) would, except for the
// begin keys of the range tombstones a batch writes over runs of item
// keys (writeBuf.delThrough): RocksDB 7.8.3 keeps one hint per prefix
// for a memtable's point and range tombstone skiplists together, and a
// hint made in one list corrupts an insert into the other. Item keys of
// available and in_progress end with the queue's terminator (0x00 0x01)
// and a 16-byte id; a range's begin key drops the id's last byte, so the
// byte 17 from its end is the terminator's 0x00 instead of its 0x01.
// Visibility keys (batch.headRun) have the priority and visible_at
// (9 bytes) between the terminator and the id: byte 26 from the end.
class HintByNamespace : public SliceTransform {
 public:
  const char* Name() const override { return "leaseq.HintByNamespace"; }
  Slice Transform(const Slice& k) const override { return Slice(k.data(), 1); }
  bool InDomain(const Slice& k) const override {
    if (k.size() < 1) return false;
    const char ns = k[0];
    if ((ns == 0x02 || ns == 0x04) && k.size() >= 17 && k[k.size() - 17] == 0x00) return false;
    if (ns == 0x03 && k.size() >= 26 && k[k.size() - 26] == 0x00) return false;
    return true;
  }
};

static int64_t copyOut(const Status& s, const PinnableSlice& v, char* out, size_t cap, char** err) {
  if (s.IsNotFound()) return -2;
  if (!s.ok()) return fail(s, err);
  if (v.size() <= cap && v.size() > 0) std::memcpy(out, v.data(), v.size());
  return int64_t(v.size());
}

extern "C" {

lq_db* lq_open(const char* dir, const lq_options* o, const char* const* families, int n, char** err) {
  auto* d = new lq_db;
  Options& opts = d->opts;
  BlockBasedTableOptions bbto;
  if (o->cache_bytes > 0) bbto.block_cache = NewLRUCache(size_t(o->cache_bytes));
  bbto.filter_policy.reset(NewBloomFilterPolicy(10, false));
  bbto.cache_index_and_filter_blocks = true;
  bbto.pin_l0_filter_and_index_blocks_in_cache = true;
  opts.table_factory.reset(NewBlockBasedTableFactory(bbto));
  opts.memtable_insert_with_hint_prefix_extractor = std::make_shared<HintByNamespace>();
  opts.create_if_missing = o->mode != LQ_READ_ONLY;
  opts.create_missing_column_families = o->mode != LQ_READ_ONLY;
  opts.info_log_level = WARN_LEVEL;
  if (o->log_dir != nullptr) opts.db_log_dir = o->log_dir;
  opts.keep_log_file_num = 2;
  opts.merge_operator = std::make_shared<CountersMerge>();
  opts.compression = kLZ4Compression;
  if (o->memtable > 0) {
    opts.write_buffer_size = size_t(o->memtable);
    opts.db_write_buffer_size = size_t(3 * o->memtable);
  }
  opts.max_write_buffer_number = 3;
  opts.max_write_buffer_size_to_maintain = 1;
  // Two flush threads and one compaction thread. With one flush thread
  // (max_background_jobs 2 gives one of each), a flush that the WAL limit
  // forces on a small family (visibility_index: 374k entries, 150-200 ms)
  // ran while the available family's memtables filled up to
  // max_write_buffer_number, and RocksDB stopped writes for 0.5-0.9 s
  // every 1.7 s of produce-b100 (docs/BENCHMARKS.md, "Writes stopped
  // behind one flush thread").
  opts.max_background_flushes = 2;
  opts.max_background_compactions = 1;
  opts.max_total_wal_size = 128 << 20;
  // Writeback of the log starts every MiB (sync_file_range), so the
  // fdatasync OrderedLogs makes at each log switch has little left to
  // write: with --sync=none, without this, it wrote a log's worth of
  // dirty pages in the write path, 9-10 % fewer items/s in produce-b100
  // and e2e in process (docs/BENCHMARKS.md, session 72); with it, level.
  opts.wal_bytes_per_sync = 1 << 20;
  if (o->stats) opts.statistics = CreateDBStatistics();
  if (o->del_compact) {
    opts.table_properties_collector_factories.emplace_back(NewCompactOnDeletionCollectorFactory(1000, 500));
  }
  if (o->mode != LQ_READ_ONLY) {
    // The lock first (HeldLock): a refused open changes nothing in dir.
    FileLock* lock = nullptr;
    Status s = lockDir(dir, &lock);
    if (!s.ok()) {
      fail(s, err);
      delete d;
      return nullptr;
    }
    std::shared_ptr<FileSystem> base = FileSystem::Default();
    if (o->mode == LQ_TXN_DB && o->zeroed_wal > 0) {
      d->walfs = std::make_shared<leaseq::ZeroedWALs>(FileSystem::Default(), dir, uint64_t(o->zeroed_wal));
      d->walfs->Prepare();
      base = d->walfs;
    } else if (o->mode == LQ_TXN_DB) {
      leaseq::ZeroedWALs::RemoveSpare(dir);
    }
    d->logfs = std::make_shared<OrderedLogs>(base);
    d->lockfs = std::make_shared<HeldLock>(d->logfs, std::string(dir) + "/LOCK", lock);
    d->env = NewCompositeEnv(d->lockfs);
    opts.env = d->env.get();
  }
  opts.wal_recovery_mode = o->point_in_time ? WALRecoveryMode::kPointInTimeRecovery
                                            : WALRecoveryMode::kTolerateCorruptedTailRecords;
  std::vector<ColumnFamilyDescriptor> descs;
  for (int i = 0; i < n; i++) descs.emplace_back(families[i], ColumnFamilyOptions(opts));
  Status s;
  switch (o->mode) {
    case LQ_TXN_DB: {
      TransactionDBOptions tdbo;
      tdbo.transaction_lock_timeout = o->lock_timeout;
      s = TransactionDB::Open(opts, tdbo, dir, descs, &d->cfs, &d->tdb);
      d->db = d->tdb;
      d->txo.lock_timeout = o->lock_timeout;
      break;
    }
    case LQ_PLAIN_DB:
      s = DB::Open(opts, dir, descs, &d->cfs, &d->db);
      break;
    default:
      s = DB::OpenForReadOnly(opts, dir, descs, &d->cfs, &d->db, false);
  }
  if (!s.ok()) {
    fail(s, err);
    delete d;
    return nullptr;
  }
  // Only the TransactionDB keeps the logs it replayed: a plain DB deletes
  // them once their records are flushed.
  if (o->mode == LQ_TXN_DB) {
    s = emptyReplayedLogs(d->db, dir);
    if (!s.ok()) {
      fail(s, err);
      lq_close(d);
      return nullptr;
    }
  }
  d->swo.sync = true;
  // GetForUpdate reads skip range tombstones. Only runs of deleted item
  // keys in available and in_progress get them (writeBuf.delThrough), and
  // the store reads such a key for update only when its memory says the
  // item is there (ready, or inflight under a lease: rdbTxn.
  // getManyForUpdate), so the key's newest entry is a write that no
  // tombstone covers. Without this, every such read after a batch that
  // wrote a range tombstone fragmented all of the memtable's range
  // tombstones anew (RocksDB 7.8.3 caches them only until the next one):
  // draining a backlog from tables lost a quarter of its throughput. Every
  // other read (lq_txn_get, lq_get, iterators, Check) honours them.
  d->roLive.ignore_range_deletions = true;
  return d;
}

void lq_close(lq_db* d) {
  for (auto* h : d->cfs) d->db->DestroyColumnFamilyHandle(h);
  delete d->db;
  if (d->walfs) d->walfs->Stop();
  delete d;
}

void lq_wal_files(lq_db* d, int64_t* zeroed, int64_t* plain) {
  *zeroed = d->walfs ? d->walfs->zeroed.load() : 0;
  *plain = d->walfs ? d->walfs->plain.load() : 0;
}

void lq_wal_synced(lq_db* d, uint64_t* log, int64_t* size) {
  *log = 0;
  *size = -1;
  if (d->logfs) d->logfs->synced(log, size);
}

char* lq_list_families(const char* dir, size_t* len, char** err) {
  std::vector<std::string> names;
  Status s = DB::ListColumnFamilies(DBOptions(), dir, &names);
  if (!s.ok()) {
    fail(s, err);
    return nullptr;
  }
  std::string all;
  for (auto& n : names) {
    all += n;
    all.push_back(0);
  }
  *len = all.size();
  return dup(all);
}

void lq_route(lq_db* d, int ns, int family) { d->route[ns & 0xff] = family < 0 ? nullptr : d->cfs[family]; }

void lq_free(void* p) { std::free(p); }

int64_t lq_get(lq_db* d, const lq_snap* snap, int family, const char* k, size_t kl, char* out, size_t cap,
               char** err) {
  quiet();
  ReadOptions ro;
  ro.snapshot = snapOf(snap);
  PinnableSlice v;
  ColumnFamilyHandle* cf = family < 0 ? d->route[uint8_t(k[0])] : d->cfs[family];
  Status s = d->db->Get(ro, cf, Slice(k, kl), &v);
  return copyOut(s, v, out, cap, err);
}

const lq_snap* lq_snapshot(lq_db* d) { return reinterpret_cast<const lq_snap*>(d->db->GetSnapshot()); }

void lq_release_snapshot(lq_db* d, const lq_snap* snap) { d->db->ReleaseSnapshot(snapOf(snap)); }

char* lq_write(lq_db* d, const char* buf, size_t n, int sync, uint64_t mark) {
  quiet();
  // Room for the whole batch up front: our encoding is about as long as
  // RocksDB's, so the rep does not regrow (and recopy) as it fills.
  WriteBatch wb(n + 64);
  apply(&wb, d, buf, n);
  // In LQ_TXN_DB the batch goes to the base DB: the caller writes nothing a
  // transaction holds (see rdb.go).
  DB* target = d->tdb != nullptr ? d->tdb->GetBaseDB() : d->db;
  leaseq::CommitMark m(progress(d), mark, wb.GetDataSize());
  return errOf(target->Write(sync ? d->swo : d->wo, &wb));
}

int lq_can_wait_logged(lq_db* d) { return progress(d) != nullptr; }

int lq_wait_logged(lq_db* d, uint64_t mark) {
  leaseq::WALProgress* p = progress(d);
  return p != nullptr && p->Wait(mark) ? 1 : 0;
}

void lq_mark_done(lq_db* d, uint64_t mark) {
  if (leaseq::WALProgress* p = progress(d)) p->Publish(&p->done, mark);
}

uint64_t lq_marks_logged(lq_db* d) { return progress(d) ? progress(d)->logged.load() : 0; }

char* lq_flush_wal(lq_db* d, int sync) { return errOf(d->db->FlushWAL(sync != 0)); }

int lq_flush(lq_db* d, char** err) {
  FlushOptions fo;
  fo.wait = true;
  for (auto* h : d->cfs) {
    Status s = d->db->Flush(fo, h);
    if (!s.ok()) return fail(s, err);
  }
  return 0;
}

int lq_compact_family(lq_db* d, int family, char** err) {
  Status s = d->db->CompactRange(CompactRangeOptions(), d->cfs[family], nullptr, nullptr);
  return s.ok() ? 0 : fail(s, err);
}

char* lq_statistics(lq_db* d) {
  if (!d->opts.statistics) return nullptr;
  return dup(d->opts.statistics->ToString());
}

char* lq_property(lq_db* d, int family, const char* name) {
  std::string v;
  if (!d->db->GetProperty(d->cfs[family], name, &v)) return nullptr;
  return dup(v);
}

int64_t lq_write_stall_micros(lq_db* d) {
  std::map<std::string, std::string> m;
  if (!d->db->GetMapProperty(DB::Properties::kDBStats, &m)) return 0;
  auto it = m.find("db.user_write_stall_micros");
  if (it == m.end()) return 0;
  return int64_t(std::strtoull(it->second.c_str(), nullptr, 10));
}

void lq_pause_background(lq_db* d, int pause) {
  if (pause) {
    d->db->PauseBackgroundWork();
  } else {
    d->db->ContinueBackgroundWork();
  }
}

lq_iter* lq_iter_new(lq_db* d, const lq_snap* snap, int family, const char* lower, size_t ll,
                     const char* upper, size_t ul, int once) {
  auto* it = new lq_iter;
  it->ro.snapshot = snapOf(snap);
  if (lower != nullptr) {
    it->lower.assign(lower, ll);
    it->lo = Slice(it->lower);
    it->ro.iterate_lower_bound = &it->lo;
  }
  if (upper != nullptr) {
    it->upper.assign(upper, ul);
    it->up = Slice(it->upper);
    it->ro.iterate_upper_bound = &it->up;
  }
  if (once) {
    it->ro.fill_cache = false;
    it->ro.readahead_size = 2 << 20;
  }
  it->it = d->db->NewIterator(it->ro, d->cfs[family]);
  return it;
}

static int entry(lq_iter* it) {
  lq_entry* e = &it->cur;
  if (!it->it->Valid()) {
    e->k = e->v = nullptr;
    e->kl = e->vl = 0;
    Status s = it->it->status();
    return s.ok() ? 0 : fail(s, &e->err);
  }
  Slice k = it->it->key(), v = it->it->value();
  e->k = k.data();
  e->kl = k.size();
  e->v = v.data();
  e->vl = v.size();
  return 1;
}

lq_entry* lq_iter_entry(lq_iter* it) { return &it->cur; }

int lq_iter_seek(lq_iter* it, const char* k, size_t kl) {
  quiet();
  if (k == nullptr) {
    it->it->SeekToFirst();
  } else {
    it->it->Seek(Slice(k, kl));
  }
  return entry(it);
}

int lq_iter_next(lq_iter* it) {
  quiet();
  it->it->Next();
  return entry(it);
}

void lq_iter_destroy(lq_iter* it) {
  free(it->cur.err);
  delete it->it;
  delete it;
}

lq_txn* lq_txn_begin(lq_db* d, lq_txn* old) {
  quiet();
  if (old == nullptr) {
    old = new lq_txn{d, nullptr, nullptr};
  }
  old->t = d->tdb->BeginTransaction(d->wo, d->txo, old->t);
  // Nothing reads a write back through the transaction (the store's batch
  // overlay answers first), so its batch keeps no index.
  old->t->DisableIndexing();
  old->wb = old->t->GetWriteBatch()->GetWriteBatch();
  return old;
}

void lq_txn_destroy(lq_txn* t) {
  delete t->t;
  delete t;
}

void lq_txn_write(lq_txn* t, const char* buf, size_t n) { apply(t->wb, t->db, buf, n); }

int64_t lq_txn_get_for_update(lq_txn* t, const char* keys, const uint32_t* koff, int64_t start, int64_t n,
                              char* out, size_t cap, size_t* used, int64_t* vlen, char** err) {
  quiet();
  lq_db* d = t->db;
  PinnableSlice v;
  for (int64_t i = start; i < n; i++) {
    Slice k(keys + koff[i], koff[i + 1] - koff[i]);
    v.Reset();
    Status s = t->t->GetForUpdate(d->roLive, d->route[uint8_t(k[0])], k, &v, true);
    if (s.IsNotFound()) {
      vlen[i] = -1;
      continue;
    }
    if (!s.ok()) return fail(s, err);
    vlen[i] = int64_t(v.size());
    if (v.size() > cap - *used) return i;
    if (v.size() > 0) std::memcpy(out + *used, v.data(), v.size());
    *used += v.size();
  }
  return n;
}

int lq_txn_lock(lq_txn* t, const char* keys, const uint32_t* koff, int64_t n, char** err) {
  quiet();
  lq_db* d = t->db;
  for (int64_t i = 0; i < n; i++) {
    Slice k(keys + koff[i], koff[i + 1] - koff[i]);
    Status s = t->t->GetForUpdate(d->ro, d->route[uint8_t(k[0])], k, static_cast<PinnableSlice*>(nullptr), true);
    if (!s.ok()) return fail(s, err);
  }
  return 0;
}

int64_t lq_txn_get(lq_txn* t, const char* k, size_t kl, char* out, size_t cap, char** err) {
  quiet();
  PinnableSlice v;
  Status s = t->t->Get(t->db->ro, t->db->route[uint8_t(k[0])], Slice(k, kl), &v);
  return copyOut(s, v, out, cap, err);
}

int lq_txn_commit(lq_txn* t, uint64_t mark, char** err) {
  quiet();
  leaseq::CommitMark m(progress(t->db), mark, t->wb->GetDataSize());
  Status s = t->t->Commit();
  return s.ok() ? 0 : fail(s, err);
}

int lq_txn_rollback(lq_txn* t, char** err) {
  Status s = t->t->Rollback();
  return s.ok() ? 0 : fail(s, err);
}

}  // extern "C"
