package idemtest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Settlement is the final verdict the consumer gave one event's delivery on a Source. A nak is
// not one: the Source redelivers the message, and counts the nak (Source.Naks).
type Settlement string

// The settlements a Source records.
const (
	// SettledNone: no final verdict yet (never delivered, in flight, or nak'ed).
	SettledNone Settlement = ""
	// SettledAck: acked after commit (processed or duplicate).
	SettledAck Settlement = "ack"
	// SettledTerm: terminated after a dead letter was written.
	SettledTerm Settlement = "term"
)

// SourceConfig configures a Source; zero fields take the documented defaults.
type SourceConfig struct {
	// Name is the source's name in logs and dead letters (default "idemtest").
	Name string
	// Lease is the reported lease time (default one minute); deliveries never expire.
	Lease time.Duration
	// DeliveryLimit, when > 0, is reported as an idem.DeliveryLimiter would (Run checks it).
	DeliveryLimit int
	// RedeliveryWindow, when > 0, is reported as an idem.RedeliveryWindower would.
	RedeliveryWindow time.Duration
	// FirstAttempt, when set, is what every delivery reports as an idem.FirstAttempter (the
	// broker's record of the event's first attempt, where the retry budget starts).
	FirstAttempt time.Time
}

// Source is an in-memory idem.Source for driving Consumer.Run in unit tests: Push queues a
// message, Run receives it, and the Source records how each event was settled. A nak puts the
// message back after its delay with Attempt one higher, as brokers do. It is safe for
// concurrent use.
type Source struct {
	cfg     SourceConfig
	mu      sync.Mutex
	queue   []idem.Message
	settled map[string]Settlement
	naks    int
	changed chan struct{} // closed and replaced on every push and settlement
	closed  bool
}

var (
	_ idem.FirstAttempter     = (*delivery)(nil)
	_ idem.Source             = (*Source)(nil)
	_ idem.DeliveryLimiter    = (*Source)(nil)
	_ idem.RedeliveryWindower = (*Source)(nil)
)

// NewSource returns a Source holding msgs, in order.
func NewSource(cfg SourceConfig, msgs ...idem.Message) *Source {
	if cfg.Name == "" {
		cfg.Name = "idemtest"
	}
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	s := &Source{cfg: cfg, settled: map[string]Settlement{}, changed: make(chan struct{})}
	s.Push(msgs...)
	return s
}

// errSourceClosed is what Receive returns after Close.
var errSourceClosed = errors.New("idemtest: source is closed")

// Push queues msgs for delivery; a zero Attempt becomes 1.
func (s *Source) Push(msgs ...idem.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if m.Attempt == 0 {
			m.Attempt = 1
		}
		s.queue = append(s.queue, m.Clone())
	}
	s.notifyLocked()
}

func (s *Source) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Receive returns up to max queued deliveries, waiting until one is queued or ctx ends.
func (s *Source) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errSourceClosed
		}
		if n := min(max, len(s.queue)); n > 0 {
			out := make([]idem.Delivery, n)
			for i := range n {
				out[i] = &delivery{src: s, msg: s.queue[i]}
			}
			s.queue = s.queue[n:]
			s.mu.Unlock()
			return out, nil
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// Lease reports the configured lease.
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// Name reports the configured name.
func (s *Source) Name() string { return s.cfg.Name }

// DeliveryLimit reports the configured delivery limit (0: unlimited).
func (s *Source) DeliveryLimit() int { return s.cfg.DeliveryLimit }

// RedeliveryWindow reports the configured redelivery window (0: none reported).
func (s *Source) RedeliveryWindow() time.Duration { return s.cfg.RedeliveryWindow }

// Close makes Receive fail; queued messages stay queued.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.notifyLocked()
	return nil
}

// Settled reports the final verdict on the delivery of eventID (SettledNone while there is none).
func (s *Source) Settled(eventID string) Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled[eventID]
}

// Naks reports how many naks the Source received.
func (s *Source) Naks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.naks
}

// Wait blocks until every event in eventIDs has a final settlement or ctx ends,
// and returns their settlements in the same order (with ctx's error when it ended first).
func (s *Source) Wait(ctx context.Context, eventIDs ...string) ([]Settlement, error) {
	for {
		s.mu.Lock()
		out := make([]Settlement, len(eventIDs))
		final := true
		for i, id := range eventIDs {
			out[i] = s.settled[id]
			final = final && out[i] != SettledNone
		}
		changed := s.changed
		s.mu.Unlock()
		if final {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-changed:
		}
	}
}

// settle records a final verdict, or a nak when how is SettledNone.
func (s *Source) settle(id string, how Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if how == SettledNone {
		s.naks++
	} else {
		s.settled[id] = how
	}
	s.notifyLocked()
}

// delivery is one message handed out by a Source.
type delivery struct {
	src *Source
	msg idem.Message
}

func (d *delivery) Message() idem.Message { return d.msg.Clone() }

func (d *delivery) Ack(context.Context) error {
	d.src.settle(d.msg.EventID, SettledAck)
	return nil
}

func (d *delivery) Term(context.Context) error {
	d.src.settle(d.msg.EventID, SettledTerm)
	return nil
}

func (d *delivery) Extend(context.Context) error { return nil }

// FirstAttempt makes a delivery an idem.FirstAttempter (zero: the source has no record).
func (d *delivery) FirstAttempt() time.Time { return d.src.cfg.FirstAttempt }

func (d *delivery) Nak(_ context.Context, delay time.Duration) error {
	d.src.settle(d.msg.EventID, SettledNone)
	m := d.msg
	m.Attempt++
	time.AfterFunc(delay, func() { d.src.Push(m) })
	return nil
}
