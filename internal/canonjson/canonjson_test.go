package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

type canonCase struct {
	name string
	in   string
	opts Options
	want string
}

var canonCases = []canonCase{
	// Key order and whitespace.
	{name: "sorted keys", in: `{"b":1,"a":2,"c":3}`, want: `{"a":2,"b":1,"c":3}`},
	{name: "whitespace", in: " \t\r\n{ \"a\" : [ 1 , 2 ] ,\n\"b\":{ } , \"c\" : [ ] }\n ", want: `{"a":[1,2],"b":{},"c":[]}`},
	{name: "nested sort", in: `{"z":{"y":1,"x":{"b":true,"a":false}},"a":null}`, want: `{"a":null,"z":{"x":{"a":false,"b":true},"y":1}}`},
	{name: "byte order of keys", in: `{"é":1,"z":2,"A":3,"aa":4,"a":5,"":6}`, want: `{"":6,"A":3,"a":5,"aa":4,"z":2,"é":1}`},
	{name: "sorted by decoded key", in: `{"\u0001":1,"A":2,"\"":3}`, want: `{"\u0001":1,"\"":3,"A":2}`},
	{name: "escaped key", in: `{"\u0062":1,"a":2}`, want: `{"a":2,"b":1}`},
	{name: "scalar document", in: ` "x" `, want: `"x"`},
	{name: "literals", in: `[true,false,null]`, want: `[true,false,null]`},

	// Strings.
	{name: "unicode escape", in: `"\u0041\u00e9\u00E9"`, want: `"Aéé"`},
	{name: "surrogate pair", in: `"\ud83d\ude00"`, want: `"😀"`},
	{name: "solidus", in: `"a\/b"`, want: `"a/b"`},
	{name: "html not escaped", in: `"<a href=\"x\">&amp;</a>"`, want: `"<a href=\"x\">&amp;</a>"`},
	{name: "html escapes decoded", in: `"\u003c\u003e\u0026"`, want: `"<>&"`},
	{name: "line separators raw", in: `"\u2028\u2029"`, want: "\"\u2028\u2029\""},
	{name: "short escapes", in: `"\u0008\u000c\u000a\u000d\u0009"`, want: `"\b\f\n\r\t"`},
	{name: "short escapes kept", in: `"\b\f\n\r\t"`, want: `"\b\f\n\r\t"`},
	{name: "other controls", in: `"\u0000\u001F\u007f"`, want: "\"\\u0000\\u001f\x7f\""},
	{name: "quote and backslash", in: `"\u0022\u005c\"\\"`, want: `"\"\\\"\\"`},
	{name: "raw non-ASCII", in: `"日本語 ✓"`, want: `"日本語 ✓"`},
	{name: "replacement char is valid", in: "\"\uFFFD\"", want: "\"\uFFFD\""},

	// Numbers as written.
	{name: "numbers as written", in: `[1.0,1,1.00,-0,0,1E+5,1e5,1e-5,-12.5e10]`, want: `[1.0,1,1.00,-0,0,1E+5,1e5,1e-5,-12.5e10]`},
	{name: "big integer exact", in: `{"n":10000000000000000001}`, want: `{"n":10000000000000000001}`},
	{name: "long fraction exact", in: `0.1000000000000000055511151231257827`, want: `0.1000000000000000055511151231257827`},

	// Arrays keep order.
	{name: "array order", in: `[3,1,2,{"b":1,"a":2},[2,1]]`, want: `[3,1,2,{"a":2,"b":1},[2,1]]`},

	// Include.
	{name: "include top", in: `{"b":1,"a":2,"c":3}`, opts: Options{Include: []string{"a", "c"}}, want: `{"a":2,"c":3}`},
	{name: "include nested", in: `{"order":{"id":7,"note":"x","amount":{"cents":100,"cur":"EUR"}},"meta":{}}`,
		opts: Options{Include: []string{"order.id", "order.amount.cents"}}, want: `{"order":{"amount":{"cents":100},"id":7}}`},
	{name: "include whole subtree", in: `{"order":{"id":7,"x":{"y":1}},"b":2}`, opts: Options{Include: []string{"order", "order.id"}}, want: `{"order":{"id":7,"x":{"y":1}}}`},
	{name: "include missing path", in: `{"a":1}`, opts: Options{Include: []string{"nope", "a.b.c"}}, want: `{}`},
	{name: "include missing nested", in: `{"a":1,"order":{"x":1}}`, opts: Options{Include: []string{"a", "order.id"}}, want: `{"a":1}`},
	{name: "include through scalar", in: `{"order":5}`, opts: Options{Include: []string{"order.id"}}, want: `{}`},
	{name: "include through array", in: `{"items":[{"sku":"A","q":1},{"q":2},5,{"sku":"B"},{"q":3},[]],"x":1}`,
		opts: Options{Include: []string{"items.sku"}}, want: `{"items":[{"sku":"A"},null,null,{"sku":"B"}]}`},
	{name: "include nested arrays", in: `{"m":[[{"a":1,"b":2}],[{"b":3}]]}`, opts: Options{Include: []string{"m.a"}}, want: `{"m":[[{"a":1}]]}`},
	{name: "include array holding nothing", in: `{"items":[{"q":1}],"a":1}`, opts: Options{Include: []string{"items.sku", "a"}}, want: `{"a":1}`},
	{name: "include terminal array", in: `{"items":[{"q":1},2],"a":1}`, opts: Options{Include: []string{"items"}}, want: `{"items":[{"q":1},2]}`},
	{name: "include on top array", in: `[{"a":1,"b":2},{"b":3}]`, opts: Options{Include: []string{"a"}}, want: `[{"a":1}]`},
	{name: "include on top array nothing", in: `[{"b":3}]`, opts: Options{Include: []string{"a"}}, want: `[]`},
	{name: "include on scalar", in: `42`, opts: Options{Include: []string{"a"}}, want: `null`},
	{name: "include null value", in: `{"a":null}`, opts: Options{Include: []string{"a"}}, want: `{"a":null}`},

	// Exclude.
	{name: "exclude top", in: `{"trace":"abc","a":1}`, opts: Options{Exclude: []string{"trace"}}, want: `{"a":1}`},
	{name: "exclude nested", in: `{"meta":{"delivered_at":"now","source":"s"},"a":1}`, opts: Options{Exclude: []string{"meta.delivered_at"}}, want: `{"a":1,"meta":{"source":"s"}}`},
	{name: "exclude leaves empty object", in: `{"meta":{"delivered_at":"now"}}`, opts: Options{Exclude: []string{"meta.delivered_at"}}, want: `{"meta":{}}`},
	{name: "exclude through array", in: `{"items":[{"sku":"A","ts":1},{"ts":2},3]}`, opts: Options{Exclude: []string{"items.ts"}}, want: `{"items":[{"sku":"A"},{},3]}`},
	{name: "exclude missing", in: `{"a":{"b":1}}`, opts: Options{Exclude: []string{"x", "a.b.c", "a.x"}}, want: `{"a":{"b":1}}`},
	{name: "exclude prefix wins", in: `{"a":{"b":1},"c":2}`, opts: Options{Exclude: []string{"a.b", "a"}}, want: `{"c":2}`},

	// Include then Exclude.
	{name: "include then exclude", in: `{"order":{"id":1,"meta":{"ts":5},"x":2},"y":3}`,
		opts: Options{Include: []string{"order"}, Exclude: []string{"order.meta"}}, want: `{"order":{"id":1,"x":2}}`},
	{name: "exclude everything included", in: `{"order":{"id":1},"y":3}`,
		opts: Options{Include: []string{"order.id"}, Exclude: []string{"order.id"}}, want: `{}`},
	{name: "exclude inside included array", in: `{"items":[{"sku":"A","ts":1},{"ts":2}]}`,
		opts: Options{Include: []string{"items"}, Exclude: []string{"items.ts"}}, want: `{"items":[{"sku":"A"},{}]}`},
}

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	for _, tc := range canonCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tc.in), tc.opts)
			if err != nil {
				t.Fatalf("Canonicalize(%q) error: %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("Canonicalize(%q)\n got %s\nwant %s", tc.in, got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("output %q is not valid JSON", got)
			}
		})
	}
}

// TestEquivalentDocuments checks that different encodings of the same document agree.
func TestEquivalentDocuments(t *testing.T) {
	t.Parallel()
	groups := []struct {
		name string
		docs []string
	}{
		{"key order and whitespace", []string{
			`{"id":"evt_1","amount":{"cents":1299,"currency":"EUR"},"tags":["a","b"]}`,
			`{"tags":["a","b"],"amount":{"currency":"EUR","cents":1299},"id":"evt_1"}`,
			"{\n  \"amount\" : { \"currency\" : \"EUR\", \"cents\" : 1299 },\n  \"id\" : \"evt_1\",\n  \"tags\" : [ \"a\" , \"b\" ]\n}\n",
		}},
		{"escapes", []string{
			`{"name":"Zoë <ok> & \"q\"","path":"a/b"}`,
			`{"name":"Zo\u00eb \u003cok\u003e \u0026 \u0022q\"","path":"a\/b"}`,
			`{"n\u0061me":"Z\u006f\u00EB <ok> & \"q\"","path":"a\/b"}`,
		}},
		{"astral", []string{`"😀"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			first, err := Canonicalize([]byte(g.docs[0]), Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range g.docs[1:] {
				got, err := Canonicalize([]byte(d), Options{})
				if err != nil {
					t.Fatalf("Canonicalize(%q): %v", d, err)
				}
				if !bytes.Equal(got, first) {
					t.Fatalf("Canonicalize(%q) = %s, want %s", d, got, first)
				}
			}
		})
	}

	distinct := [][2]string{
		{`1`, `1.0`},
		{`{"a":1}`, `{"a":"1"}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":null}`, `{}`},
		{`10000000000000000001`, `10000000000000000000`},
	}
	for _, d := range distinct {
		a, errA := Canonicalize([]byte(d[0]), Options{})
		b, errB := Canonicalize([]byte(d[1]), Options{})
		if errA != nil || errB != nil {
			t.Fatalf("unexpected errors %v, %v", errA, errB)
		}
		if bytes.Equal(a, b) {
			t.Errorf("%s and %s canonicalise to the same bytes %s", d[0], d[1], a)
		}
	}
}

func TestCanonicalizeErrors(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	deepObj := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	cases := []struct {
		name string
		in   string
		opts Options
		want error
		msg  string // substring of the error message
	}{
		{name: "empty", in: "", want: ErrInvalid, msg: "empty input"},
		{name: "only whitespace", in: " \n\t ", want: ErrInvalid},
		{name: "truncated object", in: `{"a":1`, want: ErrInvalid},
		{name: "truncated string", in: `{"a":"x`, want: ErrInvalid},
		{name: "truncated key", in: `{"a`, want: ErrInvalid},
		{name: "truncated after colon", in: `{"a":`, want: ErrInvalid},
		{name: "truncated array", in: `[1,2`, want: ErrInvalid},
		{name: "truncated literal", in: `tru`, want: ErrInvalid},
		{name: "truncated escape", in: `"\u00`, want: ErrInvalid},
		{name: "trailing comma object", in: `{"a":1,}`, want: ErrInvalid},
		{name: "trailing comma array", in: `[1,2,]`, want: ErrInvalid},
		{name: "leading comma", in: `[,1]`, want: ErrInvalid},
		{name: "missing comma", in: `[1 2]`, want: ErrInvalid},
		{name: "missing colon", in: `{"a" 1}`, want: ErrInvalid},
		{name: "unquoted key", in: `{a:1}`, want: ErrInvalid},
		{name: "bare word", in: `hello`, want: ErrInvalid},
		{name: "bare word in array", in: `[undefined]`, want: ErrInvalid},
		{name: "single quotes", in: `{'a':'b'}`, want: ErrInvalid},
		{name: "NaN", in: `NaN`, want: ErrInvalid},
		{name: "Infinity", in: `[-Infinity]`, want: ErrInvalid},
		{name: "leading zero", in: `01`, want: ErrInvalid},
		{name: "plus sign", in: `+1`, want: ErrInvalid},
		{name: "bare fraction", in: `.5`, want: ErrInvalid},
		{name: "no fraction digits", in: `1.`, want: ErrInvalid},
		{name: "no exponent digits", in: `1e+`, want: ErrInvalid},
		{name: "hex number", in: `0x10`, want: ErrInvalid},
		{name: "trailing data", in: `{"a":1} {"b":2}`, want: ErrInvalid, msg: "after the JSON value"},
		{name: "trailing garbage", in: `1x`, want: ErrInvalid},
		{name: "literal prefix", in: `nullx`, want: ErrInvalid},
		{name: "raw control char", in: "\"a\nb\"", want: ErrInvalid},
		{name: "bad escape", in: `"\x41"`, want: ErrInvalid},
		{name: "bad unicode escape", in: `"\u00G1"`, want: ErrInvalid},
		{name: "lone high surrogate", in: `"\ud800"`, want: ErrInvalid, msg: "surrogate"},
		{name: "lone low surrogate", in: `"\udc00\udc00"`, want: ErrInvalid, msg: "surrogate"},
		{name: "high then non-low", in: `"\ud800\u0041"`, want: ErrInvalid, msg: "surrogate"},
		{name: "invalid UTF-8", in: "\"a\xffb\"", want: ErrInvalid, msg: "UTF-8"},
		{name: "invalid UTF-8 in key", in: "{\"\xc3\":1}", want: ErrInvalid, msg: "UTF-8"},
		{name: "UTF-8 encoded surrogate", in: "\"\xed\xa0\x80\"", want: ErrInvalid, msg: "UTF-8"},
		{name: "overlong UTF-8", in: "\"\xc0\xaf\"", want: ErrInvalid, msg: "UTF-8"},
		{name: "invalid UTF-8 in excluded member", in: "{\"x\":\"\xff\",\"a\":1}", opts: Options{Exclude: []string{"x"}}, want: ErrInvalid},
		{name: "BOM", in: "\ufeff{}", want: ErrInvalid},
		{name: "duplicate key", in: `{"a":1,"a":1}`, want: ErrDuplicateKey, msg: `"a"`},
		{name: "duplicate key unsorted", in: `{"b":1,"a":1,"c":2,"a":3}`, want: ErrDuplicateKey},
		{name: "duplicate key via escape", in: `{"a":1,"\u0061":2}`, want: ErrDuplicateKey},
		{name: "duplicate key nested path", in: `{"order":{"items":[{"x":1},{"b":1,"a":2,"b":3}]}}`, want: ErrDuplicateKey, msg: "order.items[1]"},
		{name: "duplicate key in excluded member", in: `{"meta":{"a":1,"a":2},"b":1}`, opts: Options{Exclude: []string{"meta"}}, want: ErrDuplicateKey},
		{name: "duplicate key not included", in: `{"meta":{"a":1,"a":2},"b":1}`, opts: Options{Include: []string{"b"}}, want: ErrDuplicateKey},
		{name: "duplicate excluded key", in: `{"ts":1,"ts":2}`, opts: Options{Exclude: []string{"ts"}}, want: ErrDuplicateKey},
		{name: "too deep arrays", in: deep(DefaultMaxDepth + 1), want: ErrTooDeep},
		{name: "too deep objects", in: deepObj(DefaultMaxDepth + 1), want: ErrTooDeep},
		{name: "10000 nested arrays", in: deep(10000), want: ErrTooDeep},
		{name: "10000 unclosed arrays", in: strings.Repeat("[", 10000), want: ErrTooDeep},
		{name: "1000000 nested mixed", in: strings.Repeat(`[{"a":`, 500000), want: ErrTooDeep},
		{name: "custom depth", in: deep(4), opts: Options{MaxDepth: 3}, want: ErrTooDeep},
		{name: "depth capped", in: deep(10001), opts: Options{MaxDepth: 1 << 30}, want: ErrTooDeep},
		{name: "empty include path", in: `{}`, opts: Options{Include: []string{""}}, want: ErrInvalidPath},
		{name: "empty segment", in: `{}`, opts: Options{Include: []string{"a", "a..b"}}, want: ErrInvalidPath, msg: `"a..b"`},
		{name: "leading dot", in: `{}`, opts: Options{Exclude: []string{".a"}}, want: ErrInvalidPath, msg: `".a"`},
		{name: "trailing dot", in: `{}`, opts: Options{Exclude: []string{"a."}}, want: ErrInvalidPath, msg: `exclude path "a."`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			got, err := Canonicalize([]byte(tc.in), tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Canonicalize(%.40q) = %q, %v; want error %v", tc.in, got, err, tc.want)
			}
			if got != nil {
				t.Errorf("output %q returned with error", got)
			}
			if tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestDepthLimits(t *testing.T) {
	t.Parallel()
	deep := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	cases := []struct {
		n, max int
		ok     bool
	}{
		{DefaultMaxDepth, 0, true},
		{DefaultMaxDepth + 1, 0, false},
		{DefaultMaxDepth + 1, -1, false},
		{3, 3, true},
		{4, 3, false},
		{10000, 10000, true},
		{10000, 1 << 30, true},
		{10001, 1 << 30, false},
	}
	for _, tc := range cases {
		_, err := Canonicalize(deep(tc.n), Options{MaxDepth: tc.max})
		if (err == nil) != tc.ok {
			t.Errorf("depth %d with MaxDepth %d: err = %v, want ok = %v", tc.n, tc.max, err, tc.ok)
		}
	}
}

// TestLinearTime guards against work that grows with nesting depth times size, or with the
// square of the number of members, by comparing with a document of about the same size and
// number of values that needs no such work. Ratios keep the test meaningful under -race and
// on a busy machine.
func TestLinearTime(t *testing.T) {
	t.Parallel()
	payload := `"` + strings.Repeat("x", 1<<20) + `"`
	nested := func(levels int) []byte {
		// Unsorted objects around a 1 MiB string: moving each level's bytes into order would
		// copy the string once per level.
		return []byte(strings.Repeat(`{"b":`, levels) + payload + strings.Repeat(`,"a":0}`, levels))
	}
	wide := func(reversed bool) []byte {
		var b strings.Builder
		b.WriteString("{")
		for i := range 30000 {
			if i > 0 {
				b.WriteString(",")
			}
			k := 100000 + i
			if reversed {
				k = 200000 - i
			}
			b.WriteString(`"k` + strconv.Itoa(k) + `":0`)
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	minTime := func(in []byte) time.Duration {
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			out, err := Canonicalize(in, Options{MaxDepth: 10000})
			if err != nil || len(out) != len(in) {
				t.Fatalf("Canonicalize: %d bytes, %v", len(out), err)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	for _, tc := range []struct {
		name       string
		hard, easy []byte // documents of about the same size and number of values
	}{
		// As many unsorted objects and the same string, side by side instead of nested.
		{"deep", nested(10000), []byte("[" + payload + strings.Repeat(`,{"b":0,"a":0}`, 10000) + "]")},
		{"wide", wide(true), wide(false)},
	} {
		hard, easy := minTime(tc.hard), minTime(tc.easy)
		if hard > 10*easy+20*time.Millisecond {
			t.Errorf("%s: %v, against %v for a document of the same size", tc.name, hard, easy)
		}
	}
}

func TestErrorDetail(t *testing.T) {
	t.Parallel()
	_, err := Canonicalize([]byte(`{"order":{"items":[1,2,x]}}`), Options{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"offset 23", "order.items[2]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// validDocs are documents used by the property tests below.
var validDocs = []string{
	`{}`, `[]`, `0`, `-1.5e-7`, `"s"`, `true`, `null`,
	`{"b":[1,{"d":2,"c":[]}],"a":"\u00e9\n","e":{"g":null,"f":1.10}}`,
	`{"id":"evt_01H","type":"payment.captured","amount":{"value":10000000000000000001,"currency":"EUR"},"meta":{"delivered_at":"2024-05-01T10:00:00Z","trace":"abc"}}`,
	`["<script>", "a&b", "\u2028", "\u0000\u001f\u007f", "\"\\\/", "😀\ud83d\ude00"]`,
	`{"\u0000":1,"\u00ff":2,"~":3," ":4,"":5}`,
	`[[[[[{"a":[[[{}]]]}]]]]]`,
	`{"items":[{"sku":"A","q":1,"ts":3},{"q":2}],"order":{"id":7,"note":null}}`,
}

func TestIdempotent(t *testing.T) {
	t.Parallel()
	optsList := []Options{
		{},
		{Include: []string{"items.sku", "order.id", "a", "b.d"}},
		{Exclude: []string{"meta.delivered_at", "items.ts", "e.g"}},
		{Include: []string{"order", "items"}, Exclude: []string{"order.note", "items.q"}},
	}
	docs := validDocs
	for _, tc := range canonCases {
		docs = append(docs, tc.in)
	}
	for _, d := range docs {
		for _, opts := range optsList {
			once, err := Canonicalize([]byte(d), opts)
			if err != nil {
				t.Fatalf("Canonicalize(%q, %+v): %v", d, opts, err)
			}
			twice, err := Canonicalize(once, opts)
			if err != nil {
				t.Fatalf("Canonicalize(%q, %+v): %v", once, opts, err)
			}
			if !bytes.Equal(once, twice) {
				t.Errorf("not idempotent for %q with %+v:\n once %s\ntwice %s", d, opts, once, twice)
			}
			// Canonical output is also canonical without options.
			plain, err := Canonicalize(once, Options{})
			if err != nil || !bytes.Equal(plain, once) {
				t.Errorf("output %s re-canonicalised without options = %s, %v", once, plain, err)
			}
		}
	}
}

// reencode decodes data with encoding/json (UseNumber) and marshals it again without HTML
// escaping, as another producer might.
func reencode(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func TestEquivalentToReencoding(t *testing.T) {
	t.Parallel()
	docs := validDocs
	for _, tc := range canonCases {
		docs = append(docs, tc.in)
	}
	for _, d := range docs {
		want, err := Canonicalize([]byte(d), Options{})
		if err != nil {
			t.Fatalf("Canonicalize(%q): %v", d, err)
		}
		re, err := reencode([]byte(d))
		if err != nil {
			t.Fatalf("re-encoding %q: %v", d, err)
		}
		got, err := Canonicalize(re, Options{})
		if err != nil {
			t.Fatalf("Canonicalize(%q): %v", re, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("re-encoded %q canonicalises to %s, want %s", d, got, want)
		}
	}
}

func TestIsJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want bool
	}{
		{`{}`, true},
		{` [1, "a", {"b": null}] `, true},
		{`"x"`, true},
		{`-0.5E+3`, true},
		{`{"a":1,"a":2}`, true}, // duplicate keys are a Canonicalize error, not "not JSON"
		{"\"\xff\"", true},      // so is invalid UTF-8
		{`"\ud800"`, true},      // and lone surrogates
		{strings.Repeat("[", 100000) + strings.Repeat("]", 100000), true},
		{``, false},
		{` `, false},
		{`{`, false},
		{`{"a":1,}`, false},
		{`[1,]`, false},
		{`[1 2]`, false},
		{`{"a" 1}`, false},
		{`{1:2}`, false},
		{`{'a':1}`, false},
		{`NaN`, false},
		{`hello`, false},
		{`1 2`, false},
		{`{}x`, false},
		{`01`, false},
		{"\"a\nb\"", false},
		{`"\x"`, false},
		{`"\u12"`, false},
		{"plain text payload", false},
		{strings.Repeat("[", 100000), false},
	}
	for _, tc := range cases {
		if got := IsJSON([]byte(tc.in)); got != tc.want {
			t.Errorf("IsJSON(%.40q) = %v, want %v", tc.in, got, tc.want)
		}
		if len(tc.in) < 1000 {
			if v := json.Valid([]byte(tc.in)); v != tc.want {
				t.Errorf("test case disagrees with json.Valid(%q) = %v", tc.in, v)
			}
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	for g := 0; g < 8; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 200; i++ {
				tc := canonCases[(g*31+i)%len(canonCases)]
				got, err := Canonicalize([]byte(tc.in), tc.opts)
				if err != nil || string(got) != tc.want {
					t.Errorf("Canonicalize(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
					return
				}
			}
		}()
	}
	for g := 0; g < 8; g++ {
		<-done
	}
}

// paymentEvent is a typical ~500-byte event as a producer might emit it.
var paymentEvent = []byte(`{"type":"payment.captured","id":"evt_01HZX3M8K9Q2W7TJ5V4N6B1C0D",
 "created_at":"2024-05-01T10:15:30.123Z",
 "data":{"payment_id":"pay_8f3a2c1e9b7d","order_id":"ord_20240501_0042",
  "amount":{"value":129900,"currency":"EUR","exponent":2},
  "customer":{"id":"cus_77","email":"zo\u00eb@example.com","country":"DE"},
  "method":{"type":"card","brand":"visa","last4":"4242","3ds":true},
  "items":[{"sku":"SKU-1","qty":2,"price":49950},{"sku":"SKU-2","qty":1,"price":30000}],
  "fee":1.25},
 "meta":{"delivered_at":"2024-05-01T10:15:31Z","trace":"00-4bf92f3577b34da6-01"}}`)

func BenchmarkCanonicalize(b *testing.B) {
	opts := []struct {
		name string
		opts Options
	}{
		{"all", Options{}},
		{"exclude", Options{Exclude: []string{"meta.delivered_at", "meta.trace", "created_at"}}},
		{"include", Options{Include: []string{"data.order_id", "data.amount", "data.items.sku"}}},
	}
	for _, o := range opts {
		b.Run(o.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(paymentEvent)))
			for b.Loop() {
				if _, err := Canonicalize(paymentEvent, o.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("IsJSON", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(paymentEvent)))
		for b.Loop() {
			if !IsJSON(paymentEvent) {
				b.Fatal("not JSON")
			}
		}
	})
}
