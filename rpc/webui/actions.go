package webui

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// deadAct is a dead-letter action: redrive or purge.
type deadAct struct {
	verb, done string // "redrive", "Redrove"
	past       string // "redriven"
	run        func(storage.Store, context.Context, storage.RedriveParams) (storage.RedriveResult, error)
	wake       bool // moved items became ready: wake parked polls
}

var (
	actRedrive = deadAct{verb: "redrive", done: "Redrove", past: "redriven", run: storage.Store.Redrive, wake: true}
	actPurge   = deadAct{verb: "purge", done: "Purged", past: "purged", run: storage.Store.PurgeDead}
)

// deadAction handles a POST from the dead-letter page. The form carries
// either one item (one: the row's own button), the
// ticked items (id, repeated), or all=1 with the page's count and instant
// (seen, asof: see deadSeen). It answers with a redirect back to
// the dead-letter page (post/redirect/get) and a flash message saying what
// happened.
func (u *UI) deadAction(act deadAct) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			u.errorPage(w, r, http.StatusBadRequest, "Bad form", err.Error())
			return
		}
		name := r.PathValue("name")
		if err := u.limits.ValidateQueueName(name); err != nil {
			u.storeError(w, r, name, storage.ErrNotFound)
			return
		}
		back := u.queueHref(name, "dead")
		if a := r.PostForm.Get("after"); a != "" {
			if _, err := storage.ParseItemID(a); err == nil {
				back += "?after=" + a
			}
		}
		var ids []storage.ItemID
		all := r.PostForm.Get("all") == "1"
		raw := r.PostForm["id"]
		if one := r.PostForm.Get("one"); one != "" {
			raw = []string{one}
		}
		if !all {
			if len(raw) == 0 {
				setFlash(w, r, u.prefix, flash{Kind: "warn", Text: "Nothing selected: tick the items to " + act.verb + " first."})
				http.Redirect(w, r, back, http.StatusSeeOther)
				return
			}
			for _, s := range raw {
				id, err := storage.ParseItemID(s)
				if err != nil {
					u.errorPage(w, r, http.StatusBadRequest, "Bad item id", err.Error())
					return
				}
				ids = append(ids, id)
			}
		}
		// One Stats call: a 404 for an unknown queue, and the dead count
		// that bounds an "all" loop.
		now := u.clock.Now()
		st, ok := u.queueStats(w, r, name, now)
		if !ok {
			return
		}
		var moved, missing int
		var seen int64
		var err error
		if all {
			var asOf time.Time
			seen, asOf, ok = seenForm(r)
			if !ok {
				// Without them there is no telling what the user confirmed.
				setFlash(w, r, u.prefix, flash{Kind: "warn", Text: "The page was out of date: nothing was " + act.past + ". Check the dead items below and try again."})
				http.Redirect(w, r, u.queueHref(name, "dead"), http.StatusSeeOther)
				return
			}
			moved, err = u.deadSeen(r.Context(), act, name, seen, asOf, st.Dead)
		} else {
			moved, missing, err = u.deadIDs(r.Context(), act, name, ids)
		}
		if moved > 0 {
			u.log.Info("dead items "+act.verb+" from the dashboard", "queue", name, "items", moved, "remote", r.RemoteAddr)
			if act.wake && u.onReady != nil {
				u.onReady([]string{name})
			}
		}
		if err != nil && moved == 0 {
			u.storeError(w, r, name, err)
			return
		}
		if err != nil {
			// Some batches went through: say so on the page, with the error.
			u.log.Warn("dead-letter action stopped part way", "queue", name, "action", act.verb, "err", err)
			setFlash(w, r, u.prefix, flash{Kind: "error", Text: fmt.Sprintf("%s %s, then failed: %v", act.done, items(moved), err)})
			http.Redirect(w, r, back, http.StatusSeeOther)
			return
		}
		f := flash{Kind: "ok", Text: fmt.Sprintf("%s %s.", act.done, items(moved))}
		var later int64
		if all {
			later = u.diedLater(r.Context(), name, seen, moved)
		}
		switch {
		case later > 0:
			f.Kind = "warn"
			were := "were"
			if later == 1 {
				were = "was"
			}
			f.Text += fmt.Sprintf(" %s died after the page was shown and %s left.", items(int(later)), were)
		case missing > 0:
			f.Kind = "warn"
			f.Text += fmt.Sprintf(" %s no longer in the dead-letter queue (redriven or purged meanwhile).", items(missing))
		case moved == 0:
			f.Kind = "warn"
			f.Text = "The dead-letter queue was empty: nothing to " + act.verb + "."
		}
		setFlash(w, r, u.prefix, f)
		if all {
			back = u.queueHref(name, "dead")
		}
		http.Redirect(w, r, back, http.StatusSeeOther)
	}
}

// deadIDs applies act to the listed items, in batches of Limits.MaxBatch.
func (u *UI) deadIDs(ctx context.Context, act deadAct, queue string, ids []storage.ItemID) (moved, missing int, err error) {
	for len(ids) > 0 {
		n := min(len(ids), u.limits.MaxBatch)
		res, err := act.run(u.store, ctx, storage.RedriveParams{Queue: queue, IDs: ids[:n], Limit: n, Now: u.clock.Now()})
		if err != nil {
			return moved, missing, err
		}
		moved += res.Moved
		for _, c := range res.Codes {
			if c != storage.CodeOK {
				missing++
			}
		}
		ids = ids[n:]
	}
	return moved, missing, nil
}

// seenForm reads what the page showed when "all" was clicked: the dead
// count (seen) and the instant it was read (asof, Unix nanoseconds).
func seenForm(r *http.Request) (seen int64, asOf time.Time, ok bool) {
	seen, err := strconv.ParseInt(r.PostForm.Get("seen"), 10, 64)
	if err != nil || seen < 0 {
		return 0, time.Time{}, false
	}
	ns, err := strconv.ParseInt(r.PostForm.Get("asof"), 10, 64)
	if err != nil || ns <= 0 {
		return 0, time.Time{}, false
	}
	return seen, time.Unix(0, ns), true
}

// deadSeen applies act to the dead items the page counted when the user
// confirmed "all" (found by review, session 70: it took every item dead
// when the form arrived, deleting unseen ones that died in between). The
// store selects dead items only by id or as the first n in id order, and
// an old item that dies late has a lower id than those shown, so neither
// a count nor an id bound says which items were seen; their death time
// does. It pages through the dead items in id order and acts, by id, on
// those that died by asOf, at most seen of them; the others stay. The scan
// stops after as many items as were dead when the action began (dead), so
// items that die meanwhile cannot keep it going. An item that died just
// before asOf but was committed after the page read its count may be
// taken in place of one shown: the count still bounds how many go.
func (u *UI) deadSeen(ctx context.Context, act deadAct, queue string, seen int64, asOf time.Time, dead int64) (int, error) {
	moved := 0
	var after storage.ItemID
	// Pages of the dashboard's own size: DeadList reads payloads too.
	for scanned := int64(0); int64(moved) < seen && scanned < dead; {
		page, err := u.store.DeadList(ctx, storage.DeadListParams{Queue: queue, After: after, Limit: u.pageSize})
		if err != nil {
			return moved, err
		}
		if len(page) == 0 {
			break // a short page is not the end: DeadList may stop early
		}
		scanned += int64(len(page))
		var ids []storage.ItemID
		for i := range page {
			if !page[i].DeadAt.After(asOf) && int64(moved+len(ids)) < seen {
				ids = append(ids, page[i].ID)
			}
		}
		if len(ids) > 0 {
			res, err := act.run(u.store, ctx, storage.RedriveParams{Queue: queue, IDs: ids, Limit: len(ids), Now: u.clock.Now()})
			if err != nil {
				return moved, err
			}
			moved += res.Moved
		}
		after = page[len(page)-1].ID
	}
	return moved, nil
}

// diedLater is how many items are dead now that the page did not count,
// for the flash: those left in the dead-letter queue by an "all" that took
// moved of the seen shown. 0 on a store error: the flash is only a hint.
func (u *UI) diedLater(ctx context.Context, queue string, seen int64, moved int) int64 {
	st, err := u.store.Stats(ctx, storage.StatsParams{Queue: queue, Now: u.clock.Now()})
	if err != nil || len(st) != 1 {
		return 0
	}
	return max(0, st[0].Dead-max(0, seen-int64(moved)))
}

// items is "1 item" or "N items".
func items(n int) string {
	if n == 1 {
		return "1 item"
	}
	return count(n) + " items"
}

// flash is a one-time message shown on the page after an action.
type flash struct {
	Kind string // "ok", "warn" or "error"
	Text string
}

// flashCookie carries a flash message across the redirect that follows an
// action. It is read and cleared by the next page rendered.
const flashCookie = "leaseq_flash"

func cookiePath(prefix string) string { return prefix + "/" }

// setFlash sets the flash cookie for the next page.
func setFlash(w http.ResponseWriter, r *http.Request, prefix string, f flash) {
	http.SetCookie(w, &http.Cookie{
		Name:     flashCookie,
		Value:    f.Kind + "." + base64.RawURLEncoding.EncodeToString([]byte(f.Text)),
		Path:     cookiePath(prefix),
		MaxAge:   60,
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
}

// takeFlash returns the flash message of r, if any, and clears it.
func takeFlash(w http.ResponseWriter, r *http.Request, prefix string) *flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: cookiePath(prefix), MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	kind, enc, _ := strings.Cut(c.Value, ".")
	text, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || (kind != "ok" && kind != "warn" && kind != "error") {
		return nil
	}
	// The text was made by setFlash, but a cookie is client input: it is
	// escaped like everything else, and kept short.
	return &flash{Kind: kind, Text: cut(string(text), 300, false)}
}
