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
	"github.com/idemkit/idem/wire"
)

// Headers idem adds to a replayed dead letter; the original headers are kept alongside.
const (
	// HeaderReplayOf carries the id of the dead letter a message replays.
	HeaderReplayOf = wire.ReplayOf
	// HeaderReplayedBy carries the operator who replayed it.
	HeaderReplayedBy = wire.ReplayedBy
	// HeaderReplayEventTime carries, on a replay, the time of the original event (RFC 3339): the
	// earliest of its OccurredAt, its PublishedAt and its first failure. The consumer measures the
	// retention horizon from it, because a replay's own publish time is new: without it, a replay
	// of an event without OccurredAt, later than Retention after a copy was applied and its claim
	// collected, would pass too_old and apply the event again.
	HeaderReplayEventTime = wire.ReplayEventTime

	// HeaderReplayNewEventOf is set on a replay sent with idemdlq.ReplayParams.AsNewEvent: the event id of the
	// dead letter whose edited payload goes out under a new event id.
	HeaderReplayNewEventOf = wire.ReplayNewEventOf
)

// Run receives deliveries from src and handles up to Workers of them at once until ctx ends
// (it then returns nil after a graceful shutdown) or the consumer pauses itself (ErrPaused).
//
// For each delivery: the core path of Process runs with the lease extended at a third of
// src.Lease(); the delivery is acked only after commit; a transient failure is nak'ed with the
// retry policy's delay; a permanent failure, key reuse or a spent budget writes a dead letter
// and then terminates the delivery. On shutdown Run stops fetching, lets in-flight deliveries
// finish within ShutdownTimeout, and naks what is left.
//
// Unless Maintenance.Disabled, Run also deletes this consumer's expired claims every
// Maintenance.Interval while it fetches (see MaintenanceConfig), so no separate garbage-collection
// job is needed.
//
// Before it fetches, Run refuses a retention that does not cover the source's lease and the
// retry policy (CheckRetention) and a source whose delivery limit or redelivery window the
// consumer cannot keep its promise over (CheckSourceLimits).
func (c *Consumer[TTx]) Run(ctx context.Context, src Source) error {
	if src == nil {
		return errors.New("idem: Run: source is nil")
	}
	if err := CheckRetention(c.cfg.Claims.Retention, c.cfg.Claims.RedeliveryWindow, c.cfg.Failure.Retry, src.Lease()); err != nil {
		return fmt.Errorf("idem: consumer %s with source %s: %w", c.cfg.Name, src.Name(), err)
	}
	if err := CheckSourceLimits(src, c.cfg.Failure.Retry, c.cfg.Claims.RedeliveryWindow); err != nil {
		return fmt.Errorf("idem: consumer %s: %w", c.cfg.Name, err)
	}
	if oo, ok := c.cfg.Observe.Observer.(OwnerObserver); ok {
		oo.ConsumerOwner(c.cfg.Name, c.cfg.Owner)
	}
	r := &runner[TTx]{c: c, src: src}
	return r.run(ctx)
}

type runner[TTx any] struct {
	c      *Consumer[TTx]
	src    Source
	paused atomic.Bool
	// pauseOnce guards the pause log, metric and cancel; pauseCause is what Run returns with
	// ErrPaused (written once, before paused is set).
	pauseOnce  sync.Once
	pauseCause error
	// fetchCtx ends when Run stops fetching (shutdown or pause).
	fetchCtx context.Context
}

func (r *runner[TTx]) run(ctx context.Context) error {
	cfg := r.c.cfg
	// fetchCtx stops fetching on shutdown or pause; workCtx outlives it by ShutdownTimeout so
	// in-flight handlers can finish.
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	r.fetchCtx = fetchCtx
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()

	// Self-maintenance runs while Run fetches and is over before Run returns.
	maintained := make(chan struct{})
	go func() { defer close(maintained); r.c.maintain(fetchCtx) }()
	defer func() { stopFetch(); <-maintained }()

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
			delay := backoff.Backoff(min(failures, 20), cfg.Failure.Rand)
			cfg.Observe.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: receive failed",
				slog.String("consumer", cfg.Name), slog.String("queue", r.src.Name()),
				slog.String("error_type", r.c.classify(err).String()),
				slog.String("error", r.c.redactor.Text(err.Error())), slog.String("retry_in", delay.String()))
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
		return &PausedError{Consumer: cfg.Name, Cause: r.pauseCause}
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
	firsts := make([]time.Time, len(ds))
	settles := make([]func(context.Context, TTx) error, len(ds))
	for i, d := range ds {
		msgs[i], firsts[i] = r.begin(d, start)
		if ta, ok := d.(TxAcker[TTx]); ok {
			settles[i] = ta.AckTx
		}
	}
	// Each delivery settles under its own trace; the batch's transaction runs under the batch's.
	bctx, dctxs := workCtx, make([]context.Context, len(ds))
	var traces []DeliveryTrace
	if cfg.Observe.Tracer != nil {
		var endBatch func()
		bctx, endBatch = cfg.Observe.Tracer.StartBatch(workCtx, cfg.Name, r.src.Name(), msgs)
		defer endBatch()
		traces = make([]DeliveryTrace, len(ds))
	}
	for i := range ds {
		dctxs[i] = workCtx
		if traces != nil {
			traces[i] = cfg.Observe.Tracer.StartDelivery(bctx, cfg.Name, r.src.Name(), msgs[i])
			dctxs[i] = withDeliveryTrace(workCtx, traces[i])
		}
	}
	// One lost lease cancels the batch: the shared transaction cannot drop one event's
	// statements once they are under way, so all roll back and are retried.
	hctx, cancel := context.WithCancelCause(bctx)
	defer cancel(nil)
	stopExtend := r.extendLease(hctx, cancel, ds...)
	var results []Result
	if cfg.SetHandler != nil {
		results = r.c.processSet(hctx, msgs, settles, traces)
	} else {
		results = r.c.processBatch(hctx, msgs, settles, traces)
	}
	stopExtend()
	for i, d := range ds {
		r.settle(dctxs[i], hctx, stopFetch, d, msgs[i], results[i], start, firsts[i], settles[i] != nil)
	}
}

// begin returns the message of a delivery about to be handled and the time of its first
// attempt: the transport's record (FirstAttempter) or else the first attempt this consumer saw.
// The message's Attempt counts only deliveries that reached a verdict: those that ended without
// one (lost lease, give-back at shutdown or pause) and that this consumer saw are taken off.
func (r *runner[TTx]) begin(d Delivery, start time.Time) (Message, time.Time) {
	msg := d.Message()
	first, noVerdict := r.c.attempts.begin(makeAttemptKey(r.src.Name(), msg), start)
	if fa, ok := d.(FirstAttempter); ok {
		if t := fa.FirstAttempt(); !t.IsZero() && t.Before(first) {
			first = t
		}
	}
	msg.Attempt = max(msg.Attempt-noVerdict, 1)
	return msg, first
}

// noVerdict records that d ended without a verdict: it will come back, and this delivery does
// not spend an attempt of the retry budget.
func (r *runner[TTx]) noVerdict(d Delivery) {
	r.c.attempts.abandon(makeAttemptKey(r.src.Name(), d.Message()))
}

// verdict records that d's event reached a final verdict: the consumer forgets its attempts.
func (r *runner[TTx]) verdict(d Delivery) {
	r.c.attempts.forget(makeAttemptKey(r.src.Name(), d.Message()))
}

// giveBack naks a delivery that was fetched but will not be handled.
func (r *runner[TTx]) giveBack(ctx context.Context, d Delivery) {
	r.noVerdict(d)
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.Nak(nctx, 0); err != nil {
		r.c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: nak on shutdown failed",
			append(logAttrs(r.c.cfg.Name, r.src.Name(), d.Message(), OutcomeAbandoned, 0),
				slog.String("error", r.c.redactor.Text(err.Error())))...)
	}
}

// handle runs one delivery to its verdict. workCtx ends only after the shutdown deadline;
// stopFetch pauses the consumer.
func (r *runner[TTx]) handle(workCtx context.Context, d Delivery, stopFetch context.CancelFunc) {
	cfg := r.c.cfg
	if r.paused.Load() {
		r.giveBack(workCtx, d)
		return
	}
	start := cfg.Now()
	msg, first := r.begin(d, start)
	if cfg.Observe.Tracer != nil {
		workCtx = withDeliveryTrace(workCtx, cfg.Observe.Tracer.StartDelivery(workCtx, cfg.Name, r.src.Name(), msg))
	}

	hctx, cancel := context.WithCancelCause(workCtx)
	defer cancel(nil)
	stopExtend := r.extendLease(hctx, cancel, d)

	var settle func(context.Context, TTx) error
	if ta, ok := d.(TxAcker[TTx]); ok {
		settle = ta.AckTx
	}
	res := r.c.process(hctx, msg, settle)
	stopExtend()
	r.settle(workCtx, hctx, stopFetch, d, msg, res, start, first, settle != nil)
}

// settle tells the broker the verdict on one delivery: ack after commit, nak with the retry
// policy's delay, or dead letter then terminate. hctx is the context the delivery was processed
// under (its cause says whether the lease was lost); ackedInTx says the delivery was already
// acked inside the committed transaction; first is when the event was first attempted, where
// the retry budget's elapsed time starts.
func (r *runner[TTx]) settle(workCtx, hctx context.Context, stopFetch context.CancelFunc, d Delivery, msg Message, res Result, start, first time.Time, ackedInTx bool) {
	cfg := r.c.cfg
	if res.Key.Tenant != "" {
		msg.Tenant = res.Key.Tenant
	}
	ev := Observation{Consumer: cfg.Name, Owner: cfg.Owner, Queue: r.src.Name(), Tenant: BoundID(msg.Tenant), EventID: BoundID(msg.EventID), Attempt: msg.Attempt, Result: res.Outcome}

	// Settle with the broker on a context that survives shutdown for a moment.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(workCtx), 10*time.Second)
	defer scancel()

	switch res.Outcome {
	case OutcomeProcessed, OutcomeDuplicate:
		r.verdict(d)
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
	case OutcomeIgnored:
		// Settled like a duplicate: the claim committed, so a redelivery changes nothing.
		r.verdict(d)
		ev.Outcome, ev.Reason = OutcomeIgnored, res.Reason
		if !ackedInTx {
			if err := d.Ack(sctx); err != nil {
				r.log(sctx, slog.LevelWarn, "idem: ack failed after commit", msg, res.Outcome, start, err, ClassTransient)
			}
		}
		r.finish(sctx, ev, msg, start, slog.LevelInfo, nil, res.Reason)
		return
	case OutcomeKeyReuse:
		r.deadLetter(workCtx, stopFetch, d, msg, res, ReasonKeyReuse, ev, start)
		return
	}

	// Failed. Why, and whose move is it now?
	var pe *panicError
	switch {
	case errors.Is(context.Cause(hctx), ErrLeaseLost) || errors.Is(res.Err, ErrLeaseLost):
		// Another worker owns the delivery now; settling it would step on that worker.
		r.noVerdict(d)
		ev.Outcome, ev.Class = OutcomeAbandoned, ClassTransient
		r.finish(sctx, ev, msg, start, slog.LevelWarn, res.Err, "")
		return
	case workCtx.Err() != nil:
		// Shutdown deadline passed while the handler ran: give it back at once.
		r.noVerdict(d)
		_ = d.Nak(sctx, 0)
		ev.Outcome, ev.Class = OutcomeAbandoned, res.Class
		r.finish(sctx, ev, msg, start, slog.LevelWarn, res.Err, "")
		return
	case errors.As(res.Err, &pe) && cfg.Failure.OnPanic == PanicPause:
		r.pause(sctx, stopFetch, res.Err, "idem: consumer paused after handler panic",
			slog.String("event_id", BoundID(msg.EventID)), slog.String("tenant", BoundID(msg.Tenant)),
			slog.String("panic", r.c.redactor.Text(fmt.Sprint(pe.value))),
			slog.String("stack", string(pe.stack)))
		r.noVerdict(d)
		_ = d.Nak(sctx, 0)
		ev.Outcome, ev.Class = OutcomeAbandoned, ClassPermanent
		r.finish(sctx, ev, msg, start, slog.LevelError, res.Err, "")
		return
	case res.Class == ClassPermanent:
		r.deadLetter(workCtx, stopFetch, d, msg, res, res.Reason, ev, start)
		return
	}

	// The budget counts from the first attempt, never from PublishedAt: time spent waiting in
	// the broker (a consumer that is behind) spends nothing.
	hint, _ := RetryHint(res.Err)
	verdict := cfg.Failure.Retry.Decide(retry.Input{Attempt: msg.Attempt, FirstAt: first, Now: cfg.Now(), Hint: hint}, cfg.Failure.Rand)
	if !verdict.Retry {
		r.deadLetter(workCtx, stopFetch, d, msg, res, ReasonRetriesExhausted, ev, start)
		return
	}
	ev.Outcome, ev.Class, ev.Delay = OutcomeRetried, res.Class, verdict.Delay
	if err := d.Nak(sctx, verdict.Delay); err != nil {
		// The broker redelivers after the lease anyway; nothing is lost.
		r.log(sctx, slog.LevelWarn, "idem: nak failed", msg, OutcomeRetried, start, err, ClassTransient)
	}
	r.finish(sctx, ev, msg, start, slog.LevelInfo, res.Err, "")
}

// deadLetterBackoff spaces the retries of a dead-letter write that failed: capped exponential
// with full jitter, from 100ms up to 5s.
var deadLetterBackoff = retry.Policy{Base: 100 * time.Millisecond, Cap: 5 * time.Second, MaxAttempts: 1 << 30, MaxElapsed: 1<<62 - 1}

// deadLetter records the delivery in the dead-letter queue, then terminates it. A dead letter
// that cannot be written is never a silent drop nor an endless loop: the delivery is kept (its
// lease extended) while the write is retried with capped backoff, each failure is logged and
// observed (OutcomeDeadLetterFailed), and after DeadLetterFailuresToPause failures in a row the
// delivery is given back without a verdict and the consumer pauses. A shutdown, a pause or a
// lost lease meanwhile also ends the retries without a verdict.
func (r *runner[TTx]) deadLetter(workCtx context.Context, stopFetch context.CancelFunc, d Delivery, msg Message, res Result, reason Reason, ev Observation, start time.Time) {
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
		fp = RawFingerprint(msg)
	}
	// A hostile identity is stored in its bounded form, under a fingerprint of the raw one.
	stored, replaced := storableDeadLetterMessage(msg)
	if replaced {
		fp = identityFingerprint(msg)
	}
	if reason == ReasonUnauthenticated {
		stored, fp = untrustedDeadLetter(stored, fp)
	}
	dl := DeadLetter{
		Consumer:    cfg.Name,
		Message:     stored,
		Fingerprint: fp,
		Reason:      reason,
		Error:       errText,
		Attempts:    msg.Attempt,
		FirstFailed: now,
		LastFailed:  now,
		Status:      DeadLetterPending,
		Source:      r.src.Name(),
		Owner:       cfg.Owner,
	}
	if tr, ok := d.(TopicReporter); ok {
		dl.Topic = tr.Topic()
	}
	// Settle with the broker on a context that survives shutdown for a moment.
	settleCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(workCtx), 10*time.Second)
	}

	// The lease is kept while the write is retried; lctx ends when it is lost.
	lctx, lcancel := context.WithCancelCause(workCtx)
	defer lcancel(nil)
	var stopExtend func()
	defer func() {
		if stopExtend != nil {
			stopExtend()
		}
	}()
	for failures := 0; ; {
		ictx, icancel := settleCtx()
		_, err := r.c.store.InsertDeadLetter(ictx, dl)
		icancel()
		if err == nil {
			break
		}
		failures++
		werr := withEvent(msg.EventID, fmt.Errorf("idem: write dead letter (failure %d in a row, reason %s): %w", failures, reason, err))
		fev := ev
		fev.Outcome, fev.Class, fev.Reason = OutcomeDeadLetterFailed, r.c.classify(err), reason
		if fev.Class == ClassUnknown {
			fev.Class = ClassTransient
		}
		giveBack := ""
		var delay time.Duration
		switch {
		case failures >= cfg.Failure.DeadLetterFailuresToPause:
			giveBack = "pause"
		case r.paused.Load() || r.fetchCtx.Err() != nil:
			giveBack = "stopping"
		default:
			delay = deadLetterBackoff.Backoff(failures, cfg.Failure.Rand)
			fev.Delay = delay
		}
		r.finish(workCtx, fev, msg, start, slog.LevelError, werr, reason)
		if giveBack == "" {
			if stopExtend == nil {
				// Renew the lease now (the handler may have used most of it), then every third.
				if xerr := d.Extend(lctx); xerr != nil {
					lcancel(fmt.Errorf("%w: extend: %w", ErrLeaseLost, xerr))
				}
				stopExtend = r.extendLease(lctx, lcancel, d)
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				continue
			case <-lctx.Done():
				t.Stop()
				if errors.Is(context.Cause(lctx), ErrLeaseLost) {
					// Another worker owns the delivery now; it will try the dead letter again.
					r.noVerdict(d)
					ev.Outcome, ev.Class = OutcomeAbandoned, ClassTransient
					r.finish(workCtx, ev, msg, start, slog.LevelWarn, werr, "")
					return
				}
				giveBack = "stopping" // the shutdown deadline passed
			case <-r.fetchCtx.Done():
				t.Stop()
				giveBack = "stopping"
			}
		}
		// Give the delivery back without a verdict: the broker keeps it for a later try.
		if giveBack == "pause" {
			r.pause(workCtx, stopFetch, werr, "idem: consumer paused: dead letters cannot be written",
				slog.String("event_id", BoundID(msg.EventID)), slog.String("tenant", BoundID(msg.Tenant)),
				slog.Int("failures", failures))
		}
		r.noVerdict(d)
		sctx, scancel := settleCtx()
		if nerr := d.Nak(sctx, 0); nerr != nil {
			r.log(sctx, slog.LevelWarn, "idem: give back after failed dead letter failed", msg, OutcomeAbandoned, start, nerr, ClassTransient)
		}
		scancel()
		ev.Outcome, ev.Class = OutcomeAbandoned, fev.Class
		r.finish(workCtx, ev, msg, start, slog.LevelError, werr, "")
		return
	}
	if stopExtend != nil {
		stopExtend()
		stopExtend = nil
	}
	r.verdict(d)
	sctx, scancel := settleCtx()
	defer scancel()
	if err := d.Term(sctx); err != nil {
		// The dead letter is written; a redelivery updates the same pending row.
		r.log(sctx, slog.LevelWarn, "idem: terminate after dead letter failed", msg, OutcomeDeadLettered, start, err, ClassTransient)
	}
	ev.Outcome, ev.Class, ev.Reason = OutcomeDeadLettered, res.Class, reason
	if ev.Class == ClassUnknown {
		ev.Class = ClassPermanent
	}
	r.finish(sctx, ev, msg, start, slog.LevelWarn, res.Err, reason)
}

// pause stops fetching once, logs text at error level with attrs and the cause, and tells the
// observer. Run then returns a *PausedError with cause.
func (r *runner[TTx]) pause(ctx context.Context, stopFetch context.CancelFunc, cause error, text string, attrs ...slog.Attr) {
	r.pauseOnce.Do(func() {
		r.pauseCause = cause
		r.paused.Store(true)
		stopFetch()
		attrs = append([]slog.Attr{slog.String("consumer", r.c.cfg.Name), slog.String("queue", r.src.Name()),
			slog.String("error", r.c.redactor.Text(cause.Error()))}, attrs...)
		r.c.cfg.Observe.Logger.LogAttrs(ctx, slog.LevelError, text, attrs...)
		if r.c.cfg.Observe.Observer != nil {
			r.c.cfg.Observe.Observer.Paused(r.c.cfg.Name)
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
func (r *runner[TTx]) finish(ctx context.Context, ev Observation, msg Message, start time.Time, level slog.Level, err error, reason Reason) {
	ev.Duration = r.c.cfg.Now().Sub(start)
	if r.c.cfg.Observe.Observer != nil {
		r.c.cfg.Observe.Observer.Observe(ev)
	}
	if dt := deliveryTraceFrom(ctx); dt != nil {
		dt.Observe(ev)
	}
	if !r.c.cfg.Observe.Logger.Enabled(ctx, level) {
		return
	}
	attrs := logAttrs(r.c.cfg.Name, r.src.Name(), msg, ev.Outcome, ev.Duration)
	if err != nil {
		attrs = append(attrs, slog.String("error_type", ev.Class.String()), slog.String("error", r.c.redactor.Text(err.Error())))
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", string(reason)))
	}
	if ev.Delay > 0 {
		attrs = append(attrs, slog.String("retry_in", ev.Delay.String()))
	}
	r.c.cfg.Observe.Logger.LogAttrs(ctx, level, "idem: delivery "+string(ev.Outcome), attrs...)
}

// log writes one runtime line with the stable fields.
func (r *runner[TTx]) log(ctx context.Context, level slog.Level, text string, msg Message, outcome Outcome, start time.Time, err error, class Class) {
	attrs := logAttrs(r.c.cfg.Name, r.src.Name(), msg, outcome, r.c.cfg.Now().Sub(start))
	attrs = append(attrs, slog.String("error_type", class.String()), slog.String("error", r.c.redactor.Text(err.Error())))
	r.c.cfg.Observe.Logger.LogAttrs(ctx, level, text, attrs...)
}
