package webui

import (
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// queuesView is the body of queues.html.
type queuesView struct {
	Rows                              template.HTML // rowsHTML
	Queues, Shown                     string        // total and after the filter
	Ready, Delayed, Inflight, Dead    string
	DeadN                             int64
	EnqRate, AckRate                  string
	RateWindow                        string
	Filter                            string
	Next, Prev                        string // page links, "" for none
	NoQueues, NoMatch, RatesWarmingUp bool
}

// queuesPage is the queue list: one Stats call for every queue.
func (u *UI) queuesPage(w http.ResponseWriter, r *http.Request) {
	now := u.clock.Now()
	st, err := u.store.Stats(r.Context(), storage.StatsParams{Now: now})
	if err != nil {
		u.storeError(w, r, "", err)
		return
	}
	rts := u.rates.observe(now, st, true)

	q := r.URL.Query()
	filter := strings.TrimSpace(q.Get("q"))
	// Lower-cased once, not per queue: a long filter times many queues
	// allocated hundreds of MB per request (found by review, session 70).
	// One longer than any queue name matches none.
	lowFilter := strings.ToLower(filter)
	tooLong := len(filter) > u.limits.MaxQueueName
	after := q.Get("after")
	v := queuesView{Filter: filter, Queues: count(len(st)), NoQueues: len(st) == 0, RateWindow: setting(RateWindow)}
	var ready, delayed, inflight, dead int64
	var enq, ack float64
	anyRate := false
	matched := 0
	// Stats is sorted by name, so a page is the run after the last name of
	// the previous one.
	first := sort.Search(len(st), func(i int) bool { return st[i].Queue > after })
	if after == "" {
		first = 0
	}
	var rows strings.Builder
	rows.Grow(min(len(st), u.queuesPerPage) * 420) // a row is about 400 bytes
	shown, last := 0, ""
	for i := range st {
		s := &st[i]
		ready += s.Ready
		delayed += s.Delayed
		inflight += s.Inflight
		dead += s.Dead
		if rts[i].OK {
			enq += rts[i].Enqueue
			ack += rts[i].Ack
			anyRate = true
		}
		if filter != "" && (tooLong || !strings.Contains(strings.ToLower(s.Queue), lowFilter)) {
			continue
		}
		matched++
		if i < first {
			continue
		}
		if shown == u.queuesPerPage {
			v.Next = u.path("") + "?" + pageQuery(filter, last)
			continue
		}
		u.writeQueueRow(&rows, s, rts[i])
		shown++
		last = s.Queue
	}
	v.Rows = template.HTML(rows.String()) // built by writeQueueRow, which escapes every value
	if after != "" {
		v.Prev = u.path("")
		if filter != "" {
			v.Prev += "?" + pageQuery(filter, "")
		}
	}
	v.Shown = count(matched)
	v.NoMatch = matched == 0 && len(st) > 0
	v.Ready, v.Delayed, v.Inflight, v.Dead = count(ready), count(delayed), count(inflight), count(dead)
	v.RatesWarmingUp = !anyRate && len(st) > 0
	if anyRate {
		v.EnqRate, v.AckRate = perSecond(enq), perSecond(ack)
	} else {
		v.EnqRate, v.AckRate = "—", "—"
	}
	v.DeadN = dead
	u.render(w, r, http.StatusOK, "queues", layout{
		Title:  "Queues",
		AsOf:   clockTime(now),
		Crumbs: []crumb{{"Queues", ""}},
		Page:   v,
	})
}

// pageQuery is the query string of a queue list page.
func pageQuery(filter, after string) string {
	q := url.Values{}
	if filter != "" {
		q.Set("q", filter)
	}
	if after != "" {
		q.Set("after", after)
	}
	return q.Encode()
}

// nameBreaks returns the escaped queue name with <wbr> after every '.',
// '-' and '_', so a long name wraps between its parts, not inside a word.
func nameBreaks(name string) template.HTML {
	var b strings.Builder
	for _, r := range template.HTMLEscapeString(name) {
		b.WriteRune(r)
		if r == '.' || r == '-' || r == '_' {
			b.WriteString("<wbr>")
		}
	}
	return template.HTML(b.String()) // escaped above; <wbr> is the only markup
}

// queueHref links to a page of queue: "" for the queue page, or "dead",
// "dead/redrive", "dead/purge". Queue names are [A-Za-z0-9._-] and never
// "." or "..", so they are path segments as they are.
func (u *UI) queueHref(queue, page string) string {
	h := u.path("queues/" + url.PathEscape(queue))
	if page != "" {
		h += "/" + page
	}
	return h
}

// itemRow is one item on the queue or dead-letter page.
type itemRow struct {
	ID, State                string
	Priority                 uint8
	Attempts                 string
	Enqueued, EnqueuedStamp  string
	Visible, VisibleStamp    string
	LastError, DedupKey      string
	Payload                  payloadView
	Reason, Dead, DeadStamp  string // dead items only
	Delayed, Inflight, Ready bool
}

func (u *UI) itemRow(it *storage.Item, cfg storage.QueueConfig, now time.Time) itemRow {
	maxAttempts := it.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = cfg.MaxAttempts
	}
	return itemRow{
		ID:            it.ID.String(),
		State:         it.State.String(),
		Priority:      it.Priority,
		Attempts:      count(it.Attempts) + " / " + count(maxAttempts),
		Enqueued:      relative(it.EnqueuedAt, now),
		EnqueuedStamp: stamp(it.EnqueuedAt),
		Visible:       relative(it.VisibleAt, now),
		VisibleStamp:  stamp(it.VisibleAt),
		LastError:     it.LastError,
		DedupKey:      it.DedupKey,
		Payload:       preview(it.Payload),
		Ready:         it.State == storage.StateReady,
		Delayed:       it.State == storage.StateDelayed,
		Inflight:      it.State == storage.StateInflight,
	}
}

// stat is one figure on a queue's summary.
type stat struct {
	Label, Value, Class, Href, Title string
}

// queueHeader is what the queue and dead-letter pages show above their
// items.
type queueHeader struct {
	Name, Href, InflightHref, DeadHref string
	Stats                              []stat
	Dead                               int64
}

func (u *UI) header(s *storage.QueueStats) queueHeader {
	oldest := "—"
	if s.Ready > 0 {
		oldest = age(s.OldestReadyAge)
	}
	deadClass := ""
	if s.Dead > 0 {
		deadClass = "warn"
	}
	return queueHeader{
		Name:         s.Queue,
		Href:         u.queueHref(s.Queue, ""),
		InflightHref: u.queueHref(s.Queue, "") + "?view=inflight",
		DeadHref:     u.queueHref(s.Queue, "dead"),
		Dead:         s.Dead,
		Stats: []stat{
			{Label: "Ready", Value: count(s.Ready), Title: "available and visible now"},
			{Label: "Delayed", Value: count(s.Delayed), Title: "available, visible later (delay or nack backoff)"},
			{Label: "Inflight", Value: count(s.Inflight), Title: "leased to a consumer"},
			{Label: "Dead", Value: count(s.Dead), Class: deadClass, Href: u.queueHref(s.Queue, "dead"), Title: "out of attempts: in the dead-letter queue"},
			{Label: "Leases", Value: count(s.Leases), Title: "live lease records"},
			{Label: "Oldest ready", Value: oldest, Title: "how long the oldest ready item has waited"},
		},
	}
}

// kv is one row of a two-column table (config, counters).
type kv struct{ Key, Value string }

// queueView is the body of queue.html.
type queueView struct {
	Head             queueHeader
	Config, Counters []kv
	Inflight         bool // which tab
	AvailableHref    string
	InflightHref     string
	Items            []itemRow
	Next, First      string
}

// queueArgs reads the queue name and the page cursor of a queue or
// dead-letter page, rendering the error page when they are bad.
func (u *UI) queueArgs(w http.ResponseWriter, r *http.Request) (name string, after storage.ItemID, ok bool) {
	q := r.URL.Query()
	name = r.PathValue("name")
	if err := u.limits.ValidateQueueName(name); err != nil {
		// Not a name any queue could have.
		u.storeError(w, r, name, storage.ErrNotFound)
		return "", after, false
	}
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = storage.ParseItemID(a); err != nil {
			u.errorPage(w, r, http.StatusBadRequest, "Bad page link", err.Error())
			return "", after, false
		}
	}
	return name, after, true
}

// queueStats reads one queue's stats, rendering the error page (404 for
// an unknown queue) when that fails.
func (u *UI) queueStats(w http.ResponseWriter, r *http.Request, name string, now time.Time) (*storage.QueueStats, bool) {
	st, err := u.store.Stats(r.Context(), storage.StatsParams{Queue: name, Now: now})
	if err == nil && len(st) != 1 {
		err = storage.ErrNotFound
	}
	if err != nil {
		u.storeError(w, r, name, err)
		return nil, false
	}
	return &st[0], true
}

// queuePage shows one queue: figures, config, lifetime counters and a page
// of its available or inflight items.
func (u *UI) queuePage(w http.ResponseWriter, r *http.Request) {
	name, after, ok := u.queueArgs(w, r)
	if !ok {
		return
	}
	inflight := r.URL.Query().Get("view") == "inflight"
	now := u.clock.Now()
	s, ok := u.queueStats(w, r, name, now)
	if !ok {
		return
	}
	items, err := u.store.Peek(r.Context(), storage.PeekParams{
		Queue: name, Inflight: inflight, After: after, Limit: u.pageSize + 1, Now: now,
	})
	if err != nil {
		u.storeError(w, r, name, err)
		return
	}
	c := s.Config
	v := queueView{
		Head:     u.header(s),
		Inflight: inflight,
		Config: []kv{
			{"Max attempts", count(c.MaxAttempts)},
			{"Default lease", setting(c.LeaseDuration)},
			{"Dedup window", setting(c.DedupWindow)},
			{"Backoff base", setting(c.BackoffBase)},
			{"Backoff max", setting(c.BackoffMax)},
		},
		Counters: []kv{
			{"Enqueued", count(s.Enqueued)},
			{"Duplicates", count(s.Duplicates)},
			{"Delivered", count(s.Delivered)},
			{"Acked", count(s.Acked)},
			{"Nacked", count(s.Nacked)},
			{"Expired", count(s.Expired)},
			{"Dead-lettered", count(s.DeadLettered)},
			{"Redriven", count(s.Redriven)},
			{"Purged", count(s.Purged)},
		},
	}
	base := u.queueHref(name, "") + "?"
	v.AvailableHref = v.Head.Href
	v.InflightHref = v.Head.InflightHref
	if inflight {
		base = v.InflightHref + "&"
	}
	if len(items) > u.pageSize {
		items = items[:u.pageSize]
		v.Next = base + "after=" + items[len(items)-1].ID.String()
	}
	if !after.IsZero() {
		v.First = strings.TrimRight(base, "?&")
	}
	v.Items = make([]itemRow, len(items))
	for i := range items {
		v.Items[i] = u.itemRow(&items[i], c, now)
	}
	u.render(w, r, http.StatusOK, "queue", layout{
		Title:  name,
		AsOf:   clockTime(now),
		Crumbs: []crumb{{"Queues", u.path("")}, {name, ""}},
		Page:   v,
	})
}

// deadView is the body of dead.html.
type deadView struct {
	Head                 queueHeader
	Items                []itemRow
	Next, First          string
	After                string // the page cursor, posted back so an action returns to this page
	RedriveURL, PurgeURL string
	// SeenAt is the clock's instant (Unix nanoseconds) once the page's
	// count was read, posted back with that count (Head.Dead) by "Redrive
	// all" and "Purge all": they act on the items dead by then, no more
	// than the count the user confirmed (deadSeen).
	SeenAt string
}

// deadPage lists a queue's dead items with their reasons, and the redrive
// and purge forms.
func (u *UI) deadPage(w http.ResponseWriter, r *http.Request) {
	name, after, ok := u.queueArgs(w, r)
	if !ok {
		return
	}
	now := u.clock.Now()
	s, ok := u.queueStats(w, r, name, now)
	if !ok {
		return
	}
	items, err := u.store.DeadList(r.Context(), storage.DeadListParams{Queue: name, After: after, Limit: u.pageSize + 1})
	if err != nil {
		u.storeError(w, r, name, err)
		return
	}
	v := deadView{
		Head:       u.header(s),
		RedriveURL: u.queueHref(name, "dead/redrive"),
		PurgeURL:   u.queueHref(name, "dead/purge"),
		// Read after the count: every item it counted died by then.
		SeenAt: strconv.FormatInt(u.clock.Now().UnixNano(), 10),
	}
	base := u.queueHref(name, "dead")
	if len(items) > u.pageSize {
		items = items[:u.pageSize]
		v.Next = base + "?after=" + items[len(items)-1].ID.String()
	}
	if !after.IsZero() {
		v.First = base
		v.After = after.String()
	}
	v.Items = make([]itemRow, len(items))
	for i := range items {
		d := &items[i]
		row := u.itemRow(&d.Item, s.Config, now)
		row.Reason = d.Reason
		row.Dead = relative(d.DeadAt, now)
		row.DeadStamp = stamp(d.DeadAt)
		v.Items[i] = row
	}
	u.render(w, r, http.StatusOK, "dead", layout{
		Title:  name + " · dead letters",
		AsOf:   clockTime(now),
		Crumbs: []crumb{{"Queues", u.path("")}, {name, v.Head.Href}, {"Dead letters", ""}},
		Page:   v,
	})
}
