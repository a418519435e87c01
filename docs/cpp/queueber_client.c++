// A Queueber client in C++ against a leaseq node started with
// `leaseq serve --queueber-listen ADDR --queueber-queue NAME`: add two
// items, poll them under one lease, extend the lease, remove both, and show
// that a second remove and a malformed lease are refused. The schema is
// Queueber's own (schema/queueber.capnp), so this is what any Queueber
// client does. Build and run with `make cpp-example` (needs libcapnp-dev),
// or as the README's "Queueber compatibility" section shows.
#include <capnp/ez-rpc.h>
#include <kj/encoding.h>
#include <iostream>
#include "queueber.capnp.h"

int main(int argc, char** argv) {
  // "host:port", or "unix:/path/to/socket".
  const char* addr = argc > 1 ? argv[1] : "127.0.0.1:7701";
  capnp::EzRpcClient client(addr);
  auto& ws = client.getWaitScope();
  // The bootstrap capability is Queueber's Queue.
  Queue::Client queue = client.getMain<Queue>();

  // add: one call, two items, ready at once (visibilityTimeoutSecs 0).
  auto add = queue.addRequest();
  auto items = add.initReq().initItems(2);
  items[0].setContents(kj::StringPtr("hello from C++ 1").asBytes());
  items[1].setContents(kj::StringPtr("hello from C++ 2").asBytes());
  auto added = add.send().wait(ws);
  for (auto id : added.getResp().getIds()) {
    std::cout << "added " << kj::encodeHex(id).cStr() << std::endl;
  }

  // poll: up to 10 items under a 30 s lease, waiting up to 5 s.
  auto poll = queue.pollRequest();
  auto preq = poll.initReq();
  preq.setLeaseValiditySecs(30);
  preq.setNumItems(10);
  preq.setTimeoutSecs(5);
  auto polled = poll.send().wait(ws);
  auto resp = polled.getResp();
  auto lease = resp.getLease();  // covers every item of this poll
  std::cout << "lease " << kj::encodeHex(lease).cStr() << std::endl;
  for (auto it : resp.getItems()) {
    std::cout << "polled " << kj::encodeHex(it.getId()).cStr() << " " << kj::str(it.getContents().asChars()).cStr()
              << std::endl;
  }

  // extend: the lease now runs 60 s from now.
  auto ext = queue.extendRequest();
  auto ereq = ext.initReq();
  ereq.setLease(lease);
  ereq.setLeaseValiditySecs(60);
  std::cout << "extended " << (ext.send().wait(ws).getResp().getExtended() ? "true" : "false") << std::endl;

  // remove: each item under the lease; the second remove of an item is false.
  for (auto it : resp.getItems()) {
    auto rm = queue.removeRequest();
    auto rreq = rm.initReq();
    rreq.setId(it.getId());
    rreq.setLease(lease);
    std::cout << "removed " << kj::encodeHex(it.getId()).cStr() << " "
              << (rm.send().wait(ws).getResp().getRemoved() ? "true" : "false") << std::endl;
  }
  if (resp.getItems().size() > 0) {
    auto rm = queue.removeRequest();
    auto rreq = rm.initReq();
    rreq.setId(resp.getItems()[0].getId());
    rreq.setLease(lease);
    std::cout << "removed again " << (rm.send().wait(ws).getResp().getRemoved() ? "true" : "false") << std::endl;
  }

  // A malformed request is a Cap'n Proto exception that says why.
  auto bad = queue.removeRequest();
  auto breq = bad.initReq();
  breq.setId(resp.getItems().size() > 0 ? resp.getItems()[0].getId() : capnp::Data::Reader());
  breq.setLease(kj::StringPtr("abc").asBytes());
  auto badResult = bad.send().then(
      [](auto&&) { return kj::str("no exception"); },
      [](kj::Exception&& e) { return kj::str("exception: ", e.getDescription()); });
  std::cout << "bad lease: " << badResult.wait(ws).cStr() << std::endl;
  return 0;
}
