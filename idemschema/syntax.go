package idemschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// checkSyntax refuses a payload that is not valid UTF-8, that nests arrays and objects deeper
// than maxDepth, or that is not exactly one JSON value. Depth is checked before syntax, in one
// pass over the bytes, so that neither the syntax check nor the decoder ever sees a hostile
// nesting; the syntax check (encoding/json's scanner, which does not recurse) then gives the
// offset of the first error.
func checkSyntax(data []byte, maxDepth int) error {
	if len(data) == 0 {
		return errors.New("payload is empty, want a JSON document")
	}
	if !utf8.Valid(data) {
		off := invalidUTF8(data)
		return fmt.Errorf("payload is not valid UTF-8 (first bad byte 0x%02x at offset %d)", data[off], off)
	}
	if off := tooDeep(data, maxDepth); off >= 0 {
		return fmt.Errorf("JSON nested deeper than %d levels (at offset %d)", maxDepth, off)
	}
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("invalid JSON at offset %d: %s", se.Offset, se.Error())
		}
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return nil
}

// invalidUTF8 returns the offset of the first byte of data that does not start a valid UTF-8
// sequence (len(data) if there is none).
func invalidUTF8(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(data)
}

// tooDeep returns the offset of the first '[' or '{' outside a string that opens level
// maxDepth+1, or -1. It does not check syntax: brackets in strings are skipped by tracking
// quotes and backslash escapes, and stray closing brackets are left to the syntax check.
func tooDeep(data []byte, maxDepth int) int {
	depth := 0
	inString, escaped := false, false
	for i, c := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth > maxDepth {
				return i
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return -1
}

// quoteTrunc quotes s for an error message, cut to 64 bytes at a rune boundary: event types
// come from outside and end up in dead letters and logs.
func quoteTrunc(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
