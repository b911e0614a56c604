package transporttest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/transporttest"
)

// TestExerciseInMemory runs the suite against a minimal in-memory broker, so the suite itself is
// checked on every run, without a broker: a check that no correct transport can pass fails here.
func TestExerciseInMemory(t *testing.T) {
	t.Parallel()
	b := &memBroker{topics: map[string]*memTopic{}}
	transporttest.Exercise(t, b.harness())
}

func BenchmarkInMemory(b *testing.B) {
	mb := &memBroker{topics: map[string]*memTopic{}}
	transporttest.Benchmark(b, mb.harness())
}

// memBroker is a broker with dedup by event id, per-name durable cursors, leases and delayed
// naks: the smallest thing that honours the Source and Sink contracts.
type memBroker struct {
	mu     sync.Mutex
	next   int
	topics map[string]*memTopic
}

type memTopic struct {
	msgs      []idem.Message
	seen      map[string]bool
	consumers map[string]map[int]*memState
}

// memState is one message's state for one durable consumer.
type memState struct {
	attempts  int
	visibleAt time.Time
	done      bool
}

func (b *memBroker) harness() transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{FencedSettle: true, BrokerDedup: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.next++
			name := fmt.Sprintf("topic-%d", b.next)
			b.topics[name] = &memTopic{seen: map[string]bool{}, consumers: map[string]map[int]*memState{}}
			return name
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			if !slices.Contains(transporttest.SourceNames, name) {
				tb.Errorf("a check opened a source under %q, which transporttest.SourceNames does not list", name)
			}
			return &memSource{b: b, topic: topic, name: name, lease: lease, closed: make(chan struct{})}
		},
		Sink: func(tb testing.TB) idem.Sink { return memSink{b} },
		Refuse: func(m idem.Message) idem.Message {
			m = m.Clone()
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[memRefuse] = "1"
			return m
		},
	}
}

type memSink struct{ b *memBroker }

func (s memSink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	t, ok := s.b.topics[topic]
	if !ok {
		return fmt.Errorf("no topic %s", topic)
	}
	var errs []error
	for _, m := range msgs {
		if m.Header(memRefuse) != "" {
			errs = append(errs, fmt.Errorf("event %s refused", m.EventID))
			continue
		}
		// Dedup on the id and the content, as idemnats does: a republish is dropped, key reuse
		// and another tenant's event with the same id are delivered.
		dedup := fmt.Sprintf("%q %q %q %q", m.EventID, m.Tenant, m.Type, m.Payload)
		if t.seen[dedup] {
			continue
		}
		t.seen[dedup] = true
		m = m.Clone()
		m.PublishedAt = time.Now()
		t.msgs = append(t.msgs, m)
	}
	return errors.Join(errs...)
}

// memRefuse is the header that makes the in-memory broker refuse a message.
const memRefuse = "Mem-Refuse"

func (memSink) Close() error { return nil }

type memSource struct {
	b         *memBroker
	topic     string
	name      string
	lease     time.Duration
	closeOnce sync.Once
	closed    chan struct{}
}

func (s *memSource) Name() string         { return s.topic + "/" + s.name }
func (s *memSource) Lease() time.Duration { return s.lease }
func (s *memSource) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

func (s *memSource) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.closed:
			return nil, errors.New("source closed")
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		if ds := s.take(max); len(ds) > 0 {
			return ds, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		case <-s.closed:
		}
	}
}

// take leases up to max visible messages.
func (s *memSource) take(max int) []idem.Delivery {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	t := s.b.topics[s.topic]
	states := t.consumers[s.name]
	if states == nil {
		states = map[int]*memState{}
		t.consumers[s.name] = states
	}
	now := time.Now()
	var ds []idem.Delivery
	for i, m := range t.msgs {
		if len(ds) == max {
			break
		}
		st := states[i]
		if st == nil {
			st = &memState{}
			states[i] = st
		}
		if st.done || now.Before(st.visibleAt) {
			continue
		}
		st.attempts++
		st.visibleAt = now.Add(s.lease)
		m = m.Clone()
		m.Attempt = st.attempts
		ds = append(ds, &memDelivery{src: s, st: st, msg: m})
	}
	return ds
}

type memDelivery struct {
	src *memSource
	st  *memState
	msg idem.Message
}

func (d *memDelivery) Message() idem.Message { return d.msg }

func (d *memDelivery) settle(ctx context.Context, f func(st *memState)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.src.b.mu.Lock()
	defer d.src.b.mu.Unlock()
	if d.st.attempts != d.msg.Attempt {
		// Delivered again since: this delivery's lease is gone, and with it its right to settle.
		return fmt.Errorf("event %s: delivered again (attempt %d) since attempt %d: %w", d.msg.EventID, d.st.attempts, d.msg.Attempt, idem.ErrLeaseLost)
	}
	f(d.st)
	return nil
}

func (d *memDelivery) Ack(ctx context.Context) error {
	return d.settle(ctx, func(st *memState) { st.done = true })
}

func (d *memDelivery) Nak(ctx context.Context, delay time.Duration) error {
	return d.settle(ctx, func(st *memState) { st.visibleAt = time.Now().Add(delay) })
}

func (d *memDelivery) Extend(ctx context.Context) error {
	return d.settle(ctx, func(st *memState) { st.visibleAt = time.Now().Add(d.src.lease) })
}

func (d *memDelivery) Term(ctx context.Context) error {
	return d.settle(ctx, func(st *memState) { st.done = true })
}
