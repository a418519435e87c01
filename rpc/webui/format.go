package webui

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Payload previews: how much of a payload a table cell shows, and how much
// its tooltip holds. Short enough that a page of 50 items stays small
// whatever the payloads (up to 1 MiB each) are.
const (
	previewBytes      = 120
	previewTitleBytes = 1024
	previewHexBytes   = 32
)

// payloadView is a payload as a table cell shows it.
type payloadView struct {
	Text   string // the preview: text, or hex for binary payloads
	Title  string // a longer preview for the tooltip
	Binary bool
	Size   string // "1.2 KiB"
	Empty  bool
}

// preview summarises an arbitrary payload for display. Text (valid UTF-8
// without control characters other than whitespace) is shown as text with
// line breaks and tabs made visible and cut at previewBytes; anything else
// is shown as the hex of its first bytes. Characters that could make the
// preview lie about its content (bidirectional overrides, zero-width and
// other format characters) are replaced. The result still goes through
// html/template escaping.
func preview(p []byte) payloadView {
	v := payloadView{Size: byteSize(len(p)), Empty: len(p) == 0}
	if v.Empty {
		return v
	}
	head := p[:min(len(p), previewTitleBytes)]
	if len(head) < len(p) {
		// Drop a rune the window cut in two.
		for k := 1; k < utf8.UTFMax && k <= len(head); k++ {
			if utf8.RuneStart(head[len(head)-k]) {
				if !utf8.FullRune(head[len(head)-k:]) {
					head = head[:len(head)-k]
				}
				break
			}
		}
	}
	if text, ok := printable(head); ok {
		v.Title = cut(text, previewTitleBytes, len(head) < len(p))
		v.Text = cut(text, previewBytes, len(head) < len(p))
		return v
	}
	v.Binary = true
	n := min(len(p), previewHexBytes)
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(hex.EncodeToString(p[i : i+1]))
	}
	if n < len(p) {
		b.WriteString(" …")
	}
	v.Text = b.String()
	v.Title = "binary payload, " + v.Size
	return v
}

// printable returns b as display text, or false when b is not text.
func printable(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	var sb strings.Builder
	sb.Grow(len(b))
	for _, r := range string(b) {
		switch {
		case r == '\n':
			sb.WriteString("↵ ")
		case r == '\r':
			sb.WriteString("␍")
		case r == '\t':
			sb.WriteString("⇥ ")
		case unicode.IsControl(r):
			return "", false
		case unicode.Is(unicode.Cf, r):
			// Format characters (U+202E right-to-left override, zero-width
			// joiners, ...) would let a payload disguise its own preview.
			sb.WriteRune('\uFFFD')
		default:
			sb.WriteRune(r)
		}
	}
	return sb.String(), true
}

// cut shortens s to at most n bytes on a rune boundary, adding an
// ellipsis when it cut something or more is known to follow.
func cut(s string, n int, more bool) string {
	if len(s) <= n {
		if more {
			return s + "…"
		}
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// byteSize formats n bytes as "512 B", "1.5 KiB", "2.0 MiB".
func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return strconv.Itoa(n) + " B"
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// count formats n with thousands separators: 1234567 -> "1,234,567".
func count[T ~int | ~int64 | ~uint32 | ~uint64](n T) string {
	var s string
	var b []byte
	if n < 0 {
		b = append(b, '-')
		s = strconv.FormatInt(int64(n), 10)[1:]
	} else {
		s = strconv.FormatUint(uint64(n), 10)
	}
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return string(b)
}

// perSecond formats a rate: "0", "0.25/s", "12/s", "1,234/s".
func perSecond(r float64) string {
	switch {
	case r <= 0:
		return "0"
	case r < 10:
		return strconv.FormatFloat(r, 'f', 2, 64) + "/s"
	case r < 100:
		return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
	default:
		return count(int64(r+0.5)) + "/s"
	}
}

// age formats a duration compactly, to two units at most: "850ms",
// "12s", "3m05s", "2h10m", "4d03h".
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	default:
		return fmt.Sprintf("%dd%02dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	}
}

// relative formats t as seen at now: "12s ago", "in 3m05s".
func relative(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	if d := t.Sub(now); d > 0 {
		return "in " + age(d)
	}
	return age(now.Sub(t)) + " ago"
}

// stamp formats an instant in UTC with milliseconds, as the CLI does.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// clockTime formats an instant as a UTC time of day.
func clockTime(t time.Time) string { return t.UTC().Format("15:04:05Z") }

// setting formats a config duration without zero units: "30s", "5m",
// "1h30m", "500ms".
func setting(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
