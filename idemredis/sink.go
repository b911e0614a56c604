package idemredis

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// PublishTimeoutDefault bounds a Publish whose context has no deadline, so that a Redis that
// stopped answering cannot hold the relay for ever.
const PublishTimeoutDefault = 30 * time.Second

// Sink adds messages to Redis streams, one entry per message, each confirmed (its XADD
// answered) before the next is sent, so a failure leaves the messages after it unpublished and
// a key's order holds. A republish of the same BrokerMsgID within the dedup window returns the
// first entry's id and adds nothing. It is safe for concurrent use.
type Sink struct {
	rdb    redis.UniversalClient
	cfg    SinkConfig
	closed atomic.Bool
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a sink publishing through rdb. It does not own rdb: closing the sink leaves
// the client open.
func NewSink(rdb redis.UniversalClient, cfg SinkConfig) (*Sink, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idemredis: %w", err)
	}
	return &Sink{rdb: rdb, cfg: cfg}, nil
}

// StreamKey is the stream a message published to topic is added to.
func (s *Sink) StreamKey(topic string) string { return s.cfg.Prefix + topic }

// Publish adds msgs to the stream of topic in order and returns once Redis answered for every
// one. The first failure stops it and names its event; the messages before it are published.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("idemredis: publish to %q: sink closed", topic)
	}
	if topic == "" {
		return fmt.Errorf("idemredis: publish: empty topic")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	stream := s.StreamKey(topic)
	window := int64(0)
	if s.cfg.DedupWindow > 0 {
		window = s.cfg.DedupWindow.Milliseconds()
	}
	for i, m := range msgs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("idemredis: publish to %q: event %s and %d after it not sent: %w", topic, m.EventID, len(msgs)-i-1, err)
		}
		if len(m.Payload) > s.cfg.MaxPayload {
			return fmt.Errorf("idemredis: publish to %q: event %s: payload of %d bytes exceeds MaxPayload (%d)", topic, m.EventID, len(m.Payload), s.cfg.MaxPayload)
		}
		fields, err := EncodeMessage(m)
		if err != nil {
			return fmt.Errorf("idemredis: publish to %q: message %d: %w", topic, i, err)
		}
		args := make([]any, 0, len(fields)+2)
		args = append(args, window, s.cfg.MaxLen)
		for _, f := range fields {
			args = append(args, f)
		}
		keys := []string{stream}
		if window > 0 {
			keys = append(keys, stream+"/dedup/"+BrokerMsgID(stream, m))
		}
		if err := publishScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			return fmt.Errorf("idemredis: publish to %q: event %s: %w", topic, m.EventID, err)
		}
	}
	return nil
}

// Close makes later publishes fail; it does not close the client.
func (s *Sink) Close() error {
	s.closed.Store(true)
	return nil
}
