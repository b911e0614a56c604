package idem

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrKeyReuse reports a message whose key was already claimed with a different fingerprint:
	// the producer reused an event id for other content. Nothing is applied; the message is
	// dead-lettered with reason key_reuse. Match it with errors.Is; the concrete error is a
	// *KeyReuseError that names the key and both fingerprints.
	ErrKeyReuse = errors.New("idem: event id reused with different content")

	// ErrNoRows reports a business write that matched fewer rows than expected (see ExpectRows);
	// it is permanent by default because retrying an unmet precondition does not meet it.
	ErrNoRows = errors.New("idem: business write matched fewer rows than expected")

	// ErrTooOld reports an event older than the retention horizon: its claim may already be
	// gone, so applying it could double its effect. It is dead-lettered with reason too_old.
	ErrTooOld = errors.New("idem: event older than the retention horizon")

	// ErrUnauthenticated reports a message whose channel or signature could not be verified, or
	// that claims a tenant its channel may not speak for.
	ErrUnauthenticated = errors.New("idem: message not authenticated")

	// ErrPaused reports that the consumer paused itself: after a handler bug (see PanicPolicy)
	// or because dead letters could not be written (see
	// ConsumerConfig.Failure.DeadLetterFailuresToPause). Run returns a *PausedError that names the cause.
	ErrPaused = errors.New("idem: consumer paused")

	// ErrHandlerTimeout reports a handler that ran past ConsumerConfig.Failure.HandlerTimeout: its
	// context ended, its transaction rolls back, and the delivery is retried (transient).
	ErrHandlerTimeout = errors.New("idem: handler timed out")
)

// PausedError is what Run returns when the consumer paused itself: errors.Is(err, ErrPaused)
// holds, and Cause (also reachable with errors.Is and errors.As) says why. The message that
// caused the pause is still in the broker.
type PausedError struct {
	Consumer string
	Cause    error
}

func (e *PausedError) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("idem: consumer %s paused", e.Consumer)
	}
	return fmt.Sprintf("idem: consumer %s paused: %v", e.Consumer, e.Cause)
}

// Is makes errors.Is(err, ErrPaused) true.
func (e *PausedError) Is(target error) bool { return target == ErrPaused }

// Unwrap returns the cause.
func (e *PausedError) Unwrap() error { return e.Cause }

// KeyReuseError is the detail behind ErrKeyReuse. Its text names the tenant, the consumer and
// both fingerprints but not the event id, which the consumer adds to every error it reports.
type KeyReuseError struct {
	Key      Key
	Claimed  Fingerprint // fingerprint stored with the existing claim
	Received Fingerprint // fingerprint of the message just received
}

func (e *KeyReuseError) Error() string {
	return fmt.Sprintf("idem: event id reused with different content: tenant %q, consumer %s: claimed with fingerprint %s, received %s",
		BoundID(e.Key.Tenant), e.Key.Consumer, e.Claimed.Short(), e.Received.Short())
}

// Is makes errors.Is(err, ErrKeyReuse) true.
func (e *KeyReuseError) Is(target error) bool { return target == ErrKeyReuse }

// classified marks an error with a class and an optional retry hint; handlers create it with
// Permanent, Transient and RetryAfter.
type classified struct {
	err   error
	class Class
	after time.Duration
}

func (c *classified) Error() string {
	if c.err == nil {
		return c.class.String() + " error"
	}
	return c.err.Error()
}

func (c *classified) Unwrap() error { return c.err }

// Permanent marks err as not worth retrying: the delivery is dead-lettered at once with reason
// permanent_error (or invalid_payload when err wraps ErrInvalidPayload).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassPermanent}
}

// Transient marks err as worth retrying within the retry budget, overriding the classifier.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassTransient}
}

// RetryAfter marks err as transient with a hint from the destination (a Retry-After header):
// the next attempt waits d when d fits the remaining retry budget, and the message is
// dead-lettered as retries_exhausted when it does not.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	if d < 0 {
		d = 0
	}
	return &classified{err: err, class: ClassTransient, after: d}
}

// RetryHint returns the hint attached by RetryAfter, if any.
func RetryHint(err error) (time.Duration, bool) {
	var c *classified
	if errors.As(err, &c) && c.after > 0 {
		return c.after, true
	}
	return 0, false
}

// ExpectRows returns an error wrapping ErrNoRows when a business write affected fewer than want
// rows, so that a precondition that did not hold ("UPDATE … WHERE status = 'pending'") rolls the
// transaction back instead of passing as a silent success. Pass the count the driver reports
// (pgconn.CommandTag.RowsAffected, sql.Result.RowsAffected).
func ExpectRows(got, want int64) error {
	if got >= want {
		return nil
	}
	return Permanent(fmt.Errorf("%w: affected %d, want %d", ErrNoRows, got, want))
}

// ExpectResult is ExpectRows for a database/sql result.
func ExpectResult(res interface{ RowsAffected() (int64, error) }, want int64) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idem: rows affected: %w", err)
	}
	return ExpectRows(n, want)
}
