package fdbsync_test

import (
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
)

// latencyDB wraps a model database with network-like latency: every read
// and every commit takes a little wall time, so transactions of different
// nodes overlap the way they do against a real cluster (where a claim
// spans a few milliseconds). The model alone runs a transaction in
// microseconds under one mutex, which hides conflict storms. The sleeps
// simulate latency; nothing is synchronised by them.
type latencyDB struct {
	kv.DB
	read, commit time.Duration
}

func (d latencyDB) CreateTransaction() (kv.Tx, error) {
	tx, err := d.DB.CreateTransaction()
	if err != nil {
		return nil, err
	}
	return latencyTx{Tx: tx, d: d}, nil
}

type latencyTx struct {
	kv.Tx
	d latencyDB
}

func (t latencyTx) Get(key []byte, snapshot bool) ([]byte, error) {
	time.Sleep(t.d.read)
	return t.Tx.Get(key, snapshot)
}

func (t latencyTx) GetMany(keys [][]byte, snapshot bool) ([][]byte, error) {
	time.Sleep(t.d.read)
	return t.Tx.GetMany(keys, snapshot)
}

func (t latencyTx) GetRange(begin, end []byte, o kv.RangeOptions) ([]kv.KeyValue, error) {
	time.Sleep(t.d.read)
	return t.Tx.GetRange(begin, end, o)
}

func (t latencyTx) Commit() error {
	time.Sleep(t.d.commit)
	return t.Tx.Commit()
}
