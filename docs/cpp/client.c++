// A leaseq client in C++ over the node's Cap'n Proto interface
// (schema/queue.capnp). It tours the whole protocol, one step after the
// other, printing one line per event:
//
//   1. enqueue three items, poll them under one lease, extend the lease;
//   2. ack two of them, nack the third with a reason, then read the outcome
//      back with stats and peek, and see that the finished lease is gone;
//   3. promise pipelining: call subscribe and, without waiting for its
//      answer, cancel the Subscription it will return;
//   4. push delivery: a Consumer implemented here, in C++, receives the
//      node's `deliver` calls (a `-> stream` method) and acks every batch.
//      Then it cancels the subscription, or, with --wait-done, keeps it
//      until the node ends it (stop the node) and prints the node's `done`.
//
// Build and run with `make cpp-example` (needs libcapnp-dev), or by hand as
// the README's "Other languages" section shows. TestCpp_Interop runs it
// against a real node and checks these lines and the node's state after.
#include <capnp/ez-rpc.h>
#include <capnp/schema.h>
#include <kj/async-io.h>
#include <kj/encoding.h>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include "queue.capnp.h"

namespace {

// enumName is the schema's name of an enum value ("leaseExpired"), or
// "code N" for a value newer than the schema this client was built with.
template <typename E>
kj::String enumName(E value) {
  auto enumerants = capnp::Schema::from<E>().getEnumerants();
  auto i = static_cast<uint16_t>(value);
  if (i < enumerants.size()) return kj::str(enumerants[i].getProto().getName());
  return kj::str("code ", i);
}

// check throws unless a result's Status says the request was applied.
// Any other code means the node refused the whole request and changed
// nothing; status.detail says why.
void check(const char* call, Status::Reader status) {
  if (status.getCode() != ErrorCode::NONE) {
    throw std::runtime_error(kj::str(call, ": ", enumName(status.getCode()), ": ", status.getDetail()).cStr());
  }
}

kj::String hex(capnp::Data::Reader bytes) { return kj::encodeHex(bytes); }
kj::String text(capnp::Data::Reader bytes) { return kj::str(bytes.asChars()); }

// PushConsumer is the Consumer capability this client hands to subscribe.
// The node calls deliver(lease, expiresAt, items) with one poll's worth of
// items under one lease; this consumer acks them all through the Queue.
//
// Flow control: deliver is declared `-> stream`, so Cap'n Proto gives this
// object the next deliver only once the promise returned for the previous
// one has resolved. Returning the ack's promise therefore means "send more
// when these are acked"; the node's per-subscription prefetch credit and
// its stream window bound what waits in between.
class PushConsumer final : public Consumer::Server {
 public:
  PushConsumer(Queue::Client queue, kj::StringPtr queueName)
      : queue(kj::mv(queue)), queueName(kj::heapString(queueName)) {
    auto paf = kj::newPromiseAndFulfiller<kj::String>();
    doneFulfiller = kj::mv(paf.fulfiller);
    donePromise = kj::mv(paf.promise);
  }

  // whenAcked resolves once n items have been delivered and acked.
  kj::Promise<void> whenAcked(size_t n) {
    target = n;
    auto paf = kj::newPromiseAndFulfiller<void>();
    ackedFulfiller = kj::mv(paf.fulfiller);
    notifyIfAcked();
    return kj::mv(paf.promise);
  }

  // whenDone resolves with the status the node sent to done(). Call it
  // once.
  kj::Promise<kj::String> whenDone() { return kj::mv(donePromise); }

  size_t deliveries = 0, largestDelivery = 0, maxInProgress = 0;

 protected:
  kj::Promise<void> deliver(DeliverContext context) override {
    auto params = context.getParams();
    auto items = params.getItems();
    deliveries++;
    largestDelivery = kj::max(largestDelivery, items.size());
    maxInProgress = kj::max(maxInProgress, ++inProgress);
    std::cout << "deliver " << items.size() << " items:";
    auto ack = queue.ackRequest();
    ack.setQueue(queueName);
    ack.setLease(params.getLease());  // send the token back exactly as received
    auto ids = ack.initIds(items.size());
    for (uint i = 0; i < items.size(); i++) {
      std::cout << " \"" << text(items[i].getPayload()).cStr() << "\"";
      ids.set(i, items[i].getId());
    }
    std::cout << std::endl;
    // The arguments are no longer needed (the ack request holds copies).
    context.releaseParams();
    return ack.send().then([this](capnp::Response<Queue::AckResults> res) {
      check("ack", res.getStatus());
      size_t ok = 0;
      for (auto code : res.getCodes()) ok += code == ResultCode::OK;
      acked += ok;
      inProgress--;
      std::cout << "acked " << ok << " of " << res.getCodes().size() << std::endl;
      notifyIfAcked();
    });
  }

  kj::Promise<void> done(DoneContext context) override {
    // The node ended the subscription (shutdown or failure) and says why.
    auto status = context.getParams().getStatus();
    if (doneFulfiller->isWaiting()) {
      doneFulfiller->fulfill(kj::str(enumName(status.getCode()), " detail=\"", status.getDetail(), "\""));
    }
    return kj::READY_NOW;
  }

 private:
  void notifyIfAcked() {
    if (ackedFulfiller.get() != nullptr && ackedFulfiller->isWaiting() && acked >= target) {
      ackedFulfiller->fulfill();
    }
  }

  Queue::Client queue;
  kj::String queueName;
  size_t acked = 0, target = 0, inProgress = 0;
  kj::Own<kj::PromiseFulfiller<void>> ackedFulfiller;
  kj::Own<kj::PromiseFulfiller<kj::String>> doneFulfiller;
  kj::Promise<kj::String> donePromise = nullptr;
};

// enqueue adds one item per payload to queue and returns the new ids.
kj::Vector<kj::Array<capnp::byte>> enqueue(Queue::Client& queue, kj::WaitScope& ws, kj::StringPtr queueName,
                                           kj::ArrayPtr<const kj::StringPtr> payloads) {
  auto req = queue.enqueueRequest();
  req.setQueue(queueName);
  auto items = req.initItems(payloads.size());
  for (uint i = 0; i < payloads.size(); i++) items[i].setPayload(payloads[i].asBytes());
  auto res = req.send().wait(ws);
  check("enqueue", res.getStatus());
  kj::Vector<kj::Array<capnp::byte>> ids;
  for (auto r : res.getResults()) {
    // Per item: ok, or invalid with a detail (payload too large, ...).
    if (r.getCode() != ResultCode::OK) throw std::runtime_error(kj::str("enqueue item: ", r.getDetail()).cStr());
    ids.add(kj::heapArray(r.getId()));
  }
  return ids;
}

int run(const char* addr, bool waitDone) {
  capnp::EzRpcClient client(addr);
  auto& ws = client.getWaitScope();
  auto& timer = client.getIoProvider().getTimer();
  // The bootstrap capability is the Queue (getMain; importCap is deprecated).
  Queue::Client queue = client.getMain<Queue>();

  // 1. enqueue, poll, extend.
  const kj::StringPtr jobs[] = {"job 1", "job 2", "job 3"};
  for (auto& id : enqueue(queue, ws, "cpp-jobs", jobs)) std::cout << "enqueued " << hex(id).cStr() << std::endl;

  auto poll = queue.pollRequest();
  poll.setQueue("cpp-jobs");
  poll.setMax(10);
  poll.setLeaseMs(30000);
  poll.setWaitMs(5000);  // long poll: wait up to 5 s for the first item
  auto polled = poll.send().wait(ws);
  check("poll", polled.getStatus());
  auto items = polled.getItems();
  auto lease = polled.getLease();  // one token for every item of this poll
  for (auto item : items) {
    std::cout << "polled " << hex(item.getId()).cStr() << " attempts=" << item.getAttempts() << " payload=\""
              << text(item.getPayload()).cStr() << "\"" << std::endl;
  }
  if (items.size() != 3) throw std::runtime_error("poll: expected the 3 items just enqueued");

  // extend: the lease now runs 60 s from now instead of 30 s from the poll.
  auto extend = queue.extendRequest();
  extend.setQueue("cpp-jobs");
  extend.setLease(lease);
  extend.setLeaseMs(60000);
  auto extended = extend.send().wait(ws);
  check("extend", extended.getStatus());
  std::cout << "extend status=none later=" << (extended.getExpiresAt() > polled.getExpiresAt() ? "true" : "false")
            << std::endl;

  // 2. ack the first two items; nack the third with a reason and a one-hour
  // delay (delayMs -1, the default, would use the queue's backoff).
  auto ack = queue.ackRequest();
  ack.setQueue("cpp-jobs");
  ack.setLease(lease);
  auto ackIds = ack.initIds(2);
  ackIds.set(0, items[0].getId());
  ackIds.set(1, items[1].getId());
  auto acked = ack.send().wait(ws);
  check("ack", acked.getStatus());
  for (uint i = 0; i < acked.getCodes().size(); i++) {  // one code per id, in order
    std::cout << "ack " << hex(ackIds[i]).cStr() << " " << enumName(acked.getCodes()[i]).cStr() << std::endl;
  }

  auto nacked = items[2].getId();
  auto nack = queue.nackRequest();
  nack.setQueue("cpp-jobs");
  nack.setLease(lease);
  nack.initIds(1).set(0, nacked);
  nack.setDelayMs(3600 * 1000);
  nack.setReason("cpp: downstream busy");
  auto nackRes = nack.send().wait(ws);
  check("nack", nackRes.getStatus());
  std::cout << "nack " << hex(nacked).cStr() << " " << enumName(nackRes.getCodes()[0]).cStr() << std::endl;

  // Every item of the lease is settled, so the lease is over: extending it
  // is refused with status leaseExpired (a request-level refusal, not an
  // exception).
  auto late = queue.extendRequest();
  late.setQueue("cpp-jobs");
  late.setLease(lease);
  late.setLeaseMs(60000);
  std::cout << "extend finished lease status=" << enumName(late.send().wait(ws).getStatus().getCode()).cStr()
            << std::endl;

  auto statsReq = queue.statsRequest();
  statsReq.setQueue("cpp-jobs");
  auto stats = statsReq.send().wait(ws);
  check("stats", stats.getStatus());
  for (auto s : stats.getStats()) {
    std::cout << "stats " << s.getQueue().cStr() << " enqueued=" << s.getEnqueued() << " delivered=" << s.getDelivered()
              << " acked=" << s.getAcked() << " nacked=" << s.getNacked() << " ready=" << s.getReady()
              << " delayed=" << s.getDelayed() << " inflight=" << s.getInflight() << std::endl;
  }

  // peek lists items without leasing them: the nacked one waits out its
  // delay, carrying the nack's reason.
  auto peek = queue.peekRequest();
  peek.setQueue("cpp-jobs");
  auto peeked = peek.send().wait(ws);
  check("peek", peeked.getStatus());
  for (auto item : peeked.getItems()) {
    if (item.getId() != nacked) continue;
    std::cout << "peek " << hex(item.getId()).cStr() << " state=" << enumName(item.getState()).cStr()
              << " attempts=" << item.getAttempts() << " lastError=\"" << item.getLastError().cStr() << "\""
              << std::endl;
  }

  // 3. Promise pipelining: subscribe returns a Subscription capability.
  // Instead of waiting for that answer, call cancel() on the promise of it
  // right away: both calls leave in one round trip, and the node runs the
  // cancel on the subscription as soon as subscribe has made it.
  {
    auto sub = queue.subscribeRequest();
    sub.setQueue("cpp-pipelined");
    sub.setPrefetch(1);
    sub.setConsumer(kj::heap<PushConsumer>(queue, "cpp-pipelined"));
    auto subscribed = sub.send();
    auto cancelled = subscribed.getSubscription().cancelRequest().send();
    auto subRes = subscribed.wait(ws);
    check("subscribe", subRes.getStatus());
    cancelled.wait(ws);
    std::cout << "pipelined subscribe status=none; cancel on its promised subscription ok" << std::endl;
  }

  // 4. Push delivery to a Consumer implemented in C++ (PushConsumer).
  const kj::StringPtr pushes[] = {"push 1", "push 2", "push 3", "push 4", "push 5"};
  enqueue(queue, ws, "cpp-push", pushes);
  std::cout << "push enqueued " << kj::size(pushes) << std::endl;
  auto owned = kj::heap<PushConsumer>(queue, "cpp-push");
  PushConsumer& consumer = *owned;  // the capability below keeps it alive
  Consumer::Client consumerCap = kj::mv(owned);
  auto allAcked = consumer.whenAcked(kj::size(pushes));

  auto sub = queue.subscribeRequest();
  sub.setQueue("cpp-push");
  sub.setPrefetch(2);  // at most 2 pushed items unacked at once
  sub.setLeaseMs(30000);
  sub.setConsumer(consumerCap);
  auto subRes = sub.send().wait(ws);
  check("subscribe", subRes.getStatus());
  // Dropping this capability would cancel the subscription too.
  Subscription::Client subscription = subRes.getSubscription();
  timer.timeoutAfter(30 * kj::SECONDS, kj::mv(allAcked)).wait(ws);
  std::cout << "push acked=" << kj::size(pushes) << " deliveries=" << consumer.deliveries
            << " largest=" << consumer.largestDelivery << " in_progress_max=" << consumer.maxInProgress << std::endl;

  if (waitDone) {
    // The node calls done(status) when it ends a subscription for a reason
    // of its own, such as shutting down; a client's cancel gets no done.
    std::cout << "push waiting for the node to end the subscription" << std::endl;
    std::cout << "done " << consumer.whenDone().wait(ws).cStr() << std::endl;
  } else {
    subscription.cancelRequest().send().wait(ws);
    std::cout << "push cancelled" << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // "host:port", or "unix:/path/to/socket".
  const char* addr = "127.0.0.1:7700";
  bool waitDone = false;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--wait-done") == 0) {
      waitDone = true;
    } else {
      addr = argv[i];
    }
  }
  try {
    return run(addr, waitDone);
  } catch (const kj::Exception& e) {  // transport or internal failure
    std::cerr << "error: " << e.getDescription().cStr() << std::endl;
  } catch (const std::exception& e) {  // the node refused a request
    std::cerr << "error: " << e.what() << std::endl;
  }
  return 1;
}
