// Package rpc serves leaseq's Cap'n Proto protocol (schema/queue.capnp) over
// a storage.Store, and holds the Go client (Client, Dial) and the helpers
// built on it: the consumer (Client.Consume) and the batching producer
// (Client.Producer), which coalesces concurrent single-item enqueues into
// batched calls (BenchmarkRPC_Producer: 32 goroutines, single items,
// sync=always: 8.5k items/s with a call per item, 24k through a Producer at
// 0.11 calls per item).
//
// Server. NewServer takes a ServerConfig (store, clock, logger, limits,
// connection and waiter bounds, optional TLS). Serve or Start accept on a
// listener from Listen ("host:port" or "unix:/path"); Stop stops accepting,
// ends parked long polls and subscriptions, waits for running calls, then
// closes every connection. On either engine (and on StartBootstrap
// listeners such as Queueber's), a connection that ends (Stop, the client
// gone, a failed write) gives back the items of its poll answers not a
// byte of which was written (ready again at once, as a subscription's
// undelivered batch; an answer partly written is the client's; on
// go-capnp its transport sees the Returns written or dropped:
// unwritten.go). On go-capnp, so does a poll answer the client finishes
// (cancels) before a byte of it is written (Queueber has no nack; the
// Return still goes out, and the client's library drops it). On the lean engine a client is cut off for not reading
// its answers only when the socket takes no byte of them for
// ReplyStallTimeout, however large the answer. Neither engine keeps an
// answer without capabilities once it is written (go-capnp would keep it
// until the question's Finish, which a client may never send), so the
// reply budget bounds what a connection's answers hold. Each connection
// gets its own bootstrap Queue object. On the go-capnp engine every handler calls call.Go() first so a
// blocking call (a long poll, an fsync) never holds up the connection's
// other calls; the lean engine (below) gets the same by running such calls
// off its reader. Wake is the hook for the sweeper's "queues gained ready
// items".
//
// Engines. ServerConfig.Engine (leaseq serve --rpc-engine) picks how a
// connection of the Queue interface is served. Both speak the standard Cap'n
// Proto RPC protocol (the Go client, the C++ reference client of docs/cpp
// and any conforming client work with either; TestMain runs every test of
// this package on both) and run the same handler bodies (handlers.go).
//   - go-capnp (--rpc-engine go-capnp): go-capnp's rpc.Conn. Each call crosses several goroutines
//     (the reader, handleCalls, the call.Go goroutine, a send task) and
//     every reply is its own writev.
//   - lean (the default; lean*.go): one reader goroutine per connection decodes the
//     rpc.capnp messages itself and runs every call that cannot wait on the
//     spot (nodeInfo, subscribe, and every call when the store is
//     storage.Nonblocking: memstore, rocksstore with --sync=none). On a
//     store whose calls wait for an fsync but complete asynchronously
//     (storage.Async: rocksstore with --sync=always), enqueues, polls and
//     acks take no goroutine either: the reader hands them to the store
//     and reads on, and the goroutine that fsynced them builds and sends
//     their Returns (lean_async.go; with 4 producers of single items,
//     20-25 % less server CPU per call and a third fewer context
//     switches; a lone caller's call costs what it did: 84-86 server
//     cpu-µs in BenchmarkRPC_EnqueueRoundTrip, docs/BENCHMARKS.md "Calls
//     completed by the fsync's goroutine"). Other calls on a waiting store run on a
//     goroutine of their own, taken from a pool (workers.go) so that its
//     stack, grown deep in the store, is not copied again for every
//     call. A long poll that
//     parks holds no goroutine: the dispatcher's PollAsync answers it when
//     it is woken, times out, is finished by the client or the server stops
//     (BenchmarkRPC_ParkedPollMemory: 6 KB per parked poll, client side
//     included, against 13-15 KB on go-capnp).
//     While a whole further message already waits in its read buffer
//     (a client's pipelined calls, such as Client.AckPoll's ack and
//     poll), the reader holds the store's fsyncs (storage.SyncHolder),
//     so what it hands over from one read shares one fsync; it lets go
//     before it could wait (its next read, the reply or flow budget).
//     Replies are coalesced into one write per batch of ready replies, and
//     plain sockets are read and written with raw system calls (rawio.go).
//     The reader writes what is ready before its next decode could wait
//     (no whole message buffered, part of one included) and before it
//     waits for the reply budget. A goroutine that serves every
//     connection (the store's syncer) never waits for one socket: the
//     Returns it sends, the Releases of the capabilities a call's params
//     carried and the Finishes of calls given up are written "shared"
//     (what the socket takes at once; a goroutine of the connection
//     writes the rest). The node's calls to a client's capabilities
//     (Consumer.deliver, Consumer.done) end with their context: rejected,
//     and a Finish sent, the client's later Return is dropped.
//     StartBootstrap listeners (Queueber) stay on go-capnp.
//
// Why lean, by measurement: one call at a time over TCP loopback to a
// server in a process of its own, CPU time per call from getrusage on each
// side (2 shared cores, two runs each; the numbers move by ~15% between
// runs). The server process runs with GODEBUG=schedtrace set, as `leaseq
// serve` does (sysmon.go at the repository root: without it, every RocksDB
// call of the idle server woke Go's sysmon, 88 instead of 53-65 µs for the
// rocks --sync=none enqueue):
//
//	go test ./rpc -run '^$' -bench 'NodeInfoRoundTrip|EnqueueRoundTrip' -benchtime 20000x -count 2
//
//	server cpu-µs/call                  go-capnp   lean
//	nodeInfo (no store work)              68-71    32-38
//	enqueue 1x256 B, mem                 102-104   30-44
//	enqueue 1x256 B, rocks --sync=none   147-159   63-65
//	enqueue 1x256 B, rocks --sync=always 256-264  172-177
//
// Latency follows (nodeInfo p50 0.13 -> 0.08 ms). Where the lean engine's
// remaining time goes (LEASEQ_BENCH_PROC_CPUPROFILE=/tmp/p writes the server
// process's CPU profile): about 60% is the kernel in read, write and
// epoll_wait (a loopback write also delivers to the client), one read per
// call finds nothing (Go's poller reads before it waits, and RawConn.Read
// resets readiness first, so it cannot be skipped); the rest is capnp
// decoding and encoding, allocation and the handler. With rocksstore the
// store's own work (~50 µs per single-item enqueue on Debian's assertion
// build of RocksDB) is now most of a call's cost. The Finish that follows
// every call is read in place (lean_finish.go) when it has the layout
// go-capnp gives it (one segment of four words): decoding it as a
// Message was about a sixth of the server's user-space CPU per nodeInfo
// round trip. Four interleaved pairs of 100,000 round trips: 30.7-35.1
// against 35.2-35.8 server cpu-µs; produce-b1 over RPC with
// --sync=none, three pairs: 47.8-49.2 against 51.9-53.7 node cpu-µs per
// call (docs/BENCHMARKS.md, 2026-11-29). Any other layout is decoded as
// before.
//
// The Go client has the same two engines (ClientOptions.Engine). Dial
// runs the lean one by default (leanclient.go): the caller encodes and
// writes its Call itself and, on a plain socket, reads the Returns itself
// until its own comes (handing any other to its caller), so one goroutine
// wakes per call, as in a client with a connection per caller; a caller
// whose context ends mid-read is interrupted by a read deadline, and
// frameReader keeps the half-read message for the next reader. While
// another caller reads, or on TLS, a caller waits for the reader to hand
// its Return over. Reading its own Return cut the client's CPU per call
// by a quarter (BenchmarkRPC_*RoundTrip, 2026-11-27, four runs each:
// nodeInfo 36.7 -> 23.8 µs, enqueue to rocks-none 40.2 -> 26.2 µs; p50
// round trip -10 %). A connection with no call open is read by nobody for
// 100 ms, then by the reader goroutine, which sees it end. The Finish of
// an answer rides
// along with the next call instead of taking a write of its own (at once
// when the answer was over 64 KiB, or when 32 Finishes wait, since the
// node keeps an answer until its Finish). Plain sockets are read and
// written with raw system calls, as on the server (rawio.go): with Go's
// system-call bookkeeping, sysmon took 12 % of a producer's CPU, and the
// client's CPU per single-item enqueue fell from 26-29 to 20-23 µs
// without it (Redis's Go client: 20). A caller whose context ends also
// stops waiting for the write lock, or for a socket a partitioned node
// no longer drains: its write is cut by a write deadline and, on a plain
// socket, finished by a goroutine (half a message cannot be taken back;
// on TLS the connection ends), and Finishes never wait for the lock
// (leanclient_write.go). A poll whose caller gave up before its answer
// was read has its items given back at once (an undelivered nack, which
// counts no attempt) instead of leaving them leased until the lease
// expires (leanclient_abandon.go;
// the go-capnp engine leaves them leased). It hosts no capabilities, so
// Subscribe and Queue open a go-capnp connection of their own on first
// use; NewClient, over a connection the caller made, is go-capnp only.
// A Call or Bootstrap from the node gets a Return with an exception, and
// a message kind the client does not know an Unimplemented echo (how a
// newer node learns to fall back); past 64 such replies the connection
// ends (leanclient_answer.go).
// go-capnp's rpc.Conn hands every call and every Finish to a sender
// goroutine and every Return from its reader, so the client used to cost
// two to three times the server per call:
//
//	client cpu-µs/call (server)            go-capnp       lean
//	nodeInfo                              89-101 (34-37)  60-67 (31-34)
//	enqueue 1x256 B, mem                 95-115 (37-46)  51-53 (30-31)
//	enqueue 1x256 B, rocks --sync=none     101 (77)      53-70 (59-75)
//
// (`-benchtime 5000x`, static build; p50 round trip 98-117 -> 76-80 µs
// for the mem enqueue.)
//
// Other protocols. StartBootstrap serves another Cap'n Proto interface on a
// listener of its own (rpc/queueber: Queueber's protocol), with the same
// connection handling and limits; its handlers run their calls through
// Conn.Call (metrics, shutdown draining, reply budget) and reach the queues
// through Server.Enqueue, Poll, Ack and ExtendLease, which the Queue
// handlers use too, so both protocols share the limits, the store and the
// long-poll dispatcher.
//
// Errors. Request-level failures travel as a Status (schema.ErrorCode) in
// every result, mapped from the storage sentinels by the one table in
// rpc/errcode (which the HTTP API shares); the client turns them back into
// *StatusError values that wrap the same sentinels. Cap'n Proto exceptions mean transport or internal
// failure only.
//
// Limits. Every limit of storage.Limits is checked here before the store is
// called: queue names, batch sizes, lease, wait and delay ranges are
// request-level invalidArgument; payload size, per-item delay and dedup key
// length reject only their item (ResultCode invalid). Transport bounds: a
// maximum message size and traversal limit per incoming message, a
// per-connection budget of unanswered incoming bytes (reading stops when it
// is spent), MaxConns (an excess connection receives an RPC Abort saying
// why), and MaxWaitersPerQueue. On the lean engine the budget is taken
// for a message's whole size once its header is read, so its body must
// keep coming (no byte for FirstMessageTimeout closes the connection) and
// be whole within FirstMessageTimeout plus the time its size takes at 64
// KiB/s (bodyMinRate, lean_bodywatch.go), or the connection is closed: a
// client trickling a large body holds the budget no longer than that.
// A poll that completes while the connection's unread answers are over
// its reply budget (ConnReplyLimitBytes) gives its items back and
// answers empty (trimPoll); one taken while the budget is already spent
// (either engine, and Queueber's) answers empty without calling the store, so a client
// that reads none of its answers does not make the node claim items and
// give them back for every poll it sends.
//
// Replies have a bound of their own (replylimit.go): a reply can be far
// larger than the call that asked for it (a poll of MaxBatch items of
// MaxPayload is a GiB with the default limits), so what a node sends and
// the client reads is bounded by DefaultMaxReplyBytes (1 GiB, the largest
// reply storage.DefaultLimits allow), not by the 64 MiB
// (DefaultMaxMessageBytes, --max-message) that bounds each side's incoming
// calls. The Go client, on either engine and on the go-capnp connection
// that carries a subscription's pushes, reads messages up to it, through a
// frameReader whose buffer grows as a message's bytes arrive (a header that
// claims a GiB costs nothing until the bytes come), with a traversal limit
// of four times it. A node whose limits allow larger items (a raised
// --max-payload, --max-batch, --max-dedup-key or --max-reason) cuts polls,
// subscription pushes and peek and dead-letter pages to the items that fit
// (Server.replyItems: polls claim no more than that, so no item is leased
// and then lost in a reply nobody can read; pages are also cut by the
// sizes of the items read, which may have been stored under larger
// limits): fewer items than asked for, never an error. A message over the
// client's bound (a node of another version) fails the calls open on the
// connection with ErrReplyTooLarge, which is not IsDisconnected: the
// reply, not a request over the node's --max-message, is at fault.
//
// Long polls and subscriptions go through rpc/dispatch, which parks them in
// a per-queue FIFO woken by enqueue, nack, redrive and Wake. On a store
// whose commits wait for an fsync and that can claim inside an enqueue's
// commit (storage.EnqueueClaimer: rocksstore with --sync=always), an
// enqueue (over RPC or HTTP) takes the polls parked on its queue off their
// line and the store claims for them in the enqueue's own commit, so the
// claim shares the enqueue's fsync instead of taking one of its own after
// the enqueue's reply (dispatch.Dispatcher.Enqueue; latency-max
// rpc-always: e2e p50 1.04-1.25 against 1.43-1.77 ms,
// docs/BENCHMARKS.md). Over RPC the enqueue is answered before those
// polls: the producer's next call then tends to start the next fsync
// ahead of the consumers' acks. A subscription's
// pusher is a goroutine owned by the server; a shared lease tracker returns
// its credit when its leases are acked or nacked (on any connection),
// extended leases stay counted, and expired ones are freed by the clock.
// It ends when the client cancels it or drops it, and in any case with
// its connection: a consumer promise the client resolves to a capability
// of the node's (the subscription itself) holds no reference to the
// connection (TestBadInput_ConsumerResolvedToItsSubscription). The Go
// client does not trust the node to keep to the prefetch: a node that
// pushes without waiting for the answers would otherwise have every push
// wait in go-capnp's call queue on the client, in memory. Besides the
// Prefetch batches C holds, a Subscription takes at most 2*Prefetch items
// in pushes waiting for room in C (a leaseq node has at most Prefetch
// pushed and unanswered); a push past that is refused (the node keeps
// its items) and the subscription ends with Err wrapping
// ErrPrefetchExceeded (TestHostileNode_SubscribePushFloodBounded).
//
// Sharing. Another front end of the same node (rpc/httpapi) shares the
// server's Dispatcher, its InflightBudget, and reports acks, nacks and
// extends with LeaseSettled and LeaseExtended, so waiter limits, the
// in-flight bytes bound and subscription credit are per node, not per
// protocol. The error codes of both come from rpc/errcode.
//
// Untrusted input. Every incoming message goes through limitedCodec (size
// and traversal limits; a root that is not a struct ends the connection)
// and guardTransport, which ends a connection whose peer sends a message
// that go-capnp v3.1.0-alpha.2 cannot survive, because a panic in its
// receive goroutine would take the whole node down. go-capnp workarounds,
// each with a regression test in TestBadInput_Wire and its reproducer in
// testdata/fuzz/FuzzServerConn:
//
//   - A Call whose target is the promised answer of its own question:
//     handleCall registers the answer, then looks up the target and
//     dereferences the new answer's still-nil pipeline caller
//     (TestBadInput_Wire/CallOnItsOwnAnswer).
//   - A Call pipelined on an answer that has not returned yet, whose
//     target turns out to be no capability (a null subscription of a
//     refused subscribe, a struct field, a field past the end): go-capnp
//     queues it, and AnswerQueue.Fulfill dereferences the nil pipeline
//     caller it gets for it (fixed upstream in go-capnp PR 617, in no
//     release the module proxy serves). The transport lets calls be
//     pipelined only on a Bootstrap's capability and on a subscribe's
//     subscription, the only capability in any Queue result, and ends a
//     connection that pipelines on anything else; a refused subscribe
//     returns a subscription that does nothing instead of a null one
//     (TestBadInput_Wire/CallsPipelinedOnARefusedSubscribe). A method the
//     subscription does not have takes the same nil-caller path (go-capnp's
//     server rejects an unknown method without a pipeline caller), so a
//     subscription answers unknown methods with an Unimplemented exception
//     through a method of its own (TestBadInput_UnknownMethodPipelinedOnASubscription).
//   - A sender-loopback Disembargo whose target is a promised answer:
//     go-capnp reads the answer's results through their message, which is
//     nil when the results are empty (Subscription.cancel's). A client
//     sends one only when a result resolves to a capability it hosts
//     itself, and no Queue or Queueber result holds one, so the transport
//     ends such a connection (TestBadInput_DisembargoOnAnAnswer).
//   - A capability the client passes (in a Call's params, a Return's
//     results or a Resolve) that names a field of one of the node's
//     answers (receiverAnswer) other than a bootstrap capability or a
//     subscribe's subscription: go-capnp reads that answer's results,
//     and an answer without capabilities is released once written
//     (unwritten.go), so the transport ends such a connection, as for a
//     call pipelined there (TestReviewHostile_CapabilityOnAWrittenAnswer
//     in rpc/queueber).
//   - A Resolve of a promise the client passed in to another of its
//     promises or to itself: go-capnp can follow the chain for ever (a
//     promise resolved to itself), its receive goroutine spinning and the
//     node's Stop waiting for it. A senderHosted descriptor naming a
//     promise's id does it too (go-capnp takes the import it holds under
//     that id), so the transport mirrors go-capnp's import table, adding
//     the references it receives and taking away the Releases it sends,
//     and ends a connection that resolves a promise to a promise
//     (TestBadInput_PromiseResolvedToAPromise,
//     TestBadInput_PromiseResolvedToItsOwnImport); a client resolves a
//     promise to the capability it stands for.
//   - A Return of one of the node's questions (a push to a consumer)
//     whose Call has not gone out: go-capnp resolves the question's
//     promise with it, then rejects the promise again when the queued
//     Call fails to go out, a panic. The transport notes the Calls it
//     writes and ends a connection that returns a question not asked,
//     not sent or already returned; a Return of one being written waits
//     for the write (TestBadInput_ReturnOfAQuestionNotAsked).
//   - A nil import table entry in importClient.Shutdown, when the
//     goroutine that releases a finished call's message releases the
//     capabilities it carries. A fuzz input reached it (two Calls passing
//     the same two promises, the second naming one as senderHosted;
//     testdata/fuzz/FuzzServerConn/80409e34f8c49504) in 11-22 runs of
//     4,000 with three copies of the test competing for the two CPUs, never
//     alone; what removes the entry first was not found, so no input is
//     refused for it. Instead the transport's messages recover from a
//     panic in their Release and end the connection with a reason
//     (guardMsg, TestGuardTransport_ReleasePanicEndsTheConnectionNotTheProcess):
//     the node lives on, and the fuzz target's checks (no leak, a fresh
//     client served) hold after it.
//
// The lean engine resolves pipelined calls, reflects disembargoes and
// takes resolutions itself and needs none of these.
//
// FuzzServerConn (fuzz_test.go; `make fuzz`) feeds arbitrary message
// sequences (raw bytes, framed segments, and structurally valid rpc.capnp
// Messages: Bootstrap, Call, Return, Finish, Release, Resolve, Disembargo,
// Abort, ...) to one connection of a real Server, on each engine and on
// three stores (one whose calls never wait, one whose calls wait, and
// RocksDB with --sync=always, whose calls complete asynchronously), and
// checks that the server does not panic, answers a well-formed probe or
// ends the connection within a bound, releases the connection and its
// goroutines when it closes, and then serves a fresh client. One of its
// seeds is a crash found by reading the lean engine: a call pipelined
// into a returned answer without capabilities read that Return after its
// buffer was reused, and panicked (settle keeps no results pointer for
// such an answer; test
// TestBadInput_CallPipelinedOnAReturnedAnswerWithoutCapabilities). Both
// engines also bound a connection's questions without a Finish
// (leanMaxOpenQuestions; on go-capnp the transport's guard counts them,
// guardTransport.open), since each keeps an answer for every one, and end
// the connection past it (TestGuardTransport_OpenQuestionsBounded).
//
// Concurrency: Server, Client and Subscription are safe for concurrent use.
// Lock order: Server.mu and leaseTracker.mu are leaves (never held while
// calling the store, the dispatcher or capnp); dispatch has its own leaf
// lock. Ownership: everything a Client returns is copied out of capnp
// buffers; server-side arguments are copied before they outlive a handler.
// No time is read except through the injected clock.Clock.
package rpc
