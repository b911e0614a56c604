package idemnats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/retry"
)

// Defaults and bounds of SourceConfig.
const (
	// AckWaitDefault is the lease when SourceConfig.AckWait is zero: long enough for a handler
	// and its transaction, short enough that a crashed worker's message comes back soon. The
	// consumer extends it at a third while a handler runs, so it need not cover the slowest one.
	AckWaitDefault = 30 * time.Second
	// MaxDeliverDefault is the broker's delivery limit when SourceConfig.MaxDeliver is zero:
	// unlimited. At its limit JetStream stops delivering a message without telling the consumer,
	// so idem could neither handle nor dead-letter it; the retry policy is the budget instead.
	MaxDeliverDefault = -1
	// MaxDeliverHeadroom is how many deliveries above the retry policy's MaxAttempts a bounded
	// MaxDeliver must allow: deliveries that end without a verdict (a lost lease, a give-back at
	// shutdown or at the end of a Receive) count against JetStream's limit but not the policy's.
	// It is the consumer's own margin (idem.DeliveryLimitMargin), which Run checks against
	// Source.DeliveryLimit with the consumer's actual policy (idem.CheckSourceLimits).
	MaxDeliverHeadroom = idem.DeliveryLimitMargin
	// MaxWaitDefault is the long-poll of one fetch when SourceConfig.MaxWait is zero.
	MaxWaitDefault = 5 * time.Second
	// MaxWaitMin keeps an idle Receive from spinning on fetches that expire at once.
	MaxWaitMin = 10 * time.Millisecond
	// PrefetchDefault is how many messages a pull request asks for beyond what its Receive
	// asked for when SourceConfig.Prefetch is zero: none (see Prefetch for the trade-off).
	PrefetchDefault = 0
	// TermReason is sent with a terminating ack to servers from 2.10.4 on and appears in the
	// server's advisory, so an operator looking at JetStream sees where the message went.
	TermReason = "idem: dead-lettered by the consumer"
)

// ErrClosed is returned by Receive on a Source after Close.
var ErrClosed = errors.New("idemnats: source closed")

// SourceConfig configures a Source: which stream and durable pull consumer it reads.
type SourceConfig struct {
	// Stream is the JetStream stream to read (required).
	Stream string
	// Subject filters the stream's subjects; empty means every message of the stream.
	Subject string
	// Durable names the durable pull consumer (required). Sources with the same Durable share
	// its messages, and a reopened source resumes where the last one acked.
	Durable string
	// AckWait is the lease: how long a delivery stays with this worker before JetStream
	// redelivers it (default AckWaitDefault).
	AckWait time.Duration
	// MaxDeliver is JetStream's own limit on deliveries of one message (default
	// MaxDeliverDefault: -1, unlimited). When the broker reaches it, it stops delivering the
	// message: it is neither handled nor dead-lettered, and only a JetStream advisory
	// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<durable>) records it. A bounded
	// value must be at least Retry.MaxAttempts + MaxDeliverHeadroom, so that the consumer's
	// policy always dead-letters first; subscribe to the advisory if you set one.
	MaxDeliver int
	// Retry is the retry policy of the consumer reading this source (its zero value is the
	// policy's defaults). It is only used to validate a bounded MaxDeliver.
	Retry retry.Policy
	// MaxWait bounds one long-poll fetch (default MaxWaitDefault); Receive repeats fetches
	// until a message arrives or its context ends, so this only sets how often it re-asks.
	MaxWait time.Duration
	// Prefetch is how many messages a pull request asks for beyond what Receive asked for
	// (default PrefetchDefault, none; negative: none), so that a consumer whose workers free
	// one at a time does not pay a pull request per message. The Source holds them for the
	// next Receives, for at most a third of AckWait (the consumer extends a lease at a third,
	// so a message handed out still has two thirds of it); what is not handed out by then, or
	// at Close, is nak'ed. This Source does not count such a delivery as an attempt, but
	// JetStream does: a message given back at Close reaches the next Source with one more
	// attempt than it was handled (transporttest's PersistentResume), which is why it is off
	// unless asked for.
	Prefetch int
	// AsyncAck makes Delivery.Ack send the ack without waiting for the server to confirm it.
	// It saves each worker a round trip per message after its commit. The ack is still sent
	// only after the commit; one lost on the way redelivers the message after AckWait, which
	// the consumer's claim finds a duplicate and acks again. Off (the default), Ack waits for
	// the confirmation, so that a lost ack is an error there (and logged) rather than a silent
	// redelivery later.
	AsyncAck bool
	// Tenant, when set, is the tenant of every message from this source: the stream is bound to
	// one tenant by its credentials. A different tenant claimed in the Idem-Tenant header is kept
	// in Headers under that name, so an Authenticator can refuse the mismatch.
	Tenant string
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.AckWait == 0 {
		c.AckWait = AckWaitDefault
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = MaxDeliverDefault
	}
	if c.MaxWait == 0 {
		c.MaxWait = MaxWaitDefault
	}
	if c.Prefetch == 0 {
		c.Prefetch = PrefetchDefault
	}
	return c
}

// validate reports every invalid field of a config with defaults applied, naming each.
func (c SourceConfig) validate() error {
	var errs []error
	if c.Stream == "" {
		errs = append(errs, errors.New("Stream is empty"))
	}
	if c.Durable == "" {
		errs = append(errs, errors.New("Durable is empty"))
	}
	if c.AckWait < 0 {
		errs = append(errs, fmt.Errorf("AckWait is %v, want > 0", c.AckWait))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retry: %w", err))
	} else if attempts := c.Retry.WithDefaults().MaxAttempts; c.MaxDeliver < -1 || c.MaxDeliver >= 0 && c.MaxDeliver < attempts+MaxDeliverHeadroom {
		errs = append(errs, fmt.Errorf("MaxDeliver is %d, want -1 (unlimited) or at least %d (the retry policy's %d attempts + %d for deliveries that end without a verdict): at its limit JetStream drops the message without a dead letter",
			c.MaxDeliver, attempts+MaxDeliverHeadroom, attempts, MaxDeliverHeadroom))
	}
	if c.MaxWait < MaxWaitMin {
		errs = append(errs, fmt.Errorf("MaxWait is %v, want at least %v", c.MaxWait, MaxWaitMin))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemnats: invalid SourceConfig for stream %q durable %q: %w", c.Stream, c.Durable, err)
	}
	return nil
}

// Source receives from a durable JetStream pull consumer. It is safe for concurrent use.
type Source struct {
	cfg  SourceConfig
	name string
	js   jetstream.JetStream
	cons jetstream.Consumer
	// window is the stream's redelivery window (RedeliveryWindow of its info at NewSource).
	window time.Duration
	// givenBack counts, per stream sequence, the deliveries this source nak'ed for a Receive
	// that ended before returning them: JetStream counted them in NumDelivered, but no handler
	// saw them, so they are taken off Message.Attempt when the message comes back.
	mu        sync.Mutex
	givenBack map[uint64]int
	// closed is cancelled by Close (with cause ErrClosed) and ends in-flight Receives.
	closed context.Context
	close  context.CancelCauseFunc

	// ahead holds deliveries pulled beyond what a Receive asked for (Prefetch), in order,
	// until a later Receive takes them or aheadTimer gives them back; aheadGen tells a timer
	// whether the deliveries it was set for are still the ones held.
	aheadMu    sync.Mutex
	ahead      []idem.Delivery
	aheadGen   uint64
	aheadTimer *time.Timer
}

var (
	_ idem.Source             = (*Source)(nil)
	_ idem.DeliveryLimiter    = (*Source)(nil)
	_ idem.RedeliveryWindower = (*Source)(nil)
)

// NewSource creates the durable pull consumer cfg.Durable on cfg.Stream with explicit acks, or
// updates it to cfg when it exists, and returns a Source reading from it.
func NewSource(ctx context.Context, js jetstream.JetStream, cfg SourceConfig) (*Source, error) {
	if js == nil {
		return nil, errors.New("idemnats: NewSource: JetStream is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       cfg.Durable,
		Description:   "idem source",
		FilterSubject: cfg.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("idemnats: create consumer %s on stream %s: %w", cfg.Durable, cfg.Stream, err)
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("idemnats: read stream %s: %w", cfg.Stream, err)
	}
	closed, closeFn := context.WithCancelCause(context.Background())
	return &Source{
		givenBack: make(map[uint64]int),
		window:    RedeliveryWindow(stream.CachedInfo()),
		cfg:       cfg,
		name:      cfg.Stream + "/" + cfg.Durable,
		js:        js,
		cons:      cons,
		closed:    closed,
		close:     closeFn,
	}, nil
}

// Name is "stream/durable".
func (s *Source) Name() string { return s.name }

// Lease is the consumer's AckWait.
func (s *Source) Lease() time.Duration { return s.cfg.AckWait }

// DeliveryLimit is JetStream's limit on deliveries of one message (SourceConfig.MaxDeliver),
// or 0 when there is none (the default). The consumer checks it against its retry policy: a
// broker that stops delivering first drops the message without a dead letter.
func (s *Source) DeliveryLimit() int {
	if s.cfg.MaxDeliver < 0 {
		return 0
	}
	return s.cfg.MaxDeliver
}

// RedeliveryWindow is how long after publishing the stream can deliver the same event again
// (RedeliveryWindow of the stream as NewSource found it): the consumer's claim retention must
// cover it. A stream without MaxAge reports RedeliveryWindowUnbounded, which a consumer checking
// it refuses until the stream has a MaxAge.
func (s *Source) RedeliveryWindow() time.Duration { return s.window }

// Close ends in-flight and later Receives with ErrClosed. It keeps the durable consumer, so a
// new Source with the same Durable resumes; deliveries already returned can still be settled,
// and those left unsettled come back after AckWait.
func (s *Source) Close() error {
	s.close(ErrClosed)
	s.giveBack(s.dropAhead(0), nil)
	return nil
}

// prefetch is SourceConfig.Prefetch, 0 when negative.
func (s *Source) prefetch() int { return max(s.cfg.Prefetch, 0) }

// takeAhead takes up to max of the deliveries pulled ahead, oldest first.
func (s *Source) takeAhead(max int) []idem.Delivery {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	n := min(max, len(s.ahead))
	if n == 0 {
		return nil
	}
	ds := slices.Clone(s.ahead[:n])
	s.ahead = s.ahead[n:]
	if len(s.ahead) == 0 {
		s.ahead = nil
		s.stopAheadTimer()
	}
	return ds
}

// keepAhead splits ds at max: it holds the rest for later Receives, for at most a third of
// AckWait, and returns the first max.
func (s *Source) keepAhead(ds []idem.Delivery, max int) []idem.Delivery {
	if len(ds) <= max {
		return ds
	}
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	s.ahead = append(s.ahead, ds[max:]...)
	if s.aheadTimer == nil {
		s.aheadGen++
		gen := s.aheadGen
		s.aheadTimer = time.AfterFunc(s.cfg.AckWait/3, func() { s.giveBack(s.dropAhead(gen), nil) })
	}
	return ds[:max]
}

// dropAhead takes every delivery pulled ahead, when gen is 0 or still the generation held.
func (s *Source) dropAhead(gen uint64) []idem.Delivery {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	if gen != 0 && gen != s.aheadGen {
		return nil
	}
	ds := s.ahead
	s.ahead = nil
	s.stopAheadTimer()
	return ds
}

// stopAheadTimer stops the give-back timer of the deliveries held ahead; aheadMu is held.
func (s *Source) stopAheadTimer() {
	if s.aheadTimer != nil {
		s.aheadTimer.Stop()
		s.aheadTimer = nil
	}
	s.aheadGen++
}

// Receive returns between 1 and max deliveries, waiting until one is available or ctx ends
// (then it returns ctx.Err()). It first takes what an earlier pull brought ahead (Prefetch),
// then what is ready without waiting, else long-polls for a single message and tops the batch
// up with what is ready then, so a trickle of messages is never held back waiting for a full
// batch. Messages that arrive as ctx ends are nak'ed, so they come back at once instead of
// after AckWait.
func (s *Source) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("idemnats: receive from %s: max is %d, want at least 1", s.name, max)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.closed, func() { cancel(ErrClosed) })
	defer stop()

	for {
		if ctx.Err() != nil {
			return nil, s.ctxErr(ctx)
		}
		held := s.takeAhead(max)
		if len(held) == max {
			return held, nil
		}
		// What is ready now: one round trip when there is a backlog.
		ds, err := s.fetch(ctx, ctx, max-len(held)+s.prefetch(), false)
		if len(held) > 0 {
			if err != nil {
				return held, nil // the pull is retried by a later Receive
			}
			return s.keepAhead(append(held, ds...), max), nil
		}
		if err != nil || len(ds) > 0 {
			return s.keepAhead(ds, max), err
		}
		// Nothing ready: long-poll for the first message.
		wait := s.cfg.MaxWait
		if dl, ok := ctx.Deadline(); ok {
			if left := time.Until(dl); left < wait {
				if left <= time.Millisecond {
					// Too short for a pull request to be worth sending.
					<-ctx.Done()
					continue
				}
				wait = left
			}
		}
		// The poll does not end with ctx: nats.go drops what the server already sent to a pull
		// whose context ends, and those messages would wait out AckWait. When ctx ends first,
		// fetch gives back what still arrives until the poll runs out or the Source closes.
		pollCtx, pollCancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
		stopOnClose := context.AfterFunc(s.closed, pollCancel)
		ds, err = s.fetch(ctx, pollCtx, 1, true)
		if ctx.Err() == nil {
			stopOnClose()
			pollCancel()
		} else {
			go func() {
				<-pollCtx.Done()
				stopOnClose()
				pollCancel()
			}()
		}
		if err != nil {
			return nil, err
		}
		if len(ds) == 0 {
			continue
		}
		if max > 1 || s.prefetch() > 0 {
			more, err := s.fetch(ctx, ctx, max-1+s.prefetch(), false)
			if err == nil {
				ds = append(ds, more...)
			}
			// A failed top-up does not lose the message in hand.
		}
		return s.keepAhead(ds, max), nil
	}
}

// fetch runs one pull request for up to n messages: a long-poll bounded by pollCtx when wait is
// set, else only what is ready. It returns ctx's error when ctx (the Receive's context) ends; the
// end of pollCtx alone is just an empty poll.
func (s *Source) fetch(ctx, pollCtx context.Context, n int, wait bool) ([]idem.Delivery, error) {
	var (
		batch jetstream.MessageBatch
		err   error
	)
	if wait {
		batch, err = s.cons.Fetch(n, jetstream.FetchContext(pollCtx))
	} else {
		batch, err = s.cons.FetchNoWait(n)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, s.ctxErr(ctx)
		}
		if pollCtx.Err() != nil || errors.Is(err, jetstream.ErrInvalidOption) && wait {
			// The poll's deadline passed before the request left (FetchContext refuses it).
			return nil, nil
		}
		return nil, fmt.Errorf("idemnats: receive from %s: %w", s.name, err)
	}
	msgs := batch.Messages()
	var ds []idem.Delivery
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				if err := batch.Error(); err != nil {
					if ctx.Err() != nil {
						s.giveBack(ds, nil)
						return nil, s.ctxErr(ctx)
					}
					if pollCtx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
						return ds, nil
					}
					if len(ds) > 0 {
						// The batch ended early (leadership change, …): keep what arrived.
						return ds, nil
					}
					return nil, fmt.Errorf("idemnats: receive from %s: %w", s.name, err)
				}
				return ds, nil
			}
			ds = append(ds, s.delivery(m))
		case <-ctx.Done():
			s.giveBack(ds, msgs)
			return nil, s.ctxErr(ctx)
		}
	}
}

// giveBack naks deliveries fetched for a Receive that ended, and any still arriving on msgs, so
// they are redelivered now rather than after AckWait, and records each, so that the attempt
// JetStream counted for it is not counted by idem (see delivery). The arrivals are drained in
// the background; the batch's channel closes within a second (no-wait requests) or at once
// (cancelled polls).
func (s *Source) giveBack(ds []idem.Delivery, msgs <-chan jetstream.Msg) {
	for _, d := range ds {
		d := d.(*Delivery)
		// The delivery took the earlier give-backs of its message off the record when it was
		// made (see delivery); they are not attempts either, so they go back with this one.
		s.giveBackMsg(d.msg, d.givenBack)
	}
	if msgs != nil {
		go func() {
			for m := range msgs {
				s.giveBackMsg(m, 0)
			}
		}()
	}
}

// maxGivenBack bounds the give-back record; past it the record starts over, which at worst
// counts a given-back delivery as an attempt again (never fewer attempts than deliveries seen).
const maxGivenBack = 1 << 16

// giveBackMsg records m as given back (with the prior give-backs a delivery of it had taken off
// the record), then naks it (in this order, so that the redelivery cannot overtake the record).
func (s *Source) giveBackMsg(m jetstream.Msg, prior int) {
	if md, err := m.Metadata(); err == nil {
		s.mu.Lock()
		if len(s.givenBack) >= maxGivenBack {
			clear(s.givenBack)
		}
		s.givenBack[md.Sequence.Stream] += 1 + prior
		s.mu.Unlock()
	}
	_ = m.Nak()
}

// takeGivenBack returns and forgets how many deliveries of stream sequence seq were given back.
func (s *Source) takeGivenBack(seq uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.givenBack[seq]
	delete(s.givenBack, seq)
	return n
}

// ctxErr is ctx.Err(), or ErrClosed when the source's Close ended the Receive.
func (s *Source) ctxErr(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
		return fmt.Errorf("idemnats: receive from %s: %w", s.name, ErrClosed)
	}
	return ctx.Err()
}

// delivery decodes m into a Delivery. A message that does not decode is still handed out, with
// an empty EventID and the reason in HeaderDecodeError, so the consumer dead-letters it as
// invalid_payload instead of the source failing or dropping it.
func (s *Source) delivery(m jetstream.Msg) *Delivery {
	msg, err := DecodeMessage(m)
	var givenBack int
	if md, mdErr := m.Metadata(); mdErr == nil {
		if givenBack = s.takeGivenBack(md.Sequence.Stream); givenBack > 0 {
			msg.Attempt = max(msg.Attempt-givenBack, 1)
		}
	}
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
	return &Delivery{msg: m, m: msg, js: s.js, givenBack: givenBack, async: s.cfg.AsyncAck}
}

// Delivery is one message received from JetStream and the handle to settle it.
type Delivery struct {
	msg jetstream.Msg
	m   idem.Message
	js  jetstream.JetStream
	// givenBack is how many earlier deliveries of this message the source gave back unseen
	// (taken off Source.givenBack when this delivery was made).
	givenBack int
	// async is SourceConfig.AsyncAck.
	async bool
}

var _ idem.Delivery = (*Delivery)(nil)

// Message returns the decoded message; Attempt is JetStream's delivery count.
func (d *Delivery) Message() idem.Message { return d.m }

// Topic returns the subject the message was published to, which the consumer stores with its
// dead letter so that a replay goes back there (idem.TopicReporter).
func (d *Delivery) Topic() string { return d.msg.Subject() }

var _ idem.TopicReporter = (*Delivery)(nil)

// Msg returns the underlying JetStream message, for metadata idem does not map (stream and
// consumer sequence, pending count).
func (d *Delivery) Msg() jetstream.Msg { return d.msg }

// Ack acknowledges the message and waits for the server to confirm it, so that a lost ack is
// an error here rather than a silent redelivery later; with SourceConfig.AsyncAck it only
// sends the ack.
func (d *Delivery) Ack(ctx context.Context) error {
	var err error
	if d.async {
		if err = ctx.Err(); err == nil {
			err = d.msg.Ack()
		}
	} else {
		err = d.msg.DoubleAck(ctx)
	}
	if err != nil {
		return d.wrap("ack", err)
	}
	return nil
}

// Nak asks JetStream to redeliver the message after delay (at once when delay <= 0).
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return d.wrap("nak", err)
	}
	var err error
	if delay > 0 {
		err = d.msg.NakWithDelay(delay)
	} else {
		err = d.msg.Nak()
	}
	if err != nil {
		return d.wrap("nak", err)
	}
	return nil
}

// Extend resets the message's AckWait timer (JetStream InProgress).
func (d *Delivery) Extend(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return d.wrap("extend", err)
	}
	if err := d.msg.InProgress(); err != nil {
		return d.wrap("extend", err)
	}
	return nil
}

// Term tells JetStream never to redeliver the message, with TermReason in its advisory when the
// server understands reasons. Older servers ignore a terminating ack that carries a reason and
// redeliver the message, so they get a plain one.
func (d *Delivery) Term(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return d.wrap("term", err)
	}
	var err error
	if termReasonSupported(d.js.Conn().ConnectedServerVersion()) {
		err = d.msg.TermWithReason(TermReason)
	} else {
		err = d.msg.Term()
	}
	if err != nil {
		return d.wrap("term", err)
	}
	return nil
}

// termReasonSupported reports whether a server of this version (2.10.4 or later) honours a
// terminating ack with a reason. An unknown version counts as too old.
func termReasonSupported(version string) bool {
	var major, minor, patch int
	core, _, _ := strings.Cut(strings.TrimPrefix(version, "v"), "-")
	if _, err := fmt.Sscanf(core, "%d.%d.%d", &major, &minor, &patch); err != nil {
		return false
	}
	return major > 2 || major == 2 && (minor > 10 || minor == 10 && patch >= 4)
}

// wrap names the operation and the event in a settle error.
func (d *Delivery) wrap(op string, err error) error {
	id := d.m.EventID
	if id == "" {
		id = "(no event id)"
	}
	return fmt.Errorf("idemnats: %s event %s: %w", op, id, err)
}
