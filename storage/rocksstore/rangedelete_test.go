package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

func TestIdRun(t *testing.T) {
	t.Parallel()
	avail := func(q string, seq uint64) overlayEnt {
		return overlayEnt{key: string(dbkeys.AvailableKey(q, dbkeys.NewID(seq, int64(seq)*7)))}
	}
	inprog := func(q string, seq uint64) overlayEnt {
		return overlayEnt{key: string(dbkeys.InProgressKey(q, dbkeys.NewID(seq, 3)))}
	}
	put := func(e overlayEnt) overlayEnt { e.val = []byte("v"); return e }
	vis := overlayEnt{key: string(dbkeys.VisibilityKey("q", 0, 5, dbkeys.NewID(9, 9)))}
	for _, tc := range []struct {
		name string
		keys []overlayEnt
		want int
	}{
		{"consecutive deletes", []overlayEnt{avail("q", 5), avail("q", 6), avail("q", 7)}, 3},
		{"a gap ends it", []overlayEnt{avail("q", 5), avail("q", 6), avail("q", 8), avail("q", 9)}, 2},
		{"a write ends it", []overlayEnt{avail("q", 5), avail("q", 6), put(avail("q", 7)), avail("q", 8)}, 2},
		{"another queue ends it", []overlayEnt{avail("q", 5), avail("r", 6)}, 1},
		{"another namespace ends it", []overlayEnt{avail("q", 5), inprog("q", 6)}, 1},
		{"in_progress", []overlayEnt{inprog("q", 1), inprog("q", 2)}, 2},
		{"a write starts none", []overlayEnt{put(avail("q", 5)), avail("q", 6)}, 0},
		{"visibility entries get none", []overlayEnt{vis}, 0},
		{"a lone delete", []overlayEnt{avail("q", 5)}, 1},
	} {
		require.Equal(t, tc.want, idRun(tc.keys), tc.name)
	}
}

// A claim and an ack write a range tombstone over each run of records
// with consecutive ids; an item whose id lies between two claimed or
// acked ones and that stays where it was (a lower priority, a delay,
// left out of the ack) breaks the run and keeps its record, in memory
// and after the memtable is flushed and the store reopened.
func TestRocksStore_RangeDeletesSkipItemsLeftBetween(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []storage.EnqueueItem
	for i := range 24 {
		it := storage.EnqueueItem{Payload: []byte{byte(i)}}
		switch i {
		case 5:
			it.Priority = 9 // served after every other
		case 11:
			it.Delay = time.Hour
		}
		items = append(items, it)
	}
	ids := b.enqueue("q", at(0), items...)
	res := b.poll("q", 22, time.Minute, at(time.Second))
	require.Len(t, res.Items, 22)
	got := itemIDs(res.Items)
	require.NotContains(t, got, ids[5])
	require.NotContains(t, got, ids[11])
	// Ack all but ids[8] and ids[16]: four runs.
	var acked []storage.ItemID
	for _, id := range got {
		if id != ids[8] && id != ids[16] {
			acked = append(acked, id)
		}
	}
	for _, c := range b.ack("q", res.Lease, at(2*time.Second), acked...) {
		require.Equal(t, storage.CodeOK, c)
	}
	b.check()
	for round := range 2 {
		if round == 1 {
			b.reopen() // the records now come from a table
		}
		st := b.stats("q", at(3*time.Second))
		require.Equal(t, int64(1), st.Ready, "round %d", round)
		require.Equal(t, int64(1), st.Delayed, "round %d", round)
		require.Equal(t, int64(2), st.Inflight, "round %d", round)
	}
	// The two left inflight are acked now; the two left available are
	// served with their payloads.
	for _, c := range b.ack("q", res.Lease, at(4*time.Second), ids[8], ids[16]) {
		require.Equal(t, storage.CodeOK, c)
	}
	// Acking a range-deleted item again finds it absent, not available.
	for _, c := range b.ack("q", res.Lease, at(4*time.Second), ids[9]) {
		require.NotEqual(t, storage.CodeOK, c)
	}
	late := b.poll("q", 10, time.Minute, at(2*time.Hour))
	require.ElementsMatch(t, []storage.ItemID{ids[5], ids[11]}, itemIDs(late.Items))
	for _, it := range late.Items {
		want := byte(5)
		if it.ID == ids[11] {
			want = 11
		}
		require.Equal(t, []byte{want}, it.Payload)
	}
	for _, c := range b.ack("q", late.Lease, at(2*time.Hour), ids[5], ids[11]) {
		require.Equal(t, storage.CodeOK, c)
	}
	st := b.stats("q", at(2*time.Hour))
	require.Zero(t, st.Ready+st.Delayed+st.Inflight+st.Dead)
}

func TestHeadRun(t *testing.T) {
	t.Parallel()
	qs := newQueueState("q", storage.QueueConfig{})
	other := newQueueState("qq", storage.QueueConfig{})
	vis := func(q string, prio uint8, at int64, seq uint64) overlayEnt {
		return overlayEnt{key: string(dbkeys.VisibilityKey(q, prio, at, dbkeys.NewID(seq, 1)))}
	}
	put := func(e overlayEnt) overlayEnt { e.val = []byte("v"); return e }
	// The serve order of q at priority 0 still holds (20, #7): every
	// entry before it in the database was taken by the batch.
	qs.ready.push(0, readyEntry{vis: 20, id: dbkeys.NewID(7, 1)})
	b := &batch{deltas: []queueDelta{{q: qs}, {q: other}}}
	for _, tc := range []struct {
		name string
		keys []overlayEnt
		want int
	}{
		{"deletes before the head", []overlayEnt{vis("q", 0, 10, 1), vis("q", 0, 10, 2), vis("q", 0, 15, 9), vis("q", 0, 20, 6)}, 4},
		{"the head ends it", []overlayEnt{vis("q", 0, 10, 1), vis("q", 0, 20, 7), vis("q", 0, 20, 8)}, 1},
		{"what sorts after the head ends it", []overlayEnt{vis("q", 0, 10, 1), vis("q", 0, 20, 8)}, 1},
		{"a write ends it", []overlayEnt{vis("q", 0, 10, 1), put(vis("q", 0, 11, 3)), vis("q", 0, 12, 4)}, 1},
		{"another priority ends it", []overlayEnt{vis("q", 0, 10, 1), vis("q", 1, 10, 2)}, 1},
		{"an empty serve order bounds nothing", []overlayEnt{vis("q", 1, 10, 1), vis("q", 1, 99, 2), vis("q", 1, 999, 3)}, 3},
		{"another queue ends it", []overlayEnt{vis("qq", 0, 10, 1), vis("qq", 0, 11, 2), vis("q", 0, 12, 3)}, 2},
		{"a queue the batch did not change gets none", []overlayEnt{vis("r", 0, 10, 1), vis("r", 0, 11, 2)}, 0},
		{"a write starts none", []overlayEnt{put(vis("q", 0, 10, 1)), vis("q", 0, 11, 2)}, 0},
		{"records get none", []overlayEnt{{key: string(dbkeys.AvailableKey("q", dbkeys.NewID(1, 1)))}}, 0},
	} {
		require.Equal(t, tc.want, b.headRun(tc.keys), tc.name)
	}
}
