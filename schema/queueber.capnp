# Queueber's wire protocol, served by `leaseq serve --queueber-listen ADDR
# --queueber-queue NAME` so that existing Queueber clients can use a leaseq
# node without changes.
#
# Queueber is a Rust queue server on RocksDB and Cap'n Proto. Its clients
# compile their own copy of this interface; it matches theirs where it
# matters on the wire: the same file id, and the same type names, field
# ordinals and types, so every generated type id (and so every interface
# and method id a client sends) is the same. Only the Go annotations are
# ours (they change no id). Never rename, renumber or retype anything here:
# that would break the clients in the field.
#
# How a leaseq node maps the calls (rpc/queueber/doc.go has the details):
#   add     enqueue into the one configured queue; visibilityTimeoutSecs is
#           the delay before the item is ready (0..--max-delay); one id
#           (16 bytes) per item, in order
#   poll    claim up to numItems (0: 1) under one new lease of
#           leaseValiditySecs (> 0), waiting up to timeoutSecs (0: as long as
#           the node allows) for the first item; values beyond the node's
#           limits are clamped to them
#   remove  ack one id under its lease; false when the item is gone, held
#           under another lease, or the lease has expired
#   extend  set a live lease's expiry to now + leaseValiditySecs; false when
#           the lease is gone
# Malformed requests (a lease or id that is not 16 bytes, a zero lease, an
# item over the node's limits) fail with a Cap'n Proto exception saying why.

@0xbab6e22de0402699;

using Go = import "/go.capnp";
$Go.package("queueber");
$Go.import("github.com/leaseq/leaseq/schema/queueber");

struct Item {
  contents @0 :Data;
  # add: seconds before the item becomes visible (0: at once). Ignored on
  # poll results.
  visibilityTimeoutSecs @1 :UInt64;
}

struct AddRequest {
  items @0 :List(Item);
}

struct AddResponse {
  ids @0 :List(Data);
}

struct RemoveRequest {
  id @0 :Data;
  lease @1 :Data;
}

struct RemoveResponse {
  removed @0 :Bool;
}

struct PollRequest {
  leaseValiditySecs @0 :UInt64;
  # most items to return; 0 means 1
  numItems @1 :UInt32;
  # how long to wait for an item, in seconds; the server may return sooner
  timeoutSecs @2 :UInt64;
}

struct PolledItem {
  contents @0 :Data;
  id @1 :Data;
}

struct PollResponse {
  items @0 :List(PolledItem);
  lease @1 :Data;
}

struct ExtendRequest {
  lease @0 :Data;
  leaseValiditySecs @1 :UInt64;
}

struct ExtendResponse {
  extended @0 :Bool;
}

interface Queue {
  add @0 (req :AddRequest) -> (resp :AddResponse);
  remove @1 (req :RemoveRequest) -> (resp :RemoveResponse);
  poll @2 (req :PollRequest) -> (resp :PollResponse);
  extend @3 (req :ExtendRequest) -> (resp :ExtendResponse);
}
