package payments

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// WriteVerdict ends a run's table the same way for the demo and chaos: a line per note, then
// "verdict: ok", or "verdict: FAILED" and the problems, one per line.
func WriteVerdict(w io.Writer, notes []string, ok bool, problems []string) error {
	var b strings.Builder
	for _, n := range notes {
		b.WriteString("note: " + n + "\n")
	}
	if ok {
		b.WriteString("verdict: ok\n")
	} else {
		b.WriteString("verdict: FAILED\n")
		for _, p := range problems {
			b.WriteString("  - " + p + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// CountText writes counts by name as "2 invalid_payload, 1 key_reuse", sorted by name, or
// "none".
func CountText(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// OKText is "ok" or "FAILED".
func OKText(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAILED"
}
