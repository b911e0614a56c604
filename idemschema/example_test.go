package idemschema_test

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemschema"
)

// A Validator built from one schema per event type refuses a payload in words an operator can
// act on; in a consumer it goes into idem.ConsumerConfig.Input.Validator.
func ExampleValidator() {
	v, err := idemschema.New(map[string][]byte{
		"payment.captured": []byte(`{
			"type": "object",
			"required": ["wallet", "amount_cents"],
			"properties": {"wallet": {"type": "string"}, "amount_cents": {"type": "integer"}}
		}`),
	}, idemschema.Config{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, payload := range []string{
		`{"wallet":"w1","amount_cents":500}`,
		`{"wallet":"w1","amount_cents":"500"}`,
		`{"wallet":"w1"}`,
		`{"wallet":"w1",`,
	} {
		fmt.Println(v.Validate(ctx, idem.Message{EventID: "evt-1", Type: "payment.captured", Payload: []byte(payload)}))
	}
	fmt.Println(v.Validate(ctx, idem.Message{EventID: "evt-2", Type: "payment.refunded", Payload: []byte(`{}`)}))
	// Output:
	// <nil>
	// idem: invalid payload: event evt-1: /amount_cents: got string, want integer
	// idem: invalid payload: event evt-1: missing required field amount_cents
	// idem: invalid payload: event evt-1: invalid JSON at offset 15: unexpected end of JSON input
	// idem: invalid payload: event evt-2: unknown event type "payment.refunded" (schemas exist for "payment.captured")
}
