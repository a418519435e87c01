// Client commands on items: enqueue, poll, ack, nack, extend.

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

var enqueueCommand = &command{
	name:    "enqueue",
	args:    "QUEUE [PAYLOAD|-]",
	summary: "add an item to a queue and print its id",
	help: `
Enqueue one item into QUEUE (created on first use) and print its id (32 hex
digits). PAYLOAD is taken literally (after "--" when it starts with a dash:
enqueue q -- -x); "-" reads the payload from stdin (raw
bytes, up to the node's --max-payload); no PAYLOAD enqueues an empty one.
With --lines, every line of stdin becomes one item and one id is printed
per line; lines are sent in calls of at most 500 items and about 1 MiB of
payload (a longer line goes alone), each call as soon as it is full or
stdin has nothing more for the moment, so any number of lines, each within
--max-payload, fits, lines that trickle in are enqueued as they come, and
--timeout bounds each call, not the wait for stdin. A line the node
refuses is reported on stderr by its number, after the ids of the call's
other lines, and ends the command (exit 1). When --key matches an item enqueued within the
queue's dedup window, nothing is written and the first item's id is printed
followed by "duplicate".`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		delay := newChoice("0s", nonNegDuration)
		fs.Var(delay, "delay", "make the item ready only after this `duration`")
		prio := newChoice("0", intRange(0, 255))
		fs.Var(prio, "priority", "`priority` 0-255; lower is served first (default 0)")
		key := fs.String("key", "", "dedup `key`: a repeat within the queue's dedup window is not enqueued again")
		maxAttempts := newChoice("0", intRange(0, 1<<31-1))
		fs.Var(maxAttempts, "max-attempts", "`deliveries` before the item is dead-lettered (0: the queue's setting)")
		lines := fs.Bool("lines", false, "enqueue every line of stdin as one item")
		cliOnly(fs, "delay", "priority", "key", "max-attempts", "lines")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 2, "QUEUE [PAYLOAD|-]"); err != nil {
				return err
			}
			queue := args[0]
			base := storage.EnqueueItem{Delay: delay.val, Priority: uint8(prio.val), DedupKey: *key, MaxAttempts: uint32(maxAttempts.val)}
			if *lines {
				if len(args) > 1 {
					return usagef("--lines reads stdin; drop the PAYLOAD argument")
				}
				if *key != "" {
					return usagef("--key applies to one item; it cannot be used with --lines")
				}
				return cf.withCalls(ctx, func(c *rpc.Client, call callFunc) error {
					return enqueueLines(ctx, c, call, e, queue, base)
				})
			}
			var payload []byte
			switch {
			case len(args) == 2 && args[1] == "-":
				b, err := io.ReadAll(e.stdin)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				payload = b
			case len(args) == 2:
				payload = []byte(args[1])
			default:
				payload = []byte{}
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				item := base
				item.Payload = payload
				return enqueueAndPrint(ctx, c, e, queue, []storage.EnqueueItem{item}, 0)
			})
		}
	},
}

// enqueueLines enqueues every line of stdin as one item of queue (base's
// settings), as linesInCalls groups them, printing each call's ids before
// the next call's lines are read. Each call has --timeout of its own:
// waiting for stdin is not bounded.
func enqueueLines(ctx context.Context, c *rpc.Client, call callFunc, e *env, queue string, base storage.EnqueueItem) error {
	var batch int
	if err := call(func(ctx context.Context) (err error) {
		batch, err = batchSize(ctx, c, 2)
		return err
	}); err != nil {
		return err
	}
	return linesInCalls(e.stdin, batch, enqueueCallBytes, base, func(items []storage.EnqueueItem, first int) error {
		return call(func(ctx context.Context) error {
			return enqueueAndPrint(ctx, c, e, queue, items, first)
		})
	})
}

// maxLineBytes is the longest line enqueue --lines reads.
const maxLineBytes = 64 << 20

// linesInCalls reads r's lines as items (base with the line as payload)
// and hands them to send in calls of at most batch items and maxBytes of
// payload (64 bytes of framing counted per item, as rpc.Client.Enqueue
// counts it; a larger line goes alone), with the number of the call's
// first line (from 1). A call is sent as soon as it is full, or when the
// lines read so far are used up and r has sent no more yet: a pipe that
// trickles gets each line enqueued as it comes, one that floods fills the
// calls, and memory holds one call's lines, not all of r. As
// bufio.Scanner does, a line's trailing "\r" is dropped.
func linesInCalls(r io.Reader, batch, maxBytes int, base storage.EnqueueItem, send func(items []storage.EnqueueItem, first int) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var items []storage.EnqueueItem
	size, first := 0, 1
	flush := func() error {
		if len(items) == 0 {
			return nil
		}
		err := send(items, first)
		first += len(items)
		items, size = items[:0], 0
		return err
	}
	for {
		line, err := readLine(br)
		if err == io.EOF {
			return flush()
		}
		if err != nil {
			return fmt.Errorf("read stdin: line %d: %w", first+len(items), err)
		}
		n := len(line) + 64
		if len(items) > 0 && size+n > maxBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		item := base
		item.Payload = line
		items = append(items, item)
		size += n
		if len(items) >= batch || br.Buffered() == 0 {
			// Full, or nothing more read yet: the next read may wait.
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// readLine returns br's next line, a copy without its "\n" (or "\r\n"),
// the last one also when no newline ends it; io.EOF when there is none.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > maxLineBytes+2 {
			return nil, fmt.Errorf("line longer than %d MiB", maxLineBytes>>20)
		}
		line = append(line, frag...)
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(line) > 0:
			return bytes.TrimSuffix(line, []byte("\r")), nil
		case err != nil:
			return nil, err
		}
		line = line[:len(line)-1]
		return bytes.TrimSuffix(line, []byte("\r")), nil
	}
}

// enqueueAndPrint enqueues items in one call and prints their ids, one a
// line ("ID duplicate" for a dedup hit). An item the node refuses makes it
// fail once every item of the call is accounted for: the ids of the items
// enqueued are printed all the same, and with first (the number of the
// first item's line of stdin, enqueue --lines; 0: no lines) each refused
// line is reported on stderr by its number.
func enqueueAndPrint(ctx context.Context, c *rpc.Client, e *env, queue string, items []storage.EnqueueItem, first int) error {
	res, err := c.Enqueue(ctx, queue, items)
	if err != nil {
		return err
	}
	var refused int
	var firstErr string
	for i, r := range res {
		switch {
		case r.Code != storage.CodeOK:
			if refused == 0 {
				firstErr = r.Err
			}
			refused++
			if first > 0 {
				fmt.Fprintf(e.stderr, "leaseq enqueue: line %d rejected: %s\n", first+i, r.Err)
			}
		case r.Duplicate:
			fmt.Fprintf(e.stdout, "%s duplicate\n", r.ID)
		default:
			fmt.Fprintln(e.stdout, r.ID)
		}
	}
	switch {
	case refused == 0:
		return nil
	case first == 0:
		return fmt.Errorf("item rejected: %s", firstErr)
	default:
		return fmt.Errorf("%d of lines %d-%d rejected (the ids of the others are printed); stdin was read no further", refused, first, first+len(items)-1)
	}
}

// enqueueCallBytes is about how many payload bytes one call of enqueue
// --lines carries: far under the client's 64 MiB message limit and a
// node's --max-message (64 MiB by default), and the size rpc.Producer
// sends per call.
const enqueueCallBytes = rpc.DefaultProducerBytes

var pollCommand = &command{
	name:    "poll",
	args:    "QUEUE",
	summary: "lease ready items and print them as JSON lines",
	help: `
Claim up to -n ready items of QUEUE under one new lease and print one JSON
object per item and line:

  {"id":"…","queue":"jobs","lease":"…","expires_at":"2026-01-02T15:04:05.123Z",
   "state":"inflight","attempts":1,"priority":0,"enqueued_at":"…","visible_at":"…",
   "payload":"aGVsbG8="}

ids and leases are 32 hex digits; times are RFC 3339 UTC with milliseconds;
payload is standard base64; dedup_key, max_attempts (the item's own) and
last_error appear when set. All
items of one poll share the lease: ack, nack or extend them with it before
expires_at, or they are delivered again. --wait blocks until an item is
ready or the wait ends (nothing is printed then, exit code 0).`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		n := fs.Int("n", 1, "most items to lease")
		lease := newChoice("0s", nonNegDuration)
		fs.Var(lease, "lease", "lease `duration` (0: the queue's default lease)")
		wait := newChoice("0s", nonNegDuration)
		fs.Var(wait, "wait", "wait up to this `duration` for an item (long poll; at most 60s by default)")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			if *n <= 0 {
				return usagef("-n must be positive, got %d", *n)
			}
			return cf.with(ctx, wait.val, func(ctx context.Context, c *rpc.Client) error {
				res, err := c.Poll(ctx, args[0], *n, lease.val, wait.val)
				if err != nil {
					return err
				}
				enc := json.NewEncoder(e.stdout)
				for _, it := range res.Items {
					j := toJSON(it)
					j.Lease = res.Lease.String()
					j.ExpiresAt = fmtTime(res.ExpiresAt)
					if err := enc.Encode(j); err != nil {
						return err
					}
				}
				return nil
			})
		}
	},
}

var ackCommand = &command{
	name:    "ack",
	args:    "QUEUE LEASE ID... | QUEUE -",
	summary: "acknowledge leased items (they are deleted)",
	help: `
Acknowledge the items ID... that poll handed out under LEASE: they are done
and never come back. Prints "ID RESULT" per id, RESULT one of ok,
not_found (already acked or gone), lease_mismatch (held under another
lease), lease_expired (the lease ran out; the item was or will be
delivered again). Exits 1 if any id was not ok.

With "-" instead of LEASE and ids, the items are read from stdin in poll's
output format: leaseq poll jobs -n 10 | leaseq ack jobs -`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE ID... or QUEUE -"); err != nil {
				return err
			}
			batches, err := parseLeased(args[1:], e.stdin)
			if err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				bad, total := 0, 0
				for _, b := range batches {
					codes, err := c.Ack(ctx, args[0], b.lease, b.ids)
					if err != nil {
						return err
					}
					bad += printCodes(e.stdout, b.ids, codes)
					total += len(b.ids)
				}
				return notAll(bad, total, "acked")
			})
		}
	},
}

// optDuration is a duration flag that remembers whether it was given.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(s string) error {
	d, err := nonNegDuration(s)
	if err != nil {
		return err
	}
	o.d, o.set = d, true
	return nil
}

var nackCommand = &command{
	name:    "nack",
	args:    "QUEUE LEASE ID... | QUEUE -",
	summary: "give leased items back (retry later, or dead-letter)",
	help: `
End the delivery of ID... under LEASE without success. Each item is ready
again after --delay (without --delay: the queue's exponential backoff with
jitter), or goes to the dead-letter queue if it has used its max attempts;
--reason is kept as its last error (and dead-letter reason). Prints
"ID RESULT" per id as ack does; exits 1 if any id was not ok. "-" reads
the items from poll's output on stdin, as for ack.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		delay := &optDuration{}
		fs.Var(delay, "delay", "ready again after this `duration` (default: the queue's backoff)")
		reason := fs.String("reason", "", "why the item failed, as `text` (kept as last error and dead-letter reason)")
		cliOnly(fs, "delay", "reason")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE ID... or QUEUE -"); err != nil {
				return err
			}
			batches, err := parseLeased(args[1:], e.stdin)
			if err != nil {
				return err
			}
			var d *time.Duration
			if delay.set {
				d = &delay.d
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				bad, total := 0, 0
				for _, b := range batches {
					codes, err := c.Nack(ctx, args[0], b.lease, b.ids, d, *reason)
					if err != nil {
						return err
					}
					bad += printCodes(e.stdout, b.ids, codes)
					total += len(b.ids)
				}
				return notAll(bad, total, "nacked")
			})
		}
	},
}

var extendCommand = &command{
	name:    "extend",
	args:    "QUEUE LEASE [ID...]",
	summary: "extend a lease and print its new expiry",
	help: `
Set LEASE's expiry to now + --lease (the queue's lease when not given; it
may also shorten it) and print the new expiry (RFC 3339 UTC,
milliseconds). Fails if the lease already expired (lease expired) or
belongs to another queue (lease mismatch).

A lease covers every item of its poll and is extended as a whole, so ids
are optional. Given ids (as for ack and nack), extend prints "ID RESULT
EXPIRY" per id instead, RESULT being the lease's outcome (ok,
lease_expired, lease_mismatch): the node extends leases, not single items,
and does not check that each id is one of the lease's items. Exits 1 if
the lease was not extended.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		// 0, as for poll: the queue's own lease (extend on the wire takes
		// no 0, so the command reads the queue's config first). A fixed
		// 30 s here cut a queue's longer lease short, and was refused
		// outright by a node whose --max-lease is under 30 s (found by
		// review, session 72).
		lease := newChoice("0s", nonNegDuration)
		fs.Var(lease, "lease", "new lease `duration`, from now (0: the queue's lease)")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE [ID...]"); err != nil {
				return err
			}
			l, err := parseLease(args[1])
			if err != nil {
				return err
			}
			ids, err := parseIDs(args[2:])
			if err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				d, err := queueLease(ctx, c, args[0], lease.val)
				if err != nil {
					return err
				}
				exp, err := c.Extend(ctx, args[0], l, d)
				if len(ids) == 0 {
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, fmtTime(exp))
					return nil
				}
				code, err := storage.ExtendCode(err)
				if err != nil {
					return err // the request failed; nothing to say per id
				}
				for _, id := range ids {
					if code == storage.CodeOK {
						fmt.Fprintf(e.stdout, "%s %s %s\n", id, code, fmtTime(exp))
					} else {
						fmt.Fprintf(e.stdout, "%s %s\n", id, code)
					}
				}
				if code != storage.CodeOK {
					return notAll(len(ids), len(ids), "extended")
				}
				return nil
			})
		}
	},
}

// queueLease is d, or when d is 0 the queue's configured lease (which the
// node brought into its --min-lease/--max-lease range when the queue was
// made). A queue that does not exist holds no live lease: the default
// lease then, and the node answers the extend as it must.
func queueLease(ctx context.Context, c *rpc.Client, queue string, d time.Duration) (time.Duration, error) {
	if d > 0 {
		return d, nil
	}
	cfg, err := c.QueueConfig(ctx, queue)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return storage.DefaultLeaseDuration, nil
	case err != nil:
		return 0, err
	case cfg.LeaseDuration <= 0:
		return storage.DefaultLeaseDuration, nil
	}
	return cfg.LeaseDuration, nil
}
