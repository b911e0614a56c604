package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// bucketWidth is the store's claim bucket, or a day for a plain inbox, so the key checks move
// times across what would be a partition boundary on any store.
func (s *suite[TTx]) bucketWidth() time.Duration {
	if bs, ok := s.b.Store.(idemstore.BucketedStore); ok && bs.ClaimBucket() > 0 {
		return bs.ClaimBucket()
	}
	return 24 * time.Hour
}

// keyChecks are the checks that the key is (tenant, consumer@version, event_id) and nothing
// else: neither the event's occurrence time nor the time of the first claim may make one event
// two keys. They hold trivially on a plain inbox and are the point of a partitioned one.
func keyChecks[TTx any](run func(name string, fn func(s *suite[TTx]))) {
	key := func(id string) idem.Key { return idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id} }

	run("KeysDifferingInCaseSpaceOrAccentAreDistinct", func(s *suite[TTx]) {
		// The key is compared byte for byte: a store whose columns fold case, ignore trailing
		// spaces or accents (MySQL's default collations do all three) would make two events
		// one key and skip the second as a duplicate, or dead-letter it as key reuse. The
		// balance, not the ledger, counts the effects: a bundle's own ledger query may fold.
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		p := Payment{Wallet: "w1", Amount: 1}
		at := time.Now().UTC()
		keys := []struct{ tenant, id string }{
			{"acme", "evt-a"}, {"acme", "evt-A"}, {"acme", "evt-a "}, {"acme", "evt-á"},
			{"acme", "evt-ss"}, {"acme", "evt-ß"}, {"Acme", "evt-a"}, {"acme ", "evt-a"},
		}
		for _, k := range keys {
			r := c.Process(s.ctx, PaymentMessageAt(k.tenant, k.id, at, p))
			require.NoError(s.t, r.Err, "tenant %q, event %q", k.tenant, k.id)
			require.Equal(s.t, idem.OutcomeProcessed, r.Outcome, "tenant %q, event %q: another key's claim took it", k.tenant, k.id)
		}
		for _, k := range keys {
			r := c.Process(s.ctx, PaymentMessageAt(k.tenant, k.id, at, p))
			require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome, "tenant %q, event %q again: %v", k.tenant, k.id, r.Err)
		}
		require.EqualValues(s.t, len(keys), s.balance("w1"), "one effect per distinct key")
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); ok {
			bc := s.consumer("ledger@v2", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Batch = idem.BatchConfig{Enabled: true} })
			msgs := make([]idem.Message, len(keys))
			for i, k := range keys {
				msgs[i] = PaymentMessageAt(k.tenant, k.id, at, p)
			}
			for i, r := range bc.ProcessBatch(s.ctx, msgs) {
				require.Equal(s.t, idem.OutcomeProcessed, r.Outcome, "batched: tenant %q, event %q: %v", keys[i].tenant, keys[i].id, r.Err)
			}
			require.EqualValues(s.t, 2*len(keys), s.balance("w1"), "batched: one effect per distinct key")
		}
	})

	run("OccurrenceTimeInAnotherBucketIsTheSameKey", func(s *suite[TTx]) {
		// A producer that re-sends an event with a fresh timestamp, or a copy whose header was
		// changed: the same key, a duplicate, never a second effect.
		s.wallet("w1")
		w := s.bucketWidth()
		c := s.consumer("ledger@v1", nil)
		p := Payment{Wallet: "w1", Amount: 5}
		base := time.Now().UTC().Truncate(w)
		for i, at := range []time.Time{base.Add(-2*w + time.Minute), base.Add(-w + time.Minute), base.Add(time.Minute), time.Now().UTC()} {
			want := idem.OutcomeDuplicate
			if i == 0 {
				want = idem.OutcomeProcessed
			}
			r := c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", at, p))
			err := r.Err
			require.NoError(s.t, err, "occurred at %v", at)
			require.Equal(s.t, want, r.Outcome, "occurred at %v", at)
		}
		// Another payload under the key is key reuse, whatever its time.
		r := c.Process(s.ctx, PaymentMessageAt("acme", "evt-1", base.Add(-w+2*time.Minute), Payment{Wallet: "w1", Amount: 6}))
		err := r.Err
		require.ErrorIs(s.t, err, idem.ErrKeyReuse)
		require.Equal(s.t, idem.OutcomeKeyReuse, r.Outcome)
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); ok {
			bc := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Batch = idem.BatchConfig{Enabled: true} })
			rs := bc.ProcessBatch(s.ctx, []idem.Message{
				PaymentMessageAt("acme", "evt-1", base.Add(-w+3*time.Minute), p),
				PaymentMessageAt("acme", "evt-2", base.Add(-w+3*time.Minute), p),
			})
			require.Equal(s.t, idem.OutcomeDuplicate, rs[0].Outcome, "batched: %v", rs[0].Err)
			require.Equal(s.t, idem.OutcomeProcessed, rs[1].Outcome, "batched: %v", rs[1].Err)
		}
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 1, s.claims(key("evt-1")))
	})

	run("ClaimInAnEarlierBucketIsFound", func(s *suite[TTx]) {
		// The first claim was made two buckets ago (its partition, on a partitioned inbox, is
		// an earlier one); deliveries now, one by one and batched, must find it.
		s.wallet("w1")
		w := s.bucketWidth()
		then := time.Now().UTC().Add(-2 * w)
		early := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Now = func() time.Time { return then } })
		msg := PaymentMessageAt("acme", "evt-1", then.Add(-time.Minute), Payment{Wallet: "w1", Amount: 5})
		r := early.Process(s.ctx, msg)
		err := r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)

		late := s.consumer("ledger@v1", nil)
		for _, at := range []time.Time{msg.OccurredAt, time.Now().UTC()} {
			m := msg
			m.OccurredAt = at
			r = late.Process(s.ctx, m)
			err = r.Err
			require.NoError(s.t, err)
			require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome, "occurred at %v", at)
		}
		reuse := PaymentMessageAt("acme", "evt-1", msg.OccurredAt, Payment{Wallet: "w1", Amount: 6})
		err = late.Process(s.ctx, reuse).Err
		require.ErrorIs(s.t, err, idem.ErrKeyReuse)
		if _, ok := s.b.Store.(idemstore.BatchStore[TTx]); ok {
			bc := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Batch = idem.BatchConfig{Enabled: true} })
			rs := bc.ProcessBatch(s.ctx, []idem.Message{msg, reuse, PaymentMessageAt("acme", "evt-2", time.Now().UTC(), Payment{Wallet: "w1", Amount: 1})})
			require.Equal(s.t, idem.OutcomeDuplicate, rs[0].Outcome, "batched: %v", rs[0].Err)
			require.Equal(s.t, idem.OutcomeKeyReuse, rs[1].Outcome, "batched: %v", rs[1].Err)
			require.Equal(s.t, idem.OutcomeProcessed, rs[2].Outcome, "batched: %v", rs[2].Err)
		}
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 1, s.claims(key("evt-1")))
	})

	run("ConcurrentDeliveriesAcrossBucketsApplyOnce", func(s *suite[TTx]) {
		// Many workers deliver one event at once, stamped in three buckets and claimed at
		// three claim times, one by one and in batches: exactly one applies.
		s.wallet("w1")
		w := s.bucketWidth()
		base := time.Now().UTC()
		_, batching := s.b.Store.(idemstore.BatchStore[TTx])
		const n = 24
		type outcome struct {
			r   idem.Result
			err error
		}
		outcomes := make([]outcome, n)
		begin := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			shift := time.Duration(i%3) * w
			clock := func(cfg *idem.ConsumerConfig[TTx]) { cfg.Now = func() time.Time { return base.Add(-shift) } }
			single := s.consumer("ledger@v1", clock)
			var batch *idem.Consumer[TTx]
			if batching && i%2 == 1 {
				batch = s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
					clock(cfg)
					cfg.Batch = idem.BatchConfig{Enabled: true}
				})
			}
			msg := PaymentMessageAt("acme", "evt-race", base.Add(-shift-time.Duration(i)*time.Minute), Payment{Wallet: "w1", Amount: 7})
			own := PaymentMessageAt("acme", fmt.Sprintf("own-%d", i), base.Add(-shift), Payment{Wallet: "w1", Amount: 1000})
			wg.Go(func() {
				<-begin
				var r idem.Result
				if batch != nil {
					r = batch.ProcessBatch(s.ctx, []idem.Message{own, msg})[1]
				} else {
					r = single.Process(s.ctx, msg)
				}
				// A deadlock or serialization failure is retried, as Run would.
				for try := 0; try < 5 && r.Outcome == idem.OutcomeFailed && r.Class == idem.ClassTransient; try++ {
					r = single.Process(s.ctx, msg)
				}
				outcomes[i] = outcome{r, r.Err}
			})
		}
		close(begin)
		wg.Wait()
		processed := 0
		for i, o := range outcomes {
			switch o.r.Outcome {
			case idem.OutcomeProcessed:
				processed++
			case idem.OutcomeDuplicate:
			default:
				require.Failf(s.t, "unexpected outcome", "worker %d: %s: %v", i, o.r.Outcome, o.err)
			}
		}
		require.Equal(s.t, 1, processed, "exactly one delivery applies")
		require.EqualValues(s.t, 1, s.ledger("evt-race"))
		require.EqualValues(s.t, 1, s.claims(key("evt-race")))
	})
}
