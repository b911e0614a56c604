package idemrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

// fallbackTransientStreak is how many rows of a failed batch may fail transiently one after
// the other, when published singly, before the rest of the batch is failed without trying.
const fallbackTransientStreak = 3

// maxFetchGrowth bounds how far the fetch limit grows past BatchSize when held-back rows fill
// the batches.
const maxFetchGrowth = 64

// roundResult is what one round found and did.
type roundResult struct {
	published int
	// more reports that another round may find work at once (a full batch was published, or
	// the fetch limit grew past rows held back).
	more bool
	// nextDue is the earliest NextAttemptAt of a row held back as not yet due (zero if none).
	nextDue time.Time
}

// item is one fetched row on its way to the sink.
type item struct {
	row   idemstore.OutboxRow
	topic string // sink topic
}

// group is the ordering group of an item: its key, or the row alone when the key is empty.
func (it item) group() string { return it.row.Outgoing.Key }

// round fetches one batch of the usable partitions and publishes, key by key in enqueue order,
// every row that may go: a key stops at its first row that is not yet due, whose partition lease
// ended, or whose publish failed, and its later rows wait for another round; other keys go on.
// Rows of different keys to one topic share a Publish call; a key has at most one row per call.
// An error means the store failed; publish failures are recorded on their rows.
func (r *Relay) round(ctx context.Context) (roundResult, error) {
	var res roundResult
	now := r.cfg.Now()
	parts := r.usable(now)
	if len(parts) == 0 {
		return res, nil
	}
	limit := r.fetchLimit
	rows, err := r.store.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: parts, Limit: limit})
	if err != nil {
		return res, fmt.Errorf("idemrelay: relay %s: fetch partitions %v: %w", r.cfg.ID, parts, err)
	}

	blocked := make(map[string]bool)
	held := 0
	pending := make([]item, 0, len(rows))
	checks := make(map[int64]time.Time, len(r.deadChecks))
	for _, row := range rows {
		k := row.Outgoing.Key
		if k != "" && blocked[k] {
			held++
			continue
		}
		if row.Dead {
			released, err := r.releaseDead(ctx, row, now, checks)
			if err != nil {
				return res, err
			}
			if released {
				continue // the key goes on with its next row
			}
			// A dead row holds its key back until an operator decides, unless told otherwise.
			held++
			if k != "" && !r.cfg.SkipDeadRows {
				blocked[k] = true
			}
			continue
		}
		// A row never tried is always due, whatever the clocks of database and relay say.
		if row.Attempts > 0 && row.NextAttemptAt.After(now) {
			if k != "" {
				blocked[k] = true
			}
			held++
			if res.nextDue.IsZero() || row.NextAttemptAt.Before(res.nextDue) {
				res.nextDue = row.NextAttemptAt
			}
			continue
		}
		pending = append(pending, item{row: row, topic: r.cfg.Topic(row.Outgoing)})
	}

	r.deadChecks = checks

	for len(pending) > 0 && ctx.Err() == nil {
		var batch []item
		batch, pending = r.nextBatch(pending, blocked)
		if len(batch) == 0 {
			break
		}
		n, err := r.publish(ctx, batch, blocked)
		res.published += n
		if err != nil {
			return res, err
		}
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}

	// Rows held back behind a row not yet due can fill a whole batch and hide the other keys of
	// their partitions: fetch more next time, up to a bound, and back to BatchSize once they no
	// longer fill it.
	full := len(rows) == limit
	maxLimit := r.cfg.BatchSize * maxFetchGrowth
	switch grow := full && held*2 >= len(rows); {
	case grow && limit < maxLimit:
		r.fetchLimit = min(limit*2, maxLimit)
		res.more = true
	case grow:
		// Stay at the bound while held-back rows still fill it.
	default:
		r.fetchLimit = r.cfg.BatchSize
	}
	if full && res.published > 0 {
		res.more = true
	}
	return res, nil
}

// releaseDead reports whether the dead row may stop holding its key, because an operator
// replayed (the replay published it) or discarded its dead letter; it then marks the row
// published, so that it leaves the outbox with the published rows. The dead letter is looked up
// at most once per PollInterval per row (checks carries the next lookup times to the next round).
func (r *Relay) releaseDead(ctx context.Context, row idemstore.OutboxRow, now time.Time, checks map[int64]time.Time) (bool, error) {
	if next, ok := r.deadChecks[row.ID]; ok && now.Before(next) {
		checks[row.ID] = next
		return false, nil
	}
	dl, err := r.dlq.GetDeadLetter(ctx, row.DeadLetterID)
	var outcome string
	switch {
	case errors.Is(err, idem.ErrNotFound):
		// The dead letter was deleted: nobody can decide any more, so nothing holds the key.
		outcome = "dead_letter_gone"
	case err != nil:
		return false, fmt.Errorf("idemrelay: relay %s: read dead letter %d of event %s (row %d): %w",
			r.cfg.ID, row.DeadLetterID, row.Outgoing.EventID, row.ID, err)
	case dl.Status == idem.DeadLetterPending:
		checks[row.ID] = now.Add(r.cfg.PollInterval)
		return false, nil
	default:
		outcome = string(dl.Status)
	}
	if err := r.store.OutboxMarkPublished(ctx, []int64{row.ID}, now); err != nil {
		return false, fmt.Errorf("idemrelay: relay %s: release dead row %d (event %s): %w", r.cfg.ID, row.ID, row.Outgoing.EventID, err)
	}
	r.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idemrelay: dead row released",
		append(r.attrs(item{row: row, topic: r.cfg.Topic(row.Outgoing)}, outcome), slog.Int64("dead_letter_id", row.DeadLetterID))...)
	return true, nil
}

// nextBatch takes from pending (in id order) the rows of the first row's topic that may be
// published together: at most one row per key, since a sink may pipeline a call and store a
// later message after an earlier one failed (a key's next row goes out in a later call, only
// once the call holding its earlier row returned success). It skips rows of keys blocked
// meanwhile, and stops a key at its first row that goes to another topic or is already
// represented in the batch. It returns the batch (at most BatchSize rows) and what is left, in
// id order.
func (r *Relay) nextBatch(pending []item, blocked map[string]bool) (batch, rest []item) {
	topic := ""
	first := true
	behind := make(map[string]bool) // keys with a row in the batch or left in rest
	for _, it := range pending {
		k := it.group()
		if k != "" && blocked[k] {
			continue // dropped: its key waits for another round
		}
		if first {
			topic, first = it.topic, false
		}
		if it.topic == topic && len(batch) < r.cfg.BatchSize && (k == "" || !behind[k]) {
			batch = append(batch, it)
		} else {
			rest = append(rest, it)
		}
		if k != "" {
			behind[k] = true
		}
	}
	return batch, rest
}

// publish sends one batch (one topic) and records the outcome on its rows. It reports how many
// rows it published; an error means the store failed and the round must stop.
func (r *Relay) publish(ctx context.Context, batch []item, blocked map[string]bool) (int, error) {
	return r.publishWith(ctx, batch, blocked, nil)
}

// publishWith is publish that also tells onFail (when set) the sink's error of a single-row
// batch that failed.
func (r *Relay) publishWith(ctx context.Context, batch []item, blocked map[string]bool, onFail func(error)) (int, error) {
	block := func(it item) {
		if k := it.group(); k != "" {
			blocked[k] = true
		}
	}
	topic := batch[0].topic
	if topic == "" {
		for _, it := range batch {
			block(it)
			err := idem.Permanent(fmt.Errorf("idemrelay: event %s: Config.Topic mapped outbox topic %q to an empty sink topic",
				it.row.Outgoing.EventID, it.row.Outgoing.Topic))
			if ferr := r.fail(ctx, it, err, idem.ClassPermanent); ferr != nil {
				return 0, ferr
			}
		}
		return 0, nil
	}

	// Only publish under a live lease: a partition lost or expired since the round began may
	// already belong to another relay, and two publishers would break the key's order. The
	// publish ends the landing margin before the earliest of its leases does.
	now := r.cfg.Now()
	var deadline time.Time
	live := batch[:0:0]
	for _, it := range batch {
		until := r.publishBy(it.row.Partition)
		if !now.Before(until) {
			block(it)
			continue
		}
		if deadline.IsZero() || until.Before(deadline) {
			deadline = until
		}
		live = append(live, it)
	}
	if len(live) == 0 {
		return 0, nil
	}
	batch = live

	msgs := make([]idem.Message, len(batch))
	for i, it := range batch {
		msgs[i] = it.row.Outgoing.Message()
	}
	// The deadline is on the relay's clock (Config.Now); contexts run on the real one.
	pctx, cancel := context.WithTimeout(ctx, deadline.Sub(now))
	start := r.cfg.Now()
	err := r.sink.Publish(pctx, topic, msgs...)
	cut := pctx.Err() != nil && ctx.Err() == nil
	cancel()
	// Cut off at the end of the lease it started under (less the landing margin): if the lease
	// was renewed meanwhile the publish was merely too slow, and that counts as a transient
	// failure (so the budget applies); if the lease is ending or gone, the rows belong to
	// whoever holds it next.
	leaseEnded := false
	if cut {
		now := r.cfg.Now()
		for _, it := range batch {
			if !now.Before(r.publishBy(it.row.Partition)) {
				leaseEnded = true
				break
			}
		}
	}

	if err == nil {
		ids := make([]int64, len(batch))
		oldest := batch[0].row.CreatedAt
		for i, it := range batch {
			ids[i] = it.row.ID
			if it.row.CreatedAt.Before(oldest) {
				oldest = it.row.CreatedAt
			}
		}
		at := r.cfg.Now()
		if err := r.store.OutboxMarkPublished(ctx, ids, at); err != nil {
			// Published but not marked: the rows go out again later, which consumers and the
			// broker's deduplication absorb.
			for _, it := range batch {
				block(it)
			}
			return 0, fmt.Errorf("idemrelay: relay %s: mark %s published: %w", r.cfg.ID, describe(batch), err)
		}
		if r.cfg.Observer != nil {
			r.cfg.Observer.Published(batch[0].topic, len(batch), max(at.Sub(oldest), 0))
		}
		if r.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			for _, it := range batch {
				r.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idemrelay: published",
					append(r.attrs(it, "published"), slog.Float64("duration_ms", msSince(start, at)))...)
			}
		}
		return len(batch), nil
	}

	if ctx.Err() != nil || leaseEnded {
		// Shutting down, or the lease was lost under the publish: leave the rows as they are
		// for whoever publishes next; it was not the destination's fault.
		for _, it := range batch {
			block(it)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, nil
	}

	if len(batch) > 1 {
		return r.publishEach(ctx, batch, blocked)
	}
	it := batch[0]
	block(it)
	if onFail != nil {
		onFail(err)
	}
	class := classify(err)
	if ferr := r.fail(ctx, it, err, class); ferr != nil {
		return 0, ferr
	}
	return 0, nil
}

// publishEach publishes a failed batch again one row at a time. A batch fails as a whole, but
// its rows belong to several keys: publishing them singly finds the rows that really fail, so
// that one bad row neither holds back nor dead-letters the rows of other keys (rows the sink had
// already taken go out twice, harmlessly). After fallbackTransientStreak transient failures in
// a row the destination is taken to be down, and the rest of the batch is recorded as failed
// with the same error without being tried again.
func (r *Relay) publishEach(ctx context.Context, batch []item, blocked map[string]bool) (int, error) {
	published, streak := 0, 0
	var last error
	for _, it := range batch {
		k := it.group()
		if k != "" && blocked[k] {
			continue
		}
		if streak >= fallbackTransientStreak {
			if k != "" {
				blocked[k] = true
			}
			if err := r.fail(ctx, it, last, idem.ClassTransient); err != nil {
				return published, err
			}
			continue
		}
		var failed error
		n, err := r.publishWith(ctx, []item{it}, blocked, func(err error) { failed = err })
		published += n
		if err != nil {
			return published, err
		}
		if failed != nil && classify(failed) == idem.ClassTransient {
			streak++
			last = failed
		} else {
			streak = 0
		}
	}
	return published, nil
}

// fail records a failed publish of one row: a transient failure within the retry budget
// schedules the next attempt (honouring the destination's Retry-After hint); a permanent one,
// or a spent budget, writes a dead letter and marks the row dead.
func (r *Relay) fail(ctx context.Context, it item, perr error, class idem.Class) error {
	row := it.row
	now := r.cfg.Now()
	attempt := row.Attempts + 1
	errText := r.redactor.Text(perr.Error())
	first := firstAttempt(row, now)
	fp := idemstore.OutboxFailParams{ID: row.ID, Attempts: attempt, LastError: errText, NextAttemptAt: now, FirstAttemptAt: first}
	var reason idem.Reason
	var delay time.Duration
	if class == idem.ClassPermanent {
		reason = idem.ReasonPermanentError
	} else {
		hint, _ := idem.RetryHint(perr)
		v := r.cfg.Retry.Decide(retry.Input{Attempt: attempt, FirstAt: first, Now: now, Hint: hint}, r.cfg.Rand)
		if v.Retry {
			delay = v.Delay
			fp.NextAttemptAt = now.Add(delay)
		} else {
			reason = idem.ReasonRetriesExhausted
		}
	}

	if reason != "" {
		dlID, err := r.deadLetter(ctx, it, reason, errText, attempt, first, now)
		if err != nil {
			// Without a dead letter the row must not vanish from view: keep it for another
			// attempt after the policy's ceiling, and report the store failure.
			fp.NextAttemptAt = now.Add(r.cfg.Retry.Ceiling(attempt))
			if merr := r.store.OutboxMarkFailed(ctx, fp); merr != nil {
				err = errors.Join(err, fmt.Errorf("idemrelay: mark event %s failed: %w", row.Outgoing.EventID, merr))
			}
			return err
		}
		fp.Dead, fp.DeadLetterID = true, dlID
	}
	if err := r.store.OutboxMarkFailed(ctx, fp); err != nil {
		return fmt.Errorf("idemrelay: relay %s: mark event %s (row %d) failed: %w", r.cfg.ID, row.Outgoing.EventID, row.ID, err)
	}
	if r.cfg.Observer != nil {
		r.cfg.Observer.PublishFailed(it.topic, class, fp.Dead)
	}
	outcome, level := "retried", slog.LevelWarn
	if fp.Dead {
		outcome, level = "dead_lettered", slog.LevelError
	}
	attrs := append(r.attrs(it, outcome),
		slog.Int("attempt", attempt),
		slog.String("error_type", class.String()),
		slog.String("error", errText))
	if fp.Dead {
		attrs = append(attrs, slog.String("reason", string(reason)))
	} else {
		attrs = append(attrs, slog.String("retry_in", delay.String()))
	}
	r.cfg.Logger.LogAttrs(ctx, level, "idemrelay: publish failed", attrs...)
	return nil
}

// deadLetter writes the dead letter of a row that will not be published and returns its id.
func (r *Relay) deadLetter(ctx context.Context, it item, reason idem.Reason, errText string, attempt int, first, now time.Time) (int64, error) {
	row := it.row
	msg := row.Outgoing.Message()
	fp, _ := idem.ComputeFingerprint(msg, idem.FingerprintConfig{Raw: true}) // a row need not be JSON; its dead letter must still replay
	dl := idem.DeadLetter{
		Consumer:    ConsumerName,
		Message:     msg,
		Fingerprint: fp,
		Reason:      reason,
		Error:       errText,
		Attempts:    attempt,
		FirstFailed: first,
		LastFailed:  now,
		Status:      idem.DeadLetterPending,
		Source:      SourcePrefix + row.Outgoing.Topic,
		Owner:       r.cfg.Owner,
	}
	stored, err := r.dlq.InsertDeadLetter(ctx, dl)
	if err != nil {
		return 0, fmt.Errorf("idemrelay: relay %s: dead-letter event %s (row %d, reason %s): %w", r.cfg.ID, row.Outgoing.EventID, row.ID, reason, err)
	}
	return stored.ID, nil
}

// firstAttempt is when the relay first tried to publish row, given that an attempt at now just
// failed: the stored time, else now for a row never tried, else (a row failed before its store
// recorded first attempts) its creation, the old and more conservative bound.
func firstAttempt(row idemstore.OutboxRow, now time.Time) time.Time {
	switch {
	case !row.FirstAttemptAt.IsZero():
		return row.FirstAttemptAt
	case row.Attempts == 0:
		return now
	}
	return row.CreatedAt
}

// classify is idem.Classify with unknown errors counted as transient: a sink that cannot say is
// given the benefit of the retry budget.
func classify(err error) idem.Class {
	if c := idem.Classify(err); c != idem.ClassUnknown {
		return c
	}
	return idem.ClassTransient
}

// attrs are the stable log fields of one row.
func (r *Relay) attrs(it item, outcome string) []slog.Attr {
	return []slog.Attr{
		slog.String("relay", r.cfg.ID),
		slog.String("event_id", it.row.Outgoing.EventID),
		slog.String("tenant", it.row.Outgoing.Tenant),
		slog.String("topic", it.topic),
		slog.Int("partition", it.row.Partition),
		slog.String("outcome", outcome),
	}
}

// describe names the events of a batch for an error message, the first few in full.
func describe(batch []item) string {
	const show = 3
	ids := make([]string, 0, show)
	for i, it := range batch {
		if i == show {
			break
		}
		ids = append(ids, it.row.Outgoing.EventID)
	}
	s := "events " + strings.Join(ids, ", ")
	if len(batch) > show {
		s += fmt.Sprintf(" and %d more", len(batch)-show)
	}
	return s
}

// msSince is the time from start to end in milliseconds, for duration_ms.
func msSince(start, end time.Time) float64 {
	return float64(end.Sub(start).Microseconds()) / 1000
}
