package idem_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/idemkit/idem"
)

// FuzzFingerprint checks that equal documents fingerprint equally: a payload and its
// re-encoding by encoding/json (other whitespace, other escapes, keys in Go's order) have the
// same fingerprint, and computing it never panics.
func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{
		`{"order":{"id":7,"cents":100},"ts":"a"}`,
		`{ "b" : [1, 2.50, {"z":null,"a":true}], "a": "\u00e9\u0041" }`,
		`[1e10, -0, 0.1, "x"]`,
		`"just a string"`,
		`not json at all`,
		`{"a":1,"a":2}`,
	} {
		f.Add([]byte(s), "payment.captured")
	}
	f.Fuzz(func(t *testing.T, payload []byte, typ string) {
		msg := idem.Message{EventID: "e", Type: typ, Payload: payload}
		fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
		if err == nil && !json.Valid(payload) {
			t.Fatalf("%q is not JSON, yet it has a fingerprint by default", payload)
		}
		if _, rerr := idem.ComputeFingerprint(msg, idem.FingerprintConfig{Raw: true}); rerr != nil && !json.Valid(payload) {
			t.Fatalf("Raw refuses %q, which is not JSON: %v", payload, rerr)
		}
		if err != nil || !json.Valid(payload) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "   ")
		if enc.Encode(v) != nil {
			return
		}
		msg.Payload = buf.Bytes()
		again, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
		if err != nil {
			t.Fatalf("re-encoded %q fails: %v", buf.Bytes(), err)
		}
		if again != fp {
			t.Fatalf("fingerprint changed across re-encoding:\n%q\n%q", payload, buf.Bytes())
		}
	})
}

// BenchmarkComputeFingerprint measures the per-message fingerprint of a ~300-byte payment event.
func BenchmarkComputeFingerprint(b *testing.B) {
	msg := idem.Message{EventID: "evt-1", Type: "payment.captured", Payload: []byte(`{"order_id":"ord_8f14e45fceea167a","amount_cents":4200,"currency":"EUR","customer":{"id":"cus_91","email":"a@example.com"},"captured_at":"2026-11-30T10:00:00Z","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"provider":"stripe"}`)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{}); err != nil {
			b.Fatal(err)
		}
	}
}
