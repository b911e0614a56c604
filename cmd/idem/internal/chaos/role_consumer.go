package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemnats"
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
	store, err := openRoleStore(ctx, a, a.Workers+2)
	if err != nil {
		return fmt.Errorf("chaos: consumer: %w", err)
	}
	defer store.close()
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
func consumeOnce(ctx context.Context, a RoleArgs, st *stats, store roleStore, open func(context.Context) (idem.Source, error)) error {
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
	if err := store.consume(ctx, a, st, src, window); err != nil {
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
type ledgerHandler[TX any] struct {
	seed                       int64
	transient                  float64
	stats                      *stats
	runID                      string
	insertLedger, creditWallet string
	exec                       func(ctx context.Context, tx TX, q string, args ...any) (int64, error)
}

func (h *ledgerHandler[TX]) credit(ctx context.Context, tx TX, msg idem.Message) error {
	if msg.Attempt == 1 && injectTransient(h.seed, h.transient, msg.EventID) {
		h.stats.add("transient", 1)
		return idem.Transient(errors.New("payment provider unavailable (injected transient failure)"))
	}
	var p payments.Payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.WalletID == nil || p.AmountCents == nil {
		return idem.Permanent(fmt.Errorf("%w: event %s: not a payment", idem.ErrInvalidPayload, msg.EventID))
	}
	if _, err := h.exec(ctx, tx, h.insertLedger, h.runID, msg.EventID, *p.WalletID, *p.AmountCents); err != nil {
		return fmt.Errorf("insert ledger row: %w", err)
	}
	n, err := h.exec(ctx, tx, h.creditWallet, *p.AmountCents, h.runID, *p.WalletID)
	if err != nil {
		return fmt.Errorf("credit wallet %s: %w", *p.WalletID, err)
	}
	return idem.ExpectRows(n, 1)
}

// statsObserver writes one counter line per settled delivery.
type statsObserver struct{ s *stats }

func (o statsObserver) Observe(ev idem.Observation) { o.s.add(string(ev.Outcome), 1) }
func (o statsObserver) Paused(string)               { o.s.add("paused", 1) }
