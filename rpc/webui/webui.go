package webui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

const (
	// DefaultPageSize is the number of items on one page of the queue and
	// dead-letter pages: a screenful on a laptop, one cheap Peek.
	DefaultPageSize = 50
	// DefaultQueuesPerPage is the number of rows of the queue list: every
	// queue of a typical node on one page (filterable and sortable in the
	// browser), while a node with its full 10,000 queues still gets pages
	// that render quickly (BenchmarkQueueList: 1,000 rows).
	DefaultQueuesPerPage = 1000
	// DefaultSampleInterval is how often the rate sampler reads the
	// counters of every queue: 13 samples span the one-minute rate window,
	// and one Stats call every 5 s is negligible even with 10,000 queues.
	DefaultSampleInterval = 5 * time.Second
	// DefaultRefreshInterval is how often an open page refreshes its
	// figures in the browser.
	DefaultRefreshInterval = 5 * time.Second
	// RateWindow is the span the enqueue and ack rates are averaged over.
	RateWindow = time.Minute
)

// maxFormBytes bounds a POST body: a page of ids is a few KiB.
const maxFormBytes = 256 << 10

// Config configures a UI. Store and Clock are required.
type Config struct {
	// Store is what the pages show and the actions change.
	Store storage.Store
	// Clock is the only source of time (ages, rates, the sampler's ticker).
	Clock clock.Clock
	// Logger receives the actions taken (redrive, purge) and failures; nil
	// discards. The UI adds svc=webui. Payloads are never logged.
	Logger *slog.Logger
	// Prefix is the path the handler is mounted at, such as "/ui": it
	// serves Prefix+"/" and below, given the full request path (mount it
	// with mux.Handle(Prefix+"/", ui.Handler()), no http.StripPrefix), and
	// every link it renders starts with it. "" mounts at the root. It must
	// start with "/" and not end with one.
	Prefix string
	// RequireClientCert refuses (403) every request that did not come over
	// TLS with a verified client certificate. Set it when the node requires
	// mutual TLS, so the dashboard is never the way around it.
	RequireClientCert bool
	// Limits are the node's limits; pages and batches stay within
	// MaxBatch. Zero fields take storage.DefaultLimits'.
	Limits storage.Limits
	// PageSize is the number of items per page on the queue and
	// dead-letter pages; 0 means DefaultPageSize. It is capped at
	// Limits.MaxBatch-1 (a page peeks one item more to know whether
	// there is a next page).
	PageSize int
	// QueuesPerPage is the number of rows on the queue list; 0 means
	// DefaultQueuesPerPage.
	QueuesPerPage int
	// SampleInterval is the rate sampler's period; 0 means
	// DefaultSampleInterval; negative turns the ticker off, and rates are
	// then sampled only when the queue list is viewed.
	SampleInterval time.Duration
	// RefreshInterval is how often an open page refreshes itself in the
	// browser; 0 means DefaultRefreshInterval; negative turns it off.
	RefreshInterval time.Duration
	// OnReady, if not nil, is called with the queue after a redrive moved
	// items back to ready, so parked long polls look (rpc.Server.Wake).
	OnReady func(queues []string)
	// TestSignals lets tests observe the sampler; the zero value does
	// nothing.
	TestSignals TestSignals
}

// TestSignals are optional callbacks that let tests wait for events instead
// of sleeping. Production code leaves them nil.
type TestSignals struct {
	// Sampled is called on the sampler goroutine after each ticker sample,
	// with the number of queues sampled, or with the Stats error.
	Sampled func(queues int, err error)
}

// UI is the dashboard. Create it with New, mount Handler, and Close it when
// the listener is gone.
type UI struct {
	store   storage.Store
	clock   clock.Clock
	log     *slog.Logger
	limits  storage.Limits
	prefix  string
	reqCert bool
	onReady func([]string)

	pageSize      int
	queuesPerPage int
	refresh       time.Duration

	pages   map[string]*template.Template
	static  http.Handler
	version string // content hash of the static assets, for cache busting
	handler http.Handler

	rates *rates

	stop      context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

//go:embed assets
var assets embed.FS

// pageNames are the page templates in assets/, each parsed with layout.html.
var pageNames = []string{"queues", "queue", "dead", "error"}

// New checks cfg, parses the embedded templates and starts the rate
// sampler (unless cfg.SampleInterval < 0).
func New(cfg Config) (*UI, error) {
	if cfg.Store == nil || cfg.Clock == nil {
		return nil, errors.New("webui: Config.Store and Config.Clock are required")
	}
	if cfg.Prefix != "" && (!strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/")) {
		return nil, fmt.Errorf("webui: Config.Prefix %q must start with / and not end with one", cfg.Prefix)
	}
	if strings.ContainsAny(cfg.Prefix, "{}?#% ") {
		return nil, fmt.Errorf("webui: Config.Prefix %q has a character that is not allowed in it", cfg.Prefix)
	}
	if cfg.PageSize < 0 || cfg.QueuesPerPage < 0 {
		return nil, fmt.Errorf("webui: PageSize %d and QueuesPerPage %d must not be negative", cfg.PageSize, cfg.QueuesPerPage)
	}
	u := &UI{
		store:         cfg.Store,
		clock:         cfg.Clock,
		log:           cfg.Logger,
		limits:        cfg.Limits.WithDefaults(),
		prefix:        cfg.Prefix,
		reqCert:       cfg.RequireClientCert,
		onReady:       cfg.OnReady,
		pageSize:      cfg.PageSize,
		queuesPerPage: cfg.QueuesPerPage,
		refresh:       cfg.RefreshInterval,
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	u.log = u.log.With("svc", "webui")
	if u.pageSize == 0 {
		u.pageSize = DefaultPageSize
	}
	u.pageSize = max(1, min(u.pageSize, u.limits.MaxBatch-1))
	if u.queuesPerPage == 0 {
		u.queuesPerPage = DefaultQueuesPerPage
	}
	if u.refresh == 0 {
		u.refresh = DefaultRefreshInterval
	}
	interval := cfg.SampleInterval
	if interval == 0 {
		interval = DefaultSampleInterval
	}
	spacing := interval
	if spacing < 0 {
		spacing = DefaultSampleInterval
	}
	u.rates = newRates(RateWindow, spacing)
	if err := u.parse(); err != nil {
		return nil, err
	}
	u.handler = u.routes()

	ctx, cancel := context.WithCancel(context.Background())
	u.stop = cancel
	if interval > 0 {
		// The ticker exists when New returns, so a test may move a mock
		// clock at once.
		t := u.clock.Ticker(interval)
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer t.Stop()
			u.sampleLoop(ctx, t.C, cfg.TestSignals)
		}()
	}
	return u, nil
}

// Handler returns the HTTP handler serving Prefix+"/" and below.
func (u *UI) Handler() http.Handler { return u.handler }

// Close stops the rate sampler and waits for it. It is idempotent. The
// handler keeps serving pages afterwards (rates are then sampled only on
// requests).
func (u *UI) Close() {
	u.closeOnce.Do(func() {
		u.stop()
		u.wg.Wait()
	})
}

// sampleLoop records the counters of every queue on each tick.
func (u *UI) sampleLoop(ctx context.Context, tick <-chan time.Time, sig TestSignals) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		now := u.clock.Now()
		st, err := u.store.Stats(ctx, storage.StatsParams{Now: now})
		if err == nil {
			u.rates.observe(now, st, true)
		} else if ctx.Err() == nil {
			// Warn, not Error: the store may be closing or recovering; the
			// next tick tries again and the pages show their own errors.
			u.log.Warn("rate sample failed", "err", err)
		}
		if sig.Sampled != nil {
			sig.Sampled(len(st), err)
		}
	}
}

// parse builds one template set per page (layout.html plus the page) and
// the static file server.
func (u *UI) parse() error {
	funcs := template.FuncMap{
		"path": u.path,
	}
	u.pages = make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return fmt.Errorf("webui: parse %s: %w", name, err)
		}
		u.pages[name] = t
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return fmt.Errorf("webui: static assets: %w", err)
	}
	h := sha256.New()
	err = fs.WalkDir(static, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(static, p)
		h.Write([]byte(p))
		h.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("webui: static assets: %w", err)
	}
	u.version = hex.EncodeToString(h.Sum(nil))[:12]
	u.static = http.StripPrefix(u.prefix+"/static/", http.FileServerFS(static))
	return nil
}

// path returns the absolute path of a dashboard page ("" is the queue
// list).
func (u *UI) path(p string) string { return u.prefix + "/" + p }

// routes is the handler tree: the pages and actions behind the security
// checks of guard.go.
func (u *UI) routes() http.Handler {
	mux := http.NewServeMux()
	p := u.prefix
	mux.HandleFunc("GET "+p+"/{$}", u.queuesPage)
	mux.HandleFunc("GET "+p+"/queues/{name}", u.queuePage)
	mux.HandleFunc("GET "+p+"/queues/{name}/dead", u.deadPage)
	mux.HandleFunc("POST "+p+"/queues/{name}/dead/redrive", u.deadAction(actRedrive))
	mux.HandleFunc("POST "+p+"/queues/{name}/dead/purge", u.deadAction(actPurge))
	mux.HandleFunc("GET "+p+"/static/", u.staticFile)
	mux.HandleFunc("GET "+p+"/", func(w http.ResponseWriter, r *http.Request) {
		u.errorPage(w, r, http.StatusNotFound, "Page not found", "There is no dashboard page at this address.")
	})
	if p != "" {
		mux.HandleFunc("GET "+p+"", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, p+"/", http.StatusMovedPermanently)
		})
	}
	return u.guard(mux)
}

// staticFile serves the embedded CSS and JavaScript. Links carry the
// assets' content hash (?v=), so a long cache lifetime is safe.
func (u *UI) staticFile(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("v") == u.version {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	u.static.ServeHTTP(w, r)
}

// layout is what layout.html renders around every page.
type layout struct {
	Title   string
	Prefix  string
	Version string // asset version for ?v=
	Refresh int    // auto-refresh period in seconds; 0: off
	AsOf    string // the instant the figures were read
	Flash   *flash
	Crumbs  []crumb
	Page    any
}

// crumb is one step of the breadcrumb trail; Href "" is the current page.
type crumb struct {
	Text, Href string
}

// bufPool holds render buffers: a page is rendered whole before any byte
// is written, so a template error becomes an error page, not half a page.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// render writes page with the common layout.
func (u *UI) render(w http.ResponseWriter, r *http.Request, status int, page string, l layout) {
	l.Prefix = u.prefix
	l.Version = u.version
	if u.refresh > 0 && status == http.StatusOK {
		l.Refresh = max(1, int(u.refresh/time.Second))
	}
	if l.AsOf == "" {
		l.AsOf = clockTime(u.clock.Now())
	}
	if l.Flash == nil {
		l.Flash = takeFlash(w, r, u.prefix)
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 4<<20 { // don't keep a huge page's buffer alive
			buf.Reset()
			bufPool.Put(buf)
		}
	}()
	if err := u.pages[page].Execute(buf, l); err != nil {
		// A template error is a bug: the embedded templates are fixed.
		u.log.Error("render failed", "page", page, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorView is the body of error.html.
type errorView struct {
	Status  int
	Heading string
	Detail  string
	Back    string // link back, "" for none
}

// errorPage renders a full error page with status.
func (u *UI) errorPage(w http.ResponseWriter, r *http.Request, status int, heading, detail string) {
	u.render(w, r, status, "error", layout{
		Title:  heading,
		Crumbs: []crumb{{"Queues", u.path("")}, {heading, ""}},
		Page:   errorView{Status: status, Heading: heading, Detail: detail, Back: u.path("")},
	})
}

// storeError renders the page for a failed store call: 404 for an unknown
// queue, 400 for a bad argument, 503 for a store that is closed or
// unavailable, 500 otherwise.
func (u *UI) storeError(w http.ResponseWriter, r *http.Request, queue string, err error) {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		u.errorPage(w, r, http.StatusNotFound, "Queue not found",
			fmt.Sprintf("There is no queue named %q on this node.", queue))
	case errors.Is(err, storage.ErrInvalidArgument):
		u.errorPage(w, r, http.StatusBadRequest, "Bad request", err.Error())
	case errors.Is(err, storage.ErrClosed), errors.Is(err, storage.ErrUnavailable), errors.Is(err, storage.ErrNoSpace):
		u.errorPage(w, r, http.StatusServiceUnavailable, "Store unavailable", err.Error())
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer.
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		u.log.Error("store call failed", "queue", queue, "err", err)
		u.errorPage(w, r, http.StatusInternalServerError, "Store error", err.Error())
	}
}
