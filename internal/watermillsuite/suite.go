// Package watermillsuite runs Watermill's universal pub/sub suite — the one every Watermill
// adapter must pass — against idem's transports, as a second judge beside transporttest. The
// adapter is deliberately thin: a Publisher over an idem.Sink and a Subscriber over an
// idem.Source, with no retry, buffering or ordering logic of its own, so whatever the suite
// finds is the transport's. It lives in a test-only module: no library module requires
// Watermill.
package watermillsuite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transporttest"
)

// Lease is the lease the suite's sources are opened with: long enough that a slow check on a
// loaded machine does not see a redelivery it did not ask for.
const Lease = 30 * time.Second

// PlainGroup is the source name of every subscriber made without a consumer group. A transport
// whose sources receive only what is published after their name exists (Pub/Sub subscriptions,
// queue-table subscriptions) creates it with each topic, as a deployment subscribes before it
// publishes.
const PlainGroup = "watermill"

// Run runs Watermill's TestPubSub against the transport that h opens. features must describe the
// transport honestly: a feature it does not have is false, and the checks that need it skip.
// Watermill topics are mapped to topics made by h.NewTopic on first use (a transport may need
// a topic declared ahead, as a JetStream stream is), shared by every publisher and subscriber
// of the run so that a reopened subscriber finds the messages published before.
func Run(t *testing.T, h transporttest.Harness, features tests.Features) {
	topics := &topicMap{t: t, h: h, names: map[string]string{}}
	plain := func(t *testing.T) (message.Publisher, message.Subscriber) {
		// Without a consumer group every subscriber of a topic is the same durable consumer, so a
		// subscriber opened after another was closed resumes its unacked messages.
		return newPublisher(h.Sink(t), topics), newSubscriber(t, h, topics, PlainGroup)
	}
	grouped := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return newPublisher(h.Sink(t), topics), newSubscriber(t, h, topics, group)
	}
	tests.TestPubSub(t, features, plain, grouped)
}

// topicMap maps Watermill topic names to transport topics.
type topicMap struct {
	t     *testing.T
	h     transporttest.Harness
	mu    sync.Mutex
	names map[string]string
}

func (m *topicMap) get(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if topic, ok := m.names[name]; ok {
		return topic
	}
	topic := m.h.NewTopic(m.t)
	m.names[name] = topic
	return topic
}

// Publisher is a Watermill publisher over an idem sink: the message UUID is the event id and
// the metadata are the headers.
type Publisher struct {
	sink   idem.Sink
	topics *topicMap
}

func newPublisher(sink idem.Sink, topics *topicMap) *Publisher {
	return &Publisher{sink: sink, topics: topics}
}

// Publish publishes msgs to topic and returns once the broker confirmed them.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	out := make([]idem.Message, len(msgs))
	for i, m := range msgs {
		var headers map[string]string
		if len(m.Metadata) > 0 {
			headers = make(map[string]string, len(m.Metadata))
			for k, v := range m.Metadata {
				headers[k] = v
			}
		}
		out[i] = idem.Message{EventID: m.UUID, Payload: m.Payload, Headers: headers}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return p.sink.Publish(ctx, p.topics.get(topic), out...)
}

// Close closes the sink.
func (p *Publisher) Close() error { return p.sink.Close() }

// Subscriber is a Watermill subscriber over idem sources: each Subscribe opens a source for the
// subscriber's group and hands over one delivery at a time, settling it when the handler acks
// or nacks it.
type Subscriber struct {
	t      testing.TB
	h      transporttest.Harness
	topics *topicMap
	group  string

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

func newSubscriber(t testing.TB, h transporttest.Harness, topics *topicMap, group string) *Subscriber {
	return &Subscriber{t: t, h: h, topics: topics, group: group, closing: make(chan struct{})}
}

// Subscribe opens a source on topic and streams its deliveries until ctx ends or the subscriber
// is closed; a delivery not yet settled then is nak'ed back to the broker.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("watermillsuite: subscriber is closed")
	default:
	}
	src := s.h.Source(s.t, s.topics.get(topic), s.group, Lease)
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer src.Close()
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		for ctx.Err() == nil {
			ds, err := src.Receive(ctx, 1)
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(50 * time.Millisecond) // a broker hiccup: the source keeps its messages
				}
				continue
			}
			for i, d := range ds {
				if !s.hand(ctx, out, d) {
					giveBack(ds[i+1:])
					break
				}
			}
		}
	}()
	return out, nil
}

// hand sends one delivery to the handler and settles it as the handler decides; it reports
// false when the subscription ended first (the delivery is then given back).
func (s *Subscriber) hand(ctx context.Context, out chan<- *message.Message, d idem.Delivery) bool {
	m := d.Message()
	wm := message.NewMessage(m.EventID, m.Payload)
	for k, v := range m.Headers {
		wm.Metadata.Set(k, v)
	}
	// Watermill's contract: a message's context ends once it is settled or the subscription ends.
	msgCtx, done := context.WithCancel(ctx)
	defer done()
	wm.SetContext(msgCtx)
	select {
	case out <- wm:
	case <-ctx.Done():
		giveBack([]idem.Delivery{d})
		return false
	}
	settle, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	select {
	case <-wm.Acked():
		_ = d.Ack(settle)
		return true
	case <-wm.Nacked():
		_ = d.Nak(settle, 0)
		return true
	case <-ctx.Done():
		_ = d.Nak(settle, 0)
		return false
	}
}

// giveBack naks deliveries the subscriber will not hand over, so the broker redelivers them now.
func giveBack(ds []idem.Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, d := range ds {
		_ = d.Nak(ctx, 0)
	}
}

// Close ends every subscription, waits for them and closes their channels.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}
