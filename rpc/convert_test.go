package rpc

import (
	"math"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// TestConvert_StatsRoundTrip: every field of storage.QueueStats crosses the
// wire. Each numeric field gets its own value, so a field left out of
// writeStats or readStats (or two swapped) fails.
func TestConvert_StatsRoundTrip(t *testing.T) {
	t.Parallel()
	var in storage.QueueStats
	v := reflect.ValueOf(&in).Elem()
	n := int64(1)
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int64:
			if f.Type() == reflect.TypeOf(time.Duration(0)) {
				f.SetInt(n * int64(time.Millisecond))
			} else {
				f.SetInt(n)
			}
		case reflect.Uint64:
			f.SetUint(uint64(n))
		case reflect.String:
			f.SetString("q")
		case reflect.Struct:
			continue // Config: its own conversion
		default:
			t.Fatalf("field %s of kind %s: extend this test", v.Type().Field(i).Name, f.Kind())
		}
		n++
	}
	in.Config = storage.DefaultQueueConfig()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	w, err := schema.NewRootQueueStats(seg)
	require.NoError(t, err)
	require.NoError(t, writeStats(w, &in))
	out, err := readStats(w)
	require.NoError(t, err)
	require.Equal(t, in, out)
}

// TestConvert_ItemsRoundTrip: a list of items crosses the wire intact,
// whether their payloads share one buffer (small) or not (large), and a
// payload shared with others has no room to grow into its neighbour's.
func TestConvert_ItemsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 7, 300, maxSharedPayloads / 2} {
		var in []storage.Item
		for i := range 5 {
			p := make([]byte, size)
			for j := range p {
				p[j] = byte(i + j)
			}
			q := "q"
			if i == 3 {
				q = "other"
			}
			it := storage.Item{ID: storage.ItemID{byte(i + 1)}, Queue: q, Payload: p, Priority: uint8(i), Attempts: 1,
				EnqueuedAt: time.UnixMilli(1000), VisibleAt: time.UnixMilli(2000), State: storage.StateInflight}
			if i%2 == 0 { // the others have neither (null pointers)
				it.DedupKey, it.LastError = "k", "nack: boom"
			}
			in = append(in, it)
		}
		out := itemsThroughWire(t, in)
		for i := range in {
			require.Equal(t, in[i].ID, out[i].ID)
			require.Equal(t, in[i].Queue, out[i].Queue)
			require.Equal(t, len(in[i].Payload), len(out[i].Payload))
			if size > 0 {
				require.Equal(t, in[i].Payload, out[i].Payload, "size %d item %d", size, i)
			}
			require.Equal(t, in[i].DedupKey, out[i].DedupKey)
			require.Equal(t, in[i].LastError, out[i].LastError)
			require.Equal(t, in[i].Priority, out[i].Priority)
		}
		grown := append(out[0].Payload, 0xee)
		require.Equal(t, byte(0xee), grown[len(grown)-1])
		if size > 0 {
			require.Equal(t, in[1].Payload, out[1].Payload, "growing item 0's payload left item 1's alone")
		}
	}
}

// itemsThroughWire writes in as a wire list of items and reads it back.
func itemsThroughWire(t *testing.T, in []storage.Item) []storage.Item {
	t.Helper()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	l, err := schema.NewItem_List(seg, int32(len(in)))
	require.NoError(t, err)
	require.NoError(t, writeItems(l, in))
	out, err := readItems(l)
	require.NoError(t, err)
	require.Len(t, out, len(in))
	return out
}

// TestConvert_ItemsPayloadBuffers: payloads of one size are copied into
// one buffer, back to back; payloads of mixed sizes (smaller, larger, too
// large to share, empty) each arrive intact, and none can grow into
// another.
func TestConvert_ItemsPayloadBuffers(t *testing.T) {
	t.Parallel()
	read := func(sizes ...int) ([]storage.Item, []storage.Item) {
		in := make([]storage.Item, len(sizes))
		for i, size := range sizes {
			in[i] = storage.Item{ID: storage.ItemID{byte(i + 1)}, Queue: "q", Payload: make([]byte, size)}
			for j := range in[i].Payload {
				in[i].Payload[j] = byte(i*7 + j)
			}
		}
		return in, itemsThroughWire(t, in)
	}

	_, out := read(256, 256, 256, 256)
	for i := 1; i < len(out); i++ {
		prev := unsafe.Pointer(unsafe.SliceData(out[i-1].Payload))
		require.Equal(t, unsafe.Add(prev, 256), unsafe.Pointer(unsafe.SliceData(out[i].Payload)),
			"payload %d follows payload %d in one buffer", i, i-1)
	}

	in, out := read(10, 300, 5, 2000, maxSharedPayloads/2, 1, 0, 700, maxSharedPayloads+1, 3)
	for i := range in {
		require.Equal(t, len(in[i].Payload), len(out[i].Payload), "item %d", i)
		if len(in[i].Payload) > 0 {
			require.Equal(t, in[i].Payload, out[i].Payload, "item %d", i)
		}
	}
	for i := range out {
		_ = append(out[i].Payload, 0xee, 0xee, 0xee)
	}
	for i := range in {
		if len(in[i].Payload) > 0 {
			require.Equal(t, in[i].Payload, out[i].Payload, "item %d after every payload was grown", i)
		}
	}
}

// TestEnqueueCall_Reuse: a pooled enqueueCall comes back empty, with room
// for the next call's items, whatever the last call left in it; one that
// grew past maxPooledItems gives its lists up.
func TestEnqueueCall_Reuse(t *testing.T) {
	e := newEnqueueCall("a", 3)
	require.Len(t, e.results, 3)
	e.results[1] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: "payload too big"}
	e.items = append(e.items, storage.EnqueueItem{Payload: []byte("x")})
	e.index = append(e.index, 0)
	e.release()
	require.Empty(t, e.queue)
	require.Empty(t, e.items)
	require.Empty(t, e.index)
	require.Equal(t, storage.EnqueueResult{}, e.results[:3][1], "a released call keeps no error")
	require.Nil(t, e.items[:1][0].Payload, "a released call keeps no payload")

	f := newEnqueueCall("b", 2)
	require.Equal(t, "b", f.queue)
	require.Equal(t, make([]storage.EnqueueResult, 2), f.results)
	require.Empty(t, f.items)
	f.release()

	big := newEnqueueCall("c", maxPooledItems+1)
	require.Len(t, big.results, maxPooledItems+1)
	require.GreaterOrEqual(t, cap(big.items), maxPooledItems+1)
	big.release()
	require.Nil(t, big.results)
	require.Nil(t, big.items)
}

func TestWireLimit(t *testing.T) {
	for n, want := range map[int]uint32{-1: 0, 0: 0, 7: 7, math.MaxUint32: math.MaxUint32, 1 << 32: math.MaxUint32, 1<<32 + 5: math.MaxUint32} {
		require.Equal(t, want, wireLimit(n), "wireLimit(%d)", n)
	}
}
