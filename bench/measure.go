package bench

import (
	"encoding/binary"
	"math/rand"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// payloadHeader is the stamp every payload starts with: 8 bytes of send
// time (ns since the run's base instant, monotonic) and 8 bytes of
// sequence number. The rest is seeded filler.
const payloadHeader = 16

// Histogram bounds, in microseconds: 1 µs to 1 h at 3 significant digits
// (0.1% error), enough for an fsync-bound p999 and a stalled run alike.
const (
	histMinUs = 1
	histMaxUs = int64(time.Hour / time.Microsecond)
	histSig   = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMinUs, histMaxUs, histSig) }

// recordDur adds d to h, clamping to the histogram's range so an outlier
// is counted at the edge rather than dropped.
func recordDur(h *hdrhistogram.Histogram, d time.Duration) {
	us := int64(d / time.Microsecond)
	if us < histMinUs {
		us = histMinUs
	}
	if us > histMaxUs {
		us = histMaxUs
	}
	_ = h.RecordValue(us) // cannot fail: us is within the histogram's range
}

// Latency summarises a histogram in microseconds.
type Latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
	Mean  float64 `json:"mean_us"`
}

func summarize(h *hdrhistogram.Histogram) *Latency {
	if h == nil || h.TotalCount() == 0 {
		return nil
	}
	return &Latency{
		Count: h.TotalCount(),
		P50:   float64(h.ValueAtQuantile(50)),
		P99:   float64(h.ValueAtQuantile(99)),
		P999:  float64(h.ValueAtQuantile(99.9)),
		Max:   float64(h.Max()),
		Mean:  h.Mean(),
	}
}

// payloadMaker builds stamped payloads; one per goroutine (not safe for
// concurrent use). After its 16-byte stamp each payload carries a window
// of a pool of random bytes, at an offset that moves on with every payload:
// two workers never share bytes, and one worker repeats bytes only once it
// has sent a megabyte, so a system that compresses (RocksDB's tables, say)
// gains nothing that it would not gain on incompressible application
// data. (Until 2026-11-30 every payload carried the same filler.)
type payloadMaker struct {
	size int
	pool []byte // random; windows of size-payloadHeader bytes
	off  int    // where the next payload's window starts
	buf  []byte
}

// payloadPool is the random bytes each payloadMaker draws windows from.
const payloadPool = 1 << 20

// newPayloadMaker makes payloads of size bytes; seed and worker choose its
// random bytes, so each worker of a run sends its own.
func newPayloadMaker(size int, seed int64, worker int) *payloadMaker {
	r := rand.New(rand.NewSource(seed ^ int64(worker+1)*0x5851f42d4c957f2d))
	body := max(size-payloadHeader, 0)
	m := &payloadMaker{size: size, pool: make([]byte, payloadPool+body)}
	r.Read(m.pool)
	return m
}

// batch returns n payloads stamped with sent (ns since base) and
// consecutive sequence numbers from seq. The slices share one buffer that
// is reused by the next call.
func (m *payloadMaker) batch(n int, sent int64, seq uint64) [][]byte {
	size := m.size
	if cap(m.buf) < n*size {
		m.buf = make([]byte, n*size)
	}
	m.buf = m.buf[:n*size]
	out := make([][]byte, n)
	for i := 0; i < n; i++ {
		p := m.buf[i*size : (i+1)*size : (i+1)*size]
		if size > payloadHeader {
			copy(p[payloadHeader:], m.pool[m.off:])
			// Move on by the window's length plus an odd number, so that
			// windows do not line up with the last pass over the pool.
			m.off = (m.off + size - payloadHeader + 61) % payloadPool
		}
		binary.BigEndian.PutUint64(p[0:8], uint64(sent))
		binary.BigEndian.PutUint64(p[8:16], seq+uint64(i))
		out[i] = p
	}
	return out
}

// stamp reads the send time and sequence number of a payload; ok is false
// for a payload the harness did not write.
func stamp(p []byte) (sent int64, seq uint64, ok bool) {
	if len(p) < payloadHeader {
		return 0, 0, false
	}
	return int64(binary.BigEndian.Uint64(p[0:8])), binary.BigEndian.Uint64(p[8:16]), true
}

// chargeStall charges a fixed-rate producer's stall at the end of a
// window to the requests it delayed, as the package doc promises: the
// call sent at sent, still unanswered at the deadline (cancelled there),
// waited at least until the deadline, and each send scheduled from next
// on, every interval, before the deadline was not made at all and waited
// from its time to the deadline. Found by review (session 71): those
// went unrecorded, so a system that stopped answering late in a window
// showed the latencies of its calls before the stall only.
func chargeStall(h *hdrhistogram.Histogram, sent, next time.Time, interval time.Duration, deadline time.Time) {
	if !sent.Before(deadline) || interval <= 0 {
		return
	}
	recordDur(h, deadline.Sub(sent))
	for t := next; t.Before(deadline); t = t.Add(interval) {
		recordDur(h, deadline.Sub(t))
	}
}
