package fdbmodel_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
)

type testBundle struct {
	db  *fdbmodel.DB
	clk *clock.Mock
}

func setup(t *testing.T, f fdbmodel.Faults) testBundle {
	t.Helper()
	clk := clock.NewMock()
	return testBundle{db: fdbmodel.New(fdbmodel.Options{Clock: clk, Faults: f}), clk: clk}
}

func (b testBundle) tx(t *testing.T) kv.Tx {
	t.Helper()
	tx, err := b.db.CreateTransaction()
	require.NoError(t, err)
	return tx
}

// put commits key=value in its own transaction.
func (b testBundle) put(t *testing.T, k, v string) {
	t.Helper()
	tx := b.tx(t)
	tx.Set([]byte(k), []byte(v))
	require.NoError(t, tx.Commit())
}

func (b testBundle) get(t *testing.T, k string) []byte {
	t.Helper()
	tx := b.tx(t)
	v, err := tx.Get([]byte(k), false)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return v
}

func code(err error) int { return kv.CodeOf(err) }

func TestFDBModel_Isolation(t *testing.T) {
	t.Parallel()
	t.Run("ReadsSeeTheReadVersionNotLaterCommits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "a", "1")
		t1 := b.tx(t)
		v, err := t1.Get([]byte("a"), true) // fixes the read version
		require.NoError(t, err)
		require.Equal(t, "1", string(v))
		b.put(t, "a", "2")
		b.put(t, "b", "x")
		v, err = t1.Get([]byte("a"), true)
		require.NoError(t, err)
		require.Equal(t, "1", string(v))
		rows, err := t1.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{Snapshot: true})
		require.NoError(t, err)
		require.Len(t, rows, 1, "b was committed after the read version")
		require.Equal(t, "2", string(b.get(t, "a")))
	})
	t.Run("ReadWrittenLaterConflicts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "k", "1")
		t1 := b.tx(t)
		_, err := t1.Get([]byte("k"), false)
		require.NoError(t, err)
		b.put(t, "k", "2")
		t1.Set([]byte("other"), []byte("x"))
		require.Equal(t, kv.CodeNotCommitted, code(t1.Commit()))
		require.Nil(t, b.get(t, "other"), "a failed commit writes nothing")
	})
	t.Run("WriteBeforeReadVersionDoesNotConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "k", "1")
		t1 := b.tx(t)
		_, err := t1.Get([]byte("k"), false)
		require.NoError(t, err)
		t1.Set([]byte("k"), []byte("mine"))
		require.NoError(t, t1.Commit())
		require.Equal(t, "mine", string(b.get(t, "k")))
	})
	t.Run("SnapshotReadAddsNoConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		t1 := b.tx(t)
		_, err := t1.Get([]byte("k"), true)
		require.NoError(t, err)
		_, err = t1.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{Snapshot: true})
		require.NoError(t, err)
		b.put(t, "k", "2")
		t1.Set([]byte("other"), []byte("x"))
		require.NoError(t, t1.Commit())
	})
	t.Run("RangeReadConflictsWithInsertInRange", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "a", "1")
		b.put(t, "c", "1")
		t1 := b.tx(t)
		rows, err := t1.GetRange([]byte("a"), []byte("d"), kv.RangeOptions{})
		require.NoError(t, err)
		require.Len(t, rows, 2)
		b.put(t, "b", "phantom")
		t1.Set([]byte("z"), nil)
		require.Equal(t, kv.CodeNotCommitted, code(t1.Commit()))
	})
	t.Run("LimitedRangeConflictsOnlyOnWhatWasRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "a", "1")
		b.put(t, "c", "1")
		t1 := b.tx(t)
		rows, err := t1.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{Limit: 1})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		b.put(t, "b", "after the limit")
		t1.Set([]byte("y"), nil)
		require.NoError(t, t1.Commit())

		t2 := b.tx(t)
		rows, err = t2.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{Limit: 1, Reverse: true})
		require.NoError(t, err)
		require.Equal(t, "y", string(rows[0].Key))
		b.put(t, "b2", "before the reverse limit")
		t2.Set([]byte("q"), nil)
		require.NoError(t, t2.Commit())
	})
	t.Run("ReadOnlyTransactionAlwaysCommits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{NotCommitted: 1, Seed: 1})
		t1 := b.tx(t)
		_, err := t1.Get([]byte("k"), false)
		require.NoError(t, err)
		require.NoError(t, t1.Commit())
		require.Equal(t, int64(1), b.db.Stats().ReadOnly)
	})
	t.Run("ExplicitConflictRanges", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		t1 := b.tx(t)
		_, err := t1.ReadVersion()
		require.NoError(t, err)
		require.NoError(t, t1.AddReadConflictRange([]byte("m"), []byte("n")))
		t1.Set([]byte("x"), nil)
		t2 := b.tx(t)
		require.NoError(t, t2.AddWriteConflictRange([]byte("m1"), []byte("m2")))
		require.NoError(t, t2.Commit(), "a write-conflict-only transaction commits")
		require.Equal(t, kv.CodeNotCommitted, code(t1.Commit()))
		require.Equal(t, int64(1), b.db.Stats().Conflicts)
	})
	t.Run("FirstCommitterWins", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "item", "ready")
		claim := func() kv.Tx {
			tx := b.tx(t)
			v, err := tx.Get([]byte("item"), false)
			require.NoError(t, err)
			require.Equal(t, "ready", string(v))
			tx.Clear([]byte("item"))
			return tx
		}
		t1, t2 := claim(), claim()
		require.NoError(t, t2.Commit())
		err := t1.Commit()
		require.Equal(t, kv.CodeNotCommitted, code(err))
		require.Equal(t, kv.CodeNotCommitted, code(t1.Commit()), "a failed transaction stays failed")
		require.NoError(t, t1.OnError(err), "OnError resets a transaction after a retryable error")
		v, err := t1.Get([]byte("item"), false)
		require.NoError(t, err)
		require.Nil(t, v, "the retry sees the winner's commit")
	})
}

func TestFDBModel_ReadYourWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, fdbmodel.Faults{})
	b.put(t, "a", "old")
	b.put(t, "b", "old")
	b.put(t, "c", "old")
	tx := b.tx(t)
	tx.Set([]byte("a"), []byte("new"))
	v, err := tx.Get([]byte("a"), false)
	require.NoError(t, err)
	require.Equal(t, "new", string(v))
	tx.ClearRange([]byte("b"), []byte("d"))
	tx.Set([]byte("c"), []byte("again"))
	tx.Add([]byte("n"), 5)
	tx.Add([]byte("n"), -2)
	rows, err := tx.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{})
	require.NoError(t, err)
	var got []string
	for _, r := range rows {
		got = append(got, string(r.Key)+"="+string(r.Value))
	}
	three := string(binary.LittleEndian.AppendUint64(nil, 3))
	require.Equal(t, []string{"a=new", "c=again", "n=" + three}, got)
	rows, err = tx.GetRange([]byte("a"), []byte("z"), kv.RangeOptions{Reverse: true, Limit: 2})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, "n", string(rows[0].Key))
	require.Equal(t, "c", string(rows[1].Key))
	require.NoError(t, tx.Commit())
	require.Nil(t, b.get(t, "b"))
	require.Equal(t, "again", string(b.get(t, "c")))
}

func TestFDBModel_AtomicAdd(t *testing.T) {
	t.Parallel()
	b := setup(t, fdbmodel.Faults{})
	t1, t2 := b.tx(t), b.tx(t)
	for _, tx := range []kv.Tx{t1, t2} {
		_, err := tx.ReadVersion()
		require.NoError(t, err)
		tx.Add([]byte("ctr"), 7)
	}
	require.NoError(t, t1.Commit())
	require.NoError(t, t2.Commit(), "blind atomic adds do not conflict")
	require.Equal(t, int64(14), int64(binary.LittleEndian.Uint64(b.get(t, "ctr"))))
	t3 := b.tx(t)
	t3.Add([]byte("ctr"), -20)
	require.NoError(t, t3.Commit())
	require.Equal(t, int64(-6), int64(binary.LittleEndian.Uint64(b.get(t, "ctr"))))
	// FDB extends a shorter stored value with zeros.
	b.put(t, "short", "\x01")
	t4 := b.tx(t)
	t4.Add([]byte("short"), 1)
	require.NoError(t, t4.Commit())
	require.Equal(t, int64(2), int64(binary.LittleEndian.Uint64(b.get(t, "short"))))
}

func vsKey(prefix string) []byte {
	k := append([]byte(prefix), make([]byte, 10)...)
	k = append(k, 0xAA, 0xBB) // user order
	return binary.LittleEndian.AppendUint32(k, uint32(len(prefix)))
}

func TestFDBModel_Versionstamps(t *testing.T) {
	t.Parallel()
	b := setup(t, fdbmodel.Faults{})
	var prev kv.Versionstamp
	for i := 0; i < 5; i++ {
		tx := b.tx(t)
		tx.SetVersionstampedKey(vsKey("q/"), []byte("item"))
		val := append([]byte{1}, make([]byte, 10)...)
		tx.SetVersionstampedValue([]byte("ptr"), binary.LittleEndian.AppendUint32(val, 1))
		_, err := tx.Get([]byte("ptr"), true)
		require.Equal(t, kv.CodeAccessedUnreadable, code(err), "a versionstamped value is unreadable in its transaction")
		rows, err := tx.GetRange([]byte("q/"), []byte("q0"), kv.RangeOptions{Snapshot: true})
		require.NoError(t, err)
		require.Len(t, rows, i, "a versionstamped key is invisible in its own transaction")
		require.NoError(t, tx.Commit())
		vs, err := tx.Versionstamp()
		require.NoError(t, err)
		require.Equal(t, 1, bytes.Compare(vs[:], prev[:]), "versionstamps strictly increase")
		prev = vs
		want := append(append([]byte("q/"), vs[:]...), 0xAA, 0xBB)
		require.Equal(t, "item", string(b.get(t, string(want))))
		require.Equal(t, append([]byte{1}, vs[:]...), b.get(t, "ptr"))
	}
	tx := b.tx(t)
	tx.SetVersionstampedKey([]byte("bad\x09\x00\x00\x00"), nil)
	require.Equal(t, fdbmodel.CodeClientInvalidOperation, code(tx.Commit()), "offset past the key")
	ro := b.tx(t)
	require.NoError(t, ro.Commit())
	_, err := ro.Versionstamp()
	require.Error(t, err, "no versionstamp without a versionstamped mutation")
}

func waitClosed(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not fire")
	}
}

func isOpen(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

func TestFDBModel_Watches(t *testing.T) {
	t.Parallel()
	t.Run("FiresOnChangeAfterCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "w", "1")
		tx := b.tx(t)
		w, err := tx.Watch([]byte("w"))
		require.NoError(t, err)
		b.put(t, "unrelated", "x")
		require.True(t, isOpen(w.Done()))
		require.NoError(t, tx.Commit())
		b.put(t, "w", "1")
		require.True(t, isOpen(w.Done()), "same value is no change")
		b.put(t, "w", "2")
		waitClosed(t, w.Done())
		require.NoError(t, w.Err())
	})
	t.Run("ChangeBeforeActivationFiresAtCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		w, err := tx.Watch([]byte("w"))
		require.NoError(t, err)
		b.put(t, "w", "new")
		require.True(t, isOpen(w.Done()), "not active before its transaction commits")
		require.NoError(t, tx.Commit())
		waitClosed(t, w.Done())
	})
	t.Run("AtomicAddAndClearRangeFire", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		b.put(t, "r/1", "x")
		mk := func(k string) kv.Watch {
			tx := b.tx(t)
			w, err := tx.Watch([]byte(k))
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
			return w
		}
		wa, wr := mk("ctr"), mk("r/1")
		tx := b.tx(t)
		tx.Add([]byte("ctr"), 1)
		tx.ClearRange([]byte("r/"), []byte("r0"))
		require.NoError(t, tx.Commit())
		waitClosed(t, wa.Done())
		waitClosed(t, wr.Done())
	})
	t.Run("FailedCommitFailsWatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		_, err := tx.Get([]byte("k"), false)
		require.NoError(t, err)
		w, err := tx.Watch([]byte("w"))
		require.NoError(t, err)
		tx.Set([]byte("x"), nil)
		b.put(t, "k", "conflict")
		require.Equal(t, kv.CodeNotCommitted, code(tx.Commit()))
		waitClosed(t, w.Done())
		require.Equal(t, kv.CodeNotCommitted, code(w.Err()))
	})
	t.Run("CancelClosesWatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		w, err := tx.Watch([]byte("w"))
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		w.Cancel()
		waitClosed(t, w.Done())
		require.ErrorIs(t, w.Err(), kv.ErrWatchCancelled)
	})
}

func TestFDBModel_Limits(t *testing.T) {
	t.Parallel()
	t.Run("KeyTooLarge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		tx.Set(make([]byte, kv.MaxKeySize+1), nil)
		require.Equal(t, kv.CodeKeyTooLarge, code(tx.Commit()))
		tx2 := b.tx(t)
		tx2.Set(make([]byte, kv.MaxKeySize), nil)
		require.NoError(t, tx2.Commit())
	})
	t.Run("ValueTooLarge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		tx.Set([]byte("k"), make([]byte, kv.MaxValueSize+1))
		require.Equal(t, kv.CodeValueTooLarge, code(tx.Commit()))
		tx2 := b.tx(t)
		tx2.Set([]byte("k"), make([]byte, kv.MaxValueSize))
		require.NoError(t, tx2.Commit())
	})
	t.Run("TransactionTooLarge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		for i := 0; i < 101; i++ {
			tx.Set([]byte{byte(i)}, make([]byte, kv.MaxValueSize))
		}
		require.Equal(t, kv.CodeTransactionTooLarge, code(tx.Commit()))
		require.Equal(t, int64(1), b.db.Stats().TooLarge)
		require.Greater(t, b.db.Stats().MaxTxnSize, kv.MaxTransactionSize)
	})
	t.Run("ReadVersionOlderThanFiveSeconds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		tx := b.tx(t)
		_, err := tx.Get([]byte("k"), false)
		require.NoError(t, err)
		b.clk.Add(5 * time.Second)
		_, err = tx.Get([]byte("k"), false)
		require.NoError(t, err, "exactly 5 s is still fine")
		b.clk.Add(time.Millisecond)
		_, err = tx.Get([]byte("k"), false)
		require.Equal(t, kv.CodeTransactionTooOld, code(err))
		tx.Set([]byte("k"), nil)
		require.Equal(t, kv.CodeTransactionTooOld, code(tx.Commit()))
		require.True(t, kv.IsRetryable(err))
	})
}

func TestFDBModel_FaultInjection(t *testing.T) {
	t.Parallel()
	t.Run("UnknownResultMayOrMayNotApply", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{Seed: 42, UnknownResult: 1, UnknownApplied: 0.5})
		applied := 0
		const n = 200
		for i := 0; i < n; i++ {
			tx := b.tx(t)
			tx.Add([]byte("ctr"), 1)
			require.Equal(t, kv.CodeCommitUnknownResult, code(tx.Commit()))
		}
		b.db.SetFaults(fdbmodel.Faults{})
		applied = int(binary.LittleEndian.Uint64(b.get(t, "ctr")))
		s := b.db.Stats()
		require.Equal(t, int64(n), s.InjUnknown)
		require.Equal(t, int64(applied), s.InjUnknownApplied)
		require.Greater(t, applied, n/4)
		require.Less(t, applied, 3*n/4)
	})
	t.Run("SeededAndDeterministic", func(t *testing.T) {
		t.Parallel()
		run := func() []int {
			b := setup(t, fdbmodel.Faults{Seed: 7, NotCommitted: 0.2, TooOld: 0.2, UnknownResult: 0.2, UnknownApplied: 0.5})
			var codes []int
			for i := 0; i < 50; i++ {
				tx := b.tx(t)
				tx.Set([]byte("k"), []byte{byte(i)})
				codes = append(codes, code(tx.Commit()))
			}
			return codes
		}
		first := run()
		require.Equal(t, first, run())
		seen := map[int]bool{}
		for _, c := range first {
			seen[c] = true
		}
		for _, c := range []int{0, kv.CodeNotCommitted, kv.CodeTransactionTooOld, kv.CodeCommitUnknownResult} {
			require.True(t, seen[c], "code %d injected", c)
		}
	})
}

func TestFDBModel_GarbageCollection(t *testing.T) {
	t.Parallel()
	b := setup(t, fdbmodel.Faults{})
	for i := 0; i < 1000; i++ {
		tx := b.tx(t)
		k := []byte{'k', byte(i >> 8), byte(i)}
		tx.Set(k, []byte("v"))
		require.NoError(t, tx.Commit())
		tx = b.tx(t)
		tx.Clear(k)
		require.NoError(t, tx.Commit())
	}
	b.put(t, "last", "x")
	require.Equal(t, 1, b.db.Stats().Keys, "deleted keys are pruned once no reader needs them")
}

// errorRetrier runs Retrier cases; the bindings' generic helpers once
// dropped errors that came back with a value, so each path is pinned here.
func TestFDBModel_RetrierNeverDropsErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	errBoom := errors.New("boom")
	t.Run("FunctionErrorWithValue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{})
		v, err := r.Transact(ctx, func(tx kv.Tx) (any, error) {
			tx.Set([]byte("k"), []byte("v"))
			return 42, errBoom
		})
		require.ErrorIs(t, err, errBoom)
		require.Nil(t, v)
		require.Nil(t, b.get(t, "k"), "nothing committed")
		require.Equal(t, int64(1), r.Metrics().Failed)
	})
	t.Run("FatalCommitError", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{})
		v, err := r.Transact(ctx, func(tx kv.Tx) (any, error) {
			tx.Set([]byte("k"), make([]byte, kv.MaxValueSize+1))
			return "value", nil
		})
		require.Equal(t, kv.CodeValueTooLarge, code(err))
		require.Nil(t, v)
	})
	t.Run("RetryLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{Seed: 3, NotCommitted: 1})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{MaxAttempts: 4})
		_, rep, err := r.Run(ctx, func(tx kv.Tx, _ kv.Call) (any, error) {
			tx.Set([]byte("k"), nil)
			return nil, nil
		})
		require.ErrorIs(t, err, kv.ErrRetryLimit)
		require.Equal(t, kv.CodeNotCommitted, code(err))
		require.Equal(t, 4, rep.Attempts)
		require.Equal(t, 3, rep.Conflicts)
		require.Equal(t, int64(3), r.Metrics().Retries)
	})
	t.Run("TimeBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{Seed: 3, NotCommitted: 1})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{MaxDuration: time.Second, Clock: b.clk})
		attempts := 0
		_, err := r.Transact(ctx, func(tx kv.Tx) (any, error) {
			attempts++
			if attempts == 3 {
				b.clk.Add(time.Second)
			}
			tx.Set([]byte("k"), nil)
			return nil, nil
		})
		require.ErrorIs(t, err, kv.ErrRetryLimit)
		require.Equal(t, 3, attempts)
	})
	t.Run("ContextCancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{Seed: 3, NotCommitted: 1})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{})
		cctx, cancel := context.WithCancel(ctx)
		_, err := r.Transact(cctx, func(tx kv.Tx) (any, error) {
			cancel()
			tx.Set([]byte("k"), nil)
			return nil, nil
		})
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("RetriesThenReturnsCommittedValue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fdbmodel.Faults{Seed: 11, UnknownResult: 0.5, UnknownApplied: 0.5})
		r := kv.NewRetrier(b.db, kv.RetrierOptions{})
		maybe := 0
		for i := 0; i < 50; i++ {
			v, rep, err := r.Run(ctx, func(tx kv.Tx, c kv.Call) (any, error) {
				if c.MaybeCommitted {
					maybe++
				}
				tx.Set([]byte("k"), []byte{byte(i)})
				return i, nil
			})
			require.NoError(t, err)
			require.Equal(t, i, v)
			require.Equal(t, rep.UnknownResults, rep.Retries)
		}
		require.Positive(t, maybe, "attempts after commit_unknown_result are flagged")
		require.Equal(t, int64(maybe), r.Metrics().UnknownResults)
	})
}

// TestFDBModel_VersionsFollowTheClock: versions advance a million a second
// on the injected clock, read versions too while nothing commits, and a
// commit's version is above every read version given out before it, so a
// reader at that version never sees it.
func TestFDBModel_VersionsFollowTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t, fdbmodel.Faults{})
	b.put(t, "a", "1")
	require.Equal(t, int64(1), b.db.Version(), "at least one more per commit")
	b.put(t, "a", "2")
	require.Equal(t, int64(2), b.db.Version())

	b.clk.Add(2 * time.Second)
	reader := b.tx(t)
	rv, err := reader.ReadVersion()
	require.NoError(t, err)
	require.Equal(t, int64(2_000_000), rv, "an idle cluster's read version follows the clock")

	// A commit at the same instant gets a version above rv, which the
	// reader does not see.
	b.put(t, "a", "3")
	require.Greater(t, b.db.Version(), rv)
	v, err := reader.Get([]byte("a"), false)
	require.NoError(t, err)
	require.Equal(t, "2", string(v))
	reader.Cancel()

	b.clk.Add(time.Second)
	b.put(t, "a", "4")
	// One above its own read version, the clock's.
	require.Equal(t, int64(3_000_001), b.db.Version(), "a commit's version follows the clock")
}
