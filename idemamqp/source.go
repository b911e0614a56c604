package idemamqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
)

// ErrClosed is returned by Receive on a Source after Close.
var ErrClosed = errors.New("source closed")

// RedeliveryWindowUnbounded is what RedeliveryWindow returns for a work queue without a message
// TTL: a message can wait in it for any time, so no claim retention covers it. It is 100 years
// rather than the largest Duration so that adding a retry budget and a lease cannot overflow.
const RedeliveryWindowUnbounded = 100 * 365 * 24 * time.Hour

// Source consumes a RabbitMQ work queue with manual acknowledgements and a prefetch. It is safe
// for concurrent use.
//
// It owns its connection: it dials through its Dialer, and when the connection or channel is
// lost it dials again with backoff, declares its topology again and consumes on. Deliveries of
// the lost channel can no longer be settled (the broker already put them back, flagged
// redelivered); settling one returns an error wrapping idem.ErrLeaseLost.
type Source struct {
	cfg  SourceConfig
	name string
	dial Dialer
	tag  string // consumer tag prefix

	in chan *Delivery // deliveries received and not yet handed out

	closed context.Context // cancelled by Close, with cause ErrClosed
	close  context.CancelCauseFunc
	wg     sync.WaitGroup

	// Demand: Receive counts itself in waiting while it waits, signals demand, and stamps
	// lastTake (unix nanoseconds) when it takes a delivery.
	waiting   atomic.Int64
	demand    chan struct{}
	lastTake  atomic.Int64
	consumers int // consumer tags issued; only the run goroutine touches it

	// implicitLimit is the delivery limit the broker last connected to applies to the work
	// queue without an x-delivery-limit (implicitDeliveryLimit), set on every connect.
	implicitLimit atomic.Int64
}

// session is one connection with its consuming channel and its publishing channel (for naks).
// Everything received on it dies with it.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	pub  *publisher
	// tag and deliveries are the current consumer's; only the run goroutine touches them.
	tag        string
	deliveries <-chan amqp.Delivery
	dead       chan struct{} // closed when the session ended
	once       sync.Once
}

// end marks the session dead and closes its connection; the broker requeues what it holds.
func (s *session) end() {
	s.once.Do(func() {
		close(s.dead)
		_ = s.conn.Close()
	})
}

// isDead reports whether the session ended.
func (s *session) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

var _ idem.Source = (*Source)(nil)

// NewSource connects through dial, declares the work queue and its delay queues, and starts
// consuming. It fails when the first connection or declaration fails (a wrong URL or a queue
// declared earlier with other arguments); later losses are retried in the background until
// Close.
func NewSource(ctx context.Context, dial Dialer, cfg SourceConfig) (*Source, error) {
	if dial == nil {
		return nil, errors.New("idemamqp: NewSource: Dialer is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	closed, closeFn := context.WithCancelCause(context.Background())
	s := &Source{
		cfg:    cfg,
		name:   cfg.Queue,
		dial:   dial,
		tag:    "idem-" + hex.EncodeToString(b[:]),
		in:     make(chan *Delivery, cfg.Prefetch),
		demand: make(chan struct{}, 1),
		closed: closed,
		close:  closeFn,
	}
	s.lastTake.Store(time.Now().UnixNano())
	sess, err := s.connect(ctx)
	if err != nil {
		closeFn(ErrClosed)
		return nil, err
	}
	s.wg.Add(1)
	go s.run(sess)
	return s, nil
}

// Name is the work queue's name.
func (s *Source) Name() string { return s.name }

// Lease is SourceConfig.Lease: how long a delivery stays with a worker that does not settle or
// extend it before the source gives it back.
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// DeliveryLimit is the quorum queue's x-delivery-limit: SourceConfig.DeliveryLimit, or, when
// that is 0, the limit the broker applies by itself (20 on a quorum queue from RabbitMQ 4.0), or
// 0 when there is none. The consumer checks it against its retry policy (idem.CheckSourceLimits):
// at its limit the broker drops a message that was neither applied nor dead-lettered.
func (s *Source) DeliveryLimit() int {
	if s.cfg.DeliveryLimit > 0 {
		return s.cfg.DeliveryLimit
	}
	return int(s.implicitLimit.Load())
}

// QuorumDeliveryLimitDefault is the delivery limit RabbitMQ 4.0 and later give a quorum queue
// declared without x-delivery-limit (earlier versions give none).
const QuorumDeliveryLimitDefault = 20

// implicitDeliveryLimit is the delivery limit a broker reporting version (the connection's
// server property "version", "4.0.5") applies to a queue of queueType declared without
// x-delivery-limit: QuorumDeliveryLimitDefault for a quorum queue from RabbitMQ 4, else 0. A
// version that does not parse counts as 4 or later: assuming a limit is only ever stricter.
func implicitDeliveryLimit(version any, queueType string) int {
	if queueType != QueueQuorum {
		return 0
	}
	v, _ := version.(string)
	major, _, _ := strings.Cut(v, ".")
	if n, err := strconv.Atoi(major); err == nil && n < 4 {
		return 0
	}
	return QuorumDeliveryLimitDefault
}

// RedeliveryWindow is how long after publishing the broker can deliver the same event again:
// a message waits in the work queue until consumed (bounded by MessageTTL when set, else
// RedeliveryWindowUnbounded), a nak'ed copy in a delay queue at most the largest tier, and an
// unacked delivery comes back at the latest when consumer_timeout closes its channel.
func (s *Source) RedeliveryWindow() time.Duration {
	if s.cfg.MessageTTL <= 0 {
		return RedeliveryWindowUnbounded
	}
	return s.cfg.MessageTTL + s.cfg.DelayTiers[len(s.cfg.DelayTiers)-1] + s.cfg.ConsumerTimeout
}

// Close stops consuming and closes the connection: deliveries not settled yet are requeued by
// the broker (flagged redelivered) and can no longer be settled here. Later Receives fail with
// ErrClosed.
func (s *Source) Close() error {
	s.close(ErrClosed)
	s.wg.Wait()
	return nil
}

// connect dials, declares the topology and starts consuming.
func (s *Source) connect(ctx context.Context) (*session, error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("idemamqp: connect for queue %s: %w", s.name, err)
	}
	fail := func(what string, err error) (*session, error) {
		_ = conn.Close()
		return nil, fmt.Errorf("idemamqp: %s on queue %s: %w", what, s.name, err)
	}
	s.implicitLimit.Store(int64(implicitDeliveryLimit(conn.Properties["version"], s.cfg.QueueType)))
	ch, err := conn.Channel()
	if err != nil {
		return fail("open channel", err)
	}
	if err := s.declare(ch); err != nil {
		return fail("declare", err)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fail("set prefetch", err)
	}
	pub, err := newPublisher(conn)
	if err != nil {
		return fail("publisher", err)
	}
	sess := &session{conn: conn, ch: ch, pub: pub, dead: make(chan struct{})}
	if err := s.consume(sess); err != nil {
		return fail("consume", err)
	}
	// Losing either channel ends the session; the consuming one ends the deliveries too.
	go func() {
		select {
		case <-pub.done:
			sess.end()
		case <-sess.dead:
		}
	}()
	return sess, nil
}

// declare declares the work queue and its delay queues. Each delay queue holds messages for
// its tier's TTL and then dead-letters them through the default exchange back to the work
// queue; one TTL per queue, because RabbitMQ expires messages only at the head of a queue.
func (s *Source) declare(ch *amqp.Channel) error {
	args := amqp.Table{"x-queue-type": s.cfg.QueueType}
	for k, v := range s.cfg.QueueArgs {
		args[k] = v
	}
	if s.cfg.DeliveryLimit > 0 {
		args["x-delivery-limit"] = int64(s.cfg.DeliveryLimit)
	}
	if s.cfg.MessageTTL > 0 {
		args["x-message-ttl"] = s.cfg.MessageTTL.Milliseconds()
	}
	if _, err := ch.QueueDeclare(s.name, true, false, false, false, args); err != nil {
		return fmt.Errorf("queue %s: %w", s.name, err)
	}
	for _, b := range s.cfg.Bindings {
		if err := ch.ExchangeDeclare(b.Exchange, b.Kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("exchange %s: %w", b.Exchange, err)
		}
		if err := ch.QueueBind(s.name, b.RoutingKey, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to exchange %s with key %q: %w", s.name, b.Exchange, b.RoutingKey, err)
		}
	}
	for _, tier := range s.cfg.DelayTiers {
		name := DelayQueueName(s.name, tier)
		dargs := amqp.Table{
			"x-queue-type":              s.cfg.QueueType,
			"x-message-ttl":             tier.Milliseconds(),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": s.name,
		}
		if s.cfg.QueueType == QueueQuorum {
			// Quorum queues dead-letter at least once (a classic queue may lose a message it
			// dead-letters while the broker restarts); that strategy needs reject-publish.
			dargs["x-dead-letter-strategy"] = "at-least-once"
			dargs["x-overflow"] = "reject-publish"
		}
		for k, v := range s.cfg.DelayQueueArgs {
			dargs[k] = v
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, dargs); err != nil {
			return fmt.Errorf("delay queue %s: %w", name, err)
		}
	}
	return nil
}

// run forwards deliveries until Close, reconnecting with backoff whenever the session ends.
func (s *Source) run(sess *session) {
	defer s.wg.Done()
	backoff := s.cfg.ReconnectMin
	for {
		lost, held := s.forward(sess)
		if !lost {
			s.handBack(sess, held...)
		}
		sess.end()
		if !lost {
			return
		}
		// What the dead session left unreceived is the broker's again; drop it so that the
		// new session's prefetch finds room.
		for drained := false; !drained; {
			select {
			case <-s.in:
			default:
				drained = true
			}
		}
		s.cfg.Logger.Warn("idemamqp: connection lost; reconnecting", "queue", s.name)
		for {
			var err error
			sess, err = s.connect(s.closed)
			if err == nil {
				s.cfg.Logger.Info("idemamqp: reconnected", "queue", s.name)
				backoff = s.cfg.ReconnectMin
				break
			}
			if s.closed.Err() != nil {
				return
			}
			s.cfg.Logger.Warn("idemamqp: reconnect failed", "queue", s.name, "error", err, "retry_in", backoff.String())
			select {
			case <-time.After(backoff):
			case <-s.closed.Done():
				return
			}
			backoff = min(2*backoff, s.cfg.ReconnectMax)
		}
	}
}

// forward hands the session's deliveries to Receive until the session ends (lost = true) or
// the source closes (lost = false). RabbitMQ pushes up to the prefetch ahead of demand, so a
// source nobody receives from (a paused consumer) would sit on those messages: when deliveries
// have waited a whole lease with no Receive taking one, forward stops consuming, hands them
// back to the queue for the other consumers, and consumes again at the next Receive.
//
// A delivery forward holds when the source closes is returned as held, for handBack: select
// picks at random between the close and a free slot in s.in, and a delivery dropped there would
// be requeued by the channel's close flagged redelivered, an attempt no handler made.
func (s *Source) forward(sess *session) (lost bool, held []amqp.Delivery) {
	check := time.NewTicker(min(s.cfg.Lease/2, time.Second))
	defer check.Stop()
	for {
		select {
		case raw, ok := <-sess.deliveries:
			if !ok {
				return s.closed.Err() == nil, nil
			}
			d := s.delivery(sess, raw)
			select {
			case s.in <- d:
			case <-sess.dead:
				return s.closed.Err() == nil, nil
			case <-s.closed.Done():
				return false, []amqp.Delivery{raw}
			}
		case <-check.C:
			if len(s.in) == 0 || s.waiting.Load() > 0 || time.Since(time.Unix(0, s.lastTake.Load())) < s.cfg.Lease {
				continue
			}
			if !s.handBack(sess) {
				return s.closed.Err() == nil, nil
			}
			s.cfg.Logger.Debug("idemamqp: no receiver for a lease; handed the prefetch back", "queue", s.name)
			select {
			case <-s.demand: // a stale token from before the pause
			default:
			}
			for s.waiting.Load() == 0 {
				select {
				case <-s.demand:
				case <-check.C:
				case <-sess.dead:
					return s.closed.Err() == nil, nil
				case <-s.closed.Done():
					return false, nil
				}
			}
			if err := s.consume(sess); err != nil {
				return s.closed.Err() == nil, nil
			}
		case <-sess.dead:
			return s.closed.Err() == nil, nil
		case <-s.closed.Done():
			return false, nil
		}
	}
}

// consume starts a consumer on the session's channel under a new tag.
func (s *Source) consume(sess *session) error {
	s.consumers++
	tag := fmt.Sprintf("%s-%d", s.tag, s.consumers)
	deliveries, err := sess.ch.Consume(s.name, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	sess.tag, sess.deliveries = tag, deliveries
	return nil
}

// handBackTimeout bounds how long handing back the deliveries no Receive took may last.
const handBackTimeout = 5 * time.Second

// handBack cancels the consumer and returns the deliveries the broker sent ahead (the
// prefetch) that no Receive took: each is republished to the work queue with its attempt
// unchanged and then acked. Merely closing the channel would requeue them flagged redelivered,
// and every graceful restart would then count an attempt against messages no handler saw. It
// reports whether everything was handed back; what was not is left to the broker's requeue
// when the session ends.
func (s *Source) handBack(sess *session, held ...amqp.Delivery) bool {
	ctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
	defer cancel()
	if err := sess.ch.Cancel(sess.tag, false); err != nil {
		return false
	}
	back := func(raw amqp.Delivery) bool {
		m, _ := DecodeDelivery(raw)
		if sess.pub.publishWait(ctx, "", s.name, republishing(raw, m.Attempt)) != nil {
			return false
		}
		return raw.Ack(false) == nil
	}
	for _, raw := range held {
		if !back(raw) {
			return false
		}
	}
	for drained := false; !drained; {
		select {
		case d := <-s.in:
			if d.sess == sess && !back(d.raw) {
				return false
			}
		default:
			drained = true
		}
	}
	for {
		select {
		case raw, ok := <-sess.deliveries:
			if !ok {
				return true
			}
			if !back(raw) {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
}

// Receive returns between 1 and max deliveries, waiting until one is available or ctx ends
// (then it returns ctx.Err()). Deliveries of a session that ended meanwhile are skipped: the
// broker has put them back and delivers them again.
func (s *Source) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("idemamqp: receive from %s: max is %d, want at least 1", s.name, max)
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.demand <- struct{}{}:
	default:
	}
	var out []idem.Delivery
	for len(out) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if s.closed.Err() != nil {
			return nil, fmt.Errorf("idemamqp: receive from %s: %w", s.name, ErrClosed)
		}
		select {
		case d := <-s.in:
			out = s.take(out, d)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed.Done():
			return nil, fmt.Errorf("idemamqp: receive from %s: %w", s.name, ErrClosed)
		}
	}
	for len(out) < max {
		select {
		case d := <-s.in:
			out = s.take(out, d)
		default:
			return out, nil
		}
	}
	return out, nil
}

// take appends d to out and starts its lease, unless its session has ended. A delivery that
// waited in the prefetch so long that one lease would carry it past consumer_timeout is given
// back instead: handed out, it would make the broker close the channel under every other one.
func (s *Source) take(out []idem.Delivery, d *Delivery) []idem.Delivery {
	s.lastTake.Store(time.Now().UnixNano())
	if d.sess.isDead() {
		return out
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.received)+s.cfg.Lease > s.consumerLimit() {
		_ = d.raw.Nack(false, true)
		d.lost = fmt.Errorf("%w: it waited in the prefetch too close to consumer_timeout", idem.ErrLeaseLost)
		return out
	}
	d.handed = time.Now()
	d.deadline = d.handed.Add(s.cfg.Lease)
	d.timer = time.AfterFunc(s.cfg.Lease, d.expire)
	return append(out, d)
}

// consumerLimit is how long a delivery may stay unacked before the source gives it back
// itself: ConsumerTimeout less a margin (a minute, or a tenth of a short timeout), since the
// broker checks the timeout only periodically.
func (s *Source) consumerLimit() time.Duration {
	return s.cfg.ConsumerTimeout - min(consumerTimeoutMargin, s.cfg.ConsumerTimeout/10)
}

// delivery decodes raw into a Delivery. A message that does not decode is still handed out,
// with an empty EventID and the reason in HeaderDecodeError, so the consumer dead-letters it as
// invalid_payload instead of the source failing or dropping it.
func (s *Source) delivery(sess *session, raw amqp.Delivery) *Delivery {
	msg, err := DecodeDelivery(raw)
	if err != nil {
		if msg.Headers == nil {
			msg.Headers = make(map[string]string, 2)
		}
		if msg.EventID != "" {
			msg.Headers[HeaderEventID] = msg.EventID
		}
		msg.Headers[HeaderDecodeError] = err.Error()
		msg.EventID = ""
	}
	if s.cfg.Tenant != "" {
		if msg.Tenant != "" && msg.Tenant != s.cfg.Tenant {
			if msg.Headers == nil {
				msg.Headers = make(map[string]string, 1)
			}
			msg.Headers[HeaderTenant] = msg.Tenant
		}
		msg.Tenant = s.cfg.Tenant
	}
	return &Delivery{src: s, sess: sess, raw: raw, m: msg, received: time.Now()}
}

// Delivery is one message received from RabbitMQ and the handle to settle it. Only the channel
// it arrived on can settle it; once that channel is gone, or the lease passed, every settle
// returns an error wrapping idem.ErrLeaseLost.
type Delivery struct {
	src      *Source
	sess     *session
	raw      amqp.Delivery
	m        idem.Message
	received time.Time // when the broker handed it to this client (consumer_timeout runs from here)

	mu       sync.Mutex
	handed   time.Time
	deadline time.Time // the lease's end; Extend moves it
	timer    *time.Timer
	settled  bool
	lost     error // why the delivery can no longer be settled
}

var _ idem.Delivery = (*Delivery)(nil)

// Message returns the decoded message.
func (d *Delivery) Message() idem.Message { return d.m }

// Raw returns the underlying AMQP delivery, for properties idem does not map (exchange,
// routing key, delivery tag, Redelivered).
func (d *Delivery) Raw() amqp.Delivery { return d.raw }

// expire gives the delivery back to the queue when its lease passed unsettled and unextended.
func (d *Delivery) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled || d.lost != nil || time.Now().Before(d.deadline) {
		return // settled, or extended while this timer fired (Reset arms it again)
	}
	d.giveBack(fmt.Errorf("%w: the lease of %v passed unextended; the delivery was given back", idem.ErrLeaseLost, d.src.cfg.Lease))
}

// giveBack returns the message to the queue (flagged redelivered) and marks the delivery lost.
// The caller holds d.mu.
func (d *Delivery) giveBack(why error) {
	d.lost = why
	if d.timer != nil {
		d.timer.Stop()
	}
	if !d.sess.isDead() {
		_ = d.raw.Nack(false, true)
	}
}

// usable returns why the delivery cannot be settled now, or nil. The caller holds d.mu.
func (d *Delivery) usable() error {
	switch {
	case d.lost != nil:
		return d.lost
	case d.settled:
		return errors.New("delivery already settled")
	case d.sess.isDead():
		d.lost = fmt.Errorf("%w: its channel closed; the broker redelivers it", idem.ErrLeaseLost)
		return d.lost
	}
	return nil
}

// settle marks the delivery settled after a successful ack. The caller holds d.mu.
func (d *Delivery) settle() {
	d.settled = true
	if d.timer != nil {
		d.timer.Stop()
	}
}

// ack sends basic.ack. RabbitMQ does not confirm acks: an ack written to a channel that dies
// before the broker reads it is lost, and the message comes back flagged redelivered, where the
// consumer's claim recognises it as a duplicate.
func (d *Delivery) ack(op string) error {
	if err := d.usable(); err != nil {
		return d.wrap(op, err)
	}
	if err := d.raw.Ack(false); err != nil {
		if errors.Is(err, amqp.ErrClosed) || d.sess.isDead() {
			d.lost = fmt.Errorf("%w: its channel closed; the broker redelivers it: %w", idem.ErrLeaseLost, err)
			return d.wrap(op, d.lost)
		}
		return d.wrap(op, err)
	}
	d.settle()
	return nil
}

// Ack acknowledges the message on the channel it arrived on.
func (d *Delivery) Ack(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return d.wrap("ack", err)
	}
	return d.ack("ack")
}

// Term acknowledges the message: the consumer has written it to idem's dead-letter table, so
// no broker dead-letter exchange is involved and the broker forgets it.
func (d *Delivery) Term(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return d.wrap("term", err)
	}
	return d.ack("term")
}

// Nak sends a copy of the message, with Idem-Attempt set to the next attempt, to the delay
// queue of DelayTier(delay) (or straight back to the work queue when delay <= 0), waits for the
// broker's confirm and then acks the original. The delay is rounded up to the next tier, so
// the message never comes back early; past the largest tier it waits the largest. Should the
// ack be lost after the copy was confirmed, both come back, and the consumer's claim absorbs
// the second.
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return d.wrap("nak", err)
	}
	if err := d.usable(); err != nil {
		return d.wrap("nak", err)
	}
	target := d.src.name
	if tier := DelayTier(d.src.cfg.DelayTiers, delay); tier > 0 {
		target = DelayQueueName(d.src.name, tier)
	}
	if err := d.sess.pub.publishWait(ctx, "", target, republishing(d.raw, saturatingAdd(d.m.Attempt, 1))); err != nil {
		if d.sess.isDead() {
			return d.wrap("nak", fmt.Errorf("%w: its channel closed; the broker redelivers it: %w", idem.ErrLeaseLost, err))
		}
		return d.wrap("nak", fmt.Errorf("republish to %s: %w", target, err))
	}
	return d.ack("nak")
}

// Extend restarts the delivery's lease. RabbitMQ has no per-message visibility timeout to
// push, so nothing goes to the broker: Extend succeeds while the channel lives and the
// delivery is younger than ConsumerTimeout less a minute. Past that it gives the delivery back
// and fails with idem.ErrLeaseLost, since the broker would otherwise close the channel and take
// every other delivery on it too.
func (d *Delivery) Extend(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return d.wrap("extend", err)
	}
	if err := d.usable(); err != nil {
		return d.wrap("extend", err)
	}
	if time.Since(d.received)+d.src.cfg.Lease > d.src.consumerLimit() {
		d.giveBack(fmt.Errorf("%w: the delivery would outlive the broker's consumer_timeout (%v); it was given back", idem.ErrLeaseLost, d.src.cfg.ConsumerTimeout))
		return d.wrap("extend", d.lost)
	}
	d.deadline = time.Now().Add(d.src.cfg.Lease)
	if d.timer != nil {
		d.timer.Reset(d.src.cfg.Lease)
	}
	return nil
}

// wrap names the operation and the queue in a settle error. The event id is not mentioned: the
// consumer adds it once.
func (d *Delivery) wrap(op string, err error) error {
	return fmt.Errorf("idemamqp: %s on %s: %w", op, d.src.name, err)
}
