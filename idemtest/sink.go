package idemtest

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/idemkit/idem"
)

// Published is one message a Sink received, with its topic.
type Published struct {
	Topic   string
	Message idem.Message
}

// Sink is an in-memory idem.Sink that records every published message in order, so a test can
// assert what a relay or a handler's code published. FailWith makes Publish fail. It is safe
// for concurrent use.
type Sink struct {
	mu     sync.Mutex
	msgs   []Published
	fail   error
	closed bool
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns an empty Sink.
func NewSink() *Sink { return &Sink{} }

// errSinkClosed is what Publish returns after Close.
var errSinkClosed = errors.New("idemtest: sink is closed")

// Publish records msgs under topic (deep copies), or returns the error set by FailWith without
// recording any of them, as a broker that confirms none would.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errSinkClosed
	case s.fail != nil:
		return s.fail
	}
	for _, m := range msgs {
		s.msgs = append(s.msgs, Published{Topic: topic, Message: m.Clone()})
	}
	return nil
}

// Close makes later publishes fail; it is idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// FailWith makes every later Publish return err (nil to succeed again).
func (s *Sink) FailWith(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// Published returns every recorded message in publish order.
func (s *Sink) Published() []Published {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// Topic returns the messages recorded under topic, in publish order.
func (s *Sink) Topic(topic string) []idem.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []idem.Message
	for _, p := range s.msgs {
		if p.Topic == topic {
			out = append(out, p.Message)
		}
	}
	return out
}

// EventIDs returns the event ids recorded under topic, in publish order.
func (s *Sink) EventIDs(topic string) []string {
	var ids []string
	for _, m := range s.Topic(topic) {
		ids = append(ids, m.EventID)
	}
	return ids
}

// Reset forgets what was recorded.
func (s *Sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = nil
}
