package idemschema_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemschema"
)

// FuzzValidate feeds arbitrary payloads to a Validator: it never panics, every refusal wraps
// idem.ErrInvalidPayload, and nothing that is not valid UTF-8 and valid JSON is ever accepted.
func FuzzValidate(f *testing.F) {
	f.Add([]byte(`{"tenant_id":"acme","wallet":"w1","amount_cents":500}`), true)
	f.Add([]byte(`{"tenant_id":"acme","wallet":"w1","amount_cents":"500"}`), true)
	f.Add([]byte(`{"tenant_id":"acme","wallet":"w1"`), true)
	f.Add([]byte("{\"wallet\":\"w\xff\"}"), true)
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`), false)
	f.Add([]byte(`{"a":"[[[[\"]]]]"}`), false)
	f.Add([]byte(``), false)

	v, err := idemschema.New(map[string][]byte{"payment.captured": []byte(paymentSchema), "line.item": []byte(lineSchema)},
		idemschema.Config{AllowUnknownTypes: true, MaxDepth: 16})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte, known bool) {
		typ := "something.else"
		if known {
			typ = "payment.captured"
		}
		err := v.Validate(context.Background(), idem.Message{EventID: "e", Type: typ, Payload: payload})
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidPayload) {
				t.Fatalf("error %v does not wrap idem.ErrInvalidPayload", err)
			}
			return
		}
		if !utf8.Valid(payload) || !json.Valid(payload) {
			t.Fatalf("accepted %q, which is not UTF-8 JSON", payload)
		}
		if known {
			var p map[string]any
			dec := json.NewDecoder(bytes.NewReader(payload))
			dec.UseNumber() // 1e400 is an integer to JSON Schema, but no float64
			if dec.Decode(&p) != nil || p["wallet"] == nil || p["amount_cents"] == nil {
				t.Fatalf("accepted %q, which the schema refuses", payload)
			}
		}
	})
}
