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
// concurrent use).
type payloadMaker struct {
	filler []byte
	buf    []byte
}

func newPayloadMaker(size int, seed int64) *payloadMaker {
	r := rand.New(rand.NewSource(seed))
	f := make([]byte, size)
	r.Read(f[payloadHeader:])
	return &payloadMaker{filler: f}
}

// batch returns n payloads stamped with sent (ns since base) and
// consecutive sequence numbers from seq. The slices share one buffer that
// is reused by the next call.
func (m *payloadMaker) batch(n int, sent int64, seq uint64) [][]byte {
	size := len(m.filler)
	if cap(m.buf) < n*size {
		m.buf = make([]byte, n*size)
	}
	m.buf = m.buf[:n*size]
	out := make([][]byte, n)
	for i := 0; i < n; i++ {
		p := m.buf[i*size : (i+1)*size : (i+1)*size]
		copy(p, m.filler)
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
