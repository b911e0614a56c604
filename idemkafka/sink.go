package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
)

// PublishTimeoutDefault bounds waiting for Kafka's acknowledgements when Publish's context has no
// deadline, so a lost broker fails the publish instead of hanging the relay.
const PublishTimeoutDefault = 30 * time.Second

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Key returns the Kafka record key of a message (default KeyOf: the Idem-Key header, else
	// "<tenant>/<event id>"). Kafka's partitioner sends records with the same key to the same
	// partition, where their order holds.
	Key func(m idem.Message) string
}

// Sink publishes messages to Kafka through an idempotent producer and waits for every record to
// be acknowledged by all in-sync replicas. It is safe for concurrent use.
type Sink struct {
	cl  *kgo.Client
	key func(m idem.Message) string
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a Sink over cl, which the caller keeps ownership of. It refuses a client
// whose producer is not idempotent (kgo's default, which also requires acks from all in-sync
// replicas): without it a retried produce could store a record twice or out of order, and an
// acknowledged record could be lost with its leader.
func NewSink(cl *kgo.Client, cfg SinkConfig) (*Sink, error) {
	if cl == nil {
		return nil, errors.New("idemkafka: NewSink: client is nil")
	}
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return nil, errors.New("idemkafka: NewSink: the client disables idempotent writes (kgo.DisableIdempotentWrite)")
	}
	if cfg.Key == nil {
		cfg.Key = KeyOf
	}
	return &Sink{cl: cl, key: cfg.Key}, nil
}

// Publish produces msgs to topic (see EncodeRecord for the mapping, SinkConfig.Key for the key)
// and returns once Kafka acknowledged every record. Records go out in call order, and the
// idempotent producer keeps that order within a partition: when a record fails, kgo fails the
// records after it in the same partition too (and those sent in one batch with it), so a key
// never has a gap followed by a later record. The error then names each failed event; events
// not named were stored. Records of
// other partitions are independent; a caller that needs two records in order publishes them
// with the same key, or in separate calls.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r, err := EncodeRecord(topic, []byte(s.key(m)), m)
		if err != nil {
			return fmt.Errorf("idemkafka: publish to %s: message %d: %w", topic, i, err)
		}
		recs[i] = r
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemkafka: publish to %s: not sent: %w", topic, err)
	}
	// Each promise reports into errs; done counts them. On ctx's end Publish stops waiting and
	// names the records not yet acknowledged: they may still be stored, which a republish and
	// the consumers' claims absorb, but Publish never reports an unconfirmed success.
	var mu sync.Mutex
	errs := make([]error, len(recs))
	acked := make([]bool, len(recs))
	left := len(recs)
	done := make(chan struct{})
	for i, r := range recs {
		s.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			errs[i], acked[i] = err, err == nil
			if left--; left == 0 {
				close(done)
			}
		})
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range errs {
		if errs[i] == nil && !acked[i] {
			errs[i] = fmt.Errorf("no acknowledgement: %w", ctx.Err())
		}
	}
	var out []error
	for i, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("idemkafka: publish event %s to %s: %w", boundID(msgs[i].EventID), topic, err))
		}
	}
	return errors.Join(out...)
}

// Close does nothing: the Sink owns no resources beyond the caller's client, and Publish returns
// only when its records are settled.
func (s *Sink) Close() error { return nil }

// boundID bounds an event id for an error message: at most 64 bytes, cut with "…".
func boundID(id string) string {
	if len(id) > 64 {
		return id[:64] + "…"
	}
	return id
}
