// Package peers implements the benchmark's comparison systems through their
// usual Go clients, each started by the harness as a real server process on
// 127.0.0.1 with a fresh data directory:
//
//   - Redis Streams (go-redis): XADD (pipelined per batch), XREADGROUP,
//     XACK+XDEL (so an acked item is gone, as in a work queue), and
//     XAUTOCLAIM to take over entries whose consumer went silent for longer
//     than the lease. appendfsync always (fsync before replies, shared by
//     the commands of one event-loop pass) and everysec.
//   - beanstalkd (go-beanstalk): put / reserve-with-timeout / delete on one
//     tube per queue, TTR as the lease. Binlog with -f 0 (fsync every
//     write) and -F (never fsync). beanstalkd has no batch commands, so a
//     batch is a sequence of commands on one connection.
//   - NATS JetStream (nats.go jetstream): one work-queue stream with file
//     storage, subjects q.<queue>, one durable pull consumer per queue with
//     explicit acks and AckWait as the lease. Publishes of a batch are
//     asynchronous and awaited together; sync_interval always (fsync every
//     write) and the default (fsync every 2 minutes).
//
// Servers are found in PATH, or in the go install directories for
// nats-server (Debian bookworm's 2.9 has no sync_interval). System.Available
// says what is missing.
package peers
