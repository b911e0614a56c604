package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemkit/idem"
)

// Benchmark measures the whole single-event path through Consumer.Process — fingerprint,
// transaction, claim, the suite's credit effect, commit — for a new event and for a duplicate,
// with allocations. Run it from a store package: storetest.Benchmark(b, factory).
func Benchmark[TTx any](b *testing.B, factory Factory[TTx]) {
	ctx := context.Background()
	setup := func(b *testing.B) (*idem.Consumer[TTx], Bundle[TTx]) {
		bundle := factory(b)
		if err := bundle.CreateWallet(ctx, "w1"); err != nil {
			b.Fatal(err)
		}
		c, err := idem.NewConsumer(bundle.Store, idem.ConsumerConfig[TTx]{Name: "ledger@v1", Handler: CreditHandler(bundle)})
		if err != nil {
			b.Fatal(err)
		}
		return c, bundle
	}
	b.Run("new", func(b *testing.B) {
		c, _ := setup(b)
		msgs := make([]idem.Message, b.N)
		for i := range msgs {
			msgs[i] = PaymentMessage("acme", fmt.Sprintf("evt-%d", i), Payment{Wallet: "w1", Amount: 1})
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			r := c.Process(ctx, msgs[i])
			err := r.Err
			if err != nil || r.Outcome != idem.OutcomeProcessed {
				b.Fatalf("event %d: %v %v", i, r.Outcome, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		c, _ := setup(b)
		msg := PaymentMessage("acme", "evt-dup", Payment{Wallet: "w1", Amount: 1})
		if err := c.Process(ctx, msg).Err; err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			r := c.Process(ctx, msg)
			err := r.Err
			if err != nil || r.Outcome != idem.OutcomeDuplicate {
				b.Fatalf("duplicate: %v %v", r.Outcome, err)
			}
		}
	})
}
