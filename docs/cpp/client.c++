// A leaseq client in C++ over the node's Cap'n Proto interface
// (schema/queue.capnp): enqueue one item, poll it, ack it. Build and run
// with `make cpp-example` (needs libcapnp-dev), or by hand as the README's
// "Other languages" section shows.
#include <capnp/ez-rpc.h>
#include <kj/encoding.h>
#include <iostream>
#include "queue.capnp.h"

int main(int argc, char** argv) {
  // "host:port", or "unix:/path/to/socket".
  const char* addr = argc > 1 ? argv[1] : "127.0.0.1:7700";
  capnp::EzRpcClient client(addr);
  auto& ws = client.getWaitScope();
  // The bootstrap capability is the Queue (getMain; importCap is deprecated).
  Queue::Client queue = client.getMain<Queue>();

  auto enq = queue.enqueueRequest();
  enq.setQueue("jobs");
  enq.initItems(1)[0].setPayload(kj::StringPtr("hello from C++").asBytes());
  auto enqRes = enq.send().wait(ws);
  if (enqRes.getStatus().getCode() != ErrorCode::NONE) {
    std::cerr << "enqueue: " << enqRes.getStatus().getDetail().cStr() << std::endl;
    return 1;
  }
  std::cout << "enqueued " << kj::encodeHex(enqRes.getResults()[0].getId()).cStr() << std::endl;

  auto poll = queue.pollRequest();
  poll.setQueue("jobs");
  poll.setMax(10);
  poll.setLeaseMs(30000);
  poll.setWaitMs(5000);  // long poll: wait up to 5 s for an item
  auto polled = poll.send().wait(ws);
  if (polled.getStatus().getCode() != ErrorCode::NONE) {
    std::cerr << "poll: " << polled.getStatus().getDetail().cStr() << std::endl;
    return 1;
  }
  auto items = polled.getItems();
  auto ack = queue.ackRequest();
  ack.setQueue("jobs");
  ack.setLease(polled.getLease());  // the token covers every item of this poll
  auto ids = ack.initIds(items.size());
  for (uint i = 0; i < items.size(); i++) {
    auto payload = items[i].getPayload();
    std::cout << "polled " << kj::encodeHex(items[i].getId()).cStr() << " attempts=" << items[i].getAttempts()
              << " payload=" << kj::str(payload.asChars()).cStr() << std::endl;
    ids.set(i, items[i].getId());
  }
  auto codes = ack.send().wait(ws).getCodes();
  for (uint i = 0; i < codes.size(); i++) {
    std::cout << "ack " << kj::encodeHex(ids[i]).cStr() << " " << (codes[i] == ResultCode::OK ? "ok" : "failed")
              << std::endl;
  }
  return 0;
}
