package webui

import (
	"html"
	"strconv"
	"strings"

	"github.com/leaseq/leaseq/storage"
)

// writeQueueRow appends one row of the queue list to b.
//
// This is the one piece of HTML built outside html/template: the queue
// list of a large node is a thousand rows of eight cells, refreshed every
// few seconds by every open dashboard, and html/template's per-action
// escaping dominates that page (BenchmarkQueueList; docs/BENCHMARKS.md).
// The rules that keep it safe: every value written goes through
// html.EscapeString (text and double-quoted attribute values alike), names
// in URLs go through url.PathEscape first (queueHref), and markup comes
// only from constants. TestWriteQueueRow feeds it hostile names.
func (u *UI) writeQueueRow(b *strings.Builder, s *storage.QueueStats, rt rate) {
	b.WriteString(`<tr><td class="name"><a href="`)
	b.WriteString(html.EscapeString(u.queueHref(s.Queue, "")))
	b.WriteString(`">`)
	b.WriteString(string(nameBreaks(s.Queue))) // escapes, then adds <wbr>
	b.WriteString(`</a></td>`)

	oldest, oldestMS := "—", int64(0)
	if s.Ready > 0 {
		oldest, oldestMS = age(s.OldestReadyAge), s.OldestReadyAge.Milliseconds()
	}
	enq, ack := "—", "—"
	if rt.OK {
		enq, ack = perSecond(rt.Enqueue), perSecond(rt.Ack)
	}
	intCell(b, "", s.Ready, "")
	intCell(b, "opt", s.Delayed, "")
	intCell(b, "", s.Inflight, "")
	intCell(b, "dead", s.Dead, u.queueHref(s.Queue, "dead"))
	cell(b, "", oldestMS == 0, strconv.FormatInt(oldestMS, 10), oldest, "")
	cell(b, "", rt.Enqueue == 0, strconv.FormatFloat(rt.Enqueue, 'g', 6, 64), enq, "")
	cell(b, "", rt.Ack == 0, strconv.FormatFloat(rt.Ack, 'g', 6, 64), ack, "")
	b.WriteString("</tr>\n")
}

// intCell writes a numeric cell for a count; class "dead" marks a non-zero
// count as a warning.
func intCell(b *strings.Builder, class string, n int64, href string) {
	cell(b, class, n == 0, strconv.FormatInt(n, 10), count(n), href)
}

// cell writes a right-aligned cell with sort key sortKey (data-v), muted
// when zero, its text linked to href when href is not "".
func cell(b *strings.Builder, class string, zero bool, sortKey, text, href string) {
	b.WriteString(`<td class="num`)
	switch {
	case class == "dead" && !zero:
		b.WriteString(" warn")
	case class != "" && class != "dead":
		b.WriteString(" " + class)
	}
	if zero {
		b.WriteString(" zero")
	}
	b.WriteString(`" data-v="`)
	b.WriteString(html.EscapeString(sortKey))
	b.WriteString(`">`)
	if href != "" {
		b.WriteString(`<a href="`)
		b.WriteString(html.EscapeString(href))
		b.WriteString(`">`)
	}
	b.WriteString(html.EscapeString(text))
	if href != "" {
		b.WriteString(`</a>`)
	}
	b.WriteString(`</td>`)
}
