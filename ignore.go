package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/idemstore"
)

// ErrIgnored is matched (errors.Is) by the error Ignore returns.
var ErrIgnored = errors.New("idem: event ignored")

// MaxIgnoreReasonBytes bounds an ignore reason: it is a metric label and an audit field.
const MaxIgnoreReasonBytes = 64

// IgnoreReasonDefault is the reason of Ignore("").
const IgnoreReasonDefault = "unspecified"

// IgnoredError is what Ignore returns: a handler's verdict that the event's target is gone for
// good. Match it with errors.Is(err, ErrIgnored) or errors.As.
type IgnoredError struct {
	// Reason is the normalised reason (see Ignore).
	Reason string
}

func (e *IgnoredError) Error() string { return "idem: event ignored: " + e.Reason }

// Is makes errors.Is(err, ErrIgnored) true.
func (e *IgnoredError) Is(target error) bool { return target == ErrIgnored }

// Ignore is the third exit of a handler, beside retry and dead letter: the event's target is
// gone for good (the order was deleted), so the event is acknowledged without effect. The
// consumer rolls back everything the handler wrote, keeps the claim (a redelivery is a
// duplicate), writes an audit row (action "ignore", the reason, the consumer as actor) in the
// same transaction as the claim, and reports OutcomeIgnored with the reason.
//
// The reason becomes a metric label (idem_ignored_total{reason}): keep it to a small fixed set
// such as "order_deleted", never an id or a tenant. It is bounded to MaxIgnoreReasonBytes,
// control characters and spaces become '_', and an empty reason is IgnoreReasonDefault.
func Ignore(reason string) error {
	return &IgnoredError{Reason: normaliseIgnoreReason(reason)}
}

func normaliseIgnoreReason(reason string) string {
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return IgnoreReasonDefault
	}
	reason = strings.Map(func(r rune) rune {
		if r == unicode.ReplacementChar || unicode.IsControl(r) || unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, reason)
	if len(reason) > MaxIgnoreReasonBytes {
		cut := MaxIgnoreReasonBytes
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut]
	}
	return reason
}

// AuditActionIgnore is the audit action of an event a handler ignored (see Ignore); its actor
// is the consumer's name and its dead-letter id is 0.
const AuditActionIgnore = "ignore"

// ignoredOf returns the handler's Ignore verdict carried by err, if any.
func ignoredOf(err error) (*IgnoredError, bool) {
	var ig *IgnoredError
	if err != nil && errors.As(err, &ig) {
		return ig, true
	}
	return nil, false
}

// recordIgnore writes the audit row of an ignored event in tx when the store can.
func (c *Consumer[TTx]) recordIgnore(ctx context.Context, tx TTx, key Key, reason string, now time.Time) error {
	is, ok := c.store.(idemstore.IgnoreStore[TTx])
	if !ok {
		return nil
	}
	if err := is.RecordIgnoreTx(ctx, tx, idemstore.RecordIgnoreParams{Key: key, Reason: reason, Now: now}); err != nil {
		return fmt.Errorf("idem: record ignore: %w", err)
	}
	return nil
}

// ignoredResult is res settled as ignored for reason.
func ignoredResult(res Result, reason string) Result {
	res.Outcome, res.Reason, res.Err, res.Class = OutcomeIgnored, Reason(reason), nil, ClassUnknown
	return res
}

// commitIgnore settles an event whose handler returned Ignore after the handler's transaction
// rolled back (claim and effect with it): a new transaction claims the key again and records
// the ignore, so the claim and its audit row commit without any of the effect. A concurrent
// delivery may have claimed the key in between; the result is then the duplicate (or key
// reuse) it is.
func (c *Consumer[TTx]) commitIgnore(ctx context.Context, res Result, reason string, now time.Time, settle func(ctx context.Context, tx TTx) error) Result {
	var status idemstore.ClaimStatus
	err := c.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		cr, err := c.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: res.Key, Fingerprint: res.Fingerprint, Now: now, Bucket: res.bucket})
		if err != nil {
			return err
		}
		status = cr.Status
		switch cr.Status {
		case idemstore.ClaimNew:
			if err := c.recordIgnore(ctx, tx, res.Key, reason, now); err != nil {
				return err
			}
		case idemstore.ClaimDuplicate:
		case idemstore.ClaimConflict:
			return &KeyReuseError{Key: res.Key, Claimed: cr.Existing, Received: res.Fingerprint}
		default:
			return fmt.Errorf("idem: claim: store returned invalid status %d", cr.Status)
		}
		if settle != nil {
			if err := settle(ctx, tx); err != nil {
				return fmt.Errorf("idem: settle in transaction: %w", err)
			}
		}
		return nil
	})
	if err == nil && status == idemstore.ClaimNew {
		return ignoredResult(res, reason)
	}
	return c.finishResult(ctx, res, status, err)
}
