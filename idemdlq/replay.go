// Package idemdlq operates the dead-letter queue: it replays a dead letter's original message or
// discards it with a reason, and writes an audit row for each. The CLI (idem dlq) and the
// dashboard (idem serve) use it; any program can.
package idemdlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ReplayLimitDefault is how many dead letters one replay or discard touches unless told
// otherwise: operators replay a small batch first and watch it.
const ReplayLimitDefault = 10

// Replayer operates the dead-letter queue: replay republishes a dead letter's original message
// (same event id, tenant, payload and headers, plus replay headers) and discard retires it with
// a reason; both write an audit row. The CLI and the dashboard use it.
type Replayer struct {
	store idemstore.DeadLetterStore
	sink  idem.Sink
	cfg   ReplayerConfig
}

// ReplayerConfig configures a Replayer. Zero fields take the documented defaults.
type ReplayerConfig struct {
	// Signer, when set, signs every republished message as a replay (idemauth.ReplaySigner), so
	// that a verifier accepts a signed dead letter older than its tolerance. Dead letters refused
	// as unauthenticated are never signed: a replay must not turn a forgery into an event.
	Signer ReplaySigner
	// Fingerprints gives the fingerprint configuration of consumers that do not use the default
	// one, by full consumer name ("ledger@v2"), so that Replay can recompute a dead letter's
	// fingerprint and refuse a payload edited since it was dead-lettered. Replay refuses a dead
	// letter whose fingerprint it cannot reproduce.
	Fingerprints map[string]idem.FingerprintConfig
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

// ReplaySigner signs a message the Replayer is about to republish, after the replay headers are
// set (idemauth.ReplaySigner is the implementation).
type ReplaySigner interface {
	SignReplay(ctx context.Context, msg *idem.Message) error
}

// ErrReplayEdited marks a replay refused because the dead letter's payload no longer matches
// the fingerprint stored with it: it was edited after it was dead-lettered.
var ErrReplayEdited = errors.New("idemdlq: dead letter edited since it was stored")

// ActorMaxLen bounds the actor recorded in the audit trail.
const ActorMaxLen = 200

// validateActor refuses an actor that is blank, too long or holds control characters: the audit
// trail must say who, on one line.
func validateActor(actor string) error {
	switch {
	case strings.TrimSpace(actor) == "":
		return errors.New("idem: dead-letter operation: Actor is blank (who is doing this?)")
	case len(actor) > ActorMaxLen:
		return fmt.Errorf("idem: dead-letter operation: Actor is %d bytes, limit %d", len(actor), ActorMaxLen)
	case !utf8.ValidString(actor):
		return errors.New("idem: dead-letter operation: Actor is not UTF-8")
	}
	for _, r := range actor {
		if unicode.IsControl(r) {
			return fmt.Errorf("idem: dead-letter operation: Actor %q has a control character", actor)
		}
	}
	return nil
}

// NewReplayer returns a Replayer over store that republishes through sink (sink may be nil when
// only discarding).
func NewReplayer(store idemstore.DeadLetterStore, sink idem.Sink, cfg ReplayerConfig) *Replayer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Replayer{store: store, sink: sink, cfg: cfg}
}

// Selection picks dead letters by id or by filter; only pending ones are ever touched.
type Selection struct {
	// IDs selects exactly these dead letters; each must exist.
	IDs []int64
	// Filter selects by consumer, tenant, reason and age when IDs is empty.
	Filter idemstore.DeadLetterFilter
	// Limit bounds how many are touched (default ReplayLimitDefault).
	Limit int
	// All lifts the limit: every matching pending dead letter is touched.
	All bool
	// Actor is who does it, recorded in the audit trail (required).
	Actor string
	// Reason explains the action in the audit trail (required for discard).
	Reason string
}

// ReplayParams is the input of Replayer.Replay.
type ReplayParams struct {
	Selection
	// Topic is where to republish; empty means the topic the dead letter's message arrived on
	// when ArrivalTopic is set and it is known (idem.DeadLetter.Topic, e.g. its JetStream subject),
	// or else the queue it came from ("queue:NAME" sources), one of which must then be known.
	// The audit records where each replay went.
	Topic string
	// ArrivalTopic lets an empty Topic mean idem.DeadLetter.Topic: set it when the sink publishes to
	// the broker the dead letters arrived from (their topics are its topics).
	ArrivalTopic bool
	// AsNewEvent sends a dead letter whose payload was edited since it was stored (its
	// fingerprint no longer matches) as a new event: event id "<original>~edit-<dead letter
	// id>", with the idem.HeaderReplayNewEventOf header and an audit row naming the original. Without
	// it such a dead letter is refused with ErrReplayEdited. Unedited dead letters replay as
	// themselves either way.
	AsNewEvent bool
}

// ReplayResult reports what a replay did.
type ReplayResult struct {
	// Replayed lists the dead letters republished and marked replayed.
	Replayed []int64
	// Remaining is how many more pending dead letters matched beyond the limit.
	Remaining int
}

// selectPending resolves a selection to pending dead letters, oldest first, within the limit.
func (r *Replayer) selectPending(ctx context.Context, s Selection) ([]idem.DeadLetter, int, error) {
	if err := validateActor(s.Actor); err != nil {
		return nil, 0, err
	}
	limit := s.Limit
	if limit <= 0 {
		limit = ReplayLimitDefault
	}
	var dls []idem.DeadLetter
	if len(s.IDs) > 0 {
		for _, id := range s.IDs {
			dl, err := r.store.GetDeadLetter(ctx, id)
			if err != nil {
				return nil, 0, fmt.Errorf("idem: dead letter %d: %w", id, err)
			}
			if dl.Status != idem.DeadLetterPending {
				return nil, 0, fmt.Errorf("idem: dead letter %d (event %s) is %s, not pending", id, dl.Message.EventID, dl.Status)
			}
			dls = append(dls, dl)
		}
	} else {
		f := s.Filter
		f.Status = idem.DeadLetterPending
		f.Limit = 1 << 30
		var err error
		if dls, err = r.store.ListDeadLetters(ctx, f); err != nil {
			return nil, 0, fmt.Errorf("idem: list dead letters: %w", err)
		}
	}
	if s.All || len(dls) <= limit {
		return dls, 0, nil
	}
	return dls[:limit], len(dls) - limit, nil
}

// Replay republishes the selected pending dead letters with their original identity and marks
// them replayed. When the replayed event is processed, the consumer records the time from the
// first failure to the recovery. It stops at the first publish error, reporting what it did.
func (r *Replayer) Replay(ctx context.Context, p ReplayParams) (ReplayResult, error) {
	var res ReplayResult
	if r.sink == nil {
		return res, errors.New("idem: replay: no sink to republish through")
	}
	dls, remaining, err := r.selectPending(ctx, p.Selection)
	if err != nil {
		return res, err
	}
	res.Remaining = remaining
	actor := p.Selection.Actor
	for _, dl := range dls {
		topic := p.Topic
		if topic == "" && p.ArrivalTopic {
			topic = dl.Topic
		}
		if topic == "" {
			q, ok := strings.CutPrefix(dl.Source, "queue:")
			if !ok || q == "" {
				return res, fmt.Errorf("idem: replay dead letter %d (event %s): source %q is not a queue; name the topic to republish to", dl.ID, dl.Message.EventID, dl.Source)
			}
			topic = q
		}
		if dl.Reason == idem.ReasonUnauthenticated {
			return res, fmt.Errorf("idem: replay dead letter %d (event %s): it failed authentication, so its tenant (%q, as claimed) was never verified; it cannot be replayed: discard it, or have its producer send it again, signed",
				dl.ID, idem.BoundID(dl.Message.EventID), idem.BoundID(dl.Message.Header(idem.HeaderUntrustedTenant)))
		}
		msg := dl.Message.Clone()
		reason := p.Selection.Reason
		if !r.unedited(dl) {
			if !p.AsNewEvent {
				return res, fmt.Errorf("%w: dead letter %d: its payload no longer matches the fingerprint %s stored with it; replay refused (replay it as a new event explicitly, or discard it)",
					ErrReplayEdited, dl.ID, dl.Fingerprint.Short())
			}
			msg.EventID = fmt.Sprintf("%s~edit-%d", dl.Message.EventID, dl.ID)
			if msg.Headers == nil {
				msg.Headers = map[string]string{}
			}
			msg.Headers[idem.HeaderReplayNewEventOf] = dl.Message.EventID
			reason = strings.TrimSpace(fmt.Sprintf("%s [edited payload replayed as new event %q; original event %q]", reason, msg.EventID, dl.Message.EventID))
		}
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[idem.HeaderReplayOf] = strconv.FormatInt(dl.ID, 10)
		msg.Headers[idem.HeaderReplayedBy] = actor
		if t := replayEventTime(dl); !t.IsZero() {
			msg.Headers[idem.HeaderReplayEventTime] = t.UTC().Format(time.RFC3339Nano)
		}
		msg.Attempt, msg.PublishedAt = 0, time.Time{}
		if r.cfg.Signer != nil && dl.Reason != idem.ReasonUnauthenticated {
			if err := r.cfg.Signer.SignReplay(ctx, &msg); err != nil {
				return res, fmt.Errorf("idem: replay dead letter %d: sign: %w", dl.ID, err)
			}
		}
		if err := r.sink.Publish(ctx, topic, msg); err != nil {
			return res, fmt.Errorf("idem: replay dead letter %d (event %s) to %s: %w", dl.ID, dl.Message.EventID, topic, err)
		}
		changed, err := r.store.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{
			IDs: []int64{dl.ID}, Status: idem.DeadLetterReplayed, Actor: actor, Reason: reason, Destination: topic, Now: r.cfg.Now(),
		})
		if err != nil {
			return res, fmt.Errorf("idem: mark dead letter %d (event %s) replayed: %w", dl.ID, dl.Message.EventID, err)
		}
		res.Replayed = append(res.Replayed, changed...)
	}
	return res, nil
}

// replayEventTime is the original time of dl's event: the earliest of its OccurredAt, its
// PublishedAt, its first failure and the event time an earlier replay carried.
func replayEventTime(dl idem.DeadLetter) time.Time {
	m := dl.Message
	t, err := m.EventTime()
	if err != nil { // an earlier replay's time that does not parse is left out, never guessed
		m.Headers = nil // EventTime reads only that header; dl's own map is untouched
		t, _ = m.EventTime()
	}
	if f := dl.FirstFailed; !f.IsZero() && (t.IsZero() || f.Before(t)) {
		t = f
	}
	return t
}

// unedited reports whether dl's message still has the fingerprint stored with it, recomputed with
// the consumer's configuration (Fingerprints, else the default), or as raw bytes for a dead
// letter refused before its fingerprint was computed.
func (r *Replayer) unedited(dl idem.DeadLetter) bool {
	if dl.Fingerprint.IsZero() {
		return false
	}
	if idem.RawFingerprint(dl.Message) == dl.Fingerprint {
		return true
	}
	fp, err := idem.ComputeFingerprint(dl.Message, r.cfg.Fingerprints[dl.Consumer])
	return err == nil && fp == dl.Fingerprint
}

// DiscardResult reports a Discard.
type DiscardResult struct {
	// Discarded lists the dead letters marked discarded.
	Discarded []int64
	// Remaining is how many more pending dead letters matched beyond the limit.
	Remaining int
}

// Discard marks the selected pending dead letters discarded with a reason (required) and
// reports their ids.
func (r *Replayer) Discard(ctx context.Context, s Selection) (DiscardResult, error) {
	if strings.TrimSpace(s.Reason) == "" {
		return DiscardResult{}, errors.New("idemdlq: discard: Selection.Reason is empty (say why these dead letters are dropped)")
	}
	dls, remaining, err := r.selectPending(ctx, s)
	if err != nil {
		return DiscardResult{}, err
	}
	if len(dls) == 0 {
		return DiscardResult{Remaining: remaining}, nil
	}
	ids := make([]int64, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	changed, err := r.store.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: ids, Status: idem.DeadLetterDiscarded, Actor: s.Actor, Reason: s.Reason, Now: r.cfg.Now()})
	if err != nil {
		return DiscardResult{Remaining: remaining}, fmt.Errorf("idem: discard dead letters %v: %w", ids, err)
	}
	return DiscardResult{Discarded: changed, Remaining: remaining}, nil
}
