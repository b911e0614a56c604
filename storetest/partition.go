package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// PaymentMessageAt is PaymentMessage with the producer's occurrence time, which a partitioned
// inbox needs to place the claim.
func PaymentMessageAt(tenant, eventID string, occurredAt time.Time, p Payment) idem.Message {
	m := PaymentMessage(tenant, eventID, p)
	m.OccurredAt = occurredAt
	return m
}

// ExercisePartitioned runs the checks of a partitioned inbox against stores built by factory,
// whose Store must implement idemstore.BucketedStore with ClaimBucket() > 0 and keep partitions from
// at least 2 days back to at least one bucket ahead (the checks' events span that). The
// consumer requires each event's OccurredAt; every guarantee of Exercise must hold for events
// that carry one, and the batched path is checked too when the store implements
// idemstore.BatchStore.
//
// The key is (tenant, consumer@version, event_id) alone, as on every store: neither the
// event's occurrence time nor the bucket the first claim went to may make one event two keys
// (the key checks of Exercise run here too).
func ExercisePartitioned[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	// Each check gets its suite, the bucket width, and the start of the bucket two buckets back:
	// a past bucket inside every retention, whose times do not move while the check runs.
	run := func(name string, fn func(s *suite[TTx], bucket time.Duration, start time.Time)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := factory(t)
			bs, ok := b.Store.(idemstore.BucketedStore)
			require.True(t, ok, "ExercisePartitioned: the store (%T) does not implement idemstore.BucketedStore", b.Store)
			bucket := bs.ClaimBucket()
			require.Positive(t, bucket, "ExercisePartitioned: the store's ClaimBucket is 0: its inbox is not partitioned")
			start := time.Now().UTC().Truncate(bucket).Add(-2 * bucket)
			fn(&suite[TTx]{t: t, b: b, ctx: ctx}, bucket, start)
		})
	}
	key := func(id string) idem.Key { return idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id} }

	keyChecks(func(name string, fn func(s *suite[TTx])) {
		run(name, func(s *suite[TTx], _ time.Duration, _ time.Time) { fn(s) })
	})

	run("DuplicateDeliveryAppliesOnce", func(s *suite[TTx], _ time.Duration, start time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		msg := PaymentMessageAt("acme", "evt-1", start.Add(time.Minute), Payment{Wallet: "w1", Amount: 500})
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		msg.Attempt = 2
		r = c.Process(s.ctx, msg)
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome)
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 500, s.balance("w1"))
		require.EqualValues(s.t, 1, s.claims(key("evt-1")))
	})

	run("ConcurrentDeliveriesApplyOnce", func(s *suite[TTx], _ time.Duration, start time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		msg := PaymentMessageAt("acme", "evt-race", start.Add(time.Minute), Payment{Wallet: "w1", Amount: 7})
		const n = 16
		var processed, duplicates atomic.Int64
		errs := make(chan error, n)
		begin := make(chan struct{})
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				<-begin
				r := c.Process(s.ctx, msg)
				err := r.Err
				switch {
				case err != nil:
					errs <- err
				case r.Outcome == idem.OutcomeProcessed:
					processed.Add(1)
				case r.Outcome == idem.OutcomeDuplicate:
					duplicates.Add(1)
				default:
					errs <- fmt.Errorf("unexpected outcome %s", r.Outcome)
				}
			})
		}
		close(begin)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(s.t, err)
		}
		require.EqualValues(s.t, 1, processed.Load(), "exactly one delivery applies")
		require.EqualValues(s.t, n-1, duplicates.Load(), "all others are duplicates")
		require.EqualValues(s.t, 1, s.ledger("evt-race"))
		require.EqualValues(s.t, 7, s.balance("w1"))
	})

	run("KeyReuseInOneBucketAppliesNothing", func(s *suite[TTx], _ time.Duration, start time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		err := c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", start.Add(time.Minute), Payment{Wallet: "w1", Amount: 100})).Err
		require.NoError(s.t, err)
		r := c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", start.Add(2*time.Minute), Payment{Wallet: "w1", Amount: 999}))
		err = r.Err
		require.ErrorIs(s.t, err, idem.ErrKeyReuse)
		require.Equal(s.t, idem.OutcomeKeyReuse, r.Outcome)
		require.Equal(s.t, idem.ReasonKeyReuse, r.Reason)
		var kr *idem.KeyReuseError
		require.ErrorAs(s.t, err, &kr)
		require.Equal(s.t, key("evt-1"), kr.Key)
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 100, s.balance("w1"))
		require.EqualValues(s.t, 1, s.claims(key("evt-1")))
	})

	run("OccurrenceTimesInOneBucketAreOneEvent", func(s *suite[TTx], bucket time.Duration, start time.Time) {
		// The fingerprint does not cover the occurrence time: within one bucket, a redelivery
		// stamped with another time is the duplicate it most likely is, never a second effect.
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		p := Payment{Wallet: "w1", Amount: 5}
		r := c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", start.Add(time.Minute), p))
		err := r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		r = c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", start.Add(bucket-time.Minute), p))
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome)
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 1, s.claims(key("evt-1")))
	})

	run("MissingOccurrenceTimeIsInvalid", func(s *suite[TTx], _ time.Duration, _ time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		msg := PaymentMessage("acme", "evt-1", Payment{Wallet: "w1", Amount: 5})
		msg.PublishedAt = time.Now() // a broker's time is no substitute for the producer's
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.ErrorIs(s.t, err, idem.ErrInvalidPayload)
		require.Equal(s.t, idem.OutcomeFailed, r.Outcome)
		require.Equal(s.t, idem.ClassPermanent, r.Class)
		require.Equal(s.t, idem.ReasonInvalidPayload, r.Reason)
		require.EqualValues(s.t, 0, s.ledger("evt-1"))
		require.EqualValues(s.t, 0, s.claims(key("evt-1")))
		require.EqualValues(s.t, 0, s.balance("w1"))
	})

	run("TooOldEventIsRefused", func(s *suite[TTx], _ time.Duration, _ time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Claims.Retention = 48 * time.Hour
			cfg.Claims.RedeliveryWindow = time.Hour
		})
		now := time.Now()
		r := c.Process(s.ctx, PaymentMessageAt("acme", "evt-old", now.Add(-49*time.Hour), Payment{Wallet: "w1", Amount: 1}))
		err := r.Err
		require.ErrorIs(s.t, err, idem.ErrTooOld)
		require.Equal(s.t, idem.ReasonTooOld, r.Reason)
		require.Equal(s.t, idem.ClassPermanent, r.Class)
		require.EqualValues(s.t, 0, s.ledger("evt-old"))
		require.EqualValues(s.t, 0, s.claims(key("evt-old")))

		// Just inside the consumer's horizon the event applies: its partition still exists.
		r = c.Process(s.ctx, PaymentMessageAt("acme", "evt-recent", now.Add(-47*time.Hour), Payment{Wallet: "w1", Amount: 1}))
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		require.EqualValues(s.t, 1, s.balance("w1"))
	})

	run("EventsAcrossBucketsApplyOnceEach", func(s *suite[TTx], bucket time.Duration, start time.Time) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		// From five buckets back to the next bucket, which exists ahead of time.
		var msgs []idem.Message
		for i := range 7 {
			at := start.Add(time.Duration(i-3)*bucket + 17*time.Minute)
			msgs = append(msgs, PaymentMessageAt("acme", fmt.Sprintf("evt-%d", i), at, Payment{Wallet: "w1", Amount: 1}))
		}
		for round, want := range []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate} {
			for _, m := range msgs {
				r := c.Process(s.ctx, m)
				err := r.Err
				require.NoError(s.t, err, "round %d, %s at %v", round, m.EventID, m.OccurredAt)
				require.Equal(s.t, want, r.Outcome, "round %d, %s at %v", round, m.EventID, m.OccurredAt)
			}
		}
		require.EqualValues(s.t, len(msgs), s.balance("w1"))
	})

	run("BatchTakesEachPath", func(s *suite[TTx], bucket time.Duration, start time.Time) {
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); !ok {
			s.t.Skip("the store does not implement idemstore.BatchStore")
		}
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Batch = idem.BatchConfig{Enabled: true}
			inner := cfg.Handler
			cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
				if err := inner(ctx, tx, msg); err != nil {
					return err
				}
				if msg.Header("fail") != "" { // written, then rolled back alone
					return errors.New("downstream timeout")
				}
				if msg.EventID == "panic" {
					panic("bug")
				}
				return nil
			}
		})
		at, other := start.Add(time.Minute), start.Add(bucket+time.Minute)
		failing := func(m idem.Message) idem.Message { m.Headers = map[string]string{"fail": "1"}; return m }
		for _, m := range []idem.Message{
			PaymentMessageAt("acme", "old", at, Payment{Wallet: "w1", Amount: 1}),
			PaymentMessageAt("acme", "twin", at, Payment{Wallet: "w1", Amount: 1}),
		} {
			err := c.Process(s.ctx, m).Err
			require.NoError(s.t, err)
		}
		msgs := []idem.Message{
			PaymentMessageAt("acme", "a", at, Payment{Wallet: "w1", Amount: 10}),
			PaymentMessageAt("acme", "old", at, Payment{Wallet: "w1", Amount: 1}),  // duplicate
			PaymentMessageAt("acme", "old", at, Payment{Wallet: "w1", Amount: 99}), // same key twice in a batch, and key reuse
			failing(PaymentMessageAt("acme", "fail", at, Payment{Wallet: "w1", Amount: 100})),
			PaymentMessageAt("acme", "panic", at, Payment{Wallet: "w1", Amount: 100}),
			PaymentMessageAt("acme", "nowallet", at, Payment{Wallet: "missing", Amount: 100}),
			PaymentMessage("acme", "notime", Payment{Wallet: "w1", Amount: 100}), // no OccurredAt
			// "twin" in another bucket is the same key: a duplicate, whose handler (which would
			// fail) does not run.
			failing(PaymentMessageAt("acme", "twin", other, Payment{Wallet: "w1", Amount: 1})),
			PaymentMessageAt("acme", "b", other, Payment{Wallet: "w1", Amount: 20}),
		}
		rs := c.ProcessBatch(s.ctx, msgs)
		require.Len(s.t, rs, len(msgs))
		want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse, idem.OutcomeFailed,
			idem.OutcomeFailed, idem.OutcomeFailed, idem.OutcomeFailed, idem.OutcomeDuplicate, idem.OutcomeProcessed}
		for i, r := range rs {
			require.Equal(s.t, want[i], r.Outcome, "message %d (%s): %v", i, msgs[i].EventID, r.Err)
		}
		require.Equal(s.t, idem.ClassTransient, rs[3].Class)
		require.Equal(s.t, idem.ReasonHandlerPanic, rs[4].Reason)
		require.ErrorIs(s.t, rs[5].Err, idem.ErrNoRows)
		require.Equal(s.t, idem.ReasonInvalidPayload, rs[6].Reason)
		for id, n := range map[string]int64{"a": 1, "old": 1, "fail": 0, "panic": 0, "nowallet": 0, "notime": 0, "twin": 1, "b": 1} {
			require.EqualValues(s.t, n, s.ledger(id), "ledger rows of %s", id)
			require.EqualValues(s.t, n, s.claims(key(id)), "claims of %s", id)
		}
		require.EqualValues(s.t, 32, s.balance("w1"))

		// The failed ones apply once when redelivered.
		rs = c.ProcessBatch(s.ctx, []idem.Message{
			PaymentMessageAt("acme", "fail", at, Payment{Wallet: "w1", Amount: 100}),
			PaymentMessageAt("acme", "a", at, Payment{Wallet: "w1", Amount: 10}),
			PaymentMessageAt("acme", "twin", other, Payment{Wallet: "w1", Amount: 1}),
		})
		require.Equal(s.t, idem.OutcomeProcessed, rs[0].Outcome, "%v", rs[0].Err)
		require.Equal(s.t, idem.OutcomeDuplicate, rs[1].Outcome, "%v", rs[1].Err)
		require.Equal(s.t, idem.OutcomeDuplicate, rs[2].Outcome, "%v", rs[2].Err)
		require.EqualValues(s.t, 132, s.balance("w1"))
		require.EqualValues(s.t, 1, s.claims(key("twin")))
	})

	run("ConcurrentOverlappingBatchesApplyOnce", func(s *suite[TTx], bucket time.Duration, start time.Time) {
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); !ok {
			s.t.Skip("the store does not implement idemstore.BatchStore")
		}
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Batch = idem.BatchConfig{Enabled: true} })
		const events, workers = 60, 4
		var wg sync.WaitGroup
		var processed atomic.Int64
		for w := range workers {
			wg.Go(func() {
				// Each worker delivers every event, in its own order, in batches of 15; events
				// spread over three buckets.
				msgs := make([]idem.Message, 0, events)
				for i := range events {
					j := (i*7 + w*13) % events
					at := start.Add(time.Duration(j%3)*bucket + time.Minute)
					msgs = append(msgs, PaymentMessageAt("acme", fmt.Sprintf("evt-%d", j), at, Payment{Wallet: "w1", Amount: 1}))
				}
				for from := 0; from < events; from += 15 {
					batch := msgs[from : from+15]
					for k, r := range c.ProcessBatch(s.ctx, batch) {
						for try := 0; r.Outcome == idem.OutcomeFailed && r.Class == idem.ClassTransient && try < 5; try++ {
							// A deadlock between overlapping batches: retried, as Run would.
							r = c.ProcessBatch(s.ctx, []idem.Message{batch[k]})[0]
						}
						if r.Outcome == idem.OutcomeProcessed {
							processed.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		bal := s.balance("w1")
		require.EqualValues(s.t, events, bal, "every event applied")
		for i := range events {
			require.LessOrEqual(s.t, s.ledger(fmt.Sprintf("evt-%d", i)), int64(1), "evt-%d applied at most once", i)
		}
		require.EqualValues(s.t, processed.Load(), bal, "every processed outcome is exactly one effect")
	})
}
