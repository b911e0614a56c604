package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/retry"
)

// consumerRetry is the consumers' retry policy: attempts are generous, and the time budget is
// RoleArgs.RetryBudget — short (RetryBudgetDefault), so that a database outage can outlast it,
// yet longer than any cut, stall, kill or broker restart, which must never spend an event's
// budget (a valid event would end as retries_exhausted).
func consumerRetry(budget time.Duration) retry.Policy {
	if budget <= 0 {
		budget = RetryBudgetDefault
	}
	return retry.Policy{MaxAttempts: 1000, MaxElapsed: budget, Base: 20 * time.Millisecond, Cap: time.Second}
}

// runConsumer runs ledger@v1 over the run's shared durable until ctx ends.
func runConsumer(ctx context.Context, a RoleArgs, st *stats) error {
	if a.Workers <= 0 {
		a.Workers = WorkersDefault
	}
	pool, err := openPool(ctx, a.PostgresURL, int32(a.Workers)+2)
	if err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	defer pool.Close()
	store, err := idempg.NewWithConfig(pool, storeConfig(a.Schema, a.InboxBucket))
	if err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	defer store.Close()
	open, closeBroker, err := consumerSource(a)
	if err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	defer closeBroker()

	// A consumer that pauses itself (a dead letter it cannot write, say) returns ErrPaused and
	// leaves its message in the broker; an orchestrator starts it again. So does this loop,
	// after a moment, in the same process: a pause is not an unexpected exit.
	for {
		err := consumeOnce(ctx, a, st, store, open)
		if err == nil || !errors.Is(err, idem.ErrPaused) {
			return err
		}
		st.add("paused_restart", 1)
		a.Logger.LogAttrs(ctx, slog.LevelWarn, "chaos: consumer paused itself; starting it again", slog.String("error", err.Error()))
		if !sleepCtx(ctx, time.Second) {
			return nil
		}
	}
}

// consumeOnce runs the consumer until ctx ends (nil) or it pauses itself (ErrPaused).
func consumeOnce(ctx context.Context, a RoleArgs, st *stats, store *idempg.Store, open func(context.Context) (idem.Source, error)) error {
	t := newTables(a.Schema)
	h := &ledgerHandler{
		seed: a.Seed, transient: a.Transient, stats: st,
		insertLedger: t.sql(`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents) VALUES ($1, $2, $3, $4)`),
		creditWallet: t.sql(`UPDATE {wallets} SET balance_cents = balance_cents + $1 WHERE run_id = $2 AND id = $3`),
		runID:        a.RunID,
	}
	// The broker may be down (restarting) when the process starts: keep trying.
	var (
		src idem.Source
		err error
	)
	for failures := 1; ; failures++ {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		src, err = open(sctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		a.Logger.LogAttrs(ctx, slog.LevelWarn, "chaos: consumer: open source", slog.String("error", err.Error()))
		if !sleepCtx(ctx, backoff(failures)) {
			return nil
		}
	}
	defer src.Close()
	// A RabbitMQ queue can hold a message longer than the stream's MaxAge (its TTL, a delay
	// tier, consumer_timeout): the window must cover what the source says (the default
	// Retention of a week covers both).
	window := max(streamMaxAge, streamDuplicates)
	if w, ok := src.(idem.RedeliveryWindower); ok {
		window = max(window, w.RedeliveryWindow())
	}
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{
		Name:             payments.ConsumerName,
		Handler:          h.credit,
		Validator:        idem.ValidatorFunc(payments.Validate),
		Retry:            consumerRetry(a.RetryBudget),
		RedeliveryWindow: window,
		Workers:          a.Workers,
		ShutdownTimeout:  5 * time.Second,
		Logger:           a.Logger,
		Observer:         statsObserver{st},
	})
	if err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	if err := consumer.Run(ctx, src); err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	return nil
}

// consumerSource returns how a consumer opens its source on the run's broker, and what closes
// the connection it shares.
func consumerSource(a RoleArgs) (func(context.Context) (idem.Source, error), func(), error) {
	if a.BrokerURL != "" {
		b, err := openRoleBroker(a)
		if err != nil {
			return nil, nil, err
		}
		return b.source, b.close, nil
	}
	js, closeNATS, err := connectJetStream(a.NATSURL, a.Name)
	if err != nil {
		return nil, nil, err
	}
	open := func(ctx context.Context) (idem.Source, error) {
		return idemnats.NewSource(ctx, js, idemnats.SourceConfig{
			Stream:     a.Stream,
			Subject:    a.Subject,
			Durable:    a.Durable,
			AckWait:    ackWait,
			MaxDeliver: -1, // the retry policy decides; the broker never gives up silently
			MaxWait:    500 * time.Millisecond,
		})
	}
	return open, closeNATS, nil
}

// ledgerHandler is ledger@v1: one ledger row and the wallet's balance, in the transaction that
// holds the event's claim. Chosen events fail their first attempt on purpose.
type ledgerHandler struct {
	seed                       int64
	transient                  float64
	stats                      *stats
	runID                      string
	insertLedger, creditWallet string
}

func (h *ledgerHandler) credit(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
	if msg.Attempt == 1 && injectTransient(h.seed, h.transient, msg.EventID) {
		h.stats.add("transient", 1)
		return idem.Transient(errors.New("payment provider unavailable (injected transient failure)"))
	}
	var p payments.Payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.WalletID == nil || p.AmountCents == nil {
		return idem.Permanent(fmt.Errorf("%w: event %s: not a payment", idem.ErrInvalidPayload, msg.EventID))
	}
	if _, err := tx.Exec(ctx, h.insertLedger, h.runID, msg.EventID, *p.WalletID, *p.AmountCents); err != nil {
		return fmt.Errorf("insert ledger row: %w", err)
	}
	tag, err := tx.Exec(ctx, h.creditWallet, *p.AmountCents, h.runID, *p.WalletID)
	if err != nil {
		return fmt.Errorf("credit wallet %s: %w", *p.WalletID, err)
	}
	return idem.ExpectRows(tag.RowsAffected(), 1)
}

// statsObserver writes one counter line per settled delivery.
type statsObserver struct{ s *stats }

func (o statsObserver) Observe(ev idem.Event) { o.s.add(string(ev.Outcome), 1) }
func (o statsObserver) Paused(string)         { o.s.add("paused", 1) }
