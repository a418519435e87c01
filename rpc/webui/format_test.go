package webui

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func TestPreview(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 1000) // 2 bytes per rune
	for _, tc := range []struct {
		name    string
		in      []byte
		text    string
		binary  bool
		size    string
		titleOK func(string) bool
	}{
		{"Empty", nil, "", false, "0 B", nil},
		{"Text", []byte("hello"), "hello", false, "5 B", nil},
		{"Whitespace", []byte("a\tb\r\nc"), "a⇥ b␍↵ c", false, "6 B", nil},
		{"HTMLStaysText", []byte(`<img src=x onerror=alert(1)>`), `<img src=x onerror=alert(1)>`, false, "28 B", nil},
		{"Bidi", []byte("abc\u202Edef\u200Bg"), "abc\uFFFDdef\uFFFDg", false, "13 B", nil},
		{"Control", []byte("a\x1bb"), "61 1b 62", true, "3 B", nil},
		{"InvalidUTF8", []byte{0xff, 0xfe}, "ff fe", true, "2 B", nil},
		{"LongBinary", make([]byte, 40), strings.TrimSpace(strings.Repeat("00 ", 32)) + " …", true, "40 B", nil},
		{"LongText", []byte(long), strings.Repeat("é", previewBytes/2) + "…", false, "2.0 KiB",
			func(s string) bool { return len(s) <= previewTitleBytes+len("…") && strings.HasSuffix(s, "…") }},
		// A multi-byte rune cut by the preview window is dropped, not
		// taken for binary.
		{"RuneCutByWindow", []byte("x" + long), "x" + strings.Repeat("é", (previewBytes-1)/2) + "…", false, "2.0 KiB", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := preview(tc.in)
			require.Equal(t, tc.text, v.Text)
			require.Equal(t, tc.binary, v.Binary)
			require.Equal(t, tc.size, v.Size)
			require.Equal(t, len(tc.in) == 0, v.Empty)
			if tc.titleOK != nil {
				require.True(t, tc.titleOK(v.Title), v.Title)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct{ got, want string }{
		{count(0), "0"},
		{count(999), "999"},
		{count(1000), "1,000"},
		{count(int64(-1234567)), "-1,234,567"},
		{count(uint64(18446744073709551615)), "18,446,744,073,709,551,615"},
		{count(uint32(100000)), "100,000"},
		{perSecond(0), "0"},
		{perSecond(0.25), "0.25/s"},
		{perSecond(12.34), "12.3/s"},
		{perSecond(1234.5), "1,235/s"},
		{age(-time.Second), "0ms"},
		{age(850 * time.Millisecond), "850ms"},
		{age(12 * time.Second), "12s"},
		{age(3*time.Minute + 5*time.Second), "3m05s"},
		{age(2*time.Hour + 10*time.Minute), "2h10m"},
		{age(4*24*time.Hour + 3*time.Hour), "4d03h"},
		{relative(now.Add(-90*time.Second), now), "1m30s ago"},
		{relative(now.Add(3*time.Second), now), "in 3s"},
		{relative(time.Time{}, now), ""},
		{stamp(now.Add(7 * time.Millisecond)), "2026-01-02 03:04:05.007Z"},
		{setting(30 * time.Second), "30s"},
		{setting(5 * time.Minute), "5m"},
		{setting(90 * time.Minute), "1h30m"},
		{setting(2 * time.Hour), "2h"},
		{setting(500 * time.Millisecond), "500ms"},
		{byteSize(1023), "1023 B"},
		{byteSize(1536), "1.5 KiB"},
		{byteSize(1 << 20), "1.0 MiB"},
		{cut("héllo", 2, false), "h…"},
		{cut("abc", 5, true), "abc…"},
	} {
		require.Equal(t, tc.want, tc.got)
	}
}

func TestSameHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, host string
		want      bool
	}{
		{"http://node:8080", "node:8080", true},
		{"https://Node:8080/ui/", "node:8080", true},
		{"http://node", "node:8080", false},
		{"http://node:8080@evil", "node:8080", false},
		{"null", "node", false},
		{"/ui/", "node", false},
		{"file://node", "node", false},
		{"http://node", "", false},
		{"http://[::1]:7701", "[::1]:7701", true},
	} {
		require.Equal(t, tc.want, sameHost(tc.raw, tc.host), "%s vs %s", tc.raw, tc.host)
	}
}

// TestWriteQueueRow checks the escaping of the one fragment built outside
// html/template, with names no queue can have (the store refuses them) in
// case that rule ever loosens.
func TestWriteQueueRow(t *testing.T) {
	t.Parallel()
	u := &UI{prefix: "/ui"}
	for _, name := range []string{`<script>alert(1)</script>`, `a"onmouseover="x`, `a'b&c`, "x\u202Ey", `../../admin`} {
		var b strings.Builder
		u.writeQueueRow(&b, &storage.QueueStats{Queue: name, Ready: 3, Dead: 1}, rate{})
		row := b.String()
		require.NotContains(t, row, "<script", name)
		require.NotContains(t, row, `"onmouseover`, name)
		require.NotContains(t, row, "'", name)
		require.NotContains(t, row, "&c", name)
		require.NotContains(t, row, "../", name)
		require.Equal(t, 8, strings.Count(row, "<td"), name)
		require.Equal(t, 2, strings.Count(row, "<a href="), name)
	}
	var b strings.Builder
	u.writeQueueRow(&b, &storage.QueueStats{Queue: "orders.eu", Ready: 1234, Inflight: 0, Dead: 2, OldestReadyAge: 90 * time.Second},
		rate{Enqueue: 2, Ack: 0.5, OK: true})
	require.Equal(t, `<tr><td class="name"><a href="/ui/queues/orders.eu">orders.<wbr>eu</a></td>`+
		`<td class="num" data-v="1234">1,234</td><td class="num opt zero" data-v="0">0</td>`+
		`<td class="num zero" data-v="0">0</td><td class="num warn" data-v="2"><a href="/ui/queues/orders.eu/dead">2</a></td>`+
		`<td class="num" data-v="90000">1m30s</td><td class="num" data-v="2">2.00/s</td><td class="num" data-v="0.5">0.50/s</td></tr>`+"\n", b.String())
}
