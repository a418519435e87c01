// Package webui is the node's web dashboard: server-rendered HTML pages over
// a storage.Store, meant to be mounted under a prefix (e.g. /ui/) of the
// node's HTTP listener.
//
// Pages (all GET, read-only):
//
//	PREFIX/                  queue list: depth by state, oldest ready age, enqueue/ack rates
//	PREFIX/queues/Q          one queue: stats, config, a page of available (or ?view=inflight) items
//	PREFIX/queues/Q/dead     the queue's dead-letter items with their reasons
//
// Actions (POST forms from the dead-letter page): PREFIX/queues/Q/dead/redrive
// and .../dead/purge, for one item, the items ticked on the page, or all of
// them; each answers with a redirect back and a one-time flash message.
// "All" posts the page's dead count and the instant it was read, and acts
// on the items dead by then, no more than that count: an item that dies
// between the page and the click stays (deadSeen).
// Queue names ([A-Za-z0-9._-], never "." or "..") are path segments as they
// are; pages are cursors (?after=ID) as in Store.Peek and Store.DeadList.
//
// Security. Every mutating request must come from the dashboard itself: its
// Sec-Fetch-Site is same-origin, or its Origin (else Referer) names the
// request's Host; anything else is refused with 403 before the store is
// touched. With Config.RequireClientCert every request, pages included
// (they show payloads), needs a verified TLS client certificate. Pages send
// a strict Content-Security-Policy (no inline script, no framing), and
// everything from the store (queue names, reasons, payloads: arbitrary
// bytes) goes through html/template; payload previews are cut short and
// stripped of control and bidirectional-override characters.
//
// Rates. The enqueue and ack rates on the queue list are differences of the
// lifetime counters in storage.QueueStats over about the last minute. A UI
// keeps a fixed-size ring of timestamped counter samples per queue, filled
// by a ticker on the injected clock (one Store.Stats call for all queues per
// SampleInterval) and by the queue list page itself; rings of queues that no
// longer exist are dropped, so memory is bounded by the store's queue
// limit.
//
// Concurrency: a UI and its Handler are safe for concurrent use. The rate
// rings are guarded by one leaf mutex, never held while calling the store.
// The sampler goroutine belongs to the UI and stops in Close. No time is
// read except through the injected clock.Clock. Assets (templates, CSS,
// JavaScript) are embedded: the dashboard works offline, with no CDN.
package webui
