package canonjson

// IsJSON reports whether data is a single syntactically valid JSON value, optionally surrounded
// by whitespace; Canonicalize may still reject such a document (duplicate keys, invalid UTF-8,
// lone surrogates, nesting beyond MaxDepth), which callers should treat as a bad document.
func IsJSON(data []byte) bool {
	// The nesting is tracked on an explicit stack, so any depth is handled without recursion.
	var stackBuf [64]byte
	stack := stackBuf[:0]
	i := skipWS(data, 0)
	for {
		// A value is expected at data[i].
		if i >= len(data) {
			return false
		}
		switch c := data[i]; c {
		case '{':
			i = skipWS(data, i+1)
			if i < len(data) && data[i] == '}' {
				i++
				break
			}
			stack = append(stack, '{')
			if i = memberName(data, i); i < 0 {
				return false
			}
			continue
		case '[':
			i = skipWS(data, i+1)
			if i < len(data) && data[i] == ']' {
				i++
				break
			}
			stack = append(stack, '[')
			continue
		case '"':
			if i = skipString(data, i); i < 0 {
				return false
			}
		case 't', 'f', 'n':
			lit := "null"
			if c == 't' {
				lit = "true"
			} else if c == 'f' {
				lit = "false"
			}
			if len(data)-i < len(lit) || string(data[i:i+len(lit)]) != lit {
				return false
			}
			i += len(lit)
		default:
			if i = skipNumber(data, i); i < 0 {
				return false
			}
		}
		// A value ended just before data[i]: close containers until another value is expected.
		for {
			i = skipWS(data, i)
			if len(stack) == 0 {
				return i == len(data)
			}
			if i >= len(data) {
				return false
			}
			top := stack[len(stack)-1]
			if c := data[i]; c == ',' {
				i = skipWS(data, i+1)
				if top == '{' {
					if i = memberName(data, i); i < 0 {
						return false
					}
				}
				break
			} else if top == '{' && c == '}' || top == '[' && c == ']' {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return false
		}
	}
}

func skipWS(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// memberName skips a member name and its colon at data[i] and the whitespace after them,
// returning the offset of the value, or -1.
func memberName(data []byte, i int) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	if i = skipString(data, i); i < 0 {
		return -1
	}
	i = skipWS(data, i)
	if i >= len(data) || data[i] != ':' {
		return -1
	}
	return skipWS(data, i+1)
}

// skipString skips the string whose opening quote is at data[i], returning the offset just
// past it or -1. Like the JSON grammar, it does not check UTF-8 or surrogate pairing.
func skipString(data []byte, i int) int {
	for i++; i < len(data); {
		switch c := data[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i+1 >= len(data) {
				return -1
			}
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := hex4(data, i+2); !ok {
					return -1
				}
				i += 6
			default:
				return -1
			}
		default:
			i++
		}
	}
	return -1
}

// skipNumber skips the number at data[i], returning the offset just past it or -1.
func skipNumber(data []byte, i int) int {
	digits := func() bool {
		s := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		return i > s
	}
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case !digits():
		return -1
	}
	if i < len(data) && data[i] == '.' {
		i++
		if !digits() {
			return -1
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if !digits() {
			return -1
		}
	}
	return i
}
