package idemnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
)

const (
	// PublishTimeoutDefault bounds waiting for the stream's PubAcks when Publish's context has no
	// deadline, so a lost ack fails the publish instead of hanging the relay.
	PublishTimeoutDefault = 30 * time.Second
	// publishWindow is how many asynchronous publishes of one batch are awaiting their PubAck at
	// once; it stays well under the client's PublishAsyncMaxPending default (4000).
	publishWindow = 256
)

// Sink publishes messages to JetStream with BrokerMsgID (the event id scoped by subject and
// content) as Nats-Msg-Id, waiting for the stream to confirm each. It is safe for concurrent use.
//
// Header names are not configurable: they are a wire contract shared with every Source.
type Sink struct {
	js jetstream.JetStream
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a Sink over js. The caller keeps ownership of js's connection.
func NewSink(js jetstream.JetStream) *Sink { return &Sink{js: js} }

// Publish sends msgs to subject (see EncodeMessage for the mapping) and returns once the stream
// stored every one. A PubAck marked Duplicate counts as success: the stream already holds the
// same publish (BrokerMsgID) from within its Duplicates window. One message is published
// synchronously; a batch is pipelined in windows of asynchronous publishes, each awaited before
// the next is sent, and nothing more is sent once a message of a window failed. The error then
// names each failed or unsent event; events not named were stored.
//
// Messages of one call are independent: within a window a message may be stored after an earlier
// one failed. A caller that needs two messages in order publishes them in separate calls, the
// later only after the earlier returned nil — as the relay does for the rows of one key.
func (s *Sink) Publish(ctx context.Context, subject string, msgs ...idem.Message) error {
	err := s.publish(ctx, subject, msgs)
	if err != nil && (errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)) {
		// No responder for the subject: a stream may be electing a leader (transient), or no
		// stream captures the subject at all, which is a configuration error that retrying
		// never fixes. Tell the two apart with one lookup.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, lerr := s.js.StreamNameBySubject(lctx, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("idemnats: publish to %s: %w %q: a configuration error, not an outage (every publish fails until one does): create a stream whose subjects include it (idemnats.EnsureStream, or nats stream add --subjects %q): %w",
				subject, ErrNoStream, subject, subject, err)
		}
	}
	return err
}

// ErrNoStream reports a publish to a subject no JetStream stream captures: the relay keeps the
// rows and retries, but the fix is to create the stream (see EnsureStream).
var ErrNoStream = errors.New("no JetStream stream captures subject")

func (s *Sink) publish(ctx context.Context, subject string, msgs []idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	encoded := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		nm, err := EncodeMessage(subject, m)
		if err != nil {
			return fmt.Errorf("idemnats: publish to %s: message %d: %w", subject, i, err)
		}
		encoded[i] = nm
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	if len(encoded) == 1 {
		if _, err := s.js.PublishMsg(ctx, encoded[0]); err != nil {
			return fmt.Errorf("idemnats: publish event %s to %s: %w", msgs[0].EventID, subject, err)
		}
		return nil
	}
	for start := 0; start < len(encoded); start += publishWindow {
		end := min(start+publishWindow, len(encoded))
		if err := s.publishAsync(ctx, subject, msgs[start:end], encoded[start:end]); err != nil {
			errs := []error{err}
			cause := errors.New("an earlier message of the batch failed")
			if ctx.Err() != nil {
				cause = ctx.Err()
			}
			for _, m := range msgs[end:] {
				errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: not sent: %w", m.EventID, subject, cause))
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// publishAsync publishes one window of a batch and waits for all of its PubAcks. It stops
// sending at the first message the client refuses.
func (s *Sink) publishAsync(ctx context.Context, subject string, msgs []idem.Message, encoded []*nats.Msg) error {
	var errs []error
	futures := make([]jetstream.PubAckFuture, len(encoded))
	for i, nm := range encoded {
		if len(errs) > 0 {
			errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: not sent: an earlier message of the batch failed", msgs[i].EventID, subject))
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: not sent: %w", msgs[i].EventID, subject, err))
			continue
		}
		f, err := s.js.PublishMsgAsync(nm)
		if err != nil {
			errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: %w", msgs[i].EventID, subject, err))
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: %w", msgs[i].EventID, subject, err))
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("idemnats: publish event %s to %s: no PubAck: %w", msgs[i].EventID, subject, ctx.Err()))
		}
	}
	return errors.Join(errs...)
}

// Close does nothing: the Sink owns no resources beyond the caller's connection, and Publish
// returns only when its messages are settled.
func (s *Sink) Close() error { return nil }
