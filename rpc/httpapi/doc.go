// Package httpapi serves leaseq's queue operations as an HTTP/JSON API
// (`leaseq serve --http ADDR`), next to the Cap'n Proto RPC server and over
// the same storage.Store, for clients that have curl and a JSON library but
// no Cap'n Proto.
//
// Routes (openapi.json, served at GET /v1/openapi.json, describes each):
//
//	POST   /v1/queues/{queue}/items        enqueue: a JSON array of items, or one raw item (application/octet-stream)
//	POST   /v1/queues/{queue}/poll         lease up to max ready items, long-polling up to wait_ms
//	POST   /v1/queues/{queue}/ack          per-id codes
//	POST   /v1/queues/{queue}/nack         per-id codes
//	POST   /v1/queues/{queue}/extend       new expiry (per-id codes when ids are given)
//	GET    /v1/queues                      stats of every queue
//	GET    /v1/queues/{queue}              stats and config of one queue
//	PUT    /v1/queues/{queue}/config       change a queue's config
//	GET    /v1/queues/{queue}/items        peek (state=ready|inflight, after, limit)
//	DELETE /v1/queues/{queue}/items        purge live items
//	GET    /v1/queues/{queue}/dlq          list dead items (after, limit)
//	POST   /v1/queues/{queue}/dlq/redrive  dead items back to ready (ids, or all up to limit)
//	DELETE /v1/queues/{queue}/dlq          delete dead items (ids, or all up to limit)
//	GET    /v1/openapi.json                the OpenAPI 3 description
//
// One node, one set of rules. Requests are checked against the same
// storage.Limits as RPC requests, by the same functions (ValidateItem,
// ValidateQueueName, ValidateLease, ...); a refused item gets its own
// result code and the rest of the batch is applied. Errors map through the
// table of rpc/errcode, so the "code" of a JSON error is the name of the
// RPC ErrorCode the same failure would get (invalidArgument, notFound,
// leaseMismatch, leaseExpired, unavailable, tooManyWaiters, internal), and
// per-item codes are the names of the RPC ResultCode (ok, notFound,
// leaseMismatch, leaseExpired, invalid). Long polls park on the node's
// rpc/dispatch Dispatcher (Config.Dispatcher: the RPC server's), so an
// enqueue through either front end, a nack, a redrive or the sweeper wakes
// them, and they count against the same per-queue and per-node waiter
// limits. Request bodies draw on the node's in-flight bytes budget
// (Config.Inflight: the RPC server's) while they are handled (a request
// never waits for it while holding some: call.take), and are bounded by
// Config.MaxBodyBytes (413 beyond it). A poll answer is bounded
// too, as the RPC server bounds its replies: the items that would take it
// past DefaultMaxAnswerBytes of JSON (at least one is served) are given
// back at once, as an undelivered nack (trimPoll). Acks, nacks and extends
// are reported to Config.Leases, so RPC subscriptions get their credit
// back whichever front end settled their items.
//
// Wire format. JSON in and out (415 for a body of another type, except
// application/octet-stream on the enqueue route); unknown fields are
// refused, so a misspelt field fails loudly instead of being ignored, and
// so are a field named twice in one object (checkNamesOnce) and a query
// parameter given twice (checkQuery).
// Durations are integer milliseconds (*_ms); instants are RFC 3339 in UTC
// with milliseconds, as the CLI prints them; ids and leases are 32 hex
// digits; payloads are standard base64 ("payload"), and items also carry
// "text", the payload itself, when it is valid UTF-8; strings are not
// HTML-escaped ('<' stays '<', not "\u003c"). An error is an HTTP status
// with the body {"error": {"code": ..., "message": ...}}.
//
// Mounting. The Server's handler serves /v1/; Mount adds other handlers on
// the same listener (the web dashboard at /ui/), before Start.
//
// Lifecycle: New, then Start on a listener (TLS from Config.TLS), then
// Stop: it refuses new requests with 503 unavailable, ends parked long
// polls with 503 unavailable, lets running requests finish, and closes the
// listener. Stop it before the RPC server whose Dispatcher it shares.
//
// Concurrency: Server is safe for concurrent use. Lock order: Server.mu is
// a leaf (never held while calling the store or the dispatcher).
// Ownership: request bodies are read into buffers the handler owns; the
// store's results are encoded before the handler returns. No time is read
// except through the injected clock.Clock.
package httpapi
