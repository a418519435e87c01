package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
)

// ackedTwice is a system whose every Ack is sent twice and answered by
// the second: its acks come back NotFound, as from a leaseq bug that
// turned acks into NotFound, while the items are gone all the same.
type ackedTwice struct{ target.System }

func (s ackedTwice) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	in, err := s.System.Start(ctx, o)
	if err != nil {
		return nil, err
	}
	return ackedTwiceInstance{in}, nil
}

type ackedTwiceInstance struct{ target.Instance }

func (in ackedTwiceInstance) Connect(ctx context.Context) (target.Client, error) {
	c, err := in.Instance.Connect(ctx)
	return ackedTwiceClient{c}, err
}

type ackedTwiceClient struct{ target.Client }

func (c ackedTwiceClient) Ack(ctx context.Context, q string, ds []target.Delivery) error {
	if err := c.Client.Ack(ctx, q, ds); err != nil {
		return err
	}
	return c.Client.Ack(ctx, q, ds)
}

// Found by review (session 72): an ack that the system answered
// NotFound, LeaseExpired or LeaseMismatch was taken as an ack
// (leaseqt's ackCodes), so the row counted its items as done: a bug that
// lost every ack read as full throughput. Such acks are counted apart
// (acks_lost) and are not items.
func TestRun_LostAcksAreNotThroughput(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadE2E}
	rep, err := Run(context.Background(), c, []target.System{ackedTwice{leaseqt.InProcess{Backend: leaseqt.BackendMem}}})
	require.NoError(t, err)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Empty(t, r.Err)
	require.Positive(t, r.Extra["enqueued"], "the producers ran")
	require.Positive(t, r.AcksLost, "the acks answered NotFound are counted")
	require.Zero(t, r.Items, "acks answered NotFound were counted as items done")
	require.Zero(t, r.ItemsPerSec)
	require.Contains(t, note(r), "ACKS LOST")
}

// Found by review (session 72): a goal whose leaseq row lost acks read
// as met on its ratio alone.
func TestCompare_LostAcksFlagTheGoal(t *testing.T) {
	t.Parallel()
	l := row("e2e", "leaseq-rpc-always", "leaseq", "durable", 60000, 0)
	l.AcksLost = 5
	_, goals := compare([]Result{l, row("e2e", "redis-always", "redis", "durable", 10000, 0)})
	var g Goal
	for _, x := range goals {
		if x.Goal == "e2e items/s vs Redis appendfsync always" {
			g = x
		}
	}
	require.InDelta(t, 6, g.Ratio, 1e-9)
	require.False(t, g.Met, "a row that lost acks meets no goal")
	require.Contains(t, g.Note, "leaseq-rpc-always lost 5 acks")
	var txt, md bytes.Buffer
	rep := &Report{Results: []Result{l}, Goals: []Goal{g}}
	require.NoError(t, WriteTable(&txt, rep))
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, txt.String(), "LOST ACKS")
	require.Contains(t, md.String(), "| 6.00 | >= 5 | **lost acks** |")
}

// Found by review (session 72): a row that failed most of its rounds was
// compared on the one that completed, as if it had run well.
func TestCompare_RowThatFailedMostRoundsIsFailed(t *testing.T) {
	t.Parallel()
	failed := func(r Result, round int) Result {
		r.Round, r.Err, r.Items, r.ItemsPerSec = round, "boom", 0, 0
		return r
	}
	at := func(r Result, round int) Result { r.Round = round; return r }
	l := row("e2e", "leaseq-rpc-always", "leaseq", "durable", 60000, 0)
	p := row("e2e", "redis-always", "redis", "durable", 10000, 0)
	b := row("e2e", "beanstalkd-fsync", "beanstalkd", "durable", 3000, 0)
	rs := medianRows([]Result{
		at(l, 1), at(p, 1), at(b, 1),
		failed(l, 2), at(p, 2), failed(b, 2),
		failed(l, 3), at(p, 3), at(b, 3),
	})
	ratios, goals := compare(rs)
	require.NotEmpty(t, ratios)
	for _, r := range ratios {
		require.Equal(t, "leaseq-rpc-always failed 2/3 rounds", r.Failed, "%+v", r)
		require.Zero(t, r.Ratio)
		if r.Peer == "beanstalkd-fsync" {
			require.Contains(t, r.Note, "beanstalkd-fsync failed 1/3 rounds, compared on the others")
		}
	}
	require.NotEmpty(t, goals)
	for _, g := range goals {
		require.Equal(t, "leaseq-rpc-always failed 2/3 rounds", g.Failed, "%+v", g)
		require.False(t, g.Met)
	}
	var txt bytes.Buffer
	require.NoError(t, WriteTable(&txt, &Report{Results: rs, Ratios: ratios, Goals: goals}))
	require.Contains(t, txt.String(), "failed 2/3 rounds")
	require.Contains(t, txt.String(), "FAILED")
	require.NotContains(t, txt.String(), "6.00x")
}

// Found by review (session 72): a failed row printed 0 items/s, and a
// CPU per item, beside its real CPU seconds.
func TestReport_FailedRowShowsNoRate(t *testing.T) {
	t.Parallel()
	r := Result{Row: "e2e", System: "redis-always", Durability: "fsync per op", Err: "start: boom", CPUSeconds: 2.5, ClientCPUSeconds: 1}
	var txt, md bytes.Buffer
	require.NoError(t, WriteTable(&txt, &Report{Results: []Result{r}}))
	require.NoError(t, WriteMarkdown(&md, &Report{Results: []Result{r}}))
	line := strings.Split(txt.String(), "\n")[1]
	f := strings.Fields(line)
	// Fields: row, system, durability (3 words), items/s, e2e, enqueue,
	// cpu s, cpu µs/item, client µs/item, ...
	require.Equal(t, []string{"-", "2.5", "-", "-"}, []string{f[5], f[8], f[9], f[10]}, "a failed row's items/s and per-item figures: %q", line)
	require.Contains(t, md.String(), "| e2e | redis-always | fsync per op | - | - / - / - | - / - / - | 2.5 | - | - | 0 |")
}

// Found by review (session 72): with an even number of rounds, a row's
// items and seconds were the lower middle round's while its items/s was
// the mean of the two middle rounds', so items / seconds != items/s.
func TestMedianRows_EvenRoundsAreOneRound(t *testing.T) {
	t.Parallel()
	a := row("e2e", "leaseq-rpc-always", "leaseq", "durable", 1000, 0)
	b := row("e2e", "leaseq-rpc-always", "leaseq", "durable", 3000, 0)
	a.Round, b.Round = 1, 2
	m := medianRows([]Result{a, b})[0]
	require.InDelta(t, float64(m.Items)/m.Seconds, m.ItemsPerSec, 1e-6, "items, seconds and items/s come from different definitions")
	require.InDelta(t, 1000, m.ItemsPerSec, 1e-9)
}
