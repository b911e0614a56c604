// Package payments is the payments scenario that `idem demo` and `idem chaos` both drive: the
// payment.captured event and its validation, the wallets it credits, and the plan of which
// orders misbehave how (poison, poison identities, duplicates, re-sends, transient failures,
// lost acks). The plan is a pure function of a seed and an order's index, so a restarted
// process decides the same again. It also owns the scenario's tables and its one verdict
// (Check, Books), written once for PostgreSQL, SQLite and MySQL (DB). The demo drives the
// scenario in one process; chaos drives it with the producer, relays and consumers as processes
// of their own, under faults.
package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/idemkit/idem"
)

// Names of the scenario.
const (
	// EventType is the type of every event of the scenario.
	EventType = "payment.captured"
	// ConsumerName is the consumer that applies the events, with its effect version.
	ConsumerName = "ledger@v1"
	// WalletCount is how many wallets the orders of a run credit.
	WalletCount = 100
	// KeyReuseLookback bounds how far back a key-reuse order looks for the valid order whose
	// event id it reuses.
	KeyReuseLookback = 32
)

// WalletID names wallet w ("w007").
func WalletID(w int) string { return fmt.Sprintf("w%03d", w) }

// EventID is the event id of order i of a run: "<run id>-<i>". A key-reuse order's message
// carries its target's (Order.EventID).
func EventID(runID string, i int) string { return runID + "-" + strconv.Itoa(i) }

// Payment is the payload of payment.captured. Pointers tell a missing field from a zero one.
type Payment struct {
	OrderID     *int64  `json:"order_id"`
	WalletID    *string `json:"wallet_id"`
	AmountCents *int64  `json:"amount_cents"`
	Currency    string  `json:"currency,omitempty"`
}

// Validate is the consumer's idem.Validator: the message must be a payment.captured whose
// payload has every field the handler uses, with a positive amount.
func Validate(_ context.Context, msg idem.Message) error {
	if msg.Type != EventType {
		return fmt.Errorf("%w: type %q, want %q", idem.ErrInvalidPayload, msg.Type, EventType)
	}
	var p Payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return fmt.Errorf("%w: payload is not JSON: %v", idem.ErrInvalidPayload, err)
	}
	switch {
	case p.OrderID == nil:
		return fmt.Errorf("%w: order_id is missing", idem.ErrInvalidPayload)
	case p.WalletID == nil || *p.WalletID == "":
		return fmt.Errorf("%w: wallet_id is missing", idem.ErrInvalidPayload)
	case p.AmountCents == nil:
		return fmt.Errorf("%w: amount_cents is missing", idem.ErrInvalidPayload)
	case *p.AmountCents <= 0:
		return fmt.Errorf("%w: amount_cents is %d, want > 0", idem.ErrInvalidPayload, *p.AmountCents)
	}
	return nil
}
