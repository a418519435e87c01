// Package dbkeys owns the byte layout of every key and value leaseq writes to
// an ordered key-value store (RocksDB today). It is pure: functions take and
// return primitives (queue names as strings, ids and lease tokens as
// [16]byte, instants as int64 unix nanoseconds) and never touch storage
// types or a database.
//
// Keys. Every key starts with one namespace byte (the Ns* constants). The
// queue name, where present, is escaped and terminated (see AppendQueue) so
// that no queue name is a prefix of another queue's keys and byte order of
// keys agrees with byte order of queue names. Integers are big-endian and
// fixed width; signed instants have their sign bit flipped, so bytes.Compare
// on two keys agrees with comparing the values they encode. Global time
// indexes (lease_expiry, delayed, dedup_expiry) put the instant right after
// the namespace byte so one range scan finds everything due before a time,
// across queues.
//
//	meta      0x01 kind ...                       -> see Meta* kinds
//	available 0x02 queue id                        -> ItemRecord
//	visibility 0x03 queue prio visible_at id       -> marker
//	in_progress 0x04 queue id                      -> ItemRecord (with lease)
//	leases    0x05 lease                           -> LeaseRecord
//	lease_expiry 0x06 expiry lease                 -> marker
//	dlq       0x07 queue id                        -> ItemRecord (with reason, dead_at)
//	dedup     0x08 queue dedup_key                 -> DedupRecord
//	dedup_expiry 0x09 expires_at queue dedup_key   -> marker
//	delayed   0x0A visible_at queue id             -> marker
//	payload   0x0B queue id                        -> payload value
//
// Values. Every value starts with the format-version byte FormatVersion.
// Variable-length fields carry a fixed-width uint32 length so that every
// decodable value has exactly one encoding (the fuzz tests rely on it).
//
// Decoders return ErrMalformed (wrapped) for anything they cannot parse and
// never panic. Returned byte slices (payloads) alias the input; callers that
// keep them must own the input.
//
// Everything here is part of the on-disk format: never renumber or reuse a
// namespace, kind or flag; add new ones instead. The golden file in
// testdata pins every encoding.
package dbkeys
