package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/storage"
)

// Media types the API reads.
const (
	mediaJSON  = "application/json"
	mediaOctet = "application/octet-stream"
)

// readStep is how much of a body is read (and drawn from the in-flight
// budget) at a time when its length is not known in advance.
const readStep = 64 << 10

// call is one request being handled.
type call struct {
	s *Server
	w http.ResponseWriter
	r *http.Request
	// held is what the request holds of the in-flight budget; wrap
	// gives it back once the answer is written.
	held int64
}

// mediaType returns the request's media type without parameters ("" when
// it has none).
func (c *call) mediaType() (string, error) {
	ct := c.r.Header.Get("Content-Type")
	if ct == "" {
		return "", nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "", statusError(http.StatusUnsupportedMediaType, "%w: Content-Type %q: %v", storage.ErrInvalidArgument, ct, err)
	}
	return mt, nil
}

// readBody reads the request body, at most limit bytes (413 beyond).
// The bytes read are drawn from the in-flight budget before they are
// read, so when the node's budget is spent the API stops reading bodies
// as the RPC server stops reading messages; a body larger than the whole
// budget takes all of it.
func (c *call) readBody(limit int64) ([]byte, error) {
	if c.r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	body := http.MaxBytesReader(c.w, c.r.Body, limit)
	var buf []byte
	// spare is what the request holds of the budget for bytes not read
	// yet: a short read keeps it for the next, so a known length is
	// drawn from the budget once. Given back and drawn again, it would
	// queue behind a larger request waiting for bytes this one holds,
	// and both would wait for ever.
	var spare int64
	defer func() {
		if spare > 0 {
			c.s.cfg.Inflight.Release(spare)
			c.held -= spare
		}
	}()
	watch := c.watchBody() // a body that stalls ends the request
	defer watch.stop()
	for {
		// A known length is read in one step (+1: room to see EOF),
		// after the budget admitted it.
		step := int64(readStep)
		if c.r.ContentLength >= 0 {
			step = max(c.r.ContentLength+1-int64(len(buf)), 1)
		}
		if need := step - spare; need > 0 {
			took, err := c.take(need)
			if err != nil {
				// take gives back all the request held when its
				// wait fails: the spare bytes are no longer held.
				spare = min(spare, c.held)
				return nil, err
			}
			spare += took
		}
		buf = slices.Grow(buf, int(step))
		n, err := body.Read(buf[len(buf) : len(buf)+int(step)])
		watch.read.Add(int64(n))
		buf = buf[:len(buf)+n]
		spare -= min(int64(n), spare)
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(limit)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading the request body: %v", storage.ErrInvalidArgument, err)
		}
	}
}

// take draws up to n bytes from the in-flight budget for this request
// and returns how many it took (0 without a budget, or once the request
// holds the whole budget).
//
// A request never waits for the budget while it holds some of it. The
// budget serves its waiters in order, so a request of unknown length
// (chunked) that held its first step and waited in line for the next
// could wait behind another user of the budget (an RPC message, another
// body) that needs exactly the bytes this request holds: neither would
// ever proceed, and every later user, RPC messages too, would queue behind
// them (found by review, session 73). So a request that holds bytes takes
// more only if they are free at once; else it gives back all it holds and
// waits, holding nothing, for the whole amount again. The bytes of the
// body read so far are in memory but unaccounted during that wait; they
// are at most the budget's size. On an error the request holds nothing
// (c.held is 0) when it held something before.
func (c *call) take(n int64) (int64, error) {
	b := c.s.cfg.Inflight
	if b == nil {
		return 0, nil
	}
	n = min(n, c.s.cfg.InflightLimit-c.held)
	if n <= 0 {
		return 0, nil
	}
	if hook := c.s.onBudgetWait; hook != nil {
		hook()
	}
	if c.held > 0 {
		if b.TryAcquire(n) {
			c.held += n
			return n, nil
		}
		b.Release(c.held)
	}
	// c.held+n is at most InflightLimit (n was cut to it), so the wait
	// can end.
	want := c.held + n
	c.held = 0
	// The wait ends at Stop too. Found by review (session 74): closing
	// the connection of a request whose body is unread does not end its
	// context, so Stop waited shutdownTimeout for it.
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	defer context.AfterFunc(c.s.stopCtx, cancel)()
	if err := b.Acquire(ctx, want); err != nil {
		return 0, fmt.Errorf("%w: waiting for the node's in-flight bytes budget: %v", errcode.ErrUnavailable, err)
	}
	c.held = want
	return n, nil
}

// release gives back what the request holds of the in-flight budget.
func (c *call) release() {
	if c.held > 0 {
		c.s.cfg.Inflight.Release(c.held)
		c.held = 0
	}
}

func tooLarge(limit int64) error {
	return statusError(http.StatusRequestEntityTooLarge, "%w: request body exceeds the limit of %d bytes", storage.ErrInvalidArgument, limit)
}

// decodeJSON reads a JSON body into v. An empty body leaves v as it is
// (for routes whose fields are all optional); any other body must be
// application/json (415 otherwise), hold exactly one JSON value, and name
// only fields v has.
func (c *call) decodeJSON(v any) error {
	mt, err := c.mediaType()
	if err != nil {
		return err
	}
	if mt != "" && mt != mediaJSON {
		return wrongType(mt, mediaJSON)
	}
	body, err := c.readBody(c.s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if mt == "" {
		return wrongType(mt, mediaJSON)
	}
	return decodeStrict(body, v)
}

// noBody refuses a body on a route that reads none (a DELETE of a queue's
// items given the {ids} another route reads would otherwise purge them
// all), as unknown fields are refused.
func (c *call) noBody() error {
	var none struct{}
	return c.decodeJSON(&none)
}

// decodeStrict decodes exactly one JSON value with only known fields,
// each given once.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", storage.ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: request body: more data after the JSON value", storage.ErrInvalidArgument)
	}
	if err := checkNamesOnce(body); err != nil {
		return fmt.Errorf("%w: request body: %v", storage.ErrInvalidArgument, err)
	}
	return nil
}

// checkNamesOnce refuses a JSON value in which an object names a field
// twice. encoding/json keeps the last of the two (matching names without
// regard to case), so {"max": 1, "max": 1000} would otherwise poll a
// thousand items; the request is more likely a mistake than a wish for
// the second. body has been decoded already, so it is valid JSON.
func checkNamesOnce(body []byte) error {
	if bytes.IndexByte(body, '{') < 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	// What is open around the next token: an object's names so far
	// (nil for an array), and whether a name comes next in it.
	type level struct {
		names    map[string]bool
		wantName bool
	}
	var open []level
	valueDone := func() { // a value ended: its object wants a name next
		if n := len(open); n > 0 && open[n-1].names != nil {
			open[n-1].wantName = true
		}
	}
	for {
		t, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		top := len(open) - 1
		if s, ok := t.(string); ok && top >= 0 && open[top].wantName {
			// encoding/json matches names to fields without regard to
			// case (Unicode folding included): fold the same way.
			k := strings.ToLower(strings.ToUpper(s))
			if open[top].names[k] {
				return fmt.Errorf("field %q given twice", s)
			}
			open[top].names[k] = true
			open[top].wantName = false
			continue
		}
		switch t {
		case json.Delim('{'):
			open = append(open, level{names: map[string]bool{}, wantName: true})
		case json.Delim('['):
			open = append(open, level{})
		case json.Delim('}'), json.Delim(']'):
			open = open[:top]
			valueDone()
		default:
			valueDone()
		}
	}
}

// wrongType is the 415 for a body of media type got where want is needed.
func wrongType(got string, want ...string) error {
	if got == "" {
		got = "none"
	}
	return statusError(http.StatusUnsupportedMediaType, "%w: Content-Type %s: want %s (curl: --json, or -H 'Content-Type: application/json')",
		storage.ErrInvalidArgument, got, joinOr(want))
}

func joinOr(xs []string) string {
	switch len(xs) {
	case 0:
		return ""
	case 1:
		return xs[0]
	}
	out := xs[0]
	for _, x := range xs[1 : len(xs)-1] {
		out += ", " + x
	}
	return out + " or " + xs[len(xs)-1]
}
