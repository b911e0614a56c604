package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/retry"
)

// Defaults for ConsumerConfig.
const (
	// RetentionDefault keeps claims a week: long enough for broker redelivery, stream replays and
	// the retry policy's worst case in most deployments.
	RetentionDefault = 7 * 24 * time.Hour
	// RedeliveryWindowDefault is how long after its first delivery an event is assumed able to come
	// back (broker redelivery, stream retention, operator replay) when the config does not say.
	RedeliveryWindowDefault = 24 * time.Hour
	// WorkersDefault is the number of deliveries Run handles at once.
	WorkersDefault = 8
	// ShutdownTimeoutDefault bounds how long Run waits for in-flight deliveries after its context ends.
	ShutdownTimeoutDefault = 30 * time.Second
	// MaxPayloadBytesDefault refuses payloads above 1 MiB as invalid_payload.
	MaxPayloadBytesDefault = 1 << 20
	// DeadLetterFailuresToPauseDefault is how many failed writes of one dead letter in a row
	// pause the consumer.
	DeadLetterFailuresToPauseDefault = 5
	// GCBatchDefault bounds one garbage-collection batch.
	GCBatchDefault = 1000
	// MaintenanceIntervalDefault is how often Run deletes expired claims: claims live for days,
	// so an hour keeps the table near its steady size at the cost of one indexed delete.
	MaintenanceIntervalDefault = time.Hour
)

// MaintenanceConfig configures the claim garbage collection Run does on its own. Every
// Interval (the first time after a random part of it, so that processes started together do
// not delete together) Run deletes this consumer's claims older than Retention through
// Consumer.CollectGarbage. It is safe to run in every process: each delete is a bounded batch of
// rows already past the horizon, and two processes deleting the same rows delete them once.
type MaintenanceConfig struct {
	// Disabled turns self-maintenance off; call Consumer.CollectGarbage on a schedule instead.
	Disabled bool
	// Interval is the time between two collections (default MaintenanceIntervalDefault).
	Interval time.Duration
	// Batch bounds one delete statement (default GCBatchDefault).
	Batch int
}

func (m MaintenanceConfig) withDefaults() MaintenanceConfig {
	if m.Interval == 0 {
		m.Interval = MaintenanceIntervalDefault
	}
	if m.Batch == 0 {
		m.Batch = GCBatchDefault
	}
	return m
}

// Handler applies one event's business effect inside tx, the transaction that also holds the
// event's claim. It must do all its database writes through tx and no external side effects
// (enqueue those to the outbox instead). Returning an error rolls everything back.
type Handler[TTx any] func(ctx context.Context, tx TTx, msg Message) error

// Authenticator verifies the channel a message arrived on (broker credentials, an HMAC
// signature) and sets msg.Tenant to the verified tenant. An error, or a payload claiming another
// tenant, makes the delivery an unauthenticated dead letter.
type Authenticator interface {
	Authenticate(ctx context.Context, msg *Message) error
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, msg *Message) error

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, msg *Message) error { return f(ctx, msg) }

// Validator checks a message before its fields are used (a JSON Schema, required fields). A
// failure is permanent: the delivery becomes an invalid_payload dead letter.
type Validator interface {
	Validate(ctx context.Context, msg Message) error
}

// ValidatorFunc adapts a function to Validator.
type ValidatorFunc func(ctx context.Context, msg Message) error

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, msg Message) error { return f(ctx, msg) }

// PanicPolicy decides what a recovered handler panic does.
type PanicPolicy int

const (
	// PanicDeadLetter dead-letters the message with reason handler_panic and goes on.
	PanicDeadLetter PanicPolicy = iota
	// PanicPause stops fetching, leaves the message in the broker and makes Run return ErrPaused:
	// a handler bug should not drain the whole stream into the dead-letter queue.
	PanicPause
)

// ConsumerConfig configures a Consumer. The top-level fields are what every consumer sets;
// the groups (Input, Failure, Batch, Claims, Observe) hold the rest and read well left at their
// zero value. Zero fields take the documented defaults; Validate names the field of every error
// by its path ("Failure.Retry.MaxAttempts").
type ConsumerConfig[TTx any] struct {
	// Name is the consumer name with its effect version, "ledger@v1" (required). Bumping the
	// version deliberately re-applies events already processed by the old version.
	Name string
	// Handler applies the effect of one event (required unless SetHandler is set, in which
	// case it defaults to SetHandler called with a set of one).
	Handler Handler[TTx]
	// SetHandler, when set, applies the effects of a batch's new events at once (see
	// Consumer.ProcessSet): with Batch.Enabled, Run processes each batch through it, and falls
	// back to Handler event by event when a set fails. Handler and SetHandler must apply the
	// same effect.
	SetHandler SetHandler[TTx]
	// Owner names who is paged for this consumer: a team or on-call rotation ("payments",
	// "ledger-oncall"). It is stored with each dead letter and is the owner label of idemprom's
	// metrics, which the shipped alerts route on, so it must be low-cardinality: at most
	// MaxOwnerBytes of lower-case letters, digits, '-' and '_', starting with a letter. Empty
	// means no owner (alerts go to the default route).
	Owner string
	// Workers is how many deliveries Run handles at once (default WorkersDefault).
	Workers int
	// ShutdownTimeout bounds the wait for in-flight deliveries when Run's context ends; what is
	// left is nak'ed (default ShutdownTimeoutDefault).
	ShutdownTimeout time.Duration

	// Input checks each message before the handler sees it.
	Input InputConfig
	// Failure decides what a handler error, timeout or panic does.
	Failure FailureConfig
	// Batch turns on batched processing (one transaction per batch of deliveries).
	Batch BatchConfig
	// Claims bounds how long claims are kept and how they are collected.
	Claims ClaimConfig
	// Observe sends each settled delivery to logs, metrics and traces.
	Observe ObserveConfig

	// Now returns the current time (default time.Now); tests move it.
	Now func() time.Time
}

// InputConfig holds the checks a message passes before the handler sees it: who sent it, whether
// it is well formed, how large it may be, and which content tells a duplicate from key reuse.
type InputConfig struct {
	// Authenticator, when set, verifies each message and decides its tenant.
	Authenticator Authenticator
	// Validator, when set, checks each message before the handler sees it.
	Validator Validator
	// Fingerprint chooses the content that tells a duplicate from key reuse.
	Fingerprint FingerprintConfig
	// MaxPayloadBytes refuses larger payloads as invalid_payload (default MaxPayloadBytesDefault).
	MaxPayloadBytes int
}

// FailureConfig decides what a failed delivery does: which errors are permanent, how often and
// when a transient one is retried, how long a handler may run, what a panic does, and how dead
// letters are written.
type FailureConfig struct {
	// Classifier, when set, is consulted before the store's and the default classifier.
	Classifier Classifier
	// UnknownIsPermanent dead-letters errors no classifier recognises instead of retrying them.
	UnknownIsPermanent bool
	// Retry bounds retries (see package retry for defaults).
	Retry retry.Policy
	// HandlerTimeout, when positive, bounds one run of the handler: its context ends after it,
	// so a handler stuck on a lock or a slow dependency gives its transaction (and, on SQLite,
	// the database's write lock) back, and the delivery is retried with an error that says
	// ErrHandlerTimeout. Zero (the default) leaves the handler bounded only by the lease and
	// shutdown.
	HandlerTimeout time.Duration
	// OnPanic decides what a handler panic does (default PanicDeadLetter).
	OnPanic PanicPolicy
	// DeadLetterFailuresToPause is how many failed writes of one dead letter in a row make the
	// consumer give the delivery back without a verdict and pause (Run returns a *PausedError)
	// rather than let the broker's delivery limit drop it (default
	// DeadLetterFailuresToPauseDefault). Between failures the delivery is kept, its lease
	// extended, and the write retried after a capped, jittered backoff (100ms doubling to 5s).
	DeadLetterFailuresToPause int
	// Redact configures the masking of secrets in dead-letter error summaries and logs.
	Redact idemredact.Config
	// Rand is the retry jitter source (default a private math/rand/v2 source).
	Rand retry.Rand
}

// ClaimConfig bounds the life of claims: how long they are kept, the window in which an event
// can come back (which the retention must cover), and the collection that deletes them after.
type ClaimConfig struct {
	// Retention is how long claims are kept (default RetentionDefault). It must cover
	// RedeliveryWindow plus the retry policy's worst case: a claim deleted while its event can
	// still come back would let the event apply twice.
	Retention time.Duration
	// RedeliveryWindow is the longest time after publishing in which the broker or an operator
	// can bring an event back (stream max age, duplicate window, replay); default
	// RedeliveryWindowDefault. Run refuses a source that reports a longer window
	// (CheckSourceLimits).
	RedeliveryWindow time.Duration
	// Maintenance configures the claim garbage collection Run does by itself (on by default,
	// hourly).
	Maintenance MaintenanceConfig
}

// ObserveConfig sends what the consumer does to logs, metrics and traces.
type ObserveConfig struct {
	// Logger receives one line per settled delivery (default slog.Default()).
	Logger *slog.Logger
	// Observer receives one Observation per settled delivery, for metrics (package idemprom).
	Observer Observer
	// Tracer, when set, traces each delivery and its handler (package idemotel: OpenTelemetry).
	Tracer Tracer
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c ConsumerConfig[TTx]) WithDefaults() ConsumerConfig[TTx] {
	c.Failure.Retry = c.Failure.Retry.WithDefaults()
	if c.Handler == nil && c.SetHandler != nil {
		c.Handler = setOfOne(c.SetHandler)
	}
	if c.Claims.Retention == 0 {
		c.Claims.Retention = RetentionDefault
	}
	if c.Claims.RedeliveryWindow == 0 {
		c.Claims.RedeliveryWindow = RedeliveryWindowDefault
	}
	if c.Batch.Enabled {
		c.Batch = c.Batch.withDefaults()
	}
	if c.Workers == 0 {
		c.Workers = WorkersDefault
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if c.Input.MaxPayloadBytes == 0 {
		c.Input.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	if c.Failure.DeadLetterFailuresToPause == 0 {
		c.Failure.DeadLetterFailuresToPause = DeadLetterFailuresToPauseDefault
	}
	c.Claims.Maintenance = c.Claims.Maintenance.withDefaults()
	if c.Observe.Logger == nil {
		c.Observe.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports every invalid field of a config that WithDefaults has filled in.
func (c ConsumerConfig[TTx]) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("Name is empty (want a consumer name with effect version, such as \"ledger@v1\")"))
	} else if !validConsumerName(c.Name) {
		errs = append(errs, fmt.Errorf("Name %q: use letters, digits, '.', '_', '-' and one '@' before the effect version", c.Name))
	}
	if c.Handler == nil {
		errs = append(errs, errors.New("Handler is nil (set Handler, SetHandler or both)"))
	}
	if err := ValidateOwner(c.Owner); err != nil {
		errs = append(errs, err)
	}
	if err := c.Failure.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Failure.Retry: %w", err))
	}
	if c.Workers < 0 {
		errs = append(errs, fmt.Errorf("Workers is %d, want > 0", c.Workers))
	}
	if c.Batch.Enabled && (c.Batch.Size < 1 || c.Batch.Size > 10000) {
		errs = append(errs, fmt.Errorf("Batch.Size is %d, want 1..10000", c.Batch.Size))
	}
	if c.Batch.Enabled && c.Batch.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("Batch.MaxWait is %v, want >= 0", c.Batch.MaxWait))
	}
	if c.Failure.HandlerTimeout < 0 {
		errs = append(errs, fmt.Errorf("Failure.HandlerTimeout is %v, want >= 0 (0: no timeout)", c.Failure.HandlerTimeout))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("ShutdownTimeout is %v, want >= 0", c.ShutdownTimeout))
	}
	if c.Input.MaxPayloadBytes < 0 {
		errs = append(errs, fmt.Errorf("Input.MaxPayloadBytes is %d, want > 0", c.Input.MaxPayloadBytes))
	}
	if c.Failure.DeadLetterFailuresToPause < 0 {
		errs = append(errs, fmt.Errorf("Failure.DeadLetterFailuresToPause is %d, want > 0", c.Failure.DeadLetterFailuresToPause))
	}
	if c.Claims.Maintenance.Interval < 0 {
		errs = append(errs, fmt.Errorf("Claims.Maintenance.Interval is %v, want > 0", c.Claims.Maintenance.Interval))
	}
	if c.Claims.Maintenance.Batch < 0 {
		errs = append(errs, fmt.Errorf("Claims.Maintenance.Batch is %d, want > 0", c.Claims.Maintenance.Batch))
	}
	if c.Claims.RedeliveryWindow < 0 {
		errs = append(errs, fmt.Errorf("Claims.RedeliveryWindow is %v, want >= 0", c.Claims.RedeliveryWindow))
	}
	if err := CheckRetention(c.Claims.Retention, c.Claims.RedeliveryWindow, c.Failure.Retry, 0); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idem: consumer config: %w", errors.Join(errs...))
}

// CheckRetention refuses a retention shorter than the longest time in which the same event can
// come back: the redelivery window, plus the retry policy's worst case (the sum of its capped
// delays), plus one lease. The error names every value so the fix is obvious.
func CheckRetention(retention, redeliveryWindow time.Duration, policy retry.Policy, lease time.Duration) error {
	worst := policy.WithDefaults().WorstCase()
	need := redeliveryWindow + worst + lease
	if retention <= 0 {
		return fmt.Errorf("Claims.Retention is %v, want > 0", retention)
	}
	if retention < need {
		return fmt.Errorf("Claims.Retention (%v) is shorter than Claims.RedeliveryWindow (%v) + retry worst case (%v) + lease (%v) = %v: an event could come back after its claim was deleted and apply twice",
			retention, redeliveryWindow, worst, lease, need)
	}
	return nil
}

// DeliveryLimitMargin is how many deliveries above Failure.Retry.MaxAttempts a broker's delivery limit
// must allow: deliveries that end without a verdict (a lost lease, a give-back at shutdown or
// pause, a crash) count against the broker's limit although they spend no attempt of the
// retry policy.
const DeliveryLimitMargin = 5

// CheckSourceLimits refuses a source the consumer cannot keep its promise over: one whose
// broker drops a message after fewer than policy.MaxAttempts + DeliveryLimitMargin deliveries
// (a DeliveryLimiter reporting a limit; 0 is unlimited), since the broker would then drop an
// event that was neither applied nor dead-lettered; and one that can deliver an event again
// later after publishing than redeliveryWindow (a RedeliveryWindower), since its claim could be
// collected first. A source that implements neither interface passes.
func CheckSourceLimits(src Source, policy retry.Policy, redeliveryWindow time.Duration) error {
	var errs []error
	if l, ok := src.(DeliveryLimiter); ok {
		attempts := policy.WithDefaults().MaxAttempts
		if limit := l.DeliveryLimit(); limit > 0 && limit < attempts+DeliveryLimitMargin {
			errs = append(errs, fmt.Errorf("its delivery limit is %d, want unlimited or at least %d (Failure.Retry.MaxAttempts %d + DeliveryLimitMargin %d for deliveries that end without a verdict): at its limit the broker drops a message that was neither applied nor dead-lettered",
				limit, attempts+DeliveryLimitMargin, attempts, DeliveryLimitMargin))
		}
	}
	if w, ok := src.(RedeliveryWindower); ok {
		if window := w.RedeliveryWindow(); window > redeliveryWindow {
			errs = append(errs, fmt.Errorf("it can deliver an event again up to %v after publishing, longer than Claims.RedeliveryWindow (%v): bound the source (a stream's MaxAge, a queue's message TTL) or raise Claims.RedeliveryWindow and Claims.Retention to cover it",
				window, redeliveryWindow))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("source %s: %w", src.Name(), errors.Join(errs...))
}

func validConsumerName(s string) bool {
	if len(s) > 200 {
		return false
	}
	ats := 0
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		case r == '@' && i > 0 && i < len(s)-1:
			ats++
		default:
			return false
		}
	}
	return ats <= 1
}

// MaxOwnerBytes bounds ConsumerConfig.Owner.
const MaxOwnerBytes = 63

// ValidateOwner checks an owner (ConsumerConfig.Owner): empty, or at most MaxOwnerBytes of
// lower-case ASCII letters, digits, '-' and '_', starting with a letter. The charset keeps it a
// safe metric label and routing key; the bound keeps it from carrying ids.
func ValidateOwner(owner string) error {
	if owner == "" {
		return nil
	}
	if len(owner) > MaxOwnerBytes {
		return fmt.Errorf("Owner is %d bytes, want at most %d (a team or rotation name, such as \"payments\")", len(owner), MaxOwnerBytes)
	}
	for i := 0; i < len(owner); i++ {
		b := owner[i]
		switch {
		case b >= 'a' && b <= 'z':
		case i > 0 && (b >= '0' && b <= '9' || b == '-' || b == '_'):
		default:
			return fmt.Errorf("Owner %q: use lower-case letters, digits, '-' and '_', starting with a letter (it is a metric label)", BoundID(owner))
		}
	}
	return nil
}
