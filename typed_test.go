package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

type paymentCaptured struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// fakeTx stands in for a store's transaction type: the typed layer never looks at it.
type fakeTx struct{ writes *[]string }

func TestJSONHandler(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload string
		want    string // the recorded write, or "" when the handler must not run
		errHas  string // substring of the error, "" for success
	}{
		{name: "decodes", payload: `{"order_id":"o-1","amount_cents":250}`, want: "o-1:250"},
		{name: "unknown fields are allowed", payload: `{"order_id":"o-2","amount_cents":1,"extra":true}`, want: "o-2:1"},
		{name: "not JSON", payload: `{"order_id":`, errHas: "does not decode"},
		{name: "wrong type", payload: `{"order_id":7}`, errHas: "does not decode"},
		{name: "trailing data", payload: `{"order_id":"o-3"} {}`, errHas: "data after its JSON value"},
		{name: "empty", payload: ``, errHas: "payload is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var writes []string
			h := idem.JSONHandler(func(ctx context.Context, tx fakeTx, msg idem.Message, p paymentCaptured) error {
				*tx.writes = append(*tx.writes, fmt.Sprintf("%s:%d", p.OrderID, p.AmountCents))
				return nil
			})
			err := h(context.Background(), fakeTx{writes: &writes}, idem.Message{EventID: "e-1", Payload: []byte(tc.payload)})
			if tc.errHas == "" {
				require.NoError(t, err)
				require.Equal(t, []string{tc.want}, writes)
				return
			}
			require.ErrorContains(t, err, tc.errHas)
			require.ErrorIs(t, err, idem.ErrInvalidPayload, "a payload that cannot decode is invalid_payload")
			require.Equal(t, idem.ClassPermanent, idem.Classify(err), "never retried")
			require.Empty(t, writes, "the handler did not run")
		})
	}
}

func TestJSONHandlerPassesHandlerErrorsThrough(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	h := idem.JSONHandler(func(ctx context.Context, tx fakeTx, msg idem.Message, p paymentCaptured) error { return boom })
	err := h(context.Background(), fakeTx{}, idem.Message{Payload: []byte(`{}`)})
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, idem.ErrInvalidPayload)
}

func TestRouter(t *testing.T) {
	t.Parallel()
	record := func(name string) idem.Handler[fakeTx] {
		return func(ctx context.Context, tx fakeTx, msg idem.Message) error {
			*tx.writes = append(*tx.writes, name+":"+msg.EventID)
			return nil
		}
	}
	r := idem.NewRouter[fakeTx]().
		Handle("payment.captured", record("captured")).
		Handle("payment.refunded", record("refunded"))
	require.Equal(t, []string{"payment.captured", "payment.refunded"}, r.Types())

	var writes []string
	tx := fakeTx{writes: &writes}
	ctx := context.Background()
	require.NoError(t, r.Handler()(ctx, tx, idem.Message{EventID: "e-1", Type: "payment.captured"}))
	require.NoError(t, r.Handler()(ctx, tx, idem.Message{EventID: "e-2", Type: "payment.refunded"}))
	require.Equal(t, []string{"captured:e-1", "refunded:e-2"}, writes)

	err := r.Handler()(ctx, tx, idem.Message{EventID: "e-3", Type: "payment.disputed"})
	require.ErrorIs(t, err, idem.ErrInvalidPayload)
	require.Equal(t, idem.ClassPermanent, idem.Classify(err))
	require.ErrorContains(t, err, `no handler for event type "payment.disputed"`)

	long := strings.Repeat("x", 10_000)
	err = r.Handler()(ctx, tx, idem.Message{EventID: "e-4", Type: long})
	require.Less(t, len(err.Error()), 300, "a hostile type is bounded in the error")

	r.Fallback(record("fallback"))
	require.NoError(t, r.Handler()(ctx, tx, idem.Message{EventID: "e-5", Type: "payment.disputed"}))
	require.Equal(t, "fallback:e-5", writes[len(writes)-1])
}

func TestRouterRefusesProgrammingErrors(t *testing.T) {
	t.Parallel()
	h := func(ctx context.Context, tx fakeTx, msg idem.Message) error { return nil }
	require.Panics(t, func() { idem.NewRouter[fakeTx]().Handle("", h) })
	require.Panics(t, func() { idem.NewRouter[fakeTx]().Handle("a", nil) })
	require.Panics(t, func() { idem.NewRouter[fakeTx]().Handle("a", h).Handle("a", h) })
}

// A consumer applies several event types through a Router of typed handlers; each handler gets
// its event decoded, and a payload that does not decode is dead-lettered as invalid_payload.
func ExampleRouter() {
	type captured struct {
		OrderID string `json:"order_id"`
	}
	type refunded struct {
		OrderID string `json:"order_id"`
		Cents   int64  `json:"cents"`
	}
	router := idem.NewRouter[fakeTx]().
		Handle("payment.captured", idem.JSONHandler(func(ctx context.Context, tx fakeTx, msg idem.Message, e captured) error {
			fmt.Println("mark paid:", e.OrderID)
			return nil
		})).
		Handle("payment.refunded", idem.JSONHandler(func(ctx context.Context, tx fakeTx, msg idem.Message, e refunded) error {
			fmt.Println("refund:", e.OrderID, e.Cents)
			return nil
		}))
	handler := router.Handler() // put it in idem.ConsumerConfig[pgx.Tx]{Handler: handler}

	ctx := context.Background()
	_ = handler(ctx, fakeTx{}, idem.Message{Type: "payment.captured", Payload: []byte(`{"order_id":"o-1"}`)})
	_ = handler(ctx, fakeTx{}, idem.Message{Type: "payment.refunded", Payload: []byte(`{"order_id":"o-1","cents":500}`)})
	err := handler(ctx, fakeTx{}, idem.Message{Type: "payment.refunded", Payload: []byte(`{"cents":"five"}`)})
	fmt.Println(errors.Is(err, idem.ErrInvalidPayload))
	// Output:
	// mark paid: o-1
	// refund: o-1 500
	// true
}
