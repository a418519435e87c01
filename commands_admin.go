// Client commands on queues: stats, queues, peek, purge, dlq, config.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/httpapi"
	"github.com/leaseq/leaseq/storage"
)

// statsJSON is one queue in `stats --json`: the HTTP API's JSON form of
// its stats, and the node's backend and sync mode. Durations are
// milliseconds.
type statsJSON struct {
	httpapi.QueueStats
	// Backend and Sync describe the node, not the queue: repeated on every
	// line so each line stands alone.
	Backend string `json:"backend,omitempty"`
	Sync    string `json:"sync,omitempty"`
}

var statsCommand = &command{
	name:    "stats",
	args:    "[QUEUE]",
	summary: "show queue depths and counters",
	help: `
Show, for QUEUE or every queue, the items by state (ready, delayed,
inflight, dead), live leases, the age of the oldest ready item, and the
lifetime counters (enqueued, acked, nacked, expired, dead-lettered, ...).
A first line describes the node: its backend, its --sync mode (RocksDB)
and version. --json prints one JSON object per queue and line instead
(durations in milliseconds; backend and sync on every line).`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 0, 1, "[QUEUE]"); err != nil {
				return err
			}
			queue := ""
			if len(args) == 1 {
				queue = args[0]
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				stats, err := c.Stats(ctx, queue)
				if err != nil {
					return err
				}
				ni, err := c.NodeInfo(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					enc := json.NewEncoder(e.stdout)
					for _, q := range stats {
						if err := enc.Encode(statsJSON{QueueStats: httpapi.NewQueueStats(&q), Backend: ni.Backend, Sync: ni.Sync}); err != nil {
							return err
						}
					}
					return nil
				}
				fmt.Fprintf(e.stdout, "node %s: %s\n", *cf.addr, describeNode(ni))
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "QUEUE\tREADY\tDELAYED\tINFLIGHT\tDEAD\tLEASES\tOLDEST\tENQUEUED\tACKED\tNACKED\tEXPIRED\tDEAD_LETTERED")
				for _, q := range stats {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n",
						q.Queue, q.Ready, q.Delayed, q.Inflight, q.Dead, q.Leases, q.OldestReadyAge.Round(time.Millisecond),
						q.Enqueued, q.Acked, q.Nacked, q.Expired, q.DeadLettered)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, q := range stats {
					if q.CorruptErrors > 0 {
						fmt.Fprintf(e.stdout, "WARNING: queue %s: %d calls met damaged data since the node started; items may be stuck (stop the node and run 'leaseq check')\n", q.Queue, q.CorruptErrors)
					}
				}
				return nil
			})
		}
	},
}

// describeNode is the node line of `stats`.
func describeNode(ni rpc.NodeInfo) string {
	d := "backend=" + ni.Backend
	switch {
	case ni.Sync != "":
		d += " sync=" + ni.Sync
	case ni.Backend == "fdb":
		d += " (commits durable on the cluster)"
	}
	return d + " version=" + strings.ReplaceAll(ni.Version, " ", "@")
}

var queuesCommand = &command{
	name:    "queues",
	summary: "list queue names",
	help:    `Print the name of every queue, one per line, in byte order.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				qs, err := c.Queues(ctx)
				if err != nil {
					return err
				}
				for _, q := range qs {
					fmt.Fprintln(e.stdout, q)
				}
				return nil
			})
		}
	},
}

// pageFlags page through items in id order.
type pageFlags struct {
	fs    *flag.FlagSet
	n     *int
	after *string
}

func addPageFlags(fs *flag.FlagSet) *pageFlags {
	return &pageFlags{
		fs:    fs,
		n:     fs.Int("n", rpc.DefaultPageLimit, "list at most `n` items"),
		after: fs.String("after", "", "list items after this `id` (for paging)"),
	}
}

func (p *pageFlags) parse() (after storage.ItemID, limit int, err error) {
	if *p.n <= 0 {
		return after, 0, usagef("-n must be positive, got %d", *p.n)
	}
	if *p.after != "" {
		if after, err = storage.ParseItemID(*p.after); err != nil {
			return after, 0, usagef("bad --after id %q: want 32 hex digits", *p.after)
		}
	}
	return after, *p.n, nil
}

// fit lowers the default page size to the node's --max-batch; an -n the
// user gave (flag or LEASEQ_N) is sent as given, so the node's limit error
// names it.
// list runs fetch for one page of the queue named by args (usage names
// the expected arguments), with -n fitted to the node's batch limit.
func (p *pageFlags) list(ctx context.Context, cf *clientFlags, args []string, usage string,
	fetch func(ctx context.Context, c *rpc.Client, after storage.ItemID, limit int) error) error {
	if err := argsBetween(args, 1, 1, usage); err != nil {
		return err
	}
	after, limit, err := p.parse()
	if err != nil {
		return err
	}
	return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
		limit, err := p.fit(ctx, c, limit)
		if err != nil {
			return err
		}
		return fetch(ctx, c, after, limit)
	})
}

func (p *pageFlags) fit(ctx context.Context, c *rpc.Client, limit int) (int, error) {
	given := false
	p.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "n" })
	if given {
		return limit, nil
	}
	bs, err := batchSize(ctx, c, limit)
	if err != nil {
		return 0, err
	}
	return min(limit, bs), nil
}

var peekCommand = &command{
	name:    "peek",
	args:    "QUEUE",
	summary: "list items without leasing them (JSON lines)",
	help: `
List QUEUE's ready and delayed items (with --inflight: its leased items) in
id order without leasing them, as JSON lines in the format of poll (without
lease fields; state says ready, delayed or inflight). Page with -n and
--after ID.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		inflight := fs.Bool("inflight", false, "list leased (inflight) items instead")
		pf := addPageFlags(fs)
		return func(ctx context.Context, args []string) error {
			return pf.list(ctx, cf, args, "QUEUE", func(ctx context.Context, c *rpc.Client, after storage.ItemID, limit int) error {
				items, err := c.Peek(ctx, storage.PeekParams{Queue: args[0], Inflight: *inflight, After: after, Limit: limit})
				if err != nil {
					return err
				}
				enc := json.NewEncoder(e.stdout)
				for _, it := range items {
					if err := enc.Encode(toJSON(it)); err != nil {
						return err
					}
				}
				return nil
			})
		}
	},
}

var purgeCommand = &command{
	name:    "purge",
	args:    "QUEUE",
	summary: "delete every ready, delayed and inflight item of a queue",
	help: `
Delete every available and inflight item of QUEUE and print how many went.
Dead items stay (see 'leaseq dlq purge'); the queue and its config remain.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				n, err := c.Purge(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "purged %d\n", n)
				return nil
			})
		}
	},
}

var dlqCommand = &command{
	name:    "dlq",
	args:    "ls|redrive|purge QUEUE [ID...]",
	summary: "list, redrive or purge dead-lettered items",
	help: `
Inspect and act on a queue's dead-letter items (items that used up their
max attempts):

  dlq ls QUEUE [-n N] [--after ID]
      print dead items as JSON lines (poll's format plus reason and dead_at)
  dlq redrive QUEUE ID... | --all
      move dead items back to ready with attempts reset; prints "ID RESULT"
      per id, or "redriven N" with --all
  dlq purge QUEUE ID... | --all
      delete dead items; prints "ID RESULT" per id, or "purged N" with --all`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		pf := addPageFlags(fs)
		all := fs.Bool("all", false, "redrive or purge every dead item of the queue")
		// An exported LEASEQ_ALL must not turn a purge of some ids (or
		// a typo) into the loss of every dead item. -n and --after are
		// ls's: command-line only too, so that a flag given to the wrong
		// sub-command is refused, not ignored.
		cliOnly(fs, "all", "n", "after")
		return func(ctx context.Context, args []string) error {
			if len(args) == 0 {
				return usagef("missing sub-command: want ls, redrive or purge")
			}
			sub, args := args[0], args[1:]
			var given []string
			fs.Visit(func(f *flag.Flag) { given = append(given, f.Name) })
			switch sub {
			case "ls", "list":
				if slices.Contains(given, "all") {
					return usagef("dlq ls lists a page of -n items after --after; --all is for redrive and purge")
				}
				return dlqList(ctx, e, cf, pf, args)
			case "redrive", "purge":
				for _, name := range []string{"n", "after"} {
					if slices.Contains(given, name) {
						return usagef("dlq %s takes ids or --all, not -%s (a flag of dlq ls)", sub, name)
					}
				}
				return dlqAct(ctx, e, cf, sub, args, *all)
			default:
				return usagef("unknown dlq sub-command %q: want ls, redrive or purge", sub)
			}
		}
	},
}

// dlqList prints a queue's dead items as JSON lines.
func dlqList(ctx context.Context, e *env, cf *clientFlags, pf *pageFlags, args []string) error {
	return pf.list(ctx, cf, args, "dlq ls QUEUE", func(ctx context.Context, c *rpc.Client, after storage.ItemID, limit int) error {
		items, err := c.DeadList(ctx, storage.DeadListParams{Queue: args[0], After: after, Limit: limit})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(e.stdout)
		for _, d := range items {
			j := toJSON(d.Item)
			j.State = storage.StateDead.String()
			j.Reason = d.Reason
			j.DeadAt = fmtTime(d.DeadAt)
			if err := enc.Encode(j); err != nil {
				return err
			}
		}
		return nil
	})
}

// dlqAct redrives or purges (sub) the given dead items, or all of them.
func dlqAct(ctx context.Context, e *env, cf *clientFlags, sub string, args []string, all bool) error {
	if err := argsBetween(args, 1, -1, "dlq "+sub+" QUEUE ID... | --all"); err != nil {
		return err
	}
	if all == (len(args) > 1) {
		return usagef("dlq %s: give either ids or --all", sub)
	}
	ids, err := parseIDs(args[1:])
	if err != nil {
		return err
	}
	op, verb := (*rpc.Client).Redrive, "redriven"
	if sub == "purge" {
		op, verb = (*rpc.Client).PurgeDead, "purged"
	}
	return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
		if !all {
			res, err := op(c, ctx, storage.RedriveParams{Queue: args[0], IDs: ids})
			if err != nil {
				return err
			}
			return notAll(printCodes(e.stdout, ids, res.Codes), len(ids), verb)
		}
		// Page by page until a page comes back short: each call is one
		// bounded transaction on the node.
		page, err := batchSize(ctx, c, rpc.DefaultPageLimit)
		if err != nil {
			return err
		}
		page = min(page, rpc.DefaultPageLimit)
		total := 0
		for {
			res, err := op(c, ctx, storage.RedriveParams{Queue: args[0], Limit: page})
			if err != nil {
				return err
			}
			total += res.Moved
			if res.Moved < page {
				break
			}
		}
		fmt.Fprintf(e.stdout, "%s %d\n", verb, total)
		return nil
	})
}

var queueCommand = &command{
	name:    "queue",
	args:    "delete QUEUE [--force]",
	summary: "delete a queue",
	help: `
  queue delete QUEUE [--force]
      delete QUEUE: its config, counters and dedup keys. A queue that still
      holds items (ready, delayed, inflight or dead) is refused unless
      --force, which deletes them too; their leases end, so acks from
      consumers still holding them answer not_found. Prints "deleted N" (the
      items deleted). A later enqueue creates the queue anew.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		force := fs.Bool("force", false, "delete the queue's items too")
		cliOnly(fs, "force")
		return func(ctx context.Context, args []string) error {
			if len(args) == 0 {
				return usagef("missing sub-command: want delete")
			}
			if args[0] != "delete" {
				return usagef("unknown sub-command %q: want delete", args[0])
			}
			if err := argsBetween(args[1:], 1, 1, "QUEUE"); err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				n, err := c.DeleteQueue(ctx, args[1], *force)
				if errors.Is(err, storage.ErrNotEmpty) && !*force {
					// (A forced delete refused: producers kept enqueueing;
					// the node's reason says so.)
					return fmt.Errorf("%w (use --force to delete them with the queue)", err)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "deleted %d\n", n)
				return nil
			})
		}
	},
}

var configCommand = &command{
	name:    "config",
	args:    "QUEUE",
	summary: "show or change a queue's configuration",
	help: `
Print QUEUE's configuration. With any of the setting flags, change those
settings first (creating the queue if needed, from what its first enqueue
would have given it: the defaults brought within the node's --max-lease
and --max-delay) and print the result. The setting flags are read from
the command line only, never from LEASEQ_* variables: an exported
LEASEQ_MAX_ATTEMPTS must not turn a look at a queue into a change of it.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs, e)
		asJSON := fs.Bool("json", false, "print JSON instead of name=value lines")
		d := storage.DefaultQueueConfig()
		maxAttempts := newChoice("5", intRange(1, 1<<31-1))
		fs.Var(maxAttempts, "max-attempts", fmt.Sprintf("set how many deliveries (`n`) an item gets before it is dead-lettered (new queues: %d)", d.MaxAttempts))
		lease := newChoice(storage.DefaultLeaseDuration.String(), positiveDuration)
		fs.Var(lease, "lease", fmt.Sprintf("set the default lease `duration` of a poll (new queues: %v)", d.LeaseDuration))
		dedup := newChoice(storage.DefaultDedupWindow.String(), positiveDuration)
		fs.Var(dedup, "dedup-window", fmt.Sprintf("set how long (a `duration`) a dedup key suppresses repeats (new queues: %v)", d.DedupWindow))
		base := newChoice(storage.DefaultBackoffBase.String(), positiveDuration)
		fs.Var(base, "backoff-base", fmt.Sprintf("set the nack backoff base (a `duration`; new queues: %v)", d.BackoffBase))
		bmax := newChoice(storage.DefaultBackoffMax.String(), positiveDuration)
		fs.Var(bmax, "backoff-max", fmt.Sprintf("set the nack backoff cap (a `duration`; new queues: %v)", d.BackoffMax))
		cliOnly(fs, "max-attempts", "lease", "dedup-window", "backoff-base", "backoff-max")
		// A setting flag left out leaves the setting as it is: there is
		// no default to show, only what new queues start with.
		for _, name := range []string{"max-attempts", "lease", "dedup-window", "backoff-base", "backoff-max"} {
			fs.Lookup(name).DefValue = ""
		}
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			queue := args[0]
			change := maxAttempts.set || lease.set || dedup.set || base.set || bmax.set
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				cfg, err := c.QueueConfig(ctx, queue)
				switch {
				case errors.Is(err, storage.ErrNotFound) && change:
					// A new queue: what its first enqueue would have
					// given it, within the node's limits (a node with
					// --max-lease 10s gives new queues a 10 s lease).
					ni, err := c.NodeInfo(ctx)
					if err != nil {
						return err
					}
					cfg = ni.Limits().DefaultQueueConfig()
				case errors.Is(err, storage.ErrNotFound):
					return fmt.Errorf("no queue %q (a queue exists after its first enqueue or config change)", queue)
				case err != nil:
					return err
				}
				if change {
					if maxAttempts.set {
						cfg.MaxAttempts = uint32(maxAttempts.val)
					}
					if lease.set {
						cfg.LeaseDuration = lease.val
					}
					if dedup.set {
						cfg.DedupWindow = dedup.val
					}
					if base.set {
						cfg.BackoffBase = base.val
					}
					if bmax.set {
						cfg.BackoffMax = bmax.val
					}
					if err := c.SetQueueConfig(ctx, queue, cfg); err != nil {
						return err
					}
					if cfg, err = c.QueueConfig(ctx, queue); err != nil {
						return err
					}
				}
				if *asJSON {
					return json.NewEncoder(e.stdout).Encode(httpapi.NewQueueConfig(cfg))
				}
				fmt.Fprintf(e.stdout, "max-attempts=%d\nlease=%v\ndedup-window=%v\nbackoff-base=%v\nbackoff-max=%v\n",
					cfg.MaxAttempts, cfg.LeaseDuration, cfg.DedupWindow, cfg.BackoffBase, cfg.BackoffMax)
				return nil
			})
		}
	},
}
