package idempubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handoff"
)

// callMargin is how long a settle or a give-back may take when the caller gave no deadline.
const callMargin = 10 * time.Second

// retentionDefault is Pub/Sub's subscription retention when none is set.
const retentionDefault = 7 * 24 * time.Hour

// deadLetterAttemptsDefault is Pub/Sub's MaxDeliveryAttempts when a dead-letter policy sets 0.
const deadLetterAttemptsDefault = 5

// Source pulls from a Pub/Sub subscription with synchronous Pull calls. A delivery's lease is
// its ack deadline: the source sets it to Lease when it receives a message and at each Extend
// (ModifyAckDeadline); past it Pub/Sub redelivers. It is safe for concurrent use.
type Source struct {
	client  *pubsub.Client
	cfg     SourceConfig
	name    string
	limit   int           // dead-letter MaxDeliveryAttempts, or 0
	window  time.Duration // the subscription's message retention
	brokerN bool          // Pub/Sub counts delivery attempts (a dead-letter policy is set)

	mu       sync.Mutex
	closed   bool
	held     map[string]time.Time // ack id → ack deadline of every unsettled delivery
	attempts attemptCounts        // message id → deliveries handed out (without a dead-letter policy)
	freed    chan struct{}        // signalled when a settle makes room under MaxOutstanding
	calls    sync.WaitGroup       // pulls running detached from a Receive that returned
}

var (
	_ idem.Source             = (*Source)(nil)
	_ idem.DeliveryLimiter    = (*Source)(nil)
	_ idem.RedeliveryWindower = (*Source)(nil)
)

// NewSource reads the subscription's settings (dead-letter policy, retention) and returns a
// source pulling from it. It does not own client: closing the source leaves the client open.
func NewSource(ctx context.Context, client *pubsub.Client, cfg SourceConfig) (*Source, error) {
	if client == nil {
		return nil, errors.New("idempubsub: NewSource: client is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idempubsub: %w", err)
	}
	name := cfg.Subscription
	if !strings.HasPrefix(name, "projects/") {
		name = "projects/" + client.Project() + "/subscriptions/" + name
	}
	sub, err := client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		return nil, fmt.Errorf("idempubsub: subscription %s: %w", name, err)
	}
	s := &Source{
		client:   client,
		cfg:      cfg,
		name:     name,
		window:   retentionDefault,
		held:     make(map[string]time.Time),
		attempts: newAttemptCounts(attemptsGeneration),
		freed:    make(chan struct{}, 1),
	}
	if d := sub.GetMessageRetentionDuration(); d != nil {
		s.window = d.AsDuration()
	}
	if p := sub.GetDeadLetterPolicy(); p != nil && p.GetDeadLetterTopic() != "" {
		s.brokerN = true
		s.limit = int(p.GetMaxDeliveryAttempts())
		if s.limit == 0 {
			s.limit = deadLetterAttemptsDefault
		}
	}
	return s, nil
}

// Name is the subscription's full name.
func (s *Source) Name() string { return s.name }

// Lease is the ack deadline every delivery gets when received and at each Extend.
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// DeliveryLimit is the subscription's dead-letter MaxDeliveryAttempts (Pub/Sub forwards a
// message to the dead-letter topic after that many deliveries, without the consumer seeing it
// again), or 0 when it has no dead-letter policy.
func (s *Source) DeliveryLimit() int { return s.limit }

// RedeliveryWindow is the subscription's message retention: an unacked message can be
// delivered again until then after publishing.
func (s *Source) RedeliveryWindow() time.Duration { return s.window }

// Close stops the source: Receive fails afterwards, and pulls in flight finish and give back
// what they got. Deliveries not settled are redelivered after their ack deadline; a settle on
// one after Close still reaches Pub/Sub (the client stays open).
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	return nil
}

// pulled is what one Pull returned, or its error.
type pulled struct {
	ds  []*Delivery
	err error
}

// Receive returns up to max deliveries, waiting for messages until ctx ends, and never holds
// more than MaxOutstanding unsettled. The Pull runs detached from ctx: when ctx ends first,
// Receive returns ctx.Err() at once and whatever the Pull still got is given back
// (ModifyAckDeadline 0) without counting an attempt.
func (s *Source) Receive(ctx context.Context, limit int) ([]idem.Delivery, error) {
	if limit < 1 {
		return nil, fmt.Errorf("idempubsub: receive from %s: max is %d, want at least 1", s.name, limit)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("idempubsub: receive from %s: source closed", s.name)
		}
		room := s.cfg.MaxOutstanding - s.outstandingLocked(time.Now())
		if room <= 0 {
			s.mu.Unlock()
			select {
			case <-s.freed:
			case <-time.After(time.Second): // a held delivery's deadline may pass meanwhile
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		s.calls.Add(1)
		s.mu.Unlock()
		n := min(limit, room)
		h := handoff.New[pulled]()
		go func() {
			defer s.calls.Done()
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PullWait)
			defer cancel()
			ds, err := s.pull(pctx, n)
			if !h.Put(pulled{ds, err}) {
				s.giveBack(ds)
			}
		}()
		select {
		case r := <-h.Done():
			if r.err != nil {
				return nil, r.err
			}
			if len(r.ds) > 0 {
				return s.handOut(r.ds), nil
			}
		case <-ctx.Done():
			// The pull may have handed its result over just before: give that back too.
			if r, ok := h.Abandon(); ok {
				s.giveBack(r.ds)
			}
			return nil, ctx.Err()
		}
	}
}

// outstandingLocked counts held deliveries whose deadline has not passed, forgetting the others.
func (s *Source) outstandingLocked(now time.Time) int {
	for id, dl := range s.held {
		if now.After(dl) {
			delete(s.held, id)
		}
	}
	return len(s.held)
}

// pull runs one Pull and sets the ack deadline of what it got to the lease.
func (s *Source) pull(ctx context.Context, n int) ([]*Delivery, error) {
	resp, err := s.client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: s.name, MaxMessages: int32(n)})
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil // the wait ran out with nothing to deliver
		}
		return nil, fmt.Errorf("idempubsub: pull from %s: %w", s.name, err)
	}
	rms := resp.GetReceivedMessages()
	if len(rms) == 0 {
		return nil, nil
	}
	ids := make([]string, len(rms))
	ds := make([]*Delivery, len(rms))
	// The deadline counts from before the call: Pub/Sub's runs from when it handles it.
	deadline := time.Now().Add(s.cfg.Lease)
	for i, rm := range rms {
		ids[i] = rm.GetAckId()
		ds[i] = &Delivery{src: s, ackID: rm.GetAckId(), rm: rm, deadline: deadline}
	}
	mctx, cancel := context.WithTimeout(context.Background(), callMargin)
	defer cancel()
	if err := s.modack(mctx, ids, s.cfg.Lease); err != nil {
		return nil, fmt.Errorf("idempubsub: set the ack deadline of %d pulled messages on %s: %w", len(ids), s.name, err)
	}
	return ds, nil
}

// handOut decodes deliveries a caller will see, counts their attempt and holds them until the
// ack deadline their pull set.
func (s *Source) handOut(ds []*Delivery) []idem.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]idem.Delivery, len(ds))
	for i, d := range ds {
		pm := d.rm.GetMessage()
		attempt := int(d.rm.GetDeliveryAttempt())
		if !s.brokerN || attempt < 1 {
			attempt = s.attempts.next(pm.GetMessageId())
		}
		m, err := Decode(pm.GetData(), pm.GetAttributes(), pm.GetPublishTime().AsTime(), attempt)
		if err != nil {
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[AttrDecodeError] = err.Error()
			m.EventID = ""
		}
		d.msg = m
		s.held[d.ackID] = d.deadline
		out[i] = d
	}
	return out
}

// giveBack makes deliveries no caller saw available again at once.
func (s *Source) giveBack(ds []*Delivery) {
	if len(ds) == 0 {
		return
	}
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.ackID
	}
	ctx, cancel := context.WithTimeout(context.Background(), callMargin)
	defer cancel()
	// A failure leaves them leased: they come back after the lease, which is safe.
	_ = s.modack(ctx, ids, 0)
}

// modack sets the ack deadline of ackIDs to d (0: redeliver now).
func (s *Source) modack(ctx context.Context, ackIDs []string, d time.Duration) error {
	return s.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
		Subscription: s.name, AckIds: ackIDs, AckDeadlineSeconds: seconds(d),
	})
}

// release forgets a settled delivery; forget also drops its attempt count (it will not return).
func (s *Source) release(d *Delivery, forget bool) {
	s.mu.Lock()
	delete(s.held, d.ackID)
	if forget {
		s.attempts.forget(d.rm.GetMessage().GetMessageId())
	}
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// attemptsGeneration is how many message ids one generation of a Source's attempt counts holds.
const attemptsGeneration = 1 << 15

// attemptCounts counts the deliveries of each message a Source handed out, in two generations
// of at most max ids each: an id is counted in the current one, and when it is full it becomes
// the previous one and the one before is dropped. An ack or a term forgets an id, but a message
// this source held and another source of the subscription settled (a lease that ran out, a
// delivery given back) is never settled here; without generations its count would stay for
// the life of the process. A message still going round is seen again and moves to the current
// generation; one that returns only after 2×max other ids were counted starts again at 1, which
// can only give it more attempts before its dead letter, never fewer. Its caller holds the
// Source's lock.
type attemptCounts struct {
	max       int
	cur, prev map[string]int
}

func newAttemptCounts(max int) attemptCounts {
	return attemptCounts{max: max, cur: make(map[string]int), prev: make(map[string]int)}
}

// next counts one more delivery of message id and returns its number, 1 for the first.
func (a *attemptCounts) next(id string) int {
	n, ok := a.cur[id]
	if !ok {
		n = a.prev[id]
		delete(a.prev, id)
	}
	n++
	a.cur[id] = n
	if len(a.cur) >= a.max {
		a.prev, a.cur = a.cur, make(map[string]int)
	}
	return n
}

// forget drops the count of message id: it was settled and will not come back.
func (a *attemptCounts) forget(id string) {
	delete(a.cur, id)
	delete(a.prev, id)
}

// Delivery is one message received through a Source.
type Delivery struct {
	src      *Source
	ackID    string
	rm       *pubsubpb.ReceivedMessage
	msg      idem.Message
	deadline time.Time // the ack deadline set when pulled (later ones are in src.held)
}

var _ idem.Delivery = (*Delivery)(nil)

// Message returns the decoded message. Its Attempt is Pub/Sub's DeliveryAttempt when the
// subscription has a dead-letter policy, else this source's own count of deliveries.
func (d *Delivery) Message() idem.Message { return d.msg }

// MessageID is Pub/Sub's id of the message.
func (d *Delivery) MessageID() string { return d.rm.GetMessage().GetMessageId() }

// Ack acknowledges the message.
func (d *Delivery) Ack(ctx context.Context) error { return d.ack(ctx, "ack") }

// Term acknowledges the message too: the consumer wrote it to idem's dead-letter table, so
// Pub/Sub must never deliver it again (nor forward it to the subscription's dead-letter topic).
func (d *Delivery) Term(ctx context.Context) error { return d.ack(ctx, "term") }

func (d *Delivery) ack(ctx context.Context, op string) error {
	err := d.src.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{
		Subscription: d.src.name, AckIds: []string{d.ackID},
	})
	if err != nil {
		return fmt.Errorf("idempubsub: %s on %s: %w", op, d.src.name, err)
	}
	d.src.release(d, true)
	return nil
}

// Extend sets the message's ack deadline to the source's lease from now. Once the deadline
// (less fenceMargin) passed, or the delivery was settled, it fails with idem.ErrLeaseLost
// instead (see fenced).
func (d *Delivery) Extend(ctx context.Context) error {
	s := d.src
	start := time.Now()
	if err := d.fenced("extend", start); err != nil {
		return err
	}
	if err := s.modack(ctx, []string{d.ackID}, s.cfg.Lease); err != nil {
		return fmt.Errorf("idempubsub: extend on %s: %w", s.name, err)
	}
	s.mu.Lock()
	if _, ok := s.held[d.ackID]; ok {
		s.held[d.ackID] = start.Add(s.cfg.Lease)
	}
	s.mu.Unlock()
	return nil
}

// fenceMargin is how long before a delivery's ack deadline the source stops changing it: a
// ModifyAckDeadline sent then may reach Pub/Sub after the deadline, when the message may be
// someone else's.
func fenceMargin(lease time.Duration) time.Duration { return min(time.Second, lease/10) }

// fenced returns an error wrapping idem.ErrLeaseLost when, at now, d's ack deadline is within
// fenceMargin or past, or d was settled. Pub/Sub accepts a ModifyAckDeadline on an expired ack
// id without error after it may have delivered the message again, so only the source can tell
// that this delivery is no longer the one leased: an Extend then would keep a handler running
// beside the redelivery, a Nak would move a message another worker holds.
func (d *Delivery) fenced(op string, now time.Time) error {
	s := d.src
	s.mu.Lock()
	dl, ok := s.held[d.ackID]
	s.mu.Unlock()
	if !ok || !now.Before(dl.Add(-fenceMargin(s.cfg.Lease))) {
		return fmt.Errorf("idempubsub: %s on %s: the ack deadline passed or the message was settled: %w", op, s.name, idem.ErrLeaseLost)
	}
	return nil
}

// Nak asks for redelivery after delay through the ack deadline: ModifyAckDeadline(0) makes the
// message available at once, ModifyAckDeadline(delay) keeps it away until the delay passes.
// The delay is rounded up to whole seconds and capped at LeaseMax (600 s), Pub/Sub's longest
// ack deadline; the subscription's retry policy, if any, applies only to Nak(0).
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	if err := d.fenced("nak", time.Now()); err != nil {
		// Past its deadline the message comes back by itself.
		d.src.release(d, false)
		return err
	}
	if err := d.src.modack(ctx, []string{d.ackID}, delay); err != nil {
		return fmt.Errorf("idempubsub: nak on %s: %w", d.src.name, err)
	}
	d.src.release(d, false)
	return nil
}
