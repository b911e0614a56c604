package idemsqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemkit/idem"
)

// callMargin is how long a settle, a give-back or the answer to a long poll may take beyond its
// wait when the caller gave no deadline.
const callMargin = 10 * time.Second

// shortPollPause separates the short polls of a Receive whose deadline is under a second.
const shortPollPause = 50 * time.Millisecond

// retentionDefault is SQS's MessageRetentionPeriod when a queue does not report one (4 days).
const retentionDefault = 4 * 24 * time.Hour

// givenBackTTL is how long the Source remembers a message it gave back without handing it out;
// one that does not come back here within it was taken by another worker.
const givenBackTTL = time.Hour

// Source receives from an SQS queue with long polling. A delivery's lease is its visibility
// timeout: the source sets it to Lease when it receives a message and at each Extend
// (ChangeMessageVisibility); past it SQS delivers the message again. It is safe for concurrent
// use.
type Source struct {
	client *sqs.Client
	cfg    SourceConfig
	name   string
	fifo   bool
	limit  int           // the redrive policy's maxReceiveCount, or 0
	window time.Duration // the queue's message retention

	ctx    context.Context // ends at Close: stops the long polls in flight
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	givenBack map[string]givenBack // message id → receives no caller saw
	orphans   []*pollCall          // polls in flight whose Receive left, for the next to adopt
	calls     sync.WaitGroup       // polls in flight
	polling   chan struct{}        // holds a token while a poll is in flight: one at a time
}

// pollCall is one ReceiveMessage in flight. Its fields are guarded by Source.mu.
type pollCall struct {
	n         int // the most messages it asks for
	wait      time.Duration
	done      chan polled // gets the result, unless the poll is abandoned
	abandoned bool        // no Receive waits for it: it gives back what it gets
}

// givenBack counts the receives of one message that a cancelled Receive gave back.
type givenBack struct {
	n    int
	last time.Time
}

var (
	_ idem.Source             = (*Source)(nil)
	_ idem.DeliveryLimiter    = (*Source)(nil)
	_ idem.RedeliveryWindower = (*Source)(nil)
)

// NewSource reads the queue's attributes (redrive policy, retention, FIFO) and returns a source
// receiving from it. It does not own client.
func NewSource(ctx context.Context, client *sqs.Client, cfg SourceConfig) (*Source, error) {
	if client == nil {
		return nil, errors.New("idemsqs: NewSource: client is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idemsqs: %w", err)
	}
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(cfg.QueueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqs: queue %s: %w", cfg.QueueURL, err)
	}
	attrs := out.Attributes
	s := &Source{
		client:    client,
		cfg:       cfg,
		name:      queueName(cfg.QueueURL),
		fifo:      attrs[string(types.QueueAttributeNameFifoQueue)] == "true",
		window:    retentionDefault,
		givenBack: make(map[string]givenBack),
		polling:   make(chan struct{}, 1),
	}
	if v := attrs[string(types.QueueAttributeNameMessageRetentionPeriod)]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("idemsqs: queue %s: MessageRetentionPeriod %q is not a number of seconds", s.name, v)
		}
		s.window = time.Duration(n) * time.Second
	}
	if v := attrs[string(types.QueueAttributeNameRedrivePolicy)]; v != "" {
		if s.limit, err = maxReceiveCount(v); err != nil {
			return nil, fmt.Errorf("idemsqs: queue %s: RedrivePolicy: %w", s.name, err)
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// maxReceiveCount reads a redrive policy's maxReceiveCount, which SQS writes as a number or a
// string depending on how the policy was set.
func maxReceiveCount(policy string) (int, error) {
	var p struct {
		MaxReceiveCount json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(policy), &p); err != nil {
		return 0, err
	}
	raw := strings.Trim(string(p.MaxReceiveCount), `"`)
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("maxReceiveCount %s is not a positive number", p.MaxReceiveCount)
	}
	return n, nil
}

// queueName is the last path element of a queue URL.
func queueName(url string) string {
	url = strings.TrimRight(url, "/")
	if i := strings.LastIndexByte(url, '/'); i >= 0 {
		return url[i+1:]
	}
	return url
}

// Name is the queue's name.
func (s *Source) Name() string { return s.name }

// Lease is the visibility timeout every delivery gets when received and at each Extend.
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.fifo }

// DeliveryLimit is the redrive policy's maxReceiveCount (SQS moves a message to the
// dead-letter queue when it is received once more, without the consumer seeing it again), or 0
// when the queue has no redrive policy. Run refuses a retry policy that could reach it.
func (s *Source) DeliveryLimit() int { return s.limit }

// RedeliveryWindow is the queue's MessageRetentionPeriod: an undeleted message can be delivered
// again until then after it was sent.
func (s *Source) RedeliveryWindow() time.Duration { return s.window }

// Close stops the source: Receive fails afterwards, and long polls in flight are cancelled
// (messages SQS handed to a cancelled poll come back after their visibility timeout).
// Deliveries not settled are delivered again after their lease; a settle on one after Close
// still reaches SQS (the client stays open).
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.calls.Wait()
	return nil
}

// polled is what one ReceiveMessage returned, or its error.
type polled struct {
	msgs []types.Message
	at   time.Time // when the poll was sent: SQS's 12 hours count from about then
	// answered is when SQS's answer arrived. A long poll answers as soon as it has messages, so
	// their visibility timeout starts then, less the answer's flight time (which the fence's
	// margin covers); a FIFO receive retried with the same attempt id restarts it.
	answered time.Time
	err      error
}

// Receive returns up to max deliveries (at most ReceiveMax, SQS's bound per call), long polling
// until messages arrive or ctx ends. The poll runs detached from ctx: when ctx ends first,
// Receive returns ctx.Err() at once and leaves the poll to the next Receive, which waits for it
// instead of sending another; what a poll gets while no Receive waits is given back
// (ChangeMessageVisibility 0) without counting an attempt. So cancelled receives never stack up
// polls that take one another's messages.
func (s *Source) Receive(ctx context.Context, limit int) ([]idem.Delivery, error) {
	if limit < 1 {
		return nil, fmt.Errorf("idemsqs: receive from %s: max is %d, want at least 1", s.name, limit)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// A poll never waits past ctx's deadline (rounded down to whole seconds), so that it
		// does not hold messages back from the next Receive.
		wait := s.cfg.Wait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl).Truncate(time.Second))
		}
		p, err := s.startPoll(ctx, min(limit, ReceiveMax), wait)
		if err != nil {
			return nil, err
		}
		select {
		case r := <-p.done:
			if r.err != nil {
				return nil, r.err
			}
			if len(r.msgs) > limit { // an adopted poll asked for more
				s.giveBack(r.msgs[limit:])
				r.msgs = r.msgs[:limit]
			}
			if len(r.msgs) > 0 {
				return s.handOut(r.msgs, r.at, r.answered), nil
			}
			if p.wait < time.Second {
				// A short poll answers at once: pace the next one instead of spinning.
				select {
				case <-time.After(shortPollPause):
				case <-ctx.Done():
				}
			}
		case <-ctx.Done():
			s.mu.Lock()
			select {
			case r := <-p.done:
				s.mu.Unlock()
				s.giveBack(r.msgs)
			default:
				p.abandoned = true
				s.orphans = append(s.orphans, p)
				s.mu.Unlock()
			}
			return nil, ctx.Err()
		}
	}
}

// startPoll adopts a poll an earlier Receive left, or sends a new one for n messages once no
// other is in flight. One poll at a time is what Run needs (it receives from one loop), and it
// keeps concurrent receives from racing for the same messages on servers that hand one message
// to two simultaneous polls (moto does, now and then).
func (s *Source) startPoll(ctx context.Context, n int, wait time.Duration) (*pollCall, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("idemsqs: receive from %s: source closed", s.name)
		}
		if k := len(s.orphans); k > 0 {
			p := s.orphans[k-1]
			s.orphans = s.orphans[:k-1]
			p.abandoned = false
			s.mu.Unlock()
			return p, nil
		}
		select {
		case s.polling <- struct{}{}:
			p := s.sendPoll(n, wait)
			s.mu.Unlock()
			return p, nil
		default:
		}
		s.mu.Unlock()
		select {
		case <-time.After(shortPollPause): // look again: the poll in flight may be left to adopt
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// sendPoll starts a poll for n messages; the caller holds s.mu and the polling token, which the
// poll gives back when SQS answered.
func (s *Source) sendPoll(n int, wait time.Duration) *pollCall {
	p := &pollCall{n: n, wait: wait, done: make(chan polled, 1)}
	s.calls.Add(1)
	go func() {
		defer s.calls.Done()
		at := time.Now()
		msgs, err := s.poll(p.n, p.wait)
		answered := time.Now()
		<-s.polling
		s.mu.Lock()
		if p.abandoned {
			s.orphans = slices.DeleteFunc(s.orphans, func(o *pollCall) bool { return o == p })
			s.mu.Unlock()
			s.giveBack(msgs)
			return
		}
		p.done <- polled{msgs: msgs, at: at, answered: answered, err: err}
		s.mu.Unlock()
	}()
	return p
}

// poll runs one ReceiveMessage of at most n messages, long polling for wait (whole seconds,
// rounded up), with the lease as their visibility timeout.
func (s *Source) poll(n int, wait time.Duration) ([]types.Message, error) {
	ctx, cancel := context.WithTimeout(s.ctx, wait+callMargin)
	defer cancel()
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(s.cfg.QueueURL),
		MaxNumberOfMessages:         int32(n),
		WaitTimeSeconds:             seconds(wait),
		VisibilityTimeout:           seconds(s.cfg.Lease),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	}
	if s.fifo {
		// The SDK retries a receive whose answer was lost with the same attempt id, and a FIFO
		// queue answers it with the same messages instead of hiding them (and blocking their
		// groups) for a lease.
		var b [16]byte
		_, _ = rand.Read(b[:])
		in.ReceiveRequestAttemptId = aws.String(hex.EncodeToString(b[:]))
	}
	out, err := s.client.ReceiveMessage(ctx, in)
	if err != nil {
		if s.ctx.Err() != nil {
			return nil, fmt.Errorf("idemsqs: receive from %s: source closed", s.name)
		}
		return nil, fmt.Errorf("idemsqs: receive from %s: %w", s.name, err)
	}
	return out.Messages, nil
}

// handOut decodes messages a caller will see, received by a poll sent at polled and answered at
// answered. A receive that an earlier cancelled Receive gave back is not counted in the attempt.
func (s *Source) handOut(msgs []types.Message, polled, answered time.Time) []idem.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]idem.Delivery, len(msgs))
	for i, sm := range msgs {
		m, _ := Decode(sm) // a message that does not decode is delivered for a dead letter
		id := aws.ToString(sm.MessageId)
		if g, ok := s.givenBack[id]; ok {
			m.Attempt = max(m.Attempt-g.n, 1)
		}
		out[i] = &Delivery{src: s, id: id, receipt: aws.ToString(sm.ReceiptHandle), received: polled, msg: m, leaseUntil: answered.Add(s.cfg.Lease)}
	}
	return out
}

// giveBack makes messages no caller saw visible again at once and remembers that their next
// receive does not count as an attempt.
func (s *Source) giveBack(msgs []types.Message) {
	if len(msgs) == 0 {
		return
	}
	now := time.Now()
	s.mu.Lock()
	for id, g := range s.givenBack {
		if now.Sub(g.last) > givenBackTTL {
			delete(s.givenBack, id)
		}
	}
	for _, m := range msgs {
		id := aws.ToString(m.MessageId)
		g := s.givenBack[id]
		s.givenBack[id] = givenBack{n: g.n + 1, last: now}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), callMargin)
	defer cancel()
	for start := 0; start < len(msgs); start += ReceiveMax {
		batch := msgs[start:min(start+ReceiveMax, len(msgs))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(batch))
		for i, m := range batch {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
		}
		// A failure leaves them invisible: they come back after the lease, which is safe.
		_, _ = s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.cfg.QueueURL), Entries: entries})
	}
}

// settled forgets what the source remembers of a message that will not come back.
func (s *Source) settled(id string) {
	s.mu.Lock()
	delete(s.givenBack, id)
	s.mu.Unlock()
}

// Delivery is one message received through a Source.
type Delivery struct {
	src      *Source
	id       string
	receipt  string
	received time.Time
	msg      idem.Message

	mu sync.Mutex
	// leaseUntil is when the message's visibility timeout passes, by this process's clock:
	// counted from the receive's answer, then from before each Extend was sent, so SQS's own
	// deadline is earlier by at most an answer's flight time (fenceMargin covers it). Zero once
	// the delivery settled (deleted or nak'd).
	leaseUntil time.Time
}

// fenceMargin is how long before leaseUntil a visibility change is already refused, so that one
// sent just in time does not reach SQS after the message went to another worker: a tenth of the
// lease, at most a second.
func fenceMargin(lease time.Duration) time.Duration { return min(time.Second, lease/10) }

// errLeasePassed is the fence's refusal: the lease passed, so the receipt handle may belong to
// a message another worker holds now, and SQS may still apply a change made with it.
func (d *Delivery) errLeasePassed(op string, until time.Time) error {
	if until.IsZero() {
		return fmt.Errorf("idemsqs: %s on %s: %w: the delivery was already settled; its visibility is not changed", op, d.src.name, idem.ErrLeaseLost)
	}
	return fmt.Errorf("idemsqs: %s on %s: %w: the visibility timeout passed at %s, so another worker may hold the message; its visibility is not changed",
		op, d.src.name, idem.ErrLeaseLost, until.UTC().Format(time.RFC3339Nano))
}

// fenced returns an error when the lease passed (or the delivery settled), else nil.
func (d *Delivery) fenced(op string) error {
	d.mu.Lock()
	until := d.leaseUntil
	d.mu.Unlock()
	if until.IsZero() || !time.Now().Before(until.Add(-fenceMargin(d.src.cfg.Lease))) {
		return d.errLeasePassed(op, until)
	}
	return nil
}

// setLease records the lease a visibility change sent at sent set for v (0: given up).
func (d *Delivery) setLease(sent time.Time, v time.Duration) {
	d.mu.Lock()
	if v <= 0 {
		d.leaseUntil = time.Time{}
	} else {
		d.leaseUntil = sent.Add(v)
	}
	d.mu.Unlock()
}

var _ idem.Delivery = (*Delivery)(nil)

// Message returns the decoded message. Its Attempt is SQS's ApproximateReceiveCount, less the
// receives a cancelled Receive of this source gave back.
func (d *Delivery) Message() idem.Message { return d.msg }

// MessageID is SQS's id of the message.
func (d *Delivery) MessageID() string { return d.id }

// Ack deletes the message: the consumer committed its effect.
func (d *Delivery) Ack(ctx context.Context) error { return d.delete(ctx, "ack") }

// Term deletes the message too: the consumer wrote it to idem's dead-letter table, so SQS must
// never deliver it again (nor move it to the queue's dead-letter queue).
func (d *Delivery) Term(ctx context.Context) error { return d.delete(ctx, "term") }

func (d *Delivery) delete(ctx context.Context, op string) error {
	_, err := d.src.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.src.cfg.QueueURL), ReceiptHandle: aws.String(d.receipt)})
	if err != nil {
		return fmt.Errorf("idemsqs: %s on %s: %w", op, d.src.name, leaseError(err))
	}
	d.setLease(time.Time{}, 0)
	d.src.settled(d.id)
	return nil
}

// Extend sets the message's visibility timeout to the source's lease from now. SQS keeps a
// message invisible at most 12 hours after it was received: past that Extend fails with
// idem.ErrLeaseLost, and the consumer stops the handler. Once the current lease passed (or
// the delivery settled), Extend fails with idem.ErrLeaseLost without asking SQS, which may
// accept a stale receipt handle and extend another worker's delivery of the message.
func (d *Delivery) Extend(ctx context.Context) error {
	if err := d.fenced("extend"); err != nil {
		return err
	}
	left := LeaseMax - time.Since(d.received)
	if left < time.Second {
		return fmt.Errorf("idemsqs: extend on %s: %w: SQS holds a message at most %v after receiving it", d.src.name, idem.ErrLeaseLost, LeaseMax)
	}
	v := min(d.src.cfg.Lease, left)
	sent := time.Now()
	if err := d.visibility(ctx, v); err != nil {
		return fmt.Errorf("idemsqs: extend on %s: %w", d.src.name, err)
	}
	d.setLease(sent, v)
	return nil
}

// Nak asks for redelivery after delay through the visibility timeout: 0 makes the message
// visible at once, a delay keeps it invisible until the delay passes. The delay is rounded up to
// whole seconds and cut to what is left of SQS's 12 hours after the receive, so a longer delay
// brings the message back early. Once the lease passed (or the delivery settled), Nak fails
// with idem.ErrLeaseLost without asking SQS: the message is visible again or another worker's,
// and a stale receipt handle SQS still accepts would move that worker's visibility timeout.
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	if err := d.fenced("nak"); err != nil {
		return err
	}
	delay = max(min(delay, LeaseMax-time.Since(d.received)), 0)
	if err := d.visibility(ctx, delay); err != nil {
		return fmt.Errorf("idemsqs: nak on %s: %w", d.src.name, err)
	}
	d.setLease(time.Time{}, 0)
	return nil
}

// visibility sets the message's visibility timeout to v from now.
func (d *Delivery) visibility(ctx context.Context, v time.Duration) error {
	_, err := d.src.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.src.cfg.QueueURL), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: seconds(v),
	})
	return leaseError(err)
}

// leaseError marks SQS's answers for a receipt handle that no longer holds its message (it was
// received again, or deleted) as idem.ErrLeaseLost.
func leaseError(err error) error {
	var ae smithy.APIError
	if err == nil || !errors.As(err, &ae) {
		return err
	}
	switch ae.ErrorCode() {
	case "MessageNotInflight", "ReceiptHandleIsInvalid", "AWS.SimpleQueueService.MessageNotInflight":
		return fmt.Errorf("%w: %w", idem.ErrLeaseLost, err)
	case "InvalidParameterValue":
		// SQS's answer to a visibility change with a receipt handle that is not the latest.
		if strings.Contains(ae.ErrorMessage(), "ReceiptHandle") {
			return fmt.Errorf("%w: %w", idem.ErrLeaseLost, err)
		}
	}
	return err
}
