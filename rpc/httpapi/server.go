package httpapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/rpc/dispatch"
	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/storage"
)

// Defaults for Config fields left zero, and the server's timeouts.
const (
	// DefaultMaxBodyBytes bounds one request body, as the RPC server's
	// DefaultMaxMessageBytes bounds one message: a batch of 1000 items of
	// 32 KiB fits after base64.
	DefaultMaxBodyBytes = 64 << 20
	// DefaultPageLimit is the page size of peek and the dead-letter list,
	// and how many dead items "all" redrives or purges, when the request
	// gives no limit (rpc.DefaultPageLimit; the node's MaxBatch when that
	// is lower).
	DefaultPageLimit = 100
	// readHeaderTimeout bounds how long a connection may take to send its
	// request line and headers, so silent sockets do not hold
	// connections (the RPC server's DefaultFirstMessageTimeout).
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds reading a whole request: a body of MaxBodyBytes
	// at a few hundred KiB/s. net/http keeps the deadline while the
	// handler runs and cancels the request when it passes, so the server's
	// ReadTimeout adds the longest long-poll wait to it.
	readTimeout = 5 * time.Minute
	// idleTimeout closes keep-alive connections nobody uses.
	idleTimeout = 2 * time.Minute
	// writeSlack is added to the whole request's bound (readTimeout and
	// the longest wait) to bound writing its answer: net/http counts the
	// server's WriteTimeout from the request's headers, so a body that
	// took minutes to arrive, or a wait for the in-flight budget, must
	// not lose the answer to a call already carried out.
	writeSlack = 30 * time.Second
	// shutdownTimeout bounds how long Stop waits for running requests
	// (parked polls end at once; an enqueue waits for its fsync) before it
	// closes their connections.
	shutdownTimeout = 30 * time.Second
	// maxHeaderBytes bounds request headers (net/http's default is 1 MiB;
	// no request of this API needs more than a few hundred bytes).
	maxHeaderBytes = 64 << 10
)

// LeaseObserver learns of acks, nacks and extends made through the API;
// *rpc.Server implements it, so its subscriptions get their credit back
// at once.
type LeaseObserver interface {
	LeaseSettled(lease storage.LeaseID, codes []storage.Code)
	LeaseExtended(lease storage.LeaseID, expires time.Time, err error)
}

// Config configures a Server. Store and Clock are required.
type Config struct {
	Store  storage.Store
	Clock  clock.Clock
	Logger *slog.Logger // nil: discard
	// Limits enforced on every request; zero fields take
	// storage.DefaultLimits. Give the RPC server's.
	Limits storage.Limits
	// Dispatcher parks long polls. Give the RPC server's
	// (rpc.Server.Dispatcher) so enqueues through either front end and the
	// sweeper's wake-ups reach polls of both, under one set of waiter
	// limits. nil: a dispatcher of the API's own (with default limits),
	// closed by Stop; nothing but the API's own writes wakes it then.
	Dispatcher *dispatch.Dispatcher
	// Inflight, when set, bounds the bytes of request bodies being
	// handled, together with whatever else draws on it (give the RPC
	// server's InflightBudget); InflightLimit is its size, the most one
	// request takes. nil: unbounded.
	Inflight      *semaphore.Weighted
	InflightLimit int64
	// Leases, when set, is told of every ack, nack and extend (the RPC
	// server, for its subscriptions' credit).
	Leases LeaseObserver
	// Admit, when set, is asked for every accepted connection (the RPC
	// server's Admit: one --max-conns and --max-conns-per-ip count for the
	// node). A refused connection gets a 503 naming the reason and is
	// closed; an admitted one calls release when it closes.
	Admit func(net.Conn) (release func(), refused string)
	// MaxBodyBytes bounds one request body (0: DefaultMaxBodyBytes); a
	// larger one is answered 413.
	MaxBodyBytes int64
	// TLS, when set, is the server side TLS config (as the RPC server's:
	// set ClientAuth and ClientCAs to require client certificates).
	TLS *tls.Config
	// AllowedHosts are the host names (without port) by which a client
	// may reach the node over TCP besides IP addresses, "localhost" and
	// names under ".localhost" (hostGuard).
	AllowedHosts []string
}

// Route is one method and path pattern of the API, as registered
// (net/http pattern syntax: "/v1/queues/{queue}/items").
type Route struct {
	Method string
	Path   string
	op     string
	query  []string // the query parameters it reads
	h      handlerFunc
}

// handlerFunc serves one route: it returns the value to send as JSON with
// 200, or an error to send as the JSON error.
type handlerFunc func(c *call) (any, error)

// Server serves the API over a Store. Lifecycle: New, Mount (optional),
// then Start on a listener, then Stop.
type Server struct {
	cfg      Config
	log      *slog.Logger
	limits   storage.Limits
	disp     *dispatch.Dispatcher
	ownDisp  bool
	routes   []Route
	mux      *http.ServeMux
	srv      *http.Server
	stopCtx  context.Context // cancelled by Stop: ends parked polls
	stopFunc context.CancelFunc
	stopOnce sync.Once
	unwatch  func() bool    // ends Start's watch of its ctx
	wg       sync.WaitGroup // the serve goroutine
	errRefs  atomic.Uint64  // numbers internal failures in the log and the reply
	ops      map[string]*opCounters
	// onBudgetWait, when set (by tests, before Start), is called before a
	// request asks the in-flight budget for bytes.
	onBudgetWait func()
	// maxAnswer bounds the JSON of a poll answer (DefaultMaxAnswerBytes;
	// tests lower it, before Start).
	maxAnswer int64

	mu struct {
		sync.Mutex
		started  bool
		stopping bool
		// running counts requests in srv's handlers; idle, when set
		// (by Stop), is closed when it reaches 0.
		running int
		idle    chan struct{}
	}
}

// New checks c and returns a Server that is not yet serving.
func New(c Config) (*Server, error) {
	if c.Store == nil {
		return nil, errors.New("httpapi: Config.Store is required")
	}
	if c.Clock == nil {
		return nil, errors.New("httpapi: Config.Clock is required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.MaxBodyBytes < 0 || c.InflightLimit < 0 {
		return nil, errors.New("httpapi: negative limit in Config")
	}
	if c.Inflight != nil && c.InflightLimit == 0 {
		return nil, errors.New("httpapi: Config.Inflight needs its size in InflightLimit")
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	limits := c.Limits.WithDefaults()
	if limits.MinLease > limits.MaxLease || limits.MaxBatch < 1 || limits.MaxPayload < 1 {
		return nil, fmt.Errorf("httpapi: inconsistent Limits %+v", limits)
	}
	s := &Server{cfg: c, log: c.Logger.With("svc", "http"), limits: limits, disp: c.Dispatcher, mux: http.NewServeMux(),
		maxAnswer: DefaultMaxAnswerBytes}
	if s.disp == nil {
		d, err := dispatch.New(dispatch.Config{Store: c.Store, Clock: c.Clock})
		if err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
		s.disp, s.ownDisp = d, true
	}
	s.stopCtx, s.stopFunc = context.WithCancel(context.Background())
	s.routes = s.apiRoutes()
	s.ops = make(map[string]*opCounters, len(s.routes))
	for _, rt := range s.routes {
		s.ops[rt.op] = &opCounters{}
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	// Anything else under /v1/ gets a JSON 404 or 405, not net/http's
	// plain text.
	s.mux.HandleFunc("/v1/", s.noRoute)
	s.srv = &http.Server{
		Handler:           s.track(s.hostGuard(s.mux)),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout + limits.MaxWait,
		WriteTimeout:      readTimeout + limits.MaxWait + writeSlack,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		// A copy: http.Server adds its ALPN protocols (h2, http/1.1) to
		// the config it serves with, and the node's RPC listener is
		// given the same one (found by review, session 70).
		TLSConfig: c.TLS.Clone(),
	}
	return s, nil
}

// Routes returns the API's routes in registration order (a new slice each
// call); mounted handlers are not among them.
func (s *Server) Routes() []Route {
	out := make([]Route, len(s.routes))
	copy(out, s.routes)
	return out
}

// Mount serves h for pattern (net/http ServeMux syntax, such as "/ui/")
// on the API's listener, for the web dashboard and the like. Patterns
// under /v1/ belong to the API and are refused, as is a pattern that
// conflicts with one already registered. Mount before Start; mounted
// handlers get requests as they come (no body limit, no JSON errors).
func (s *Server) Mount(pattern string, h http.Handler) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.started || s.mu.stopping {
		return errors.New("httpapi: Mount after Start")
	}
	path := pattern
	if i := strings.IndexByte(path, '/'); i >= 0 {
		path = path[i:]
	}
	if path == "/v1" || strings.HasPrefix(path, "/v1/") {
		return fmt.Errorf("httpapi: mount %q: /v1/ belongs to the API", pattern)
	}
	defer func() {
		// ServeMux panics on a malformed or conflicting pattern.
		if r := recover(); r != nil {
			err = fmt.Errorf("httpapi: mount %q: %v", pattern, r)
		}
	}()
	s.mux.Handle(pattern, h)
	return nil
}

// Handler returns the handler Start serves: the API under /v1/ and the
// mounted handlers. It is for tests and for embedding the API in another
// server; Stop's refusal of new requests and its end of parked polls
// apply to it too.
func (s *Server) Handler() http.Handler { return s.hostGuard(s.mux) }

// Start serves ln in the background until Stop (or ctx is done, which
// calls Stop): with TLS when Config.TLS is set. It returns an error when
// the server was already started or stopped.
func (s *Server) Start(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.mu.started || s.mu.stopping {
		s.mu.Unlock()
		_ = ln.Close()
		return fmt.Errorf("httpapi: start: %w: server already started or stopped", errcode.ErrUnavailable)
	}
	s.mu.started = true
	s.unwatch = context.AfterFunc(ctx, s.Stop)
	s.mu.Unlock()
	if s.cfg.Admit != nil {
		ln = &admitListener{Listener: ln, admit: s.cfg.Admit, clock: s.cfg.Clock, log: s.log, stop: s.stopCtx, wg: &s.wg}
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var err error
		if s.cfg.TLS != nil {
			err = s.srv.ServeTLS(ln, "", "")
		} else {
			err = s.srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server failed", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return nil
}

// Stop closes the listener, ends parked long polls (503 unavailable),
// waits for running requests to finish and their answers to be written
// (closing their connections after shutdownTimeout, then waiting for
// their handlers, which give back the items of poll answers not
// written), and returns. A request read as Stop begins is refused with
// 503 unavailable; one read later on a connection open before is not
// carried out, and net/http closes its connection without an answer. It
// is idempotent and safe to call before Start.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.mu.stopping = true
		started, unwatch := s.mu.started, s.unwatch
		s.mu.Unlock()
		if unwatch != nil {
			unwatch()
		}
		s.stopFunc()
		if started {
			ctx, cancel := s.cfg.Clock.WithTimeout(context.Background(), shutdownTimeout)
			if err := s.srv.Shutdown(ctx); err != nil {
				s.log.Warn("http requests still running at shutdown; closing their connections", "err", err)
				_ = s.srv.Close()
			}
			cancel()
			// Found by review (session 74): Close does not wait for
			// the handlers of the connections it closes, and one whose
			// answer could not be written then gives its items back
			// (or is still in a store call), while the node closes the
			// store after Stop. Their connections are closed: they end.
			s.waitHandlers()
		}
		s.wg.Wait()
		if s.ownDisp {
			s.disp.Close()
		}
		s.log.Info("http server stopped")
	})
}

// track counts the requests in h, for Stop's waitHandlers.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.mu.running++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.mu.running--
			if s.mu.running == 0 && s.mu.idle != nil {
				close(s.mu.idle)
				s.mu.idle = nil
			}
			s.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// waitHandlers waits until no request is in srv's handlers.
func (s *Server) waitHandlers() {
	s.mu.Lock()
	if s.mu.running == 0 {
		s.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	s.mu.idle = idle
	s.mu.Unlock()
	<-idle
}

func (s *Server) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.stopping
}

// errShuttingDown is the error of requests refused or ended by Stop.
var errShuttingDown = fmt.Errorf("%w: server shutting down", errcode.ErrUnavailable)

// wrap turns a route's handler into an http.Handler: the shutdown
// refusal, the JSON answer or error, and the metrics.
func (s *Server) wrap(rt Route) http.Handler {
	ops := s.ops[rt.op]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.cfg.Clock.Now()
		c := &call{s: s, w: w, r: r}
		defer c.release()
		var v any
		var err error
		switch {
		case s.isStopping():
			err = errShuttingDown
		default:
			if err = checkQuery(c, rt.query); err == nil {
				v, err = rt.h(c)
			}
		}
		if err != nil {
			s.writeError(w, r, rt.op, err)
		} else if a, ok := v.(*pollAnswer); ok && a.giveBack != nil {
			// Items were claimed for this answer: see it out now, and
			// give them back if it cannot be written.
			if werr := writeJSON(w, http.StatusOK, v); werr != nil || http.NewResponseController(w).Flush() != nil {
				a.giveBack()
			}
		} else {
			writeJSON(w, http.StatusOK, v)
		}
		ops.observe(s.cfg.Clock.Since(start), err != nil)
	})
}

// statusOf is the HTTP status of each error code.
var statusOf = map[errcode.Code]int{
	errcode.InvalidArgument: http.StatusBadRequest,
	errcode.NotFound:        http.StatusNotFound,
	errcode.LeaseMismatch:   http.StatusConflict,
	errcode.LeaseExpired:    http.StatusGone,
	errcode.Unavailable:     http.StatusServiceUnavailable,
	errcode.TooManyWaiters:  http.StatusTooManyRequests,
	errcode.Internal:        http.StatusInternalServerError,
	errcode.NotEmpty:        http.StatusConflict,
}

// httpError gives an error an HTTP status other than its code's (413 for
// a body over the limit, 415 for a wrong content type, 405).
type httpError struct {
	status int
	err    error // wraps the sentinel of the code
}

func (e *httpError) Error() string { return e.err.Error() }
func (e *httpError) Unwrap() error { return e.err }

// statusError returns an error with an HTTP status of its own; format
// should wrap a sentinel with %w.
func statusError(status int, format string, args ...any) error {
	return &httpError{status: status, err: fmt.Errorf(format, args...)}
}

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong: Code is an rpc/errcode name.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError answers with err's status and code. Internal failures are
// logged with a reference the client gets instead of the cause.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, op string, err error) {
	code := errcode.Of(err)
	status := statusOf[code]
	var he *httpError
	if errors.As(err, &he) {
		status = he.status
	}
	if code == errcode.Internal {
		ref := s.errRefs.Add(1)
		s.log.Error("request failed", "op", op, "remote", r.RemoteAddr, "ref", ref, "err", err)
		err = errcode.InternalReason(err, ref)
	} else {
		s.log.Debug("request refused", "op", op, "remote", r.RemoteAddr, "status", status, "err", err)
	}
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	_ = writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code.String(), Message: err.Error()}})
}

// writeJSON sends v with status. An encoding failure after the header is
// out can only end the connection, which net/http does.
// writeJSON writes v as the answer; the error is the body's write's (most
// writes only fill net/http's buffer, which goes out after the handler).
func writeJSON(w http.ResponseWriter, status int, v any) error {
	buf := jsonBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledJSON {
			buf.Reset()
			jsonBufs.Put(buf)
		}
	}()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	enc := json.NewEncoder(buf)
	// No HTML escaping: the answer is JSON served as application/json
	// with nosniff, never HTML, and escaping makes each '<', '>' and '&'
	// of an item's "text" six bytes (found by review, session 73: one
	// item of 1 MiB of '<' was a 7.3 MiB answer).
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		buf.Reset()
		status = http.StatusInternalServerError
		fmt.Fprintf(buf, `{"error":{"code":%q,"message":%q}}`+"\n", errcode.Internal.String(), "encode answer: "+err.Error())
	}
	// A known length: no chunked encoding, and the answer goes out in the
	// write that ends the request.
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, err := w.Write(buf.Bytes())
	return err
}

// jsonBufs recycles the buffers answers are encoded into; one larger than
// maxPooledJSON (a big peek page) is left to the garbage collector.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledJSON = 64 << 10

// probeMethods are the methods noRoute tries when a path has no route for
// the request's method.
var probeMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}

// noRoute answers requests under /v1/ that match no route: 405 with an
// Allow header when the path has routes for other methods, else 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range probeMethods {
		if m == r.Method {
			continue
		}
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/v1/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, "no_route", statusError(http.StatusMethodNotAllowed,
			"%w: method %s not allowed on %s (allowed: %s)", storage.ErrInvalidArgument, r.Method, r.URL.Path, strings.Join(allow, ", ")))
		return
	}
	s.writeError(w, r, "no_route", fmt.Errorf("%w: no route %s %s (see GET /v1/openapi.json)", storage.ErrNotFound, r.Method, r.URL.Path))
}
