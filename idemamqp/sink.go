package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// ErrHeldBack is wrapped by the error of a message Publish did not send because an earlier
// message of its ordering key failed: sending it would let it overtake the failed one.
var ErrHeldBack = errors.New("not sent: an earlier message of its key failed")

// Sink publishes messages to RabbitMQ with publisher confirms: Publish returns only once the
// broker confirmed every message. Messages are published mandatory, so one that no queue is
// bound to is an error (ErrUnroutable), not a silent drop. It is safe for concurrent use;
// concurrent Publish calls take turns on its channel.
//
// The Sink owns its connection: it dials through its Dialer on first use and again after the
// connection or channel was lost.
type Sink struct {
	cfg  SinkConfig
	dial Dialer

	mu     sync.Mutex
	conn   *amqp.Connection
	pub    *publisher
	closed bool
}

var _ idem.Sink = (*Sink)(nil)

// NewSink connects through dial and returns a Sink publishing to cfg.Exchange.
func NewSink(ctx context.Context, dial Dialer, cfg SinkConfig) (*Sink, error) {
	if dial == nil {
		return nil, errors.New("idemamqp: NewSink: Dialer is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, dial: dial}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.connect(ctx); err != nil {
		return nil, fmt.Errorf("idemamqp: sink: %w", err)
	}
	return s, nil
}

// connect (re)opens the connection and the confirm channel. The caller holds s.mu.
func (s *Sink) connect(ctx context.Context) error {
	if s.pub != nil && !s.pub.dead() {
		return nil
	}
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn, s.pub = nil, nil
	}
	conn, err := s.dial(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	pub, err := newPublisher(conn)
	if err != nil {
		_ = conn.Close()
		return err
	}
	s.conn, s.pub = conn, pub
	return nil
}

// Publish sends msgs to the sink's exchange with routing key topic (see EncodeMessage for the
// mapping) and returns once the broker confirmed every one. A key's later messages go out only
// after its earlier ones were confirmed, and a failure holds the key's later messages back
// (ErrHeldBack); messages of different keys are pipelined (see SinkConfig.OrderKey). When some
// fail, the error names each failed event; events not named were confirmed.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	encoded := make([]amqp.Publishing, len(msgs))
	for i, m := range msgs {
		p, err := EncodeMessage(m)
		if err != nil {
			return fmt.Errorf("idemamqp: publish to %q: message %d: %w", topic, i, err)
		}
		encoded[i] = p
	}
	if s.cfg.Transient {
		for i := range encoded {
			encoded[i].DeliveryMode = amqp.Transient
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemamqp: publish to %q: not sent: %w", topic, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("idemamqp: publish to %q: sink closed", topic)
	}
	if err := s.connect(ctx); err != nil {
		return fmt.Errorf("idemamqp: publish to %q: %w", topic, err)
	}
	pub := s.pub

	groups := s.groups(msgs)
	errs := make([]error, len(msgs))
	// Each wave sends the next message of every key still going, then waits for their confirms.
	for wave := 0; ; wave++ {
		type sent struct {
			i  int
			pd *pending
		}
		var inflight []sent
		for g, idx := range groups {
			if wave >= len(idx) {
				continue
			}
			i := idx[wave]
			if errs[idx[max(wave-1, 0)]] != nil {
				// The key failed: hold back the rest of it.
				for _, j := range idx[wave:] {
					errs[j] = ErrHeldBack
				}
				groups[g] = idx[:wave]
				continue
			}
			pd, err := pub.publish(ctx, s.cfg.Exchange, topic, encoded[i])
			if err != nil {
				errs[i] = err
				continue
			}
			inflight = append(inflight, sent{i, pd})
		}
		if len(inflight) == 0 && !anyLeft(groups, wave+1) {
			break
		}
		for _, f := range inflight {
			if err := pub.wait(ctx, f.pd); err != nil {
				errs[f.i] = err
			}
		}
	}
	var out []error
	for i, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("idemamqp: publish to %q: %w (event %q)", topic, err, boundID(msgs[i].EventID)))
		}
	}
	return errors.Join(out...)
}

// groups splits the batch into ordering groups of message indexes, in batch order.
func (s *Sink) groups(msgs []idem.Message) [][]int {
	if s.cfg.OrderKey == nil {
		all := make([]int, len(msgs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	var groups [][]int
	byKey := make(map[string]int)
	for i, m := range msgs {
		k := s.cfg.OrderKey(m)
		if k == "" {
			groups = append(groups, []int{i})
			continue
		}
		g, ok := byKey[k]
		if !ok {
			g = len(groups)
			byKey[k] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// anyLeft reports whether some group has a message at position wave or later.
func anyLeft(groups [][]int, wave int) bool {
	for _, g := range groups {
		if len(g) > wave {
			return true
		}
	}
	return false
}

// Close closes the sink's connection. Publish fails afterwards.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn == nil {
		return nil
	}
	err := s.conn.Close()
	s.conn, s.pub = nil, nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// boundID bounds an event id for an error message: at most 64 bytes, cut with "…" (%q escapes
// control characters).
func boundID(id string) string {
	if len(id) > 64 {
		return id[:64] + "…"
	}
	return id
}
