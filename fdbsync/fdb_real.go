//go:build fdb

package fdbsync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/leaseq/leaseq/fdbsync/kv"
)

// apiVersion is the FDB API version the bindings in go.mod speak.
const apiVersion = 730

// OpenCluster connects to the FoundationDB cluster named by clusterFile
// ("" for the platform default) and returns a Store on it. Every node of a
// deployment opens the same cluster file with the same Options.Prefix.
func OpenCluster(clusterFile string, o Options) (*Store, error) {
	if err := fdb.APIVersion(apiVersion); err != nil {
		return nil, fmt.Errorf("fdbsync: select FDB API version %d: %w", apiVersion, convErr(err))
	}
	db, err := fdb.OpenDatabase(clusterFile)
	if err != nil {
		return nil, fmt.Errorf("fdbsync: open cluster file %q: %w", clusterFile, convErr(err))
	}
	return Open(context.Background(), &realDB{db: db}, o)
}

// convErr turns a bindings error into kv.Error so retry decisions and
// errors.As work the same as on the model.
func convErr(err error) error {
	var fe fdb.Error
	if errors.As(err, &fe) {
		return kv.Error{Code: fe.Code}
	}
	return err
}

// realDB adapts fdb.Database to kv.DB. Everything above this file is the
// same code the model tests run; this file only translates calls.
type realDB struct{ db fdb.Database }

func (d *realDB) CreateTransaction() (kv.Tx, error) {
	t, err := d.db.CreateTransaction()
	if err != nil {
		return nil, convErr(err)
	}
	// The timeout survives OnError (API >= 610), so it bounds the whole
	// retry loop of one call.
	if err := t.Options().SetTimeout(ClusterTimeout); err != nil {
		return nil, convErr(err)
	}
	return &realTx{t: t}, nil
}

type realTx struct {
	t      fdb.Transaction
	usesVS bool
	vsf    fdb.FutureKey
	vs     kv.Versionstamp
	haveVS bool
}

func (t *realTx) reader(snapshot bool) fdb.ReadTransaction {
	if snapshot {
		return t.t.Snapshot()
	}
	return t.t
}

func (t *realTx) Get(key []byte, snapshot bool) ([]byte, error) {
	v, err := t.reader(snapshot).Get(fdb.Key(key)).Get()
	return v, convErr(err)
}

func (t *realTx) GetMany(keys [][]byte, snapshot bool) ([][]byte, error) {
	r := t.reader(snapshot)
	fs := make([]fdb.FutureByteSlice, len(keys))
	for i, k := range keys {
		fs[i] = r.Get(fdb.Key(k))
	}
	out := make([][]byte, len(keys))
	for i, f := range fs {
		v, err := f.Get()
		if err != nil {
			return nil, convErr(err)
		}
		out[i] = v
	}
	return out, nil
}

func (t *realTx) GetRange(begin, end []byte, o kv.RangeOptions) ([]kv.KeyValue, error) {
	rr := t.reader(o.Snapshot).GetRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)},
		fdb.RangeOptions{Limit: o.Limit, Reverse: o.Reverse})
	kvs, err := rr.GetSliceWithError()
	if err != nil {
		return nil, convErr(err)
	}
	out := make([]kv.KeyValue, len(kvs))
	for i, x := range kvs {
		out[i] = kv.KeyValue{Key: x.Key, Value: x.Value}
	}
	return out, nil
}

func (t *realTx) Set(key, value []byte) { t.t.Set(fdb.Key(key), value) }
func (t *realTx) Clear(key []byte)      { t.t.Clear(fdb.Key(key)) }
func (t *realTx) ClearRange(begin, end []byte) {
	t.t.ClearRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)})
}

func (t *realTx) Add(key []byte, delta int64) {
	t.t.Add(fdb.Key(key), binary.LittleEndian.AppendUint64(nil, uint64(delta)))
}

func (t *realTx) SetVersionstampedKey(keyWithOffset, value []byte) {
	t.usesVS = true
	t.t.SetVersionstampedKey(fdb.Key(keyWithOffset), value)
}

func (t *realTx) SetVersionstampedValue(key, valueWithOffset []byte) {
	t.usesVS = true
	t.t.SetVersionstampedValue(fdb.Key(key), valueWithOffset)
}

func (t *realTx) Watch(key []byte) (kv.Watch, error) {
	w := &realWatch{f: t.t.Watch(fdb.Key(key)), done: make(chan struct{})}
	// The goroutine ends when the future is ready: the key changed, the
	// creating transaction failed, or Cancel cancelled the future.
	go func() {
		w.err = convErr(w.f.Get())
		close(w.done)
	}()
	return w, nil
}

func (t *realTx) ReadVersion() (int64, error) {
	v, err := t.t.GetReadVersion().Get()
	return v, convErr(err)
}

func (t *realTx) AddReadConflictRange(begin, end []byte) error {
	return convErr(t.t.AddReadConflictRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)}))
}

func (t *realTx) AddWriteConflictRange(begin, end []byte) error {
	return convErr(t.t.AddWriteConflictRange(fdb.KeyRange{Begin: fdb.Key(begin), End: fdb.Key(end)}))
}

func (t *realTx) Commit() error {
	t.haveVS = false
	if t.usesVS {
		// Must be requested before Commit; it becomes ready with it.
		t.vsf = t.t.GetVersionstamp()
	}
	if err := t.t.Commit().Get(); err != nil {
		return convErr(err)
	}
	if t.usesVS {
		k, err := t.vsf.Get()
		if err != nil {
			return convErr(err)
		}
		copy(t.vs[:], k)
		t.haveVS = true
	}
	return nil
}

func (t *realTx) Versionstamp() (kv.Versionstamp, error) {
	if !t.haveVS {
		return kv.Versionstamp{}, errors.New("fdbsync: transaction has no versionstamp")
	}
	return t.vs, nil
}

func (t *realTx) OnError(err error) error {
	var ke kv.Error
	if !errors.As(err, &ke) {
		return err
	}
	if e := t.t.OnError(fdb.Error{Code: ke.Code}).Get(); e != nil {
		return convErr(e)
	}
	t.usesVS, t.haveVS = false, false
	return nil
}

func (t *realTx) Cancel() { t.t.Cancel() }

type realWatch struct {
	f    fdb.FutureNil
	done chan struct{}
	err  error
}

func (w *realWatch) Done() <-chan struct{} { return w.done }

func (w *realWatch) Err() error {
	<-w.done
	return w.err
}

func (w *realWatch) Cancel() { w.f.Cancel() }
