package idemschema_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemschema"
)

const paymentSchema = `{
	"type": "object",
	"required": ["tenant_id", "wallet", "amount_cents"],
	"properties": {
		"tenant_id": {"type": "string"},
		"wallet": {"type": "string", "minLength": 1},
		"amount_cents": {"type": "integer", "minimum": 1},
		"captured_at": {"type": "string", "format": "date-time"},
		"customer": {
			"type": "object",
			"required": ["id"],
			"properties": {"id": {"type": "string"}}
		},
		"lines": {"type": "array", "items": {"$ref": "urn:idemschema:line.item"}}
	},
	"additionalProperties": false
}`

const lineSchema = `{"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}`

func schemas() map[string][]byte {
	return map[string][]byte{"payment.captured": []byte(paymentSchema), "line.item": []byte(lineSchema)}
}

func newValidator(t *testing.T, opts idemschema.Config) *idemschema.Validator {
	t.Helper()
	v, err := idemschema.New(schemas(), opts)
	require.NoError(t, err)
	return v
}

func msg(typ, payload string) idem.Message {
	return idem.Message{EventID: "evt-7", Tenant: "acme", Type: typ, Payload: []byte(payload)}
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		schemas map[string][]byte
		opts    idemschema.Config
		want    []string // error substrings; none means success
	}{
		{name: "valid", schemas: schemas()},
		{name: "no schemas but unknown types allowed", opts: idemschema.Config{AllowUnknownTypes: true}},
		{name: "no schemas", want: []string{"no schemas and AllowUnknownTypes is false"}},
		{name: "negative depth", schemas: schemas(), opts: idemschema.Config{MaxDepth: -1}, want: []string{"Config.MaxDepth is -1"}},
		{name: "depth beyond encoding/json", schemas: schemas(), opts: idemschema.Config{MaxDepth: 10001}, want: []string{"Config.MaxDepth is 10001, want 1 to 10000"}},
		{name: "schema not JSON", schemas: map[string][]byte{"a": []byte(`{"type":`)}, want: []string{`event type "a" is not JSON`}},
		{name: "schema invalid", schemas: map[string][]byte{"a": []byte(`{"type":"object"}`), "b": []byte(`{"type":"integr"}`)}, want: []string{`event type "b" does not compile`}},
		{name: "every bad schema named", schemas: map[string][]byte{"a": []byte(`{`), "b": []byte(`[`)}, want: []string{`"a"`, `"b"`}},
		{name: "empty type", schemas: map[string][]byte{"": []byte(`{}`)}, want: []string{"empty event type"}},
		{name: "remote ref refused", schemas: map[string][]byte{"a": []byte(`{"$ref":"https://example.com/schema.json"}`)}, want: []string{`event type "a" does not compile`, "refusing to load"}},
		{name: "file ref refused", schemas: map[string][]byte{"a": []byte(`{"$ref":"file:///etc/passwd"}`)}, want: []string{"refusing to load"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, err := idemschema.New(tt.schemas, tt.opts)
			if len(tt.want) == 0 {
				require.NoError(t, err)
				require.NotNil(t, v)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	valid := `{"tenant_id":"acme","wallet":"w1","amount_cents":500}`
	tests := []struct {
		name  string
		opts  idemschema.Config
		msg   idem.Message
		want  string // substring of the error; "" means valid
		wants []string
	}{
		{name: "valid", msg: msg("payment.captured", valid)},
		{name: "valid with everything", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"captured_at":"2025-06-01T12:00:00Z","customer":{"id":"c1"},"lines":[{"sku":"a"}]}`)},
		{name: "surrounding whitespace", msg: msg("payment.captured", " \n"+valid+"\n")},
		{name: "unknown type allowed", opts: idemschema.Config{AllowUnknownTypes: true}, msg: msg("payment.refunded", `{"anything":true}`)},
		{name: "depth exactly the limit", opts: idemschema.Config{MaxDepth: 3, AllowUnknownTypes: true}, msg: msg("x", `{"a":[{"b":1}]}`)},
		{name: "brackets in strings do not count", opts: idemschema.Config{MaxDepth: 1, AllowUnknownTypes: true}, msg: msg("x", `{"a":"[[[{{{\"]]]"}`)},

		{name: "empty payload", msg: msg("payment.captured", ""), want: "payload is empty"},
		{name: "invalid JSON", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":w1}`), want: "invalid JSON at offset 30: invalid character 'w' looking for beginning of value"},
		{name: "truncated JSON", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amou`), want: "invalid JSON at offset 39: unexpected end of JSON input"},
		{name: "trailing data", msg: msg("payment.captured", valid+` {}`), want: "invalid JSON at offset"},
		{name: "not UTF-8", msg: msg("payment.captured", "{\"tenant_id\":\"acme\",\"wallet\":\"w\xff1\",\"amount_cents\":5}"), want: "payload is not valid UTF-8 (first bad byte 0xff at offset 31)"},
		{name: "too deep", msg: msg("payment.captured", strings.Repeat("[", 65)+strings.Repeat("]", 65)), want: "JSON nested deeper than 64 levels (at offset 64)"},
		{name: "too deep before broken", msg: msg("payment.captured", strings.Repeat("{\"a\":", 100)), want: "JSON nested deeper than 64 levels"},
		{name: "custom depth", opts: idemschema.Config{MaxDepth: 2}, msg: msg("payment.captured", `{"customer":{"id":["x"]}}`), want: "JSON nested deeper than 2 levels (at offset 18)"},
		{name: "unknown type", msg: msg("payment.refunded", valid), want: `unknown event type "payment.refunded" (schemas exist for "line.item", "payment.captured")`},
		{name: "no type", msg: msg("", valid), want: "the event has no type"},
		{name: "unknown type still needs JSON", opts: idemschema.Config{AllowUnknownTypes: true}, msg: msg("payment.refunded", `{`), want: "invalid JSON"},
		{name: "wrong type", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":"500"}`), want: "/amount_cents: got string, want integer"},
		{name: "number not integer", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":5.5}`), want: "/amount_cents: got number, want integer"},
		{name: "missing required", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1"}`), want: "missing required field amount_cents"},
		{name: "missing several", msg: msg("payment.captured", `{"tenant_id":"acme"}`), want: "missing required fields wallet, amount_cents"},
		{name: "missing nested", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"customer":{}}`), want: "/customer: missing required field id"},
		{name: "in array via $ref", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"lines":[{"sku":"a"},{"sku":7}]}`), want: "/lines/1/sku: got number, want string"},
		{name: "minimum", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":0}`), want: "/amount_cents: minimum: got 0, want 1"},
		{name: "format asserted", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"captured_at":"yesterday"}`), want: "/captured_at: 'yesterday' is not valid date-time"},
		{name: "additional property", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"note":"x"}`), want: "(root): additional properties 'note' not allowed"},
		{name: "root type", msg: msg("payment.captured", `[1]`), want: "(root): got array, want object"},
		{name: "several violations sorted", msg: msg("payment.captured", `{"tenant_id":1,"wallet":"","amount_cents":"x"}`), wants: []string{
			"/amount_cents: got string, want integer; /tenant_id: got number, want string; /wallet: minLength: got 0, want 1",
		}},
		{name: "pointer escapes", msg: msg("payment.captured", `{"tenant_id":"acme","wallet":"w1","amount_cents":1,"a/b~c":1}`), want: "additional properties 'a/b~c' not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newValidator(t, tt.opts)
			err := v.Validate(context.Background(), tt.msg)
			if tt.want == "" && len(tt.wants) == 0 {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, idem.ErrInvalidPayload)
			require.Contains(t, err.Error(), "event evt-7: ")
			for _, w := range append(tt.wants, tt.want) {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestValidateCapsViolations(t *testing.T) {
	t.Parallel()
	v, err := idemschema.New(map[string][]byte{"t": []byte(`{"type":"array","items":{"type":"string"}}`)}, idemschema.Config{})
	require.NoError(t, err)
	err = v.Validate(context.Background(), msg("t", `[1,2,3,4,5,6,7,8]`))
	require.ErrorContains(t, err, "; and 3 more")
}

// TestValidateDeepNestingIsCheap shows that hostile nesting is refused in time linear in its
// size, before any decoder sees it.
func TestValidateDeepNestingIsCheap(t *testing.T) {
	t.Parallel()
	v := newValidator(t, idemschema.Config{})
	for _, p := range []string{
		strings.Repeat("[", 1<<20),
		`{"tenant_id":"acme","wallet":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
		strings.Repeat(`{"a":`, 200000) + "1" + strings.Repeat("}", 200000),
	} {
		start := time.Now()
		err := v.Validate(context.Background(), msg("payment.captured", p))
		require.ErrorContains(t, err, "nested deeper than 64 levels")
		require.Less(t, time.Since(start), time.Second)
	}
}

func TestValidateConcurrent(t *testing.T) {
	t.Parallel()
	v := newValidator(t, idemschema.Config{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				payload := `{"tenant_id":"acme","wallet":"w1","amount_cents":1}`
				if i%2 == 1 {
					payload = `{"tenant_id":"acme","wallet":"w1","amount_cents":"1"}`
				}
				err := v.Validate(context.Background(), msg("payment.captured", payload))
				if (err != nil) != (i%2 == 1) {
					t.Errorf("worker %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestTypes(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"line.item", "payment.captured"}, newValidator(t, idemschema.Config{}).Types())
}
