package idem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ReplayLimitDefault is how many dead letters one replay or discard touches unless told
// otherwise: operators replay a small batch first and watch it.
const ReplayLimitDefault = 10

// Replayer operates the dead-letter queue: replay republishes a dead letter's original message
// (same event id, tenant, payload and headers, plus replay headers) and discard retires it with
// a reason; both write an audit row. The CLI and the dashboard use it.
type Replayer struct {
	store DeadLetterStore
	sink  Sink
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

// NewReplayer returns a Replayer over store that republishes through sink (sink may be nil when
// only discarding).
func NewReplayer(store DeadLetterStore, sink Sink) *Replayer {
	return &Replayer{store: store, sink: sink, Now: time.Now}
}

// Selection picks dead letters by id or by filter; only pending ones are ever touched.
type Selection struct {
	// IDs selects exactly these dead letters; each must exist.
	IDs []int64
	// Filter selects by consumer, tenant, reason and age when IDs is empty.
	Filter DeadLetterFilter
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
	// Topic is where to republish; empty means the queue the dead letter came from
	// ("queue:NAME" sources), which must then be known.
	Topic string
}

// ReplayResult reports what a replay did.
type ReplayResult struct {
	// Replayed lists the dead letters republished and marked replayed.
	Replayed []int64
	// Remaining is how many more pending dead letters matched beyond the limit.
	Remaining int
}

// selectPending resolves a selection to pending dead letters, oldest first, within the limit.
func (r *Replayer) selectPending(ctx context.Context, s Selection) ([]DeadLetter, int, error) {
	if s.Actor == "" {
		return nil, 0, errors.New("idem: dead-letter operation: Actor is empty (who is doing this?)")
	}
	limit := s.Limit
	if limit <= 0 {
		limit = ReplayLimitDefault
	}
	var dls []DeadLetter
	if len(s.IDs) > 0 {
		for _, id := range s.IDs {
			dl, err := r.store.GetDeadLetter(ctx, id)
			if err != nil {
				return nil, 0, fmt.Errorf("idem: dead letter %d: %w", id, err)
			}
			if dl.Status != DeadLetterPending {
				return nil, 0, fmt.Errorf("idem: dead letter %d (event %s) is %s, not pending", id, dl.Message.EventID, dl.Status)
			}
			dls = append(dls, dl)
		}
	} else {
		f := s.Filter
		f.Status = DeadLetterPending
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
		if topic == "" {
			q, ok := strings.CutPrefix(dl.Source, "queue:")
			if !ok || q == "" {
				return res, fmt.Errorf("idem: replay dead letter %d (event %s): source %q is not a queue; name the topic to republish to", dl.ID, dl.Message.EventID, dl.Source)
			}
			topic = q
		}
		msg := dl.Message.Clone()
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[HeaderReplayOf] = strconv.FormatInt(dl.ID, 10)
		msg.Headers[HeaderReplayedBy] = actor
		msg.Attempt, msg.PublishedAt = 0, time.Time{}
		if err := r.sink.Publish(ctx, topic, msg); err != nil {
			return res, fmt.Errorf("idem: replay dead letter %d (event %s) to %s: %w", dl.ID, dl.Message.EventID, topic, err)
		}
		changed, err := r.store.SetDeadLetterStatus(ctx, SetDeadLetterStatusParams{
			IDs: []int64{dl.ID}, Status: DeadLetterReplayed, Actor: actor, Reason: p.Selection.Reason, Now: r.Now(),
		})
		if err != nil {
			return res, fmt.Errorf("idem: mark dead letter %d (event %s) replayed: %w", dl.ID, dl.Message.EventID, err)
		}
		res.Replayed = append(res.Replayed, changed...)
	}
	return res, nil
}

// Discard marks the selected pending dead letters discarded with a reason (required) and
// returns their ids.
func (r *Replayer) Discard(ctx context.Context, s Selection) ([]int64, int, error) {
	if strings.TrimSpace(s.Reason) == "" {
		return nil, 0, errors.New("idem: discard: Reason is empty (say why these dead letters are dropped)")
	}
	dls, remaining, err := r.selectPending(ctx, s)
	if err != nil {
		return nil, 0, err
	}
	if len(dls) == 0 {
		return nil, remaining, nil
	}
	ids := make([]int64, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	changed, err := r.store.SetDeadLetterStatus(ctx, SetDeadLetterStatusParams{IDs: ids, Status: DeadLetterDiscarded, Actor: s.Actor, Reason: s.Reason, Now: r.Now()})
	if err != nil {
		return nil, remaining, fmt.Errorf("idem: discard dead letters %v: %w", ids, err)
	}
	return changed, remaining, nil
}
