# leaseq wire protocol: the Queue interface of a leaseq node.
#
# HOW TO USE THIS SCHEMA FROM ANOTHER LANGUAGE
#
# 1. Compile this file with your language's Cap'n Proto plugin. It imports
#    /go.capnp only for Go annotations; pass the directory holding go.capnp
#    with -I (it ships with go-capnp under std/), e.g.
#      capnp compile -I<go-capnp>/std -oc++ schema/queue.capnp
#
# 2. Connect a two-party RPC session (plain Cap'n Proto framing, not packed)
#    over TCP ("host:port", default 127.0.0.1:7700) or a unix socket, with
#    TLS when the node was started with a certificate (mutual TLS when it
#    has a client CA: present a client certificate signed by it). The
#    bootstrap capability is a Queue: in C++ use
#    EzRpcClient::getMain<Queue>() (the deprecated importCap(name) ignores the
#    name). A node that is at its connection limit aborts the session at
#    once with reason "leaseq: too many connections".
#
# 3. Call the methods below. Every result struct starts with a Status:
#    status.code == none means the request was applied; any other ErrorCode
#    means the whole request was refused and nothing changed (an invalid
#    queue name, a batch over the limit, a lease or wait out of range, no
#    such queue, ...), with a human-readable status.detail. Cap'n Proto
#    exceptions are raised only for transport and internal failures: treat
#    them as "outcome unknown" and retry (delivery is at-least-once).
#
#    Batch calls (enqueue, ack, nack, redrive, purgeDead with ids) return one
#    ResultCode per input element, in input order; an element the node
#    refuses on its own (an item over a limit, an id not held) gets its own
#    code and does not fail the others. A malformed element (an id that is
#    not 16 bytes) fails the whole request with invalidArgument.
#
#    Units: every instant is a UInt64 of milliseconds since the Unix epoch
#    (UTC, by the node's clock); every duration is milliseconds. Item ids and
#    lease tokens are opaque 16-byte Data values: send back exactly what you
#    received. Ids increase in enqueue order.
#
# 4. Lease rules. poll claims up to `max` ready items (priority ascending,
#    then visible time, then id) under ONE new lease token with one expiry;
#    every poll gets a new token. ack, nack and extend must present that
#    token with the queue name. A lease is live while now < expiresAt by the
#    node's clock, whether or not the node has swept it yet:
#      ok            the operation applied;
#      notFound      the item is not in the queue (already acked, purged, or
#                    never existed);
#      leaseMismatch the item is held under another token, or your live
#                    token does not list it;
#      leaseExpired  your token is not live (expired, finished, or forged)
#                    and nobody else holds the item.
#    An item whose lease expires (or that is nacked) comes back as ready, or
#    goes to the dead-letter queue once attempts reaches max attempts.
#    Extend resets the expiry to now + leaseMs. A client that disconnects
#    loses nothing: its long polls are cancelled and its leases simply
#    expire. Delivery is at-least-once: make handlers idempotent.
#
#    poll with waitMs = 0 returns at once (possibly empty). waitMs > 0 blocks
#    until at least one item is ready or the wait ends; an empty result is
#    not an error. Issue long polls as concurrent calls (they do not block
#    other calls on the connection).
#
# 5. Push delivery: subscribe(queue, prefetch, leaseMs, consumer) with your
#    own Consumer capability. The node calls consumer.deliver(lease,
#    expiresAt, items) whenever items are ready; each delivery is exactly
#    one poll's lease, with the same ack/nack/extend rules as above (ack via
#    Queue.ack on any connection). Flow control is by credit: at most
#    `prefetch` pushed items are outstanding at once; an item stops counting
#    when it is acked or nacked (result ok), or when its lease expires.
#    Extending a pushed lease keeps its items counted. deliver is a stream
#    method: the node limits the bytes it has in flight to you as well, so a
#    slow consumer is never flooded. The subscription lasts until you call
#    subscription.cancel(), drop the Subscription capability, or the session
#    ends; when it ends for a reason of the node's (shutdown, failure) the
#    node calls consumer.done(status) once, if it can.
#
# Compatibility: enum values and field ordinals are part of the wire format;
# never renumber or reuse them. New codes and fields go at the end.

@0x871cb1721930a9c7;

using Go = import "/go.capnp";
$Go.package("schema");
$Go.import("github.com/leaseq/leaseq/schema");

# ResultCode is the per-item outcome of a batch call. It mirrors
# storage.Code. Part of the wire format; never renumber or reuse.
enum ResultCode {
  ok @0;
  notFound @1;
  leaseMismatch @2;
  leaseExpired @3;
  invalid @4;         # rejected by a limit (payload size, delay, dedup key); see detail
}

# ErrorCode is the request-level outcome carried in every result's Status.
# Part of the wire format; never renumber or reuse.
enum ErrorCode {
  none @0;            # applied
  invalidArgument @1; # bad queue name, batch too large, lease/wait/delay out of range, bad id
  notFound @2;        # no such queue (stats, getConfig)
  leaseMismatch @3;   # extend: the token belongs to another queue
  leaseExpired @4;    # extend: the token is not live
  unavailable @5;     # the node is shutting down or its store is closed: retry elsewhere/later
  tooManyWaiters @6;  # too many long polls or subscriptions waiting on this queue
  internal @7;        # the store failed (I/O, corruption); outcome unknown
  notEmpty @8;        # deleteQueue without force: the queue still holds items
}

# Status is the first field of every result.
struct Status {
  code @0 :ErrorCode;
  detail @1 :Text;    # human-readable explanation; empty when code is none
}

# ItemState mirrors storage.State. Never renumber or reuse.
enum ItemState {
  unknown @0;
  ready @1;
  delayed @2;
  inflight @3;
  dead @4;
}

struct EnqueueItem {
  payload @0 :Data;        # opaque, at most 1 MiB by default
  delayMs @1 :UInt64;      # 0: ready at once; at most 7 days by default
  priority @2 :UInt8;      # lower is served first
  dedupKey @3 :Text;       # "" for none; a key seen in the queue's dedup window is a duplicate
  maxAttempts @4 :UInt32;  # 0: the queue's configured max attempts
}

struct EnqueueResult {
  code @0 :ResultCode;     # ok or invalid
  id @1 :Data;             # 16 bytes; for a duplicate, the first item's id
  duplicate @2 :Bool;
  detail @3 :Text;         # why, when code is invalid
}

struct Item {
  id @0 :Data;
  queue @1 :Text;
  payload @2 :Data;
  priority @3 :UInt8;
  attempts @4 :UInt32;     # deliveries so far, counting the current one when inflight
  maxAttempts @5 :UInt32;  # 0: the queue's config
  enqueuedAt @6 :UInt64;   # unix ms
  visibleAt @7 :UInt64;    # unix ms
  dedupKey @8 :Text;
  lastError @9 :Text;      # reason of the last nack
  state @10 :ItemState;
}

struct DeadItem {
  item @0 :Item;
  reason @1 :Text;         # "lease expired" or "nack: <reason>"
  deadAt @2 :UInt64;       # unix ms
}

struct QueueConfig {
  maxAttempts @0 :UInt32;
  leaseMs @1 :UInt64;      # default lease for polls that ask for 0
  dedupWindowMs @2 :UInt64;
  backoffBaseMs @3 :UInt64;
  backoffMaxMs @4 :UInt64;
}

struct QueueStats {
  queue @0 :Text;
  ready @1 :Int64;
  delayed @2 :Int64;
  inflight @3 :Int64;
  dead @4 :Int64;
  leases @5 :Int64;
  oldestReadyAgeMs @6 :UInt64;
  enqueued @7 :UInt64;
  duplicates @8 :UInt64;
  delivered @9 :UInt64;
  acked @10 :UInt64;
  nacked @11 :UInt64;
  expired @12 :UInt64;
  deadLettered @13 :UInt64;
  redriven @14 :UInt64;
  purged @15 :UInt64;
  config @16 :QueueConfig;
  corruptErrors @17 :UInt64; # calls on this queue that met damaged data since the node started
}

# NodeInfo describes the serving node.
struct NodeInfo {
  version @0 :Text;   # build version and VCS revision, as far as recorded
  backend @1 :Text;   # "rocksdb" or "fdb"
  sync @2 :Text;      # rocksdb: "always" (WAL fsynced before a reply) or
                      # "none" (written, not synced); fdb: "" (commits are
                      # durable when they return)
  maxBatch @3 :UInt32;   # most items or ids one call may carry (--max-batch)
  maxPayload @4 :UInt32; # largest item payload in bytes (--max-payload)
  minLeaseMs @5 :UInt64; # shortest lease a poll or extend may ask for (--min-lease)
  maxLeaseMs @6 :UInt64; # longest lease (--max-lease)
  maxDelayMs @7 :UInt64; # longest delay, retry delay, dedup window or backoff (--max-delay)
                         # (@5-@7: 0 from nodes older than these fields)
}

# Queue is the bootstrap capability of a leaseq node.
interface Queue {
  # enqueue adds items; queues are created on first enqueue. Per item: ok
  # (with id, duplicate) or invalid (with detail).
  enqueue @0 (queue :Text, items :List(EnqueueItem))
          -> (status :Status, results :List(EnqueueResult));

  # poll claims up to max (1..1000) ready items under one new lease of
  # leaseMs (0: the queue's default; else 100 ms..12 h), waiting up to
  # waitMs (0..60000) for the first one. No items: empty lease and list.
  poll @1 (queue :Text, max :UInt32, leaseMs :UInt64, waitMs :UInt64)
       -> (status :Status, lease :Data, expiresAt :UInt64, items :List(Item));

  # ack deletes items held under lease. One code per id.
  ack @2 (queue :Text, lease :Data, ids :List(Data))
      -> (status :Status, codes :List(ResultCode));

  # nack returns items held under lease: ready again after delayMs, or, when
  # delayMs < 0 (the default), after the queue's exponential backoff with
  # full jitter; dead once attempts reached max attempts. One code per id.
  # undelivered: no consumer received the items (a client gives back a
  # poll's answer its caller gave up on): the claim is taken back instead,
  # each item ready again at once in its old place, its attempts and
  # lastError as before the claim, never dead; delayMs must be < 0 or 0,
  # and reason is not recorded. The node trusts it: a client that gives
  # back what it did process keeps a failing item out of the dead letters.
  nack @3 (queue :Text, lease :Data, ids :List(Data), delayMs :Int64 = -1, reason :Text,
           undelivered :Bool)
       -> (status :Status, codes :List(ResultCode));

  # extend sets a live lease's expiry to now + leaseMs (100 ms..12 h).
  # status leaseExpired / leaseMismatch when it cannot.
  extend @4 (queue :Text, lease :Data, leaseMs :UInt64)
         -> (status :Status, expiresAt :UInt64);

  # stats of one queue, or of all queues (sorted by name) when queue is "".
  stats @5 (queue :Text) -> (status :Status, stats :List(QueueStats));

  # queues lists queue names in byte order.
  queues @6 () -> (status :Status, queues :List(Text));

  # peek lists up to limit (0: 100; at most 1000) items without leasing
  # them, in id order after `after` (empty: from the start): available
  # items, or inflight ones.
  peek @7 (queue :Text, inflight :Bool, after :Data, limit :UInt32)
       -> (status :Status, items :List(Item));

  # purge deletes every available and inflight item of a queue.
  purge @8 (queue :Text) -> (status :Status, purged :UInt64);

  # deadList pages through up to limit (0: 100) dead items in id order
  # after `after` (empty: from the start).
  deadList @9 (queue :Text, after :Data, limit :UInt32)
           -> (status :Status, items :List(DeadItem));

  # redrive moves dead items back to ready with attempts reset: the listed
  # ids (one code each, at most 1000), or, when ids is empty, up to limit
  # (0: 100) dead items in id order.
  redrive @10 (queue :Text, ids :List(Data), limit :UInt32)
          -> (status :Status, codes :List(ResultCode), moved :UInt64);

  # purgeDead deletes dead items, selected like redrive.
  purgeDead @11 (queue :Text, ids :List(Data), limit :UInt32)
            -> (status :Status, codes :List(ResultCode), moved :UInt64);

  # getConfig returns a queue's config; status notFound for no such queue.
  getConfig @12 (queue :Text) -> (status :Status, config :QueueConfig);

  # setConfig replaces a queue's config, creating the queue if needed.
  setConfig @13 (queue :Text, config :QueueConfig) -> (status :Status);

  # subscribe starts push delivery to consumer (see the top of this file).
  # prefetch: 1..the node's max batch (nodeInfo; 1000 by default) items
  # outstanding at most; leaseMs as for poll.
  subscribe @14 (queue :Text, prefetch :UInt32, leaseMs :UInt64, consumer :Consumer)
            -> (status :Status, subscription :Subscription);

  # nodeInfo describes the node: version, backend and durability mode
  # (`leaseq stats` shows them), and the limits a client needs to stay
  # within.
  nodeInfo @15 () -> (status :Status, info :NodeInfo);

  # deleteQueue removes a queue: its config, counters and dedup keys; status
  # notFound for no such queue. A queue that still holds items (ready,
  # delayed, inflight or dead) is refused with status notEmpty unless force,
  # which deletes them too (their leases end). deleted: items deleted.
  deleteQueue @16 (queue :Text, force :Bool) -> (status :Status, deleted :UInt64);
}

# Consumer is implemented by the client and passed to Queue.subscribe.
interface Consumer {
  # deliver hands over one poll's worth of items under one lease. Return
  # normally once you hold them. Throwing says you did not take them: the
  # node gives them back at once (ready again, no attempt counted), so do
  # not throw for a batch you may still process.
  deliver @0 (lease :Data, expiresAt :UInt64, items :List(Item)) -> stream;

  # done tells the consumer that the node ended the subscription.
  done @1 (status :Status) -> ();
}

# Subscription controls one subscribe. Dropping it cancels the subscription.
interface Subscription {
  # cancel stops the pushes. Leases already delivered stay valid until acked,
  # nacked or expired.
  cancel @0 () -> ();
}
