package rocksstore

/*
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "rocksdb/c.h"

// leaseq_wal_syncer is a C thread that fsyncs the WAL on request: the Go
// side writes one byte to req and reads the answer from done through Go's
// poller, so no goroutine sits in a cgo call during the fsync.
typedef struct {
	rocksdb_transactiondb_t* db;
	int req, done;
	char* err; // set by the thread before it answers 'e'; freed by Go
	pthread_t th;
} leaseq_wal_syncer;

static void* leaseq_wal_sync_run(void* arg) {
	leaseq_wal_syncer* s = arg;
	for (;;) {
		char c;
		ssize_t n = read(s->req, &c, 1);
		if (n < 0 && errno == EINTR) continue;
		if (n != 1 || c == 'q') break;
		char* err = NULL;
		rocksdb_transactiondb_flush_wal(s->db, 1, &err);
		s->err = err;
		c = err ? 'e' : 'k';
		while (write(s->done, &c, 1) < 0 && errno == EINTR) {}
	}
	return NULL;
}

static leaseq_wal_syncer* leaseq_wal_sync_start(rocksdb_transactiondb_t* db, int req, int done) {
	leaseq_wal_syncer* s = calloc(1, sizeof(leaseq_wal_syncer));
	if (s == NULL) return NULL;
	s->db = db;
	s->req = req;
	s->done = done;
	if (pthread_create(&s->th, NULL, leaseq_wal_sync_run, s) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

static void leaseq_wal_sync_join(leaseq_wal_syncer* s) {
	pthread_join(s->th, NULL);
	free(s);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"unsafe"

	"github.com/linxGnu/grocksdb"
)

// walSyncer fsyncs the WAL on a C thread. A goroutine blocked in a cgo
// call through an fsync keeps Go's sysmon waking every 20 µs to retake its
// P (measured: about 7% of the CPU of a synced cycle benchmark); here the
// waiting goroutine is parked in Go's poller instead, and the fsync runs
// on a thread the Go scheduler does not know about. Only the syncer
// goroutine calls sync.
type walSyncer struct {
	c           *C.leaseq_wal_syncer
	req, done   *os.File // Go's ends: request writes, answer reads
	reqR, doneW *os.File // the C thread's ends
}

// transactionDBHandle returns grocksdb's C handle of db. grocksdb keeps it
// unexported, as the first field of TransactionDB; the reflect check makes
// a grocksdb upgrade that moves it fail Open instead of crashing.
func transactionDBHandle(db *grocksdb.TransactionDB) (*C.rocksdb_transactiondb_t, error) {
	f, ok := reflect.TypeOf(grocksdb.TransactionDB{}).FieldByName("c")
	if !ok || f.Offset != 0 || f.Type.Kind() != reflect.Pointer {
		return nil, errors.New("grocksdb.TransactionDB has no C handle as its first field (grocksdb upgraded?)")
	}
	return *(**C.rocksdb_transactiondb_t)(unsafe.Pointer(db)), nil
}

func newWALSyncer(db *grocksdb.TransactionDB) (*walSyncer, error) {
	h, err := transactionDBHandle(db)
	if err != nil {
		return nil, err
	}
	reqR, req, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	done, doneW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		req.Close()
		return nil, err
	}
	// Fd puts the C thread's ends into blocking mode, as it wants them.
	c := C.leaseq_wal_sync_start(h, C.int(reqR.Fd()), C.int(doneW.Fd()))
	if c == nil {
		for _, f := range []*os.File{reqR, req, done, doneW} {
			f.Close()
		}
		return nil, errors.New("cannot start the WAL sync thread")
	}
	return &walSyncer{c: c, req: req, done: done, reqR: reqR, doneW: doneW}, nil
}

// sync fsyncs the WAL and returns RocksDB's error, if any.
func (w *walSyncer) sync() error {
	if _, err := w.req.Write([]byte{'s'}); err != nil {
		return fmt.Errorf("wal sync thread: %w", err)
	}
	var b [1]byte
	if _, err := w.done.Read(b[:]); err != nil {
		return fmt.Errorf("wal sync thread: %w", err)
	}
	if b[0] == 'e' {
		msg := C.GoString(w.c.err)
		C.free(unsafe.Pointer(w.c.err))
		w.c.err = nil
		return errors.New(msg)
	}
	return nil
}

// close stops the thread. REQUIRES: no sync in flight.
func (w *walSyncer) close() {
	_, _ = w.req.Write([]byte{'q'})
	C.leaseq_wal_sync_join(w.c)
	for _, f := range []*os.File{w.req, w.done, w.reqR, w.doneW} {
		f.Close()
	}
}
