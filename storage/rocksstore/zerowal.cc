// zerowal.cc: see zerowal.h.
#include "zerowal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

using namespace rocksdb;

namespace leaseq {

namespace {

const char kSpare[] = "/LEASEQ-SPARE-WAL";

// isWAL reports whether path names a write-ahead log: digits, then ".log".
bool isWAL(const std::string& path) {
  size_t slash = path.rfind('/');
  size_t start = slash == std::string::npos ? 0 : slash + 1;
  if (path.size() < start + 5 || path.compare(path.size() - 4, 4, ".log") != 0) return false;
  for (size_t i = start; i < path.size() - 4; i++) {
    if (path[i] < '0' || path[i] > '9') return false;
  }
  return true;
}

bool syncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = fsync(fd) == 0;
  close(fd);
  return ok;
}

// walFile is a write-ahead log as ZeroedWALs hands it out: it counts its
// bytes and fsyncs into stats, and if it was made on a spare, Close cuts
// the zeros after its data (RocksDB cuts a file it preallocated, and a
// log closed before its first write is not one), so a closed log is
// replayed without its zero tail.
class walFile : public FSWritableFileOwnerWrapper {
 public:
  walFile(std::unique_ptr<FSWritableFile>&& f, const std::string& path, bool zeroed,
          std::shared_ptr<ZeroedWALs::LogStats> stats, std::shared_ptr<WALProgress> progress)
      : FSWritableFileOwnerWrapper(std::move(f)),
        path_(path),
        zeroed_(zeroed),
        stats_(std::move(stats)),
        progress_(std::move(progress)) {}

  IOStatus Append(const Slice& data, const IOOptions& opts, IODebugContext* dbg) override {
    stats_->bytes += data.size();
    IOStatus s = target()->Append(data, opts, dbg);
    marked();
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& opts, const DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    stats_->bytes += data.size();
    IOStatus s = target()->Append(data, opts, info, dbg);
    marked();
    return s;
  }
  // Flush ends what RocksDB's buffer held: for a marked commit that
  // appended here, the end of its record (WALProgress).
  IOStatus Flush(const IOOptions& opts, IODebugContext* dbg) override {
    IOStatus s = target()->Flush(opts, dbg);
    if (s.ok() && tlProgress == progress_.get() && tlMark != 0 && appended_ == tlMark) {
      progress_->logged++;
      progress_->Publish(&progress_->flushed, tlMark);
    }
    return s;
  }
  IOStatus Sync(const IOOptions& opts, IODebugContext* dbg) override {
    stats_->syncs++;
    return target()->Sync(opts, dbg);
  }
  IOStatus Fsync(const IOOptions& opts, IODebugContext* dbg) override {
    stats_->syncs++;
    return target()->Fsync(opts, dbg);
  }

  IOStatus Close(const IOOptions& opts, IODebugContext* dbg) override {
    uint64_t size = target()->GetFileSize(opts, dbg);
    IOStatus s = target()->Close(opts, dbg);
    // As RocksDB's own trim, a failure only leaves zeros to skip.
    if (s.ok() && zeroed_) (void)!truncate(path_.c_str(), off_t(size));
    return s;
  }

 private:
  const std::string path_;
  const bool zeroed_;
  const std::shared_ptr<ZeroedWALs::LogStats> stats_;
  const std::shared_ptr<WALProgress> progress_;
  uint64_t appended_ = 0;  // the last mark this log appended under

  void marked() {
    if (tlProgress == progress_.get() && tlMark != 0) appended_ = tlMark;
  }
};

}  // namespace

thread_local WALProgress* tlProgress = nullptr;
thread_local uint64_t tlMark = 0;

void WALProgress::Publish(std::atomic<uint64_t>* a, uint64_t mark) {
  a->store(mark);
  // A waiter counts itself before it checks under mu_, so either it sees
  // mark or it is counted here (both sequentially consistent).
  if (waiters_.load() > 0) {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }
}

bool WALProgress::Wait(uint64_t mark) {
  auto reached = [&] { return flushed.load() >= mark || done.load() >= mark; };
  if (!reached()) {
    waiters_++;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, reached);
    }
    waiters_--;
  }
  return flushed.load() >= mark;
}

ZeroedWALs::ZeroedWALs(const std::shared_ptr<FileSystem>& base, const std::string& dir, uint64_t size)
    : FileSystemWrapper(base), dir_(dir), spare_(dir + kSpare), tmp_(dir + kSpare + ".tmp"), size_(size) {}

ZeroedWALs::~ZeroedWALs() { Stop(); }

void ZeroedWALs::RemoveSpare(const std::string& dir) {
  unlink((dir + kSpare).c_str());
  unlink((dir + kSpare + ".tmp").c_str());
}

void ZeroedWALs::Prepare() {
  unlink(tmp_.c_str());  // a spare being made when the process stopped
  struct stat st;
  bool ok = stat(spare_.c_str(), &st) == 0 && uint64_t(st.st_size) == size_ && blank();
  if (!ok) {
    // Never left as it is: a spare is zeros whenever one is there.
    unlink(spare_.c_str());
    ok = make();
  }
  std::lock_guard<std::mutex> l(mu_);
  ready_ = ok;
}

void ZeroedWALs::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

IOStatus ZeroedWALs::NewWritableFile(const std::string& fname, const FileOptions& opts,
                                     std::unique_ptr<FSWritableFile>* result, IODebugContext* dbg) {
  if (!isWAL(fname)) return target()->NewWritableFile(fname, opts, result, dbg);
  // The log before this one says whether zeros pay: judged once it holds
  // kJudgeBytes, so a log cut short (an open and a close) changes nothing.
  if (last_ != nullptr && last_->bytes >= kJudgeBytes) {
    worth_ = last_->bytes <= last_->syncs * kMaxBytesPerSync;
  }
  last_ = std::make_shared<LogStats>();
  std::unique_ptr<FSWritableFile> f;
  bool zeroed = false;
  IOStatus s;
  if (worth_ && take()) {
    // Renames the spare to fname and opens it for writing from its start.
    s = target()->ReuseWritableFile(fname, spare_, opts, &f, dbg);
    zeroed = s.ok();
  }
  if (worth_) refill();
  if (!zeroed) s = target()->NewWritableFile(fname, opts, &f, dbg);
  if (!s.ok()) return s;
  (zeroed ? this->zeroed : plain)++;
  result->reset(new walFile(std::move(f), fname, zeroed, last_, progress));
  return s;
}

bool ZeroedWALs::take() {
  std::lock_guard<std::mutex> l(mu_);
  bool ok = ready_;
  ready_ = false;
  return ok;
}

// refill starts making the next spare unless one is ready or being made.
void ZeroedWALs::refill() {
  std::lock_guard<std::mutex> l(mu_);
  if (ready_ || busy_ || stopping_) return;
  busy_ = true;
  // The last worker has cleared busy_, its last act: joining it is short.
  if (worker_.joinable()) worker_.join();
  worker_ = std::thread([this] {
    bool ok = make();
    std::lock_guard<std::mutex> l(mu_);
    ready_ = ok;
    busy_ = false;
  });
}

// blank reports whether the spare's first block (RocksDB's log block,
// 32 KiB) is zeros. Found by review (session 72): a power loss between a
// new log's fdatasync and the directory fsync that makes its name durable
// left its records in the file still named as the spare (fdatasync over
// the spare's blocks commits no metadata), and the next Open's log took
// it as it was: RocksDB wrote over it from byte 0, and the old records
// after the new ones were read back later (batches that Open had dropped,
// or a "damaged" log). Records start at byte 0, so such a spare is not
// zeros there. OrderedLogs (rdb.cc) now fsyncs the directory before a log
// holds a record; this catches a spare left by an older build too, at
// the cost of one read at Open.
bool ZeroedWALs::blank() {
  const size_t n = size_t(std::min<uint64_t>(kBlock, size_));
  std::unique_ptr<char[]> buf(new char[kBlock]);
  static const char zeros[kBlock] = {};
  int fd = open(spare_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, buf.get() + got, n - got, off_t(got));
    if (r > 0) {
      got += size_t(r);
    } else if (r == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  return got == n && std::memcmp(buf.get(), zeros, n) == 0;
}

// make writes size_ zero bytes to tmp_, fsyncs it and renames it to
// spare_: a spare exists only whole and durable. On failure (a full disk)
// it leaves nothing behind.
bool ZeroedWALs::make() {
  static const char zeros[1 << 20] = {};
  // Only while the disk has four spares' worth free: on a small or nearly
  // full disk, logs are created empty rather than a spare taking the room
  // the data needs.
  struct statvfs vfs;
  if (statvfs(dir_.c_str(), &vfs) != 0 || uint64_t(vfs.f_bavail) * vfs.f_frsize < 4 * size_) return false;
  int fd = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  // 64 KiB per write: the kernel may cache a file in folios as large as
  // the write that filled them (ext4 does since Linux 6.16), and the log's
  // appends, a few hundred bytes each, then walk the block buffers of the
  // folio they land in, as does every writeback. Made with 1 MiB writes,
  // the spare's folios had 256 buffers each, and that walk cost a
  // single-item durable call about a tenth of its CPU; at 64 KiB it is 16
  // buffers. One page per write would make the spare three times as
  // costly to write (docs/BENCHMARKS.md, "WAL spares made in smaller
  // writes"). A megabyte is flushed before the next: one large flush
  // would hold up the journal commit that a WAL fsync may be waiting for.
  const size_t chunk = 64 << 10;
  for (uint64_t off = 0; ok && off < size_;) {
    ssize_t n = write(fd, zeros, size_t(std::min<uint64_t>(chunk, size_ - off)));
    if (n > 0) {
      off += uint64_t(n);
      if (off % sizeof zeros == 0 && off < size_) ok = fdatasync(fd) == 0;  // the last by fsync below
    } else if (n == 0 || errno != EINTR) {
      ok = false;
    }
  }
  ok = fsync(fd) == 0 && ok;
  ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp_.c_str(), spare_.c_str()) == 0 && syncDir(dir_);
  if (!ok) unlink(tmp_.c_str());
  return ok;
}

}  // namespace leaseq
