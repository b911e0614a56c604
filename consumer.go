package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtype"
)

// Consumer runs the path of one event: verify, validate, then claim and apply in one
// transaction. Process handles a single delivery; Run drives workers over a Source with
// retries, dead letters and lease extension. A Consumer is safe for concurrent use.
type Consumer[TTx any] struct {
	store    idemstore.Store[TTx]
	cfg      ConsumerConfig[TTx]
	redactor *idemredact.Redactor
	// bucket is the store's claim bucket (0 for a plain inbox).
	bucket time.Duration
	// batchStore is the store when it can batch (nil otherwise), asserted once.
	batchStore idemstore.BatchStore[TTx]
	// attempts remembers first attempts and deliveries without a verdict, for the retry budget.
	attempts *attemptMemo
}

// NewConsumer validates cfg (after WithDefaults) and returns a consumer over store.
func NewConsumer[TTx any](store idemstore.Store[TTx], cfg ConsumerConfig[TTx]) (*Consumer[TTx], error) {
	if store == nil {
		return nil, errors.New("idem: NewConsumer: store is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bs, _ := store.(idemstore.BatchStore[TTx])
	if cfg.Batch.Enabled && bs == nil {
		return nil, fmt.Errorf("idem: consumer config: %w", errNotBatchStore)
	}
	c := &Consumer[TTx]{store: store, cfg: cfg, redactor: idemredact.New(cfg.Failure.Redact), batchStore: bs, attempts: newAttemptMemo(attemptMemoSize)}
	if b, ok := store.(idemstore.BucketedStore); ok && b.ClaimBucket() > 0 {
		c.bucket = b.ClaimBucket()
		if r := b.ClaimRetention(); cfg.Claims.Retention > r {
			return nil, fmt.Errorf("idem: consumer config: Retention (%v) is longer than the store's partition retention (%v): an event could be accepted after its claim's partition was dropped", cfg.Claims.Retention, r)
		}
	}
	return c, nil
}

// Name returns the consumer's full name with effect version.
func (c *Consumer[TTx]) Name() string { return c.cfg.Name }

// Config returns the consumer's configuration with defaults applied.
func (c *Consumer[TTx]) Config() ConsumerConfig[TTx] { return c.cfg }

// Result is what Process did with one delivery.
type Result struct {
	Outcome Outcome
	// Key is the claim key (set once the tenant is known).
	Key Key
	// Fingerprint of the message (zero if it could not be computed).
	Fingerprint Fingerprint
	// Err is the failure for OutcomeFailed and OutcomeKeyReuse.
	Err error
	// Class is the classification of Err.
	Class Class
	// Reason is the dead-letter reason Err calls for when it is permanent, or the handler's
	// reason when Outcome is OutcomeIgnored.
	Reason Reason

	// bucket is the claim's time bucket on a partitioned inbox.
	bucket time.Time
}

// Process runs one delivery of msg through the core path and reports the outcome. It does not
// retry, nak or dead-letter: Run does that with the result. A failure is Result.Err, as it is
// for each result of ProcessSet and ProcessBatch: `if err := c.Process(ctx, msg).Err; err != nil`.
//
// Processed, duplicate and ignored (the handler returned Ignore: the claim and an audit row
// commit, the handler's effect does not) are successes. Key reuse returns a *KeyReuseError (errors.Is
// ErrKeyReuse). Any other failure rolls back the claim with the effect, so the next delivery
// applies the event once. Process opens and commits its own transaction; ProcessTx is its twin
// in a transaction the caller owns.
func (c *Consumer[TTx]) Process(ctx context.Context, msg Message) Result {
	return c.process(ctx, msg, nil)
}

// panicError carries a recovered handler panic through the transaction's rollback.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panic: %v", p.value) }

// failResult fills res as a failure of err, classifying it; reason overrides the derived one.
func (c *Consumer[TTx]) failResult(res Result, err error, reason Reason) Result {
	res.Outcome, res.Err = OutcomeFailed, withEvent(res.Key.EventID, err)
	res.Class = c.classify(err)
	if reason == "" {
		reason = c.reasonFor(err, res.Class)
	}
	res.Reason = reason
	return res
}

// prepare runs the checks that come before the transaction: identity, size, authentication
// (which may set the tenant), validation, the retention horizon and the fingerprint. It returns
// the message as verified, the result so far, and false when the delivery already failed.
func (c *Consumer[TTx]) prepare(ctx context.Context, msg Message, now time.Time) (Message, Result, bool) {
	res := Result{Key: Key{Tenant: msg.Tenant, Consumer: c.cfg.Name, EventID: msg.EventID}}
	fail := func(err error, reason Reason) (Message, Result, bool) {
		return msg, c.failResult(res, err, reason), false
	}

	// Identity and size come first: without them nothing else is meaningful or safe.
	if err := ValidateIdentity(msg); err != nil {
		return fail(Permanent(err), ReasonInvalidPayload)
	}
	if len(msg.Payload) > c.cfg.Input.MaxPayloadBytes {
		return fail(Permanent(fmt.Errorf("%w: payload is %d bytes, limit %d", ErrInvalidPayload, len(msg.Payload), c.cfg.Input.MaxPayloadBytes)), ReasonInvalidPayload)
	}

	// Trust after verification: the tenant comes from the verified channel.
	if c.cfg.Input.Authenticator != nil {
		// Only this copy goes to the heap (the Authenticator gets a pointer), and only when an
		// Authenticator is set: the batched paths prepare every event.
		verified := msg
		err := c.cfg.Input.Authenticator.Authenticate(ctx, &verified)
		msg = verified
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				err = fmt.Errorf("%w: %w", ErrUnauthenticated, err)
			}
			return fail(Permanent(err), ReasonUnauthenticated)
		}
		// The verified tenant is an identity too: an Authenticator may not set a hostile one.
		if err := idemtype.ValidateField(FieldTenant, msg.Tenant); err != nil {
			return fail(Permanent(fmt.Errorf("%w: %w", ErrUnauthenticated, err)), ReasonUnauthenticated)
		}
		res.Key.Tenant = msg.Tenant
	}
	if c.cfg.Input.Validator != nil {
		if err := c.cfg.Input.Validator.Validate(ctx, msg); err != nil {
			if !errors.Is(err, ErrInvalidPayload) {
				err = fmt.Errorf("%w: %w", ErrInvalidPayload, err)
			}
			return fail(Permanent(err), ReasonInvalidPayload)
		}
	}

	t, err := msg.EventTime()
	if err != nil {
		return fail(Permanent(fmt.Errorf("%w: %w", ErrInvalidPayload, err)), ReasonInvalidPayload)
	}
	if !t.IsZero() && now.Sub(t) > c.cfg.Claims.Retention {
		return fail(Permanent(fmt.Errorf("%w: event time %s is older than retention %v", ErrTooOld, t.UTC().Format(time.RFC3339), c.cfg.Claims.Retention)), ReasonTooOld)
	}

	if c.bucket > 0 {
		if msg.OccurredAt.IsZero() {
			return fail(Permanent(fmt.Errorf("%w: no occurrence time, which the partitioned inbox needs to place its claim", ErrInvalidPayload)), ReasonInvalidPayload)
		}
		res.bucket = msg.OccurredAt.UTC().Truncate(c.bucket)
	}

	fp, err := ComputeFingerprint(msg, c.cfg.Input.Fingerprint)
	if err != nil {
		return fail(Permanent(err), ReasonInvalidPayload)
	}
	res.Fingerprint = fp
	return msg, res, true
}

// ProcessTx runs the full core path of one delivery (identity, size, authentication,
// validation, retention, fingerprint, claim and handler) inside tx, a transaction the caller
// began and will end. It is the twin of Process for tests and for callers that own the
// transaction (package idemtest runs it in a transaction that is always rolled back).
//
// The caller decides what happened:
//   - commit tx after a nil Result.Err: the claim and the handler's effect stand together, and a
//     later delivery of the same event is a duplicate;
//   - roll back tx: nothing happened, neither claim nor effect, and the next delivery applies
//     the event as if it were the first;
//   - after a non-nil Result.Err the caller must roll back: tx may hold the claim and part of the
//     effect of a handler that failed (the key-reuse and checks-before-the-claim failures leave
//     it untouched, but rolling back is always right).
//
// ProcessTx neither retries, nor acks, nor dead-letters, nor extends a lease; Run never uses
// it (Run's transactions are its own, via Process's path).
func (c *Consumer[TTx]) ProcessTx(ctx context.Context, tx TTx, msg Message) Result {
	now := c.cfg.Now()
	msg, res, ok := c.prepare(ctx, msg, now)
	if !ok {
		return res
	}
	// The handler runs in a savepoint when the store has them, so that an Ignore can roll back
	// its effect alone and keep the claim in the caller's transaction.
	status, ignored, err := c.applyTx(ctx, tx, msg, res, now, nil, c.batchStore != nil)
	if ignored != nil && err == nil {
		return ignoredResult(res, ignored.Reason)
	}
	if _, ok := ignoredOf(err); ok {
		err = fmt.Errorf("idem: ProcessTx: the handler returned Ignore but the store (%s) has no savepoints to roll back its effect alone: roll the transaction back", c.store.Dialect())
	}
	return c.finishResult(ctx, res, status, err)
}

// process is Process with an optional in-transaction settle hook (TxAcker).
func (c *Consumer[TTx]) process(ctx context.Context, msg Message, settle func(ctx context.Context, tx TTx) error) Result {
	now := c.cfg.Now()
	msg, res, ok := c.prepare(ctx, msg, now)
	if !ok {
		return res
	}
	var status idemstore.ClaimStatus
	err := c.store.InTx(ctx, func(ctx context.Context, tx TTx) (err error) {
		status, _, err = c.applyTx(ctx, tx, msg, res, now, settle, false)
		return err
	})
	if ig, ok := ignoredOf(err); ok && status == idemstore.ClaimNew {
		// The handler's effect rolled back with the claim; claim again and record the ignore.
		return c.commitIgnore(ctx, res, ig.Reason, now, settle)
	}
	return c.finishResult(ctx, res, status, err)
}

// applyTx claims the prepared message's key in tx, runs the handler on a new claim and, when
// set, settles the delivery in tx. It returns the claim's status and the error that must roll
// tx back. With savepoint (the store must be a BatchStore) the handler runs in a savepoint: an
// Ignore then rolls back to it, the ignore is recorded in tx and returned, and the error is nil.
func (c *Consumer[TTx]) applyTx(ctx context.Context, tx TTx, msg Message, res Result, now time.Time, settle func(ctx context.Context, tx TTx) error, savepoint bool) (idemstore.ClaimStatus, *IgnoredError, error) {
	cr, err := c.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: res.Key, Fingerprint: res.Fingerprint, Now: now, Bucket: res.bucket})
	if err != nil {
		return 0, nil, err // the store's error names the claim
	}
	var ignored *IgnoredError
	switch cr.Status {
	case idemstore.ClaimNew:
		if !savepoint {
			if err := c.runHandler(ctx, tx, msg); err != nil {
				return cr.Status, nil, err
			}
			break
		}
		err := c.batchStore.SavepointTx(ctx, tx, func(ctx context.Context, tx TTx) error { return c.runHandler(ctx, tx, msg) })
		ig, ok := ignoredOf(err)
		if err != nil && (!ok || errors.Is(err, ErrTxEnded)) {
			return cr.Status, nil, err
		}
		if ok {
			if err := c.recordIgnore(ctx, tx, res.Key, ig.Reason, now); err != nil {
				return cr.Status, nil, err
			}
			ignored = ig
		}
	case idemstore.ClaimDuplicate:
		// Nothing to apply; the transaction only settles the delivery (if it can).
	case idemstore.ClaimConflict:
		return cr.Status, nil, &KeyReuseError{Key: res.Key, Claimed: cr.Existing, Received: res.Fingerprint}
	default:
		return cr.Status, nil, fmt.Errorf("idem: claim: store returned invalid status %d", cr.Status)
	}
	if settle != nil {
		if err := settle(ctx, tx); err != nil {
			return cr.Status, nil, fmt.Errorf("idem: settle in transaction: %w", err)
		}
	}
	return cr.Status, ignored, nil
}

// finishResult turns the transaction's outcome into the delivery's result.
func (c *Consumer[TTx]) finishResult(ctx context.Context, res Result, status idemstore.ClaimStatus, err error) Result {
	switch {
	case err == nil && status == idemstore.ClaimNew:
		res.Outcome = OutcomeProcessed
	case err == nil && status == idemstore.ClaimDuplicate:
		res.Outcome = OutcomeDuplicate
	case errors.Is(err, ErrKeyReuse):
		res.Outcome, res.Err, res.Class, res.Reason = OutcomeKeyReuse, withEvent(res.Key.EventID, err), ClassPermanent, ReasonKeyReuse
	default:
		if err == nil {
			err = fmt.Errorf("idem: claim ended in status %s", status)
		}
		if ctxErr := context.Cause(ctx); ctxErr != nil && errors.Is(ctxErr, ErrLeaseLost) && !errors.Is(err, ErrLeaseLost) {
			err = fmt.Errorf("%w: %w", ErrLeaseLost, err)
		}
		return c.failResult(res, err, "")
	}
	return res
}

// runHandler calls the handler, turning a panic into a *panicError so the transaction rolls back.
// With a HandlerTimeout, the handler's context ends after it, and an error the handler returns
// after that names the timeout (ErrHandlerTimeout) and is transient.
func (c *Consumer[TTx]) runHandler(ctx context.Context, tx TTx, msg Message) (err error) {
	if t := c.cfg.Observe.Tracer; t != nil {
		var end func(error)
		ctx, end = t.StartHandler(ctx, msg)
		// Deferred first, so it runs after the recover below has turned a panic into err.
		defer func() { end(err) }()
	}
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return c.bounded(ctx, func(ctx context.Context) error { return c.cfg.Handler(ctx, tx, msg) })
}

// bounded runs a handler call under HandlerTimeout (when set): an error the call returns after
// the timeout names it (ErrHandlerTimeout) and is transient.
func (c *Consumer[TTx]) bounded(ctx context.Context, call func(ctx context.Context) error) error {
	d := c.cfg.Failure.HandlerTimeout
	if d <= 0 {
		return call(ctx)
	}
	hctx, cancel := context.WithTimeoutCause(ctx, d, ErrHandlerTimeout)
	defer cancel()
	err := call(hctx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(hctx), ErrHandlerTimeout) {
		if _, ignored := ignoredOf(err); !ignored {
			err = Transient(fmt.Errorf("%w (HandlerTimeout %v): %w", ErrHandlerTimeout, d, err))
		}
	}
	return err
}

// classify chains the configured classifier, the store's and the default one.
func (c *Consumer[TTx]) classify(err error) Class {
	if err == nil {
		return ClassUnknown
	}
	var pe *panicError
	if errors.As(err, &pe) {
		return ClassPermanent
	}
	if c.cfg.Failure.Classifier != nil {
		if cl := c.cfg.Failure.Classifier(err); cl != ClassUnknown {
			return cl
		}
	}
	// Explicit marks from the handler win over driver codes.
	var mark *classified
	if errors.As(err, &mark) {
		return mark.class
	}
	if cl := c.store.ClassifyError(err); cl != ClassUnknown {
		return cl
	}
	if cl := Classify(err); cl != ClassUnknown {
		return cl
	}
	if c.cfg.Failure.UnknownIsPermanent {
		return ClassPermanent
	}
	return ClassTransient
}

// reasonFor picks the dead-letter reason a permanent error calls for.
func (c *Consumer[TTx]) reasonFor(err error, class Class) Reason {
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		return ReasonHandlerPanic
	case errors.Is(err, ErrKeyReuse):
		return ReasonKeyReuse
	case errors.Is(err, ErrUnauthenticated):
		return ReasonUnauthenticated
	case errors.Is(err, ErrTooOld):
		return ReasonTooOld
	case errors.Is(err, ErrInvalidPayload):
		return ReasonInvalidPayload
	case class == ClassPermanent:
		return ReasonPermanentError
	}
	return ""
}

// logAttrs are the stable log fields of one delivery.
func logAttrs(consumer, queue string, msg Message, outcome Outcome, d time.Duration) []slog.Attr {
	return []slog.Attr{
		slog.String("event_id", BoundID(msg.EventID)),
		slog.String("tenant", BoundID(msg.Tenant)),
		slog.String("consumer", consumer),
		slog.String("queue", queue),
		slog.Int("attempt", msg.Attempt),
		slog.String("outcome", string(outcome)),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
	}
}
