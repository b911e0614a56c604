package serve

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// Sparkline geometry, in SVG user units.
const (
	sparkW = 120
	sparkH = 24
)

func (s *Server) funcs() template.FuncMap {
	return template.FuncMap{
		"ago":       func(t time.Time) string { return ago(t, s.cfg.Now()) },
		"when":      when,
		"dur":       dur,
		"spark":     sparkline,
		"num":       num,
		"join":      func(ids []int64) string { return idJoin(ids) },
		"idlist":    idList,
		"rate":      func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		"truncate":  truncate,
		"lastValue": lastValue,
		"statuses":  func() []string { return []string{"pending", "replayed", "discarded", "all"} },
	}
}

// ago is "3m ago", or "-" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	return dur(d) + " ago"
}

// when is the time in UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// dur is a short duration: "42s", "7m", "3h12m", "2d4h".
func dur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		return fmt.Sprintf("%dh%02dm", h, m)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	return fmt.Sprintf("%dd%dh", days, h)
}

// num prints a counter without a useless fraction.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// lastValue is the newest value of a series, 0 when empty.
func lastValue(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	return vs[len(vs)-1]
}

// sparkline draws values, oldest first, as a small inline SVG polyline scaled to the largest
// value. It is built from numbers only, so it is safe to mark as HTML.
func sparkline(vs []float64) template.HTML {
	if len(vs) < 2 {
		return template.HTML(`<svg class="spark" width="120" height="24" viewBox="0 0 120 24" role="img" aria-label="not enough samples yet"><line x1="0" y1="23" x2="120" y2="23" stroke="#ccd" stroke-dasharray="2 3"/></svg>`)
	}
	peak := 0.0
	for _, v := range vs {
		peak = max(peak, v)
	}
	var pts strings.Builder
	for i, v := range vs {
		x := float64(i) * sparkW / float64(len(vs)-1)
		y := float64(sparkH - 1)
		if peak > 0 {
			y = float64(sparkH-1) - v/peak*float64(sparkH-3)
		}
		fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
	}
	label := fmt.Sprintf("last %s, peak %s over %d points", num(vs[len(vs)-1]), num(peak), len(vs))
	return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s"><title>%s</title><polyline fill="none" stroke="#2a6fdb" stroke-width="1.5" points="%s"/></svg>`,
		sparkW, sparkH, sparkW, sparkH, label, label, strings.TrimSpace(pts.String())))
}

// idJoin is "4,5,9", for a hidden form field.
func idJoin(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(parts, ",")
}

// truncate cuts s to n runes with an ellipsis.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
