package idem_test

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// memSource is an in-memory broker queue for Run tests: Nak puts the message back (with its
// attempt counted, as brokers do) after the delay, Term and Ack settle it. limit and window, when
// set, are reported as the source's delivery limit and redelivery window.
type memSource struct {
	mu      sync.Mutex
	queue   []*memDelivery
	wake    chan struct{}
	lease   time.Duration
	limit   int
	window  time.Duration
	settled map[string]string // event id → "ack" or "term"
	naks    int
	// firstAttempt, when set, is what every delivery reports as idem.FirstAttempter.
	firstAttempt time.Time
}

func newMemSource(msgs ...idem.Message) *memSource {
	s := &memSource{wake: make(chan struct{}, 1), lease: time.Minute, settled: map[string]string{}}
	for _, m := range msgs {
		s.push(m)
	}
	return s
}

func (s *memSource) push(m idem.Message) {
	if m.Attempt == 0 {
		m.Attempt = 1
	}
	s.mu.Lock()
	s.queue = append(s.queue, &memDelivery{src: s, msg: m})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *memSource) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			n := min(max, len(s.queue))
			out := make([]idem.Delivery, n)
			for i := range n {
				out[i] = s.queue[i]
			}
			s.queue = s.queue[n:]
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.wake:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (s *memSource) Lease() time.Duration { return s.lease }
func (s *memSource) Name() string         { return "mem" }
func (s *memSource) Close() error         { return nil }

// DeliveryLimit and RedeliveryWindow make memSource an idem.SourceLimits.
func (s *memSource) DeliveryLimit() int              { return s.limit }
func (s *memSource) RedeliveryWindow() time.Duration { return s.window }

func (s *memSource) settledAs(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled[id]
}

func (s *memSource) nakCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.naks
}

type memDelivery struct {
	src *memSource
	msg idem.Message
}

func (d *memDelivery) Message() idem.Message { return d.msg }

func (d *memDelivery) Ack(context.Context) error {
	d.src.mu.Lock()
	d.src.settled[d.msg.EventID] = "ack"
	d.src.mu.Unlock()
	return nil
}

func (d *memDelivery) Term(context.Context) error {
	d.src.mu.Lock()
	d.src.settled[d.msg.EventID] = "term"
	d.src.mu.Unlock()
	return nil
}

func (d *memDelivery) Extend(context.Context) error { return nil }

func (d *memDelivery) FirstAttempt() time.Time { return d.src.firstAttempt }

func (d *memDelivery) Nak(ctx context.Context, delay time.Duration) error {
	d.src.mu.Lock()
	d.src.naks++
	d.src.mu.Unlock()
	m := d.msg
	m.Attempt++
	time.AfterFunc(delay, func() { d.src.push(m) })
	return nil
}
