package leaseqt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/rpc/httpapi"
)

// HTTP is a `leaseq serve --http` process driven over its HTTP/JSON API
// (one keep-alive connection per worker, payloads in base64), for
// comparing the HTTP front end with RPC on the same node. It runs only
// when named (-systems leaseq-http), to keep default runs short.
type HTTP struct {
	Sync string // "always" or "none"
	Bin  *Binary
}

// Name implements target.System.
func (h HTTP) Name() string { return "leaseq-http-" + h.Sync }

// Family implements target.System.
func (HTTP) Family() string { return "leaseq" }

// OnlyWhenNamed keeps this system out of runs that do not name it.
func (HTTP) OnlyWhenNamed() bool { return true }

// Durability implements target.System.
func (h HTTP) Durability() target.Durability { return RPC{Sync: h.Sync}.Durability() }

// Available implements target.System; it builds the binary if needed.
func (h HTTP) Available() error {
	_, err := h.Bin.Resolve()
	return err
}

// Start implements target.System.
func (h HTTP) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	bin, err := h.Bin.Resolve()
	if err != nil {
		return nil, err
	}
	ports, err := procx.FreePorts(2)
	if err != nil {
		return nil, err
	}
	rpcPort, httpPort := ports[0], ports[1]
	addr := "127.0.0.1:" + strconv.Itoa(httpPort)
	p, err := procx.Start(ctx, o.Clock, h.Name(), o.Dir, addr, serveReadyWait, bin, "serve",
		"--data", filepath.Join(o.Dir, "data"), "--listen", "127.0.0.1:"+strconv.Itoa(rpcPort), "--http", addr, "--sync", h.Sync)
	if err != nil {
		return nil, err
	}
	return &httpInstance{proc: p, base: "http://" + addr + "/v1/queues/", lease: o.Lease}, nil
}

type httpInstance struct {
	proc   *procx.Process
	base   string
	lease  time.Duration
	closed atomic.Bool
}

func (in *httpInstance) PID() int { return in.proc.PID() }

func (in *httpInstance) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	return in.proc.Stop()
}

func (in *httpInstance) Connect(context.Context) (target.Client, error) {
	// One worker, one connection kept alive: as an RPC worker has its own.
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	return &httpClient{c: &http.Client{Transport: tr}, tr: tr, base: in.base, leaseMs: in.lease.Milliseconds()}, nil
}

type httpClient struct {
	c       *http.Client
	tr      *http.Transport
	base    string
	leaseMs int64
	items   []httpapi.EnqueueItem
	b64     []string
}

// handle is what Ack needs of a delivery.
type httpHandle struct{ lease, id string }

func (c *httpClient) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// post sends v as JSON to base+queue+path and decodes a 200 answer into
// out; any other answer is an error with the API's code and message.
func (c *httpClient) post(ctx context.Context, queue, path string, v, out any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+queue+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.c.Do(req)
	if err != nil {
		return fmt.Errorf("leaseqt: http %s: %w", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("leaseqt: http %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e httpapi.ErrorBody
		_ = json.Unmarshal(raw, &e)
		return fmt.Errorf("leaseqt: http %s: %s: %s: %s", path, resp.Status, e.Error.Code, e.Error.Message)
	}
	return json.Unmarshal(raw, out)
}

func (c *httpClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	c.items, c.b64 = c.items[:0], c.b64[:0]
	for _, p := range payloads {
		c.b64 = append(c.b64, base64.StdEncoding.EncodeToString(p))
	}
	for i := range c.b64 {
		c.items = append(c.items, httpapi.EnqueueItem{Payload: &c.b64[i]})
	}
	var res httpapi.EnqueueResponse
	if err := c.post(ctx, queue, "/items", c.items, &res); err != nil {
		return err
	}
	for i, r := range res.Results {
		if r.Code != "ok" {
			return fmt.Errorf("leaseqt: http enqueue item %d: %s: %s", i, r.Code, r.Error)
		}
	}
	if len(res.Results) != len(payloads) {
		return fmt.Errorf("leaseqt: http enqueue: %d results for %d items", len(res.Results), len(payloads))
	}
	return nil
}

func (c *httpClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	n := int64(max)
	var res httpapi.PollResponse
	if err := c.post(ctx, queue, "/poll", httpapi.PollRequest{Max: &n, LeaseMs: c.leaseMs, WaitMs: wait.Milliseconds()}, &res); err != nil {
		return nil, err
	}
	ds := make([]target.Delivery, len(res.Items))
	for i, it := range res.Items {
		ds[i] = target.Delivery{Payload: it.Payload, Handle: httpHandle{lease: res.Lease, id: it.ID}}
	}
	return ds, nil
}

func (c *httpClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	var order []string
	ids, at := map[string][]string{}, map[string][]int{}
	for i, d := range ds {
		h := d.Handle.(httpHandle)
		if _, ok := ids[h.lease]; !ok {
			order = append(order, h.lease)
		}
		ids[h.lease] = append(ids[h.lease], h.id)
		at[h.lease] = append(at[h.lease], i)
	}
	var errs []error
	var lost target.LostAcks
	for _, l := range order {
		var res httpapi.SettleResponse
		if err := c.post(ctx, queue, "/ack", httpapi.SettleRequest{Lease: l, IDs: ids[l]}, &res); err != nil {
			errs = append(errs, err)
			continue
		}
		for i, r := range res.Results {
			switch r.Code {
			case "ok":
			case "leaseExpired", "leaseMismatch", "notFound":
				// Not this consumer's to complete any more: not a
				// failure, nor an item done (target.LostAcks).
				lost.N++
				if i < len(at[l]) {
					lost.Index = append(lost.Index, at[l][i])
				}
			default:
				errs = append(errs, fmt.Errorf("leaseqt: http ack id %d: %s", i, r.Code))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if len(lost.Index) != lost.N {
		lost.Index = nil // the server did not answer id by id: only how many
	}
	return lostOrNil(&lost)
}
