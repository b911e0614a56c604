package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// writeJSON writes v as one indented JSON document followed by a newline. The encoder escapes
// C0 control characters; DEL, C1 control characters and bidirectional overrides, which it writes
// as they are, are escaped too, so that JSON output is as safe on a terminal as the tables.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	out := buf.String()
	esc := func(r rune) bool { return r != '\n' && needsEscape(r) }
	if strings.IndexFunc(out, esc) >= 0 {
		// Outside strings JSON has no such characters, so every one is inside a string, where
		// \uXXXX means the same character.
		var b strings.Builder
		for _, r := range out {
			if esc(r) {
				fmt.Fprintf(&b, "\\u%04x", r)
				continue
			}
			b.WriteRune(r)
		}
		out = b.String()
	}
	_, err := io.WriteString(w, out)
	return err
}

// table writes aligned columns; call flush when done.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

// row writes one line; tabs and newlines inside cells are flattened so a value cannot break the
// layout.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = cell(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// cell flattens s for a table: "-" when empty, control characters escaped.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return escapeControls(s)
}

// escapeControls makes untrusted text safe to print to a terminal, on one line: C0 control
// characters (newline and tab included), DEL, C1 control characters and the bidirectional
// overrides become visible escapes ("\x1b", "\u009b", "\u202e"), and invalid UTF-8 becomes
// U+FFFD, so that a payload or an id can neither move the cursor, recolour the screen nor fake a
// line of output.
func escapeControls(s string) string {
	clean := true
	for _, r := range s {
		if needsEscape(r) || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r < 0x80 && needsEscape(r):
			fmt.Fprintf(&b, "\\x%02x", r)
		case needsEscape(r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// needsEscape reports whether r must not reach a terminal as it is.
func needsEscape(r rune) bool {
	return r < 0x20 || r == 0x7f || (0x80 <= r && r <= 0x9f) ||
		(0x202a <= r && r <= 0x202e) || (0x2066 <= r && r <= 0x2069)
}

// truncate cuts s to max runes, marking the cut with "…".
func truncate(s string, max int) string {
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max-1]) + "…"
}

// timeText formats t for tables: UTC to the second, "-" when zero.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// timeAgo is timeText followed by the age relative to now: "2024-05-01 10:00:00Z (3h12m ago)".
func timeAgo(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return timeText(t) + " (" + ageText(now.Sub(t)) + " ago)"
}

// ageText formats an age compactly to two units: "45s", "3m12s", "5h2m", "2d4h".
func ageText(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < day:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/day), int(d%day/time.Hour))
}

// jsonTime is a time for JSON: RFC 3339 in UTC, null when zero.
func jsonTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// ageSeconds is now-t in seconds for JSON, 0 when t is zero.
func ageSeconds(t, now time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(now.Sub(t), 0).Seconds()
}

// plural returns "1 dead letter" or "3 dead letters".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// idList writes ids as "1, 2, 3", eliding the middle of long lists.
func idList(ids []int64) string {
	const show = 20
	parts := make([]string, 0, min(len(ids), show+1))
	for i, id := range ids {
		if len(ids) > show && i == show-2 {
			parts = append(parts, "…")
			parts = append(parts, fmt.Sprint(ids[len(ids)-1]))
			break
		}
		parts = append(parts, fmt.Sprint(id))
	}
	return strings.Join(parts, ", ")
}
