package rocksstore

import (
	"encoding/binary"

	"github.com/leaseq/leaseq/dbkeys"
)

// Runs of deletes a batch writes as one range tombstone (runBatch,
// writeBuf.delThrough): records with consecutive ids (idRun) and the
// visibility entries a claim takes from a queue's head (batch.headRun).

// minRangeRun is the shortest run of deleted item keys a batch writes as
// one range tombstone instead of a single delete per key.
const minRangeRun = 4

// headRun returns how many of keys, from the first, are deletes of
// visibility entries of one queue and priority that sort before the
// first entry its serve order still holds (0 when the first key is no
// such delete). keys are the batch's sorted writes, and the batch's ops
// have all been applied: the serve order mirrors the visibility
// entries (rebuild.go), so every entry of that queue and priority the
// database holds after the batch is either in the serve order, hence at
// or after its head, or written by the batch, hence in keys as a put,
// which ends the run. No key the batch leaves lies between the first and
// the last of the run: a range tombstone over them deletes those keys and
// nothing else. Claims and purges take a queue's head (popReady,
// popAny), so the visibility entries a claim pass deletes are such a run.
func (b *batch) headRun(keys []overlayEnt) int {
	first := keys[0].key
	if keys[0].val != nil || first[0] != dbkeys.NsVisibility || len(first) < 1+dbkeys.VisibilitySuffixLen {
		return 0
	}
	var q *queueState
	for _, d := range b.deltas {
		if p := d.q.visPrefix; len(first) == len(p)+dbkeys.VisibilitySuffixLen && first[:len(p)] == p {
			q = d.q
			break
		}
	}
	if q == nil {
		return 0
	}
	// prefix: the queue and priority; the rest is visible_at and id,
	// whose bytes sort as the serve order does (readyEntry.less).
	prefix := first[:len(q.visPrefix)+1]
	var head [8 + dbkeys.IDLen]byte
	hasHead := false
	if h := q.ready.heaps[prefix[len(prefix)-1]]; h != nil {
		if e, ok := h.peek(); ok {
			dbkeys.AppendInt64(head[:0], e.vis)
			copy(head[8:], e.id[:])
			hasHead = true
		}
	}
	n := 0
	for ; n < len(keys); n++ {
		k := keys[n].key
		if keys[n].val != nil || len(k) != len(first) || k[:len(prefix)] != prefix {
			break
		}
		if hasHead && k[len(prefix):] >= string(head[:]) {
			break
		}
	}
	return n
}

// idRun returns how many of keys, from the first, are deletes of one
// queue's item keys in available or in_progress whose ids have
// consecutive sequence numbers (0 when the first is no such delete). Ids
// are unique per sequence number, so no other key of the store lies
// between the first and the last of such a run: a range tombstone over
// them deletes those keys and nothing else.
func idRun(keys []overlayEnt) int {
	first := keys[0].key
	if keys[0].val != nil || len(first) < 1+dbkeys.IDLen || (first[0] != dbkeys.NsAvailable && first[0] != dbkeys.NsInProgress) {
		return 0
	}
	prefix := first[:len(first)-dbkeys.IDLen]
	seq := binary.BigEndian.Uint64(keyBytes(first[len(prefix):]))
	n := 1
	for ; n < len(keys); n++ {
		k := keys[n].key
		if keys[n].val != nil || len(k) != len(first) || k[:len(prefix)] != prefix {
			break
		}
		next := binary.BigEndian.Uint64(keyBytes(k[len(prefix):]))
		if next != seq+1 {
			break
		}
		seq = next
	}
	return n
}
