package idemnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RedeliveryWindowUnbounded is what RedeliveryWindow returns for a stream without MaxAge: such a
// stream can bring an event back at any time, so no claim retention covers it. It is 100 years
// rather than the largest Duration so that adding a retry budget and a lease cannot overflow;
// idem's retention check then refuses the configuration until MaxAge is set or a window is
// chosen deliberately (past it, events are dead-lettered as too_old instead of applied twice).
const RedeliveryWindowUnbounded = 100 * 365 * 24 * time.Hour

// EnsureStream creates the stream cfg describes, or updates it to cfg when it exists. Two of its
// fields bound what idem must remember: Duplicates is the window in which JetStream drops a
// republished Nats-Msg-Id (server default 2 minutes), and MaxAge is how long the stream can
// deliver an event at all. Pass the result's info to RedeliveryWindow to get the
// ConsumerConfig.Claims.RedeliveryWindow that covers both.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if js == nil {
		return nil, errors.New("idemnats: EnsureStream: JetStream is nil")
	}
	if cfg.Name == "" {
		return nil, errors.New("idemnats: EnsureStream: StreamConfig.Name is empty")
	}
	st, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("idemnats: ensure stream %s: %w", cfg.Name, err)
	}
	return st, nil
}

// RedeliveryWindow is how long after publishing the stream described by info can deliver the same
// event again: the larger of its MaxAge and its Duplicates window. A stream without MaxAge (or a
// nil info) yields RedeliveryWindowUnbounded.
func RedeliveryWindow(info *jetstream.StreamInfo) time.Duration {
	if info == nil || info.Config.MaxAge <= 0 {
		return RedeliveryWindowUnbounded
	}
	return max(info.Config.MaxAge, info.Config.Duplicates)
}
