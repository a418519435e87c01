package rpc

import (
	"reflect"
	"testing"
	"time"

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
