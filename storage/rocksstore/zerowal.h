// zerowal.h: write-ahead logs created over zeros (zerowal.cc), for rdb.cc.
#ifndef LEASEQ_ZEROWAL_H
#define LEASEQ_ZEROWAL_H

#include <rocksdb/file_system.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace leaseq {

// WALProgress tells a goroutine that fsyncs the WAL when a commit's
// record is in its log file, before the commit inserts the record into
// the memtables (a third of a 32-item batch's time): the fsync then runs
// while the commit finishes. A commit is marked by the number of its batch
// (the pipeline's batch.seq, rising) while it runs on its thread
// (CommitMark); a log that the marked commit appended to publishes the
// mark when RocksDB flushes its buffer to the file, which it does once,
// at the record's end, for a record that fits its write buffer
// (WritableFileWriter, 1 MiB by default; kMaxMarkedBytes keeps well under
// it). RocksDB's own buffer flushes outside a record (a log closed at a
// memtable switch) append nothing under the mark and publish nothing.
class WALProgress {
 public:
  static constexpr size_t kMaxMarkedBytes = 256 << 10;

  // Wait blocks until the commit marked mark has its record in the log
  // (true) or ended without one (false: it wrote nothing, failed, or was
  // too large to be marked).
  bool Wait(uint64_t mark);
  // Publish sets a (flushed or done) to mark and wakes the waiters.
  void Publish(std::atomic<uint64_t>* a, uint64_t mark);

  std::atomic<uint64_t> flushed{0}, done{0};
  // logged counts the publications of flushed: one per marked commit
  // whose record is written with one flush (tests check that).
  std::atomic<uint64_t> logged{0};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> waiters_{0};
};

// The commit running on this thread: its log's progress and mark.
extern thread_local WALProgress* tlProgress;
extern thread_local uint64_t tlMark;

// CommitMark marks the commit of batch mark on this thread for its
// lifetime (bytes: the batch's size; larger than kMaxMarkedBytes goes
// unmarked) and then publishes that the commit is done.
class CommitMark {
 public:
  CommitMark(WALProgress* p, uint64_t mark, size_t bytes) : p_(mark != 0 ? p : nullptr), mark_(mark) {
    if (p_ != nullptr && bytes <= WALProgress::kMaxMarkedBytes) {
      tlProgress = p_;
      tlMark = mark_;
    }
  }
  ~CommitMark() {
    tlProgress = nullptr;
    tlMark = 0;
    if (p_ != nullptr) p_->Publish(&p_->done, mark_);
  }
  CommitMark(const CommitMark&) = delete;
  CommitMark& operator=(const CommitMark&) = delete;

 private:
  WALProgress* const p_;
  const uint64_t mark_;
};

// ZeroedWALs is a file system that gives each new RocksDB write-ahead log
// (a file named <number>.log) a file already written with zeros and
// fsynced, so that appending to the log overwrites blocks the file
// system has allocated and sized: fdatasync then flushes the data and
// nothing else. A log that grows its file makes each fdatasync also
// commit the file's new size (an ext4 journal commit), which measured
// 35-45 % of the time of a small write+fdatasync on this project's
// machine. PostgreSQL zero-fills its WAL segments for the same reason.
//
// Zeros double the bytes written to the disk, so they are used only while
// RocksDB fsyncs the logs often for the bytes they carry (kMaxBytesPerSync):
// single items and small batches, not large ones.
//
// It keeps one spare of size bytes, <dir>/LEASEQ-SPARE-WAL, made in a
// background thread; a new log takes it by rename (ReuseWritableFile: no
// truncation), and the next spare is started at once. With no spare ready
// (logs switching faster than spares are made, or the disk full), a log
// is created empty, as RocksDB would. RocksDB's log reader skips zero
// blocks, so a crash leaves a log whose zero tail recovery reads past;
// a log closed cleanly is truncated to its data by RocksDB.
class ZeroedWALs : public rocksdb::FileSystemWrapper {
 public:
  ZeroedWALs(const std::shared_ptr<rocksdb::FileSystem>& base, const std::string& dir, uint64_t size);
  ~ZeroedWALs() override;

  static const char* kClassName() { return "leaseq.ZeroedWALs"; }
  const char* Name() const override { return kClassName(); }

  // Prepare makes the spare now, unless one of the right size whose first
  // block is zeros is left from before, so the log that DB::Open creates
  // takes it.
  void Prepare();
  // Stop waits for a spare being made.
  void Stop();

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;

  // Counts of logs created on a spare and empty.
  std::atomic<int64_t> zeroed{0}, plain{0};

  // progress is published by every log this file system makes.
  const std::shared_ptr<WALProgress> progress = std::make_shared<WALProgress>();

  // LogStats counts what RocksDB wrote to one log and how often it
  // synced it.
  struct LogStats {
    std::atomic<uint64_t> bytes{0}, syncs{0};
  };
  // Zeros pay while RocksDB syncs a log at least every kMaxBytesPerSync
  // bytes. Measured here: an fdatasync that need not commit a new size
  // saves 60-70 us, and zeros cost about 2 us per KiB to write and flush,
  // so the break-even is near 30 KiB per fsync. Single-item enqueues sync
  // every 1 KiB or so and gain; e2e with batches of 32 (22-28 KiB) gained
  // 5-15 % in process with zeros, nothing over RPC, and a longer latency
  // tail in both, measured twice (docs/BENCHMARKS.md, "Write-ahead logs
  // over zeros" and "Zeros for e2e's logs, measured again").
  static constexpr uint64_t kMaxBytesPerSync = 16 << 10;
  static constexpr uint64_t kJudgeBytes = 1 << 20;

  // RemoveSpare deletes a spare left in dir (a store opened without
  // zeroed logs).
  static void RemoveSpare(const std::string& dir);

 private:
  static constexpr size_t kBlock = 32 << 10;  // RocksDB's log block

  bool take();
  void refill();
  bool make();
  bool blank();

  const std::string dir_, spare_, tmp_;
  const uint64_t size_;
  // RocksDB creates logs one at a time (under its DB mutex): these need
  // no lock.
  std::shared_ptr<LogStats> last_;
  bool worth_ = true;
  std::mutex mu_;
  bool ready_ = false, busy_ = false, stopping_ = false;
  std::thread worker_;
};

}  // namespace leaseq

#endif
