package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/retry"
)

// Headers idem adds to a replayed dead letter; the original headers are kept alongside.
const (
	// HeaderReplayOf carries the id of the dead letter a message replays.
	HeaderReplayOf = "Idem-Replay-Of"
	// HeaderReplayedBy carries the operator who replayed it.
	HeaderReplayedBy = "Idem-Replayed-By"
)

// Run receives deliveries from src and handles up to Workers of them at once until ctx ends
// (it then returns nil after a graceful shutdown) or the consumer pauses itself (ErrPaused).
//
// For each delivery: the core path of Process runs with the lease extended at a third of
// src.Lease(); the delivery is acked only after commit; a transient failure is nak'ed with the
// retry policy's delay; a permanent failure, key reuse or a spent budget writes a dead letter
// and then terminates the delivery. On shutdown Run stops fetching, lets in-flight deliveries
// finish within ShutdownTimeout, and naks what is left.
func (c *Consumer[TTx]) Run(ctx context.Context, src Source) error {
	if src == nil {
		return errors.New("idem: Run: source is nil")
	}
	if err := CheckRetention(c.cfg.Retention, c.cfg.RedeliveryWindow, c.cfg.Retry, src.Lease()); err != nil {
		return fmt.Errorf("idem: consumer %s with source %s: %w", c.cfg.Name, src.Name(), err)
	}
	r := &runner[TTx]{c: c, src: src}
	return r.run(ctx)
}

type runner[TTx any] struct {
	c      *Consumer[TTx]
	src    Source
	paused atomic.Bool
	// pauseOnce guards the pause log, metric and cancel.
	pauseOnce sync.Once
}

func (r *runner[TTx]) run(ctx context.Context) error {
	cfg := r.c.cfg
	// fetchCtx stops fetching on shutdown or pause; workCtx outlives it by ShutdownTimeout so
	// in-flight handlers can finish.
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()

	// In per-event mode each slot is one delivery; in batch mode each slot is one batch.
	deliveries := make(chan []Delivery)
	slots := make(chan struct{}, cfg.Workers)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ds := range deliveries {
				if cfg.Batch.Enabled {
					r.handleBatch(workCtx, ds, stopFetch)
				} else {
					r.handle(workCtx, ds[0], stopFetch)
				}
				<-slots
			}
		}()
	}

	backoff := retry.Policy{Base: 50 * time.Millisecond, Cap: 5 * time.Second, MaxAttempts: 1 << 30, MaxElapsed: 1<<62 - 1}
	failures := 0
fetch:
	for fetchCtx.Err() == nil {
		// Wait for at least one free worker, then ask for as many as are free.
		select {
		case slots <- struct{}{}:
		case <-fetchCtx.Done():
			break fetch
		}
		free := 1
	fill:
		for free < cfg.Workers && !cfg.Batch.Enabled {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break fill
			}
		}
		want := free
		if cfg.Batch.Enabled {
			want = cfg.Batch.Size
		}
		ds, err := r.src.Receive(fetchCtx, want)
		if err == nil && cfg.Batch.Enabled {
			ds = r.fillBatch(fetchCtx, ds)
		}
		if err != nil {
			for range free {
				<-slots
			}
			if fetchCtx.Err() != nil {
				break
			}
			failures++
			delay := backoff.Backoff(min(failures, 20), cfg.Rand)
			cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: receive failed",
				slog.String("consumer", cfg.Name), slog.String("queue", r.src.Name()),
				slog.String("error_type", r.c.classify(err).String()),
				slog.String("error", r.c.redactor.Text(err.Error())), slog.Duration("retry_in", delay))
			select {
			case <-time.After(delay):
			case <-fetchCtx.Done():
			}
			continue
		}
		failures = 0
		if cfg.Batch.Enabled {
			if fetchCtx.Err() != nil {
				for _, d := range ds {
					r.giveBack(workCtx, d)
				}
				<-slots
				break
			}
			deliveries <- ds
			continue
		}
		for i := len(ds); i < free; i++ {
			<-slots
		}
		for i, d := range ds {
			if fetchCtx.Err() != nil {
				// Shutting down or paused: give back what was fetched but not started.
				for _, rest := range ds[i:] {
					r.giveBack(workCtx, rest)
					<-slots
				}
				break
			}
			deliveries <- []Delivery{d}
		}
	}
	close(deliveries)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.ShutdownTimeout):
		// Cancel what is still running: transactions roll back and deliveries are nak'ed.
		stopWork()
		<-done
	}
	if r.paused.Load() {
		return fmt.Errorf("idem: consumer %s: %w", cfg.Name, ErrPaused)
	}
	return nil
}

// fillBatch tops up a partial batch for at most Batch.MaxWait.
func (r *runner[TTx]) fillBatch(ctx context.Context, ds []Delivery) []Delivery {
	size, wait := r.c.cfg.Batch.Size, r.c.cfg.Batch.MaxWait
	if wait <= 0 || len(ds) >= size {
		return ds
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for len(ds) < size {
		more, err := r.src.Receive(fctx, size-len(ds))
		if err != nil {
			break
		}
		ds = append(ds, more...)
	}
	return ds
}

// handleBatch processes a batch in one transaction and settles each delivery on its own.
func (r *runner[TTx]) handleBatch(workCtx context.Context, ds []Delivery, stopFetch context.CancelFunc) {
	cfg := r.c.cfg
	if r.paused.Load() {
		for _, d := range ds {
			r.giveBack(workCtx, d)
		}
		return
	}
	start := cfg.Now()
	msgs := make([]Message, len(ds))
	settles := make([]func(context.Context, TTx) error, len(ds))
	for i, d := range ds {
		msgs[i] = d.Message()
		if msgs[i].Attempt < 1 {
			msgs[i].Attempt = 1
		}
		if ta, ok := d.(TxAcker[TTx]); ok {
			settles[i] = ta.AckTx
		}
	}
	// One lost lease cancels the batch: the shared transaction cannot drop one event's
	// statements once they are under way, so all roll back and are retried.
	hctx, cancel := context.WithCancelCause(workCtx)
	defer cancel(nil)
	stopExtend := r.extendLease(hctx, cancel, ds...)
	results := r.c.processBatch(hctx, msgs, settles)
	stopExtend()
	for i, d := range ds {
		r.settle(workCtx, hctx, stopFetch, d, msgs[i], results[i], start, settles[i] != nil)
	}
}

// giveBack naks a delivery that was fetched but will not be handled.
func (r *runner[TTx]) giveBack(ctx context.Context, d Delivery) {
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.Nak(nctx, 0); err != nil {
		r.c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: nak on shutdown failed",
			append(logAttrs(r.c.cfg.Name, r.src.Name(), d.Message(), OutcomeAbandoned, 0),
				slog.String("error", r.c.redactor.Text(err.Error())))...)
	}
}

// handle runs one delivery to its verdict. workCtx ends only after the shutdown deadline;
// stopFetch pauses the consumer.
func (r *runner[TTx]) handle(workCtx context.Context, d Delivery, stopFetch context.CancelFunc) {
	cfg := r.c.cfg
	msg := d.Message()
	if msg.Attempt < 1 {
		msg.Attempt = 1
	}
	if r.paused.Load() {
		r.giveBack(workCtx, d)
		return
	}
	start := cfg.Now()

	hctx, cancel := context.WithCancelCause(workCtx)
	defer cancel(nil)
	stopExtend := r.extendLease(hctx, cancel, d)

	var settle func(context.Context, TTx) error
	if ta, ok := d.(TxAcker[TTx]); ok {
		settle = ta.AckTx
	}
	res := r.c.process(hctx, msg, settle)
	stopExtend()
	r.settle(workCtx, hctx, stopFetch, d, msg, res, start, settle != nil)
}

// settle tells the broker the verdict on one delivery: ack after commit, nak with the retry
// policy's delay, or dead letter then terminate. hctx is the context the delivery was processed
// under (its cause says whether the lease was lost); ackedInTx says the delivery was already
// acked inside the committed transaction.
func (r *runner[TTx]) settle(workCtx, hctx context.Context, stopFetch context.CancelFunc, d Delivery, msg Message, res Result, start time.Time, ackedInTx bool) {
	cfg := r.c.cfg
	if res.Key.Tenant != "" {
		msg.Tenant = res.Key.Tenant
	}
	ev := Event{Consumer: cfg.Name, Queue: r.src.Name(), Tenant: msg.Tenant, EventID: msg.EventID, Attempt: msg.Attempt}

	// Settle with the broker on a context that survives shutdown for a moment.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(workCtx), 10*time.Second)
	defer scancel()

	switch res.Outcome {
	case OutcomeProcessed, OutcomeDuplicate:
		ev.Outcome = res.Outcome
		if !ackedInTx {
			if err := d.Ack(sctx); err != nil {
				// The effect is committed; a redelivery will be recognised as a duplicate.
				r.log(sctx, slog.LevelWarn, "idem: ack failed after commit", msg, res.Outcome, start, err, ClassTransient)
			}
		}
		if res.Outcome == OutcomeProcessed && msg.Header(HeaderReplayOf) != "" {
			// An unparseable id marks only the key's replayed dead letters.
			dlID, _ := strconv.ParseInt(msg.Header(HeaderReplayOf), 10, 64)
			if ds, err := r.c.store.RecordRecovery(sctx, res.Key, dlID, cfg.Now()); err == nil {
				ev.Recovered = ds
			} else {
				r.log(sctx, slog.LevelWarn, "idem: record recovery failed", msg, res.Outcome, start, err, ClassTransient)
			}
		}
		r.finish(sctx, ev, msg, start, slog.LevelDebug, nil, res.Reason)
		return
	case OutcomeKeyReuse:
		r.deadLetter(sctx, d, msg, res, ReasonKeyReuse, ev, start)
		return
	}

	// Failed. Why, and whose move is it now?
	var pe *panicError
	switch {
	case errors.Is(context.Cause(hctx), ErrLeaseLost) || errors.Is(res.Err, ErrLeaseLost):
		// Another worker owns the delivery now; settling it would step on that worker.
		ev.Outcome, ev.ErrorType = OutcomeAbandoned, ClassTransient
		r.finish(sctx, ev, msg, start, slog.LevelWarn, res.Err, "")
		return
	case workCtx.Err() != nil:
		// Shutdown deadline passed while the handler ran: give it back at once.
		_ = d.Nak(sctx, 0)
		ev.Outcome, ev.ErrorType = OutcomeAbandoned, res.Class
		r.finish(sctx, ev, msg, start, slog.LevelWarn, res.Err, "")
		return
	case errors.As(res.Err, &pe) && cfg.OnPanic == PanicPause:
		r.pause(sctx, stopFetch, msg, pe)
		_ = d.Nak(sctx, 0)
		ev.Outcome, ev.ErrorType = OutcomeAbandoned, ClassPermanent
		r.finish(sctx, ev, msg, start, slog.LevelError, res.Err, "")
		return
	case res.Class == ClassPermanent:
		r.deadLetter(sctx, d, msg, res, res.Reason, ev, start)
		return
	}

	hint, _ := RetryHint(res.Err)
	first := msg.PublishedAt
	if first.IsZero() || first.After(start) {
		first = start
	}
	verdict := cfg.Retry.Decide(retry.Input{Attempt: msg.Attempt, FirstAt: first, Now: cfg.Now(), Hint: hint}, cfg.Rand)
	if !verdict.Retry {
		r.deadLetter(sctx, d, msg, res, ReasonRetriesExhausted, ev, start)
		return
	}
	ev.Outcome, ev.ErrorType, ev.Delay = OutcomeRetried, res.Class, verdict.Delay
	if err := d.Nak(sctx, verdict.Delay); err != nil {
		// The broker redelivers after the lease anyway; nothing is lost.
		r.log(sctx, slog.LevelWarn, "idem: nak failed", msg, OutcomeRetried, start, err, ClassTransient)
	}
	r.finish(sctx, ev, msg, start, slog.LevelInfo, res.Err, "")
}

// deadLetter records the delivery in the dead-letter queue, then terminates it. If the dead
// letter cannot be written the delivery is nak'ed instead, so nothing is lost.
func (r *runner[TTx]) deadLetter(ctx context.Context, d Delivery, msg Message, res Result, reason Reason, ev Event, start time.Time) {
	cfg := r.c.cfg
	if reason == "" {
		reason = ReasonPermanentError
	}
	now := cfg.Now()
	errText := ""
	if res.Err != nil {
		errText = r.c.redactor.Text(res.Err.Error())
	}
	fp := res.Fingerprint
	if fp.IsZero() {
		fp = rawFingerprint(msg)
	}
	dl := DeadLetter{
		Consumer:    cfg.Name,
		Message:     msg,
		Fingerprint: fp,
		Reason:      reason,
		Error:       errText,
		Attempts:    msg.Attempt,
		FirstFailed: now,
		LastFailed:  now,
		Status:      DeadLetterPending,
		Source:      r.src.Name(),
	}
	if _, err := r.c.store.InsertDeadLetter(ctx, dl); err != nil {
		delay := cfg.Retry.Backoff(msg.Attempt, cfg.Rand)
		_ = d.Nak(ctx, delay)
		ev.Outcome, ev.ErrorType, ev.Delay = OutcomeRetried, ClassTransient, delay
		r.finish(ctx, ev, msg, start, slog.LevelError, fmt.Errorf("idem: write dead letter for event %s: %w", msg.EventID, err), "")
		return
	}
	if err := d.Term(ctx); err != nil {
		// The dead letter is written; a redelivery updates the same pending row.
		r.log(ctx, slog.LevelWarn, "idem: terminate after dead letter failed", msg, OutcomeDeadLettered, start, err, ClassTransient)
	}
	ev.Outcome, ev.ErrorType, ev.Reason = OutcomeDeadLettered, res.Class, reason
	if ev.ErrorType == ClassUnknown {
		ev.ErrorType = ClassPermanent
	}
	r.finish(ctx, ev, msg, start, slog.LevelWarn, res.Err, reason)
}

// pause stops fetching once, logs at error level and tells the observer.
func (r *runner[TTx]) pause(ctx context.Context, stopFetch context.CancelFunc, msg Message, pe *panicError) {
	r.pauseOnce.Do(func() {
		r.paused.Store(true)
		stopFetch()
		r.c.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: consumer paused after handler panic",
			slog.String("consumer", r.c.cfg.Name), slog.String("queue", r.src.Name()),
			slog.String("event_id", msg.EventID), slog.String("tenant", msg.Tenant),
			slog.String("panic", r.c.redactor.Text(fmt.Sprint(pe.value))),
			slog.String("stack", string(pe.stack)))
		if r.c.cfg.Observer != nil {
			r.c.cfg.Observer.Paused(r.c.cfg.Name)
		}
	})
}

// extendLease extends the deliveries' leases every third of the source's lease time until stop
// is called; when an extension fails it cancels the handler's context with ErrLeaseLost. It
// arms a timer rather than starting a goroutine: most handlers finish before the first
// extension is due, and then it costs nothing but the timer.
func (r *runner[TTx]) extendLease(ctx context.Context, cancel context.CancelCauseFunc, ds ...Delivery) (stop func()) {
	every := r.src.Lease() / 3
	if every <= 0 {
		return func() {}
	}
	var mu sync.Mutex // held while extending, so stop waits for an extension under way
	stopped := false
	mu.Lock()
	var t *time.Timer
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || ctx.Err() != nil {
			return
		}
		for _, d := range ds {
			if err := d.Extend(ctx); err != nil {
				cancel(fmt.Errorf("%w: extend: %w", ErrLeaseLost, err))
				return
			}
		}
		t.Reset(every)
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// finish logs the settled delivery and tells the observer.
func (r *runner[TTx]) finish(ctx context.Context, ev Event, msg Message, start time.Time, level slog.Level, err error, reason Reason) {
	ev.Duration = r.c.cfg.Now().Sub(start)
	if r.c.cfg.Observer != nil {
		r.c.cfg.Observer.Observe(ev)
	}
	if !r.c.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs := logAttrs(r.c.cfg.Name, r.src.Name(), msg, ev.Outcome, ev.Duration)
	if err != nil {
		attrs = append(attrs, slog.String("error_type", ev.ErrorType.String()), slog.String("error", r.c.redactor.Text(err.Error())))
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", string(reason)))
	}
	if ev.Delay > 0 {
		attrs = append(attrs, slog.Duration("retry_in", ev.Delay))
	}
	r.c.cfg.Logger.LogAttrs(ctx, level, "idem: delivery "+string(ev.Outcome), attrs...)
}

// log writes one runtime line with the stable fields.
func (r *runner[TTx]) log(ctx context.Context, level slog.Level, text string, msg Message, outcome Outcome, start time.Time, err error, class Class) {
	attrs := logAttrs(r.c.cfg.Name, r.src.Name(), msg, outcome, r.c.cfg.Now().Sub(start))
	attrs = append(attrs, slog.String("error_type", class.String()), slog.String("error", r.c.redactor.Text(err.Error())))
	r.c.cfg.Logger.LogAttrs(ctx, level, text, attrs...)
}
