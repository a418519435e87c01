package bench

import (
	"fmt"
	"html"
	"strings"
)

// chartPalette gives each system a stable colour (order of first
// appearance); leaseq rows come first in a default run.
func chartPalette() []string {
	return []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"}
}

// Chart renders the report as a self-contained SVG: for every row, one
// bar per system for throughput (left) and for latency (right: e2e p50
// and p99, or the enqueue call for produce rows). Bars are scaled per
// row, since rows differ by orders of magnitude; the value is printed on
// each bar. Durable systems are drawn solid, relaxed ones hatched.
func Chart(rep *Report) string {
	const (
		labelW = 190
		barW   = 330
		gap    = 40
		rowH   = 14
		top    = 50
	)
	var systems []string
	seen := map[string]bool{}
	class := map[string]string{}
	var rows []string
	byRow := map[string][]Result{}
	for _, r := range rep.Results {
		if !seen[r.System] {
			seen[r.System] = true
			systems = append(systems, r.System)
		}
		class[r.System] = r.Class
		if _, ok := byRow[r.Row]; !ok {
			rows = append(rows, r.Row)
		}
		byRow[r.Row] = append(byRow[r.Row], r)
	}
	color := map[string]string{}
	pal := chartPalette()
	for i, s := range systems {
		color[s] = pal[i%len(pal)]
	}
	height := top + 20
	for _, row := range rows {
		height += 22 + len(byRow[row])*rowH + 10
	}
	legendH := 18 * ((len(systems) + 2) / 3)
	width := labelW + 2*barW + gap + 40
	height += legendH + 20

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	b.WriteString(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="white" fill-opacity="0.0"/><line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern></defs>` + "\n")
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14" font-weight="bold">leaseq bench, %s, seed %d, %d CPUs</text>`+"\n",
		html.EscapeString(rep.Started.Format("2006-01-02 15:04 UTC")), rep.Config.Seed, rep.Machine.CPUs)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">throughput, items/s (higher is better)</text>`+"\n", labelW, top-8)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">latency ms: e2e p50 | p99, or enqueue (lower is better)</text>`+"\n", labelW+barW+gap, top-8)
	y := top
	for _, row := range rows {
		rs := byRow[row]
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+12, html.EscapeString(row))
		fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555" font-size="9">%s</text>`+"\n", y+22, html.EscapeString(trim(rs[0].Shape, 38)))
		y += 26
		// The memory-only baseline would flatten every other bar: scale by
		// the persisted systems and clip it (its value is still printed).
		var maxT, maxL float64
		for _, r := range rs {
			if r.Class == "memory" && len(rs) > 1 {
				continue
			}
			maxT = max(maxT, r.ItemsPerSec)
			if l := chartLatency(r); l != nil {
				maxL = max(maxL, l.P99)
			}
		}
		for _, r := range rs {
			c := color[r.System]
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="10">%s</text>`+"\n", labelW-6, y+10, html.EscapeString(r.System))
			if r.Err != "" || r.Incomplete != "" {
				word := "failed"
				if r.Err == "" {
					word = "incomplete: " + human(float64(r.Items)) + " items"
				}
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#b00" font-size="10">%s</text>`+"\n", labelW, y+10, word)
				y += rowH
				continue
			}
			w := scale(r.ItemsPerSec, maxT, barW-60)
			bar(&b, labelW, y, w, rowH-3, c, class[r.System])
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="9">%s</text>`+"\n", float64(labelW)+w+3, y+9, human(r.ItemsPerSec))
			if l := chartLatency(r); l != nil {
				x := labelW + barW + gap
				w99 := scale(l.P99, maxL, barW-90)
				w50 := scale(l.P50, maxL, barW-90)
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.35"/>`+"\n", x, y, w99, rowH-3, c)
				bar(&b, x, y, w50, rowH-3, c, class[r.System])
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="9">%.2f | %.2f</text>`+"\n", float64(x)+w99+3, y+9, l.P50/1000, l.P99/1000)
			}
			y += rowH
		}
		y += 10
	}
	y += 10
	for i, s := range systems {
		x := 10 + (i%3)*((width-20)/3)
		yy := y + (i/3)*18
		bar(&b, x, yy, 14, 10, color[s], class[s])
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10">%s (%s)</text>`+"\n", x+18, yy+9, html.EscapeString(s), html.EscapeString(class[s]))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// chartLatency is the latency a row is judged by: enqueue to ack, or the
// enqueue call when nothing was consumed.
func chartLatency(r Result) *Latency {
	if r.E2E != nil {
		return r.E2E
	}
	return r.Enqueue
}

func bar(b *strings.Builder, x, y int, w float64, h int, c, class string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, x, y, w, h, c)
	if class != "durable" {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="url(#hatch)"/>`, x, y, w, h)
	}
	b.WriteString("\n")
}

func scale(v, maxV float64, width int) float64 {
	if maxV <= 0 || v <= 0 {
		return 0
	}
	return min(v/maxV, 1.08) * float64(width)
}

func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
