// rocksdb_floor: what RocksDB itself costs per item for leaseq's key
// pattern, without Go, RPC or leaseq's own code. One thread runs N items
// through enqueue (record + visibility entry), claim (GetForUpdate of the
// record, single deletes of both, an in_progress record, a lease and its
// expiry entry) and ack (single delete of in_progress, delete of the lease
// and its expiry), in batches of 32, sync off, one column family per
// namespace, options as leaseq's. Modes:
//   A  every batch a transaction, writes through PutUntracked and friends
//      (indexed, and each key locked)
//   B  as A with the transaction's indexing disabled
//   C  as B, and enqueue and ack written as plain batches (no transaction)
//   D  writes straight into the transaction's indexed batch: indexed, not
//      locked (leaseq until 2026-11-24, through RocksDB's C API)
//   E  writes straight into the transaction's plain write batch: neither
//      indexed nor locked (leaseq since, through storage/rocksstore/rdb.cc)
// Prints process CPU (background flushes included) per item.
//
// Build against the release library of `make rocksdb` (printed by it):
//   D=~/.cache/leaseq/rocksdb-7.8.3-release
//   g++ -O2 -std=c++17 -I$D/include rocksdb_floor.cc -o rocksdb_floor \
//       $D/lib/librocksdb.a -lsnappy -llz4 -lzstd -lz -lbz2 -lpthread -ldl
//   ./rocksdb_floor A /tmp/floor-db   (remove the directory between runs)
// Results: docs/BENCHMARKS.md, "What RocksDB itself costs per item".
#include <rocksdb/db.h>
#include <rocksdb/utilities/transaction_db.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/utilities/write_batch_with_index.h>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>
#include <memory>
using namespace rocksdb;
static double cpu() { timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static std::string key(char ns, uint64_t id) { std::string k(1, ns); k += "q"; k.push_back(0); char b[8]; for (int i = 0; i < 8; i++) b[i] = (id >> (56 - 8 * i)) & 0xff; k.append(b, 8); k.append(8, 'x'); return k; }
int main(int argc, char** argv) {
  if (argc != 3 || std::strlen(argv[1]) != 1 || std::strchr("ABCDE", argv[1][0]) == nullptr) {
    fprintf(stderr, "usage: rocksdb_floor A|B|C|D|E DIR\n");
    return 2;
  }
  char mode = argv[1][0];
  std::string dir = argv[2];
  Options o; o.create_if_missing = true; o.create_missing_column_families = true;
  o.compression = kLZ4Compression; o.write_buffer_size = 32 << 20; o.max_write_buffer_number = 3;
  o.db_write_buffer_size = 96 << 20; o.max_write_buffer_size_to_maintain = 1;
  o.memtable_insert_with_hint_prefix_extractor.reset(NewFixedPrefixTransform(1));
  TransactionDBOptions to;
  std::vector<ColumnFamilyDescriptor> cfs = {{"default", o}, {"available", o}, {"visibility", o}, {"in_progress", o}, {"leases", o}, {"lease_expiry", o}};
  std::vector<ColumnFamilyHandle*> h; TransactionDB* db;
  Status s = TransactionDB::Open(o, to, dir, cfs, &h, &db);
  if (!s.ok()) { fprintf(stderr, "%s\n", s.ToString().c_str()); return 1; }
  WriteOptions wo; ReadOptions ro; TransactionOptions txo;
  std::string payload(300, 'p');
  const int B = 32; const uint64_t N = 400000;
  uint64_t next = 1, lease = 1;
  double t0 = cpu();
  Transaction* txn = nullptr;
  auto begin = [&]() { txn = db->BeginTransaction(wo, txo, txn); if (mode == 'B' || mode == 'C' || mode == 'E') txn->DisableIndexing(); };
  // The transaction's writes, as each mode makes them.
  auto put = [&](ColumnFamilyHandle* cf, const std::string& k, const std::string& v) {
    if (mode == 'D') txn->GetWriteBatch()->Put(cf, k, v);
    else if (mode == 'E') txn->GetWriteBatch()->GetWriteBatch()->Put(cf, k, v);
    else txn->PutUntracked(cf, k, v);
  };
  auto sdel = [&](ColumnFamilyHandle* cf, const std::string& k) {
    if (mode == 'D') txn->GetWriteBatch()->SingleDelete(cf, k);
    else if (mode == 'E') txn->GetWriteBatch()->GetWriteBatch()->SingleDelete(cf, k);
    else txn->SingleDeleteUntracked(cf, k);
  };
  auto del = [&](ColumnFamilyHandle* cf, const std::string& k) {
    if (mode == 'D') txn->GetWriteBatch()->Delete(cf, k);
    else if (mode == 'E') txn->GetWriteBatch()->GetWriteBatch()->Delete(cf, k);
    else txn->DeleteUntracked(cf, k);
  };
  for (uint64_t done = 0; done < N; done += B) {
    uint64_t first = next;
    // enqueue
    if (mode == 'C') {
      WriteBatch wb;
      for (int i = 0; i < B; i++, next++) { wb.Put(h[1], key(2, next), payload); wb.Put(h[2], key(3, next), ""); }
      db->GetBaseDB()->Write(wo, &wb);
    } else {
      begin();
      for (int i = 0; i < B; i++, next++) { put(h[1], key(2, next), payload); put(h[2], key(3, next), ""); }
      txn->Commit();
    }
    // claim
    begin();
    std::string v;
    for (int i = 0; i < B; i++) {
      uint64_t id = first + i;
      txn->GetForUpdate(ro, h[1], key(2, id), &v);
      sdel(h[1], key(2, id)); sdel(h[2], key(3, id));
      put(h[3], key(4, id), v);
    }
    put(h[4], key(5, lease), std::string(B * 16, 'l')); put(h[5], key(6, lease), "");
    txn->Commit();
    // ack
    if (mode == 'C') {
      WriteBatch wb;
      for (int i = 0; i < B; i++) wb.SingleDelete(h[3], key(4, first + i));
      wb.Delete(h[4], key(5, lease)); wb.Delete(h[5], key(6, lease));
      db->GetBaseDB()->Write(wo, &wb);
    } else {
      begin();
      for (int i = 0; i < B; i++) sdel(h[3], key(4, first + i));
      del(h[4], key(5, lease)); del(h[5], key(6, lease));
      txn->Commit();
    }
    lease++;
  }
  double t1 = cpu();
  printf("mode %c: %.2f cpu-us/item\n", mode, (t1 - t0) * 1e6 / N);
  delete txn;
  for (auto x : h) db->DestroyColumnFamilyHandle(x);
  delete db;
}
