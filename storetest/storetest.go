package storetest

import (
	"context"
	"encoding/json"
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

// Payment is the event the suite's handler applies: credit Amount to Wallet.
type Payment struct {
	Wallet string `json:"wallet"`
	Amount int64  `json:"amount"`
	// Note is fingerprinted unless excluded; tests change it to provoke key reuse.
	Note string `json:"note,omitempty"`
	// DeliveredAt is volatile: tests exclude it from the fingerprint.
	DeliveredAt string `json:"delivered_at,omitempty"`
}

// PaymentMessage builds a payment.captured message for tenant with the given event id.
func PaymentMessage(tenant, eventID string, p Payment) idem.Message {
	body, err := json.Marshal(p)
	if err != nil {
		panic(err) // cannot happen for this struct
	}
	return idem.Message{EventID: eventID, Tenant: tenant, Type: "payment.captured", Payload: body, Attempt: 1}
}

// CreditHandler returns the suite's handler: decode, credit the wallet, and insist the wallet
// existed, so a missing wallet is a precondition failure that rolls back.
func CreditHandler[TTx any](b Bundle[TTx]) idem.Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		var p Payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return idem.Permanent(err)
		}
		n, err := b.Credit(ctx, tx, msg.EventID, p.Wallet, p.Amount)
		if err != nil {
			return err
		}
		return idem.ExpectRows(n, 1)
	}
}

type suite[TTx any] struct {
	t   *testing.T
	b   Bundle[TTx]
	ctx context.Context
	// at is the occurrence time of the subtest's events: one instant, so that on a partitioned
	// inbox every delivery of an event lands in the same bucket.
	at time.Time
}

// payment is PaymentMessage with the subtest's occurrence time.
func (s *suite[TTx]) payment(tenant, eventID string, p Payment) idem.Message {
	m := PaymentMessage(tenant, eventID, p)
	m.OccurredAt = s.at
	return m
}

func (s *suite[TTx]) consumer(name string, mod func(*idem.ConsumerConfig[TTx])) *idem.Consumer[TTx] {
	s.t.Helper()
	cfg := idem.ConsumerConfig[TTx]{Name: name, Handler: CreditHandler(s.b)}
	if bs, ok := s.b.Store.(idemstore.BucketedStore); ok && bs.ClaimBucket() > 0 {
		// A partitioned inbox keeps claims for its partition retention; the consumer's may not
		// be longer.
		cfg.Claims.Retention, cfg.Claims.RedeliveryWindow = bs.ClaimRetention(), time.Hour
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := idem.NewConsumer(s.b.Store, cfg)
	require.NoError(s.t, err)
	return c
}

func (s *suite[TTx]) wallet(id string) {
	s.t.Helper()
	require.NoError(s.t, s.b.CreateWallet(s.ctx, id))
}

func (s *suite[TTx]) ledger(eventID string) int64 {
	s.t.Helper()
	n, err := s.b.LedgerRows(s.ctx, eventID)
	require.NoError(s.t, err)
	return n
}

func (s *suite[TTx]) balance(wallet string) int64 {
	s.t.Helper()
	n, err := s.b.Balance(s.ctx, wallet)
	require.NoError(s.t, err)
	return n
}

func (s *suite[TTx]) claims(k idem.Key) int64 {
	s.t.Helper()
	n, err := s.b.ClaimRows(s.ctx, k)
	require.NoError(s.t, err)
	return n
}

// Exercise runs the conformance suite against stores built by factory. Every check applies a
// non-idempotent effect, so any double application shows up in the ledger and the balance.
func Exercise[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	run := func(name string, fn func(s *suite[TTx])) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(&suite[TTx]{t: t, b: factory(t), ctx: ctx, at: time.Now().UTC()})
		})
	}

	replayChecks(run)
	keyChecks(run)
	ignoreChecks(run)

	run("DuplicateDeliveryAppliesOnce", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		msg := s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 500})
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
	})

	run("ConcurrentDeliveriesApplyOnce", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		msg := s.payment("acme", "evt-race", Payment{Wallet: "w1", Amount: 7})
		const n = 32
		var processed, duplicates atomic.Int64
		errs := make(chan error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := c.Process(s.ctx, msg)
				err := r.Err
				if err != nil {
					errs <- err
					return
				}
				switch r.Outcome {
				case idem.OutcomeProcessed:
					processed.Add(1)
				case idem.OutcomeDuplicate:
					duplicates.Add(1)
				default:
					errs <- fmt.Errorf("unexpected outcome %s", r.Outcome)
				}
			}()
		}
		close(start)
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

	run("KeyReuseAppliesNothing", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		err := c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 100})).Err
		require.NoError(s.t, err)
		r := c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 999}))
		err = r.Err
		require.ErrorIs(s.t, err, idem.ErrKeyReuse)
		require.Equal(s.t, idem.OutcomeKeyReuse, r.Outcome)
		require.Equal(s.t, idem.ReasonKeyReuse, r.Reason)
		var kr *idem.KeyReuseError
		require.True(s.t, errors.As(err, &kr))
		require.Equal(s.t, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}, kr.Key)
		require.NotEqual(s.t, kr.Claimed, kr.Received)
		require.Contains(s.t, err.Error(), kr.Claimed.Short())
		require.Contains(s.t, err.Error(), kr.Received.Short())
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 100, s.balance("w1"))
	})

	run("HandlerErrorLeavesNoClaim", func(s *suite[TTx]) {
		s.wallet("w1")
		var fail atomic.Bool
		fail.Store(true)
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			inner := cfg.Handler
			cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
				// Write first, then fail: the write must roll back with the claim.
				if err := inner(ctx, tx, msg); err != nil {
					return err
				}
				if fail.Load() {
					return errors.New("downstream timeout")
				}
				return nil
			}
		})
		msg := s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 42})
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.Error(s.t, err)
		require.Equal(s.t, idem.OutcomeFailed, r.Outcome)
		require.Equal(s.t, idem.ClassTransient, r.Class, "unknown errors are transient by default")
		require.EqualValues(s.t, 0, s.claims(r.Key), "no claim left behind")
		require.EqualValues(s.t, 0, s.ledger("evt-1"))
		require.EqualValues(s.t, 0, s.balance("w1"))

		fail.Store(false)
		msg.Attempt = 2
		r = c.Process(s.ctx, msg)
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		require.EqualValues(s.t, 1, s.claims(r.Key))
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 42, s.balance("w1"))
	})

	run("HandlerPanicRollsBack", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			inner := cfg.Handler
			cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
				if err := inner(ctx, tx, msg); err != nil {
					return err
				}
				panic("handler bug")
			}
		})
		r := c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 42}))
		err := r.Err
		require.Error(s.t, err)
		require.Equal(s.t, idem.ReasonHandlerPanic, r.Reason)
		require.Equal(s.t, idem.ClassPermanent, r.Class)
		require.EqualValues(s.t, 0, s.claims(r.Key))
		require.EqualValues(s.t, 0, s.ledger("evt-1"))
	})

	run("PreconditionFailureRollsBack", func(s *suite[TTx]) {
		// Wallet "missing" does not exist: the ledger insert happens, the balance update
		// touches no row, ExpectRows fails and both roll back with the claim.
		c := s.consumer("ledger@v1", nil)
		r := c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "missing", Amount: 42}))
		err := r.Err
		require.ErrorIs(s.t, err, idem.ErrNoRows)
		require.Equal(s.t, idem.ClassPermanent, r.Class)
		require.Equal(s.t, idem.ReasonPermanentError, r.Reason)
		require.EqualValues(s.t, 0, s.ledger("evt-1"))
		require.EqualValues(s.t, 0, s.claims(r.Key))
	})

	run("TwoConsumersEachApplyOnce", func(s *suite[TTx]) {
		s.wallet("w1")
		ledger := s.consumer("ledger@v1", nil)
		notifier := s.consumer("notifier@v1", nil)
		msg := s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 10})
		for range 2 {
			for _, c := range []*idem.Consumer[TTx]{ledger, notifier} {
				err := c.Process(s.ctx, msg).Err
				require.NoError(s.t, err)
			}
		}
		require.EqualValues(s.t, 2, s.ledger("evt-1"), "one effect per consumer")
		require.EqualValues(s.t, 20, s.balance("w1"))
	})

	run("NewEffectVersionReappliesOnce", func(s *suite[TTx]) {
		s.wallet("w1")
		msg := s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 10})
		v1 := s.consumer("ledger@v1", nil)
		v2 := s.consumer("ledger@v2", nil)
		for _, c := range []*idem.Consumer[TTx]{v1, v1, v2, v2, v1} {
			err := c.Process(s.ctx, msg).Err
			require.NoError(s.t, err)
		}
		require.EqualValues(s.t, 2, s.ledger("evt-1"), "v1 once, v2 once")
		require.EqualValues(s.t, 20, s.balance("w1"))
	})

	run("SameEventIDInTwoTenants", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", nil)
		for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
			err := c.Process(s.ctx, s.payment(tenant, "evt-1", Payment{Wallet: "w1", Amount: 3})).Err
			require.NoError(s.t, err)
		}
		require.EqualValues(s.t, 2, s.ledger("evt-1"))
		require.EqualValues(s.t, 6, s.balance("w1"))
	})

	run("GarbageCollectionRemovesOnlyExpired", func(s *suite[TTx]) {
		if bs, ok := s.b.Store.(idemstore.BucketedStore); ok && bs.ClaimBucket() > 0 {
			s.t.Skip("a partitioned inbox collects whole partitions (storetest.ExercisePartitioned and the store's own tests cover it)")
		}
		s.wallet("w1")
		now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
		clock := now
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Claims.Retention = 48 * time.Hour
			cfg.Claims.RedeliveryWindow = time.Hour
			cfg.Now = func() time.Time { return clock }
		})
		// Three claims 72h, 47h and 1h old; retention 48h keeps the last two.
		ages := []time.Duration{72 * time.Hour, 47 * time.Hour, time.Hour}
		for i, age := range ages {
			clock = now.Add(-age)
			err := c.Process(s.ctx, s.payment("acme", fmt.Sprintf("evt-%d", i), Payment{Wallet: "w1", Amount: 1})).Err
			require.NoError(s.t, err)
		}
		clock = now
		n, err := c.CollectGarbage(s.ctx, 1) // batch of one: GC must loop
		require.NoError(s.t, err)
		require.Equal(s.t, 1, n)
		require.EqualValues(s.t, 0, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-0"}))
		require.EqualValues(s.t, 1, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}))
		require.EqualValues(s.t, 1, s.claims(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-2"}))
		// Other consumers' claims are not this consumer's to delete.
		other := s.consumer("notifier@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Now = func() time.Time { return now.Add(-100 * time.Hour) }
		})
		err = other.Process(s.ctx, s.payment("acme", "evt-x", Payment{Wallet: "w1", Amount: 1})).Err
		require.NoError(s.t, err)
		n, err = c.CollectGarbage(s.ctx, 10)
		require.NoError(s.t, err)
		require.Equal(s.t, 0, n)
		require.EqualValues(s.t, 1, s.claims(idem.Key{Tenant: "acme", Consumer: "notifier@v1", EventID: "evt-x"}))
	})

	run("TooOldEventIsRefused", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Claims.Retention = 48 * time.Hour
			cfg.Claims.RedeliveryWindow = time.Hour
		})
		msg := s.payment("acme", "evt-old", Payment{Wallet: "w1", Amount: 1})
		msg.OccurredAt = time.Now().Add(-49 * time.Hour)
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.ErrorIs(s.t, err, idem.ErrTooOld)
		require.Equal(s.t, idem.ReasonTooOld, r.Reason)
		require.EqualValues(s.t, 0, s.ledger("evt-old"))
	})

	run("FingerprintIgnoresKeyOrderAndWhitespace", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Input.Fingerprint.Exclude = []string{"delivered_at"}
		})
		base := idem.Message{EventID: "evt-1", Tenant: "acme", Type: "payment.captured", OccurredAt: s.at}
		for i, tc := range []struct {
			payload string
			want    idem.Outcome
		}{
			{`{"wallet":"w1","amount":5,"delivered_at":"2026-01-01T00:00:00Z"}`, idem.OutcomeProcessed},
			{"{ \"amount\" : 5,\n  \"wallet\": \"w1\" ,\"delivered_at\":\"2026-01-02T00:00:00Z\"}", idem.OutcomeDuplicate},
			{`{"delivered_at":"x","wallet":"\u0077\u0031","amount":5}`, idem.OutcomeDuplicate},
			{`{"wallet":"w1","amount":6}`, idem.OutcomeKeyReuse},
			{`{"wallet":"w1","amount":5.0}`, idem.OutcomeKeyReuse}, // numbers kept as written
		} {
			msg := base
			msg.Payload = []byte(tc.payload)
			r := c.Process(s.ctx, msg)
			require.Equal(s.t, tc.want, r.Outcome, "delivery %d: %s", i, tc.payload)
		}
		require.EqualValues(s.t, 1, s.ledger("evt-1"))
		require.EqualValues(s.t, 5, s.balance("w1"))
	})

	run("FingerprintFieldsSubset", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Input.Fingerprint.Fields = []string{"wallet", "amount"}
		})
		r := c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 5, Note: "first"}))
		err := r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeProcessed, r.Outcome)
		r = c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 5, Note: "second"}))
		err = r.Err
		require.NoError(s.t, err)
		require.Equal(s.t, idem.OutcomeDuplicate, r.Outcome, "a field outside the fingerprint may change")
		err = c.Process(s.ctx, s.payment("acme", "evt-1", Payment{Wallet: "w1", Amount: 6, Note: "second"})).Err
		require.ErrorIs(s.t, err, idem.ErrKeyReuse, "a fingerprinted field may not")
		require.EqualValues(s.t, 5, s.balance("w1"))
	})

	run("InvalidInputIsPermanent", func(s *suite[TTx]) {
		s.wallet("w1")
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Input.MaxPayloadBytes = 64 })
		for _, tc := range []struct {
			name string
			msg  idem.Message
		}{
			{"empty event id", idem.Message{Tenant: "acme", Type: "payment.captured", Payload: []byte(`{}`)}},
			{"oversized", idem.Message{EventID: "e", Tenant: "acme", Payload: []byte(`{"wallet":"w1","amount":1,"note":"` + string(make([]byte, 100)) + `"}`)}},
			{"duplicate keys", idem.Message{EventID: "e2", Tenant: "acme", Payload: []byte(`{"amount":1,"amount":2}`)}},
			{"invalid json for handler", idem.Message{EventID: "e3", Tenant: "acme", Payload: []byte(`{"wallet":`)}},
		} {
			r := c.Process(s.ctx, tc.msg)
			err := r.Err
			require.Error(s.t, err, tc.name)
			require.Equal(s.t, idem.ClassPermanent, r.Class, tc.name)
			require.Contains(s.t, []idem.Reason{idem.ReasonInvalidPayload, idem.ReasonPermanentError}, r.Reason, tc.name)
		}
		require.EqualValues(s.t, 0, s.balance("w1"))
	})

	run("DeadLetterUpsertKeepsOnePending", func(s *suite[TTx]) {
		st := s.b.Store
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		msg := s.payment("acme", "evt-dl", Payment{Wallet: "w1", Amount: 1})
		msg.Headers = map[string]string{"Authorization": "Bearer x"}
		fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
		require.NoError(s.t, err)
		dl := idem.DeadLetter{Consumer: "ledger@v1", Message: msg, Fingerprint: fp, Reason: idem.ReasonPermanentError,
			Error: "boom", Attempts: 1, FirstFailed: now, LastFailed: now, Status: idem.DeadLetterPending, Source: "q"}
		first, err := st.InsertDeadLetter(s.ctx, dl)
		require.NoError(s.t, err)
		require.NotZero(s.t, first.ID)
		dl.Attempts, dl.Error, dl.LastFailed, dl.FirstFailed = 2, "boom again", now.Add(time.Minute), now.Add(time.Minute)
		second, err := st.InsertDeadLetter(s.ctx, dl)
		require.NoError(s.t, err)
		require.Equal(s.t, first.ID, second.ID)
		got, err := st.GetDeadLetter(s.ctx, first.ID)
		require.NoError(s.t, err)
		require.Equal(s.t, 2, got.Attempts)
		require.Equal(s.t, "boom again", got.Error)
		require.True(s.t, got.FirstFailed.Equal(now), "first failure kept: %v", got.FirstFailed)
		require.True(s.t, got.LastFailed.Equal(now.Add(time.Minute)))
		require.Equal(s.t, msg.Payload, got.Message.Payload)
		require.Equal(s.t, msg.Headers, got.Message.Headers, "original headers kept for replay")
		require.Equal(s.t, fp, got.Fingerprint)

		list, err := st.ListDeadLetters(s.ctx, idemstore.DeadLetterFilter{Consumer: "ledger@v1", Status: idem.DeadLetterPending})
		require.NoError(s.t, err)
		require.Len(s.t, list, 1)

		changed, err := st.SetDeadLetterStatus(s.ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{first.ID}, Status: idem.DeadLetterReplayed, Actor: "ops", Reason: "fixed", Now: now.Add(time.Hour)})
		require.NoError(s.t, err)
		require.Equal(s.t, []int64{first.ID}, changed)
		changed, err = st.SetDeadLetterStatus(s.ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{first.ID}, Status: idem.DeadLetterDiscarded, Actor: "ops", Reason: "again", Now: now.Add(time.Hour)})
		require.NoError(s.t, err)
		require.Empty(s.t, changed, "only pending dead letters change")
		audit, err := st.ListAudit(s.ctx, 10)
		require.NoError(s.t, err)
		require.Len(s.t, audit, 1)
		require.Equal(s.t, "ops", audit[0].Actor)
		require.Equal(s.t, first.ID, audit[0].DeadLetterID)
		require.Equal(s.t, "evt-dl", audit[0].EventID)

		rec, err := st.RecordRecovery(s.ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-dl"}, 0, now.Add(2*time.Hour))
		require.NoError(s.t, err)
		require.Equal(s.t, []time.Duration{2 * time.Hour}, rec)

		// The replay outran the replayer: the consumer records recovery while the dead letter is
		// still pending; the replayer's mark afterwards keeps the recovery time.
		other := dl
		other.Message.EventID = "evt-fast"
		fast, err := st.InsertDeadLetter(s.ctx, other)
		require.NoError(s.t, err)
		fastKey := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-fast"}
		rec, err = st.RecordRecovery(s.ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-dl"}, fast.ID, now.Add(2*time.Hour))
		require.NoError(s.t, err)
		require.Empty(s.t, rec, "a dead letter of another key is never marked")
		rec, err = st.RecordRecovery(s.ctx, fastKey, fast.ID, now.Add(3*time.Hour))
		require.NoError(s.t, err)
		require.Equal(s.t, []time.Duration{now.Add(3 * time.Hour).Sub(fast.FirstFailed)}, rec, "the pending dead letter named by the replay is marked")
		changed, err = st.SetDeadLetterStatus(s.ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{fast.ID}, Status: idem.DeadLetterReplayed, Actor: "ops", Reason: "fixed", Now: now.Add(4 * time.Hour)})
		require.NoError(s.t, err)
		require.Equal(s.t, []int64{fast.ID}, changed)
		got, err = st.GetDeadLetter(s.ctx, fast.ID)
		require.NoError(s.t, err)
		require.True(s.t, got.RecoveredAt.Equal(now.Add(3*time.Hour)), "recovery kept after the replayer's mark: %v", got.RecoveredAt)
		rec, err = st.RecordRecovery(s.ctx, fastKey, fast.ID, now.Add(5*time.Hour))
		require.NoError(s.t, err)
		require.Empty(s.t, rec, "recorded once")

		// After the replay, a new failure of the same delivery is a new pending row.
		third, err := st.InsertDeadLetter(s.ctx, dl)
		require.NoError(s.t, err)
		require.NotEqual(s.t, first.ID, third.ID)
		_, err = st.GetDeadLetter(s.ctx, 999999)
		require.ErrorIs(s.t, err, idem.ErrNotFound)
	})
	run("DeadLettersOfLongestAndHostileIdentitiesAreStored", testDeadLettersOfLongestAndHostileIdentities[TTx])
}
