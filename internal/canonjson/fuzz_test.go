package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// fuzzOpts is a fixed selection exercised alongside the default options.
var fuzzOpts = Options{
	Include: []string{"a", "b.c", "items.sku", "items.x.y"},
	Exclude: []string{"b.c.d", "items.x.y.z", "t"},
}

// FuzzCanonicalize checks that Canonicalize never panics, agrees with IsJSON and json.Valid,
// and that its output is valid JSON, a fixed point and stable under re-encoding by
// encoding/json.
func FuzzCanonicalize(f *testing.F) {
	for _, d := range validDocs {
		f.Add([]byte(d))
	}
	for _, tc := range canonCases {
		f.Add([]byte(tc.in))
	}
	f.Add(paymentEvent)
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data, Options{})
		isJSON := IsJSON(data)
		if len(data) <= 10000 { // json.Valid gives up beyond 10000 levels of nesting
			if v := json.Valid(data); v != isJSON {
				t.Fatalf("IsJSON(%q) = %v, json.Valid = %v", data, isJSON, v)
			}
		}
		if err != nil {
			if out != nil {
				t.Fatalf("output %q returned with error %v", out, err)
			}
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooDeep) && !errors.Is(err, ErrDuplicateKey) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if errors.Is(err, ErrInvalid) && isJSON &&
				!strings.Contains(err.Error(), "UTF-8") && !strings.Contains(err.Error(), "surrogate") {
				// Beyond the grammar, only the UTF-8 and surrogate checks may reject a document.
				t.Fatalf("Canonicalize(%q) = %v, but IsJSON is true", data, err)
			}
		} else {
			checkCanonical(t, data, out, Options{})
			if !isJSON {
				t.Fatalf("Canonicalize accepted %q but IsJSON is false", data)
			}
			// Re-encoding by another library must not change the canonical form.
			re, err := reencode(out)
			if err != nil {
				t.Fatalf("encoding/json cannot re-encode %q: %v", out, err)
			}
			again, err := Canonicalize(re, Options{})
			if err != nil {
				t.Fatalf("Canonicalize(re-encoded %q): %v", re, err)
			}
			if !bytes.Equal(again, out) {
				t.Fatalf("re-encoding changed the canonical form:\n  in %q\n out %q\n  re %q\nagain %q", data, out, re, again)
			}
		}

		// With a selection, the document is accepted or rejected alike (invalid paths aside)
		// and the result is canonical too.
		sel, selErr := Canonicalize(data, fuzzOpts)
		if (selErr == nil) != (err == nil) {
			t.Fatalf("Canonicalize(%q): error %v without options but %v with them", data, err, selErr)
		}
		if selErr == nil {
			checkCanonical(t, data, sel, fuzzOpts)
		}
	})
}

// checkCanonical checks that out, the canonical form of in under opts, is valid JSON and a
// fixed point, with and without opts.
func checkCanonical(t *testing.T, in, out []byte, opts Options) {
	t.Helper()
	if !json.Valid(out) {
		t.Fatalf("Canonicalize(%q, %+v) = %q, not valid JSON", in, opts, out)
	}
	for _, o := range []Options{opts, {}} {
		again, err := Canonicalize(out, o)
		if err != nil {
			t.Fatalf("Canonicalize(%q, %+v): %v (from %q)", out, o, err, in)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not a fixed point with %+v:\n  in %q\n out %q\nagain %q", o, in, out, again)
		}
	}
}
