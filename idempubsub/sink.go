package idempubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"cloud.google.com/go/pubsub/v2"

	"github.com/idemkit/idem"
)

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Key returns the ordering key of a message (default KeyOf). Pub/Sub delivers the messages
	// of one key in publish order to a subscription with message ordering enabled.
	Key func(m idem.Message) string
	// Settings are the publishers' batching settings (default pubsub.DefaultPublishSettings).
	Settings *pubsub.PublishSettings
}

// Sink publishes messages to Pub/Sub topics with ordering keys and waits for every result. It
// keeps one publisher per topic. It is safe for concurrent use.
type Sink struct {
	client *pubsub.Client
	cfg    SinkConfig

	mu     sync.Mutex
	closed bool
	pubs   map[string]*pubsub.Publisher
	wg     sync.WaitGroup // watchers of results a Publish stopped waiting for
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a Sink over client, which the caller keeps ownership of.
func NewSink(client *pubsub.Client, cfg SinkConfig) (*Sink, error) {
	if client == nil {
		return nil, errors.New("idempubsub: NewSink: client is nil")
	}
	if cfg.Key == nil {
		cfg.Key = KeyOf
	}
	return &Sink{client: client, cfg: cfg, pubs: make(map[string]*pubsub.Publisher)}, nil
}

// publisher returns topic's publisher, with message ordering enabled.
func (s *Sink) publisher(topic string) (*pubsub.Publisher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("sink closed")
	}
	p := s.pubs[topic]
	if p == nil {
		p = s.client.Publisher(topic)
		p.EnableMessageOrdering = true
		if s.cfg.Settings != nil {
			p.PublishSettings = *s.cfg.Settings
		}
		s.pubs[topic] = p
	}
	return p, nil
}

// Publish sends msgs to topic (an id in the client's project or a full name), each with its
// ordering key, and returns once Pub/Sub stored every one. Pub/Sub keeps a key's order: after a
// failure it fails every later message of that key too (the key is paused), so a key never has
// a gap followed by a later message; Publish then resumes the key, so the next call (the
// relay's retry) can publish it again, and returns an error naming each failed event. Events
// not named were stored. Messages of other keys are independent.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	enc := make([]*pubsub.Message, len(msgs))
	for i, m := range msgs {
		pm, err := Encode(m, s.cfg.Key(m))
		if err != nil {
			return fmt.Errorf("idempubsub: publish to %s: message %d: %w", topic, i, err)
		}
		enc[i] = pm
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempubsub: publish to %s: not sent: %w", topic, err)
	}
	p, err := s.publisher(topic)
	if err != nil {
		return fmt.Errorf("idempubsub: publish to %s: %w", topic, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	results := make([]*pubsub.PublishResult, len(enc))
	for i, pm := range enc {
		results[i] = p.Publish(ctx, pm)
	}
	var failed []string
	var first error
	paused := make(map[string]bool)
	for i, r := range results {
		select {
		case <-r.Ready():
		case <-ctx.Done():
			// Stop waiting; a watcher resumes the keys of results that fail later.
			s.watch(p, enc[i:], results[i:])
			failed = append(failed, fmt.Sprintf("%q (not confirmed: %v)", msgs[i].EventID, ctx.Err()))
			for _, m := range msgs[i+1:] {
				failed = append(failed, fmt.Sprintf("%q", m.EventID))
			}
			if first == nil {
				first = ctx.Err()
			}
			return s.publishError(topic, failed, first, paused, p)
		}
		if _, err := r.Get(ctx); err != nil {
			failed = append(failed, fmt.Sprintf("%q (%v)", msgs[i].EventID, err))
			if first == nil {
				first = err
			}
			paused[enc[i].OrderingKey] = true
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return s.publishError(topic, failed, first, paused, p)
}

// publishError resumes the paused keys and builds Publish's error.
func (s *Sink) publishError(topic string, failed []string, first error, paused map[string]bool, p *pubsub.Publisher) error {
	for k := range paused {
		p.ResumePublish(k)
	}
	return fmt.Errorf("idempubsub: publish to %s: events not stored: %s: %w", topic, strings.Join(failed, ", "), first)
}

// watch waits in the background for results Publish stopped waiting for and resumes the key of
// each that fails, so a key is never left paused.
func (s *Sink) watch(p *pubsub.Publisher, enc []*pubsub.Message, results []*pubsub.PublishResult) {
	s.wg.Go(func() {
		for i, r := range results {
			<-r.Ready() // Close stops the publisher, which settles every result
			if _, err := r.Get(context.Background()); err != nil {
				p.ResumePublish(enc[i].OrderingKey)
			}
		}
	})
}

// Close sends what is still queued, stops the publishers and waits for the background
// watchers. The client stays open.
func (s *Sink) Close() error {
	s.mu.Lock()
	s.closed = true
	pubs := s.pubs
	s.pubs = nil
	s.mu.Unlock()
	for _, p := range pubs {
		p.Stop()
	}
	s.wg.Wait()
	return nil
}
