package idemsqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem"
)

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Key returns the key of a message on a FIFO queue (default KeyOf); the Sink sends GroupID
	// of it as the MessageGroupId, and SQS delivers a group's messages in order, one at a time.
	Key func(m idem.Message) string
}

// Sink sends messages to SQS queues with SendMessageBatch and returns once SQS stored every
// one. On a FIFO queue (a name ending in ".fifo") each message carries a MessageGroupId from its
// key and a MessageDeduplicationId from its event id (DeduplicationID). It is safe for
// concurrent use.
type Sink struct {
	client *sqs.Client
	cfg    SinkConfig

	mu     sync.Mutex
	closed bool
	urls   map[string]string // queue name → URL
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a Sink over client, which the caller keeps ownership of.
func NewSink(client *sqs.Client, cfg SinkConfig) (*Sink, error) {
	if client == nil {
		return nil, errors.New("idemsqs: NewSink: client is nil")
	}
	if cfg.Key == nil {
		cfg.Key = KeyOf
	}
	return &Sink{client: client, cfg: cfg, urls: make(map[string]string)}, nil
}

// queueURL returns the URL of topic: topic itself when it is a URL, else the queue of that name
// (GetQueueUrl, remembered).
func (s *Sink) queueURL(ctx context.Context, topic string) (string, error) {
	if strings.Contains(topic, "://") {
		return topic, nil
	}
	s.mu.Lock()
	url, ok := s.urls[topic]
	s.mu.Unlock()
	if ok {
		return url, nil
	}
	out, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(topic)})
	if err != nil {
		return "", err
	}
	url = aws.ToString(out.QueueUrl)
	s.mu.Lock()
	s.urls[topic] = url
	s.mu.Unlock()
	return url, nil
}

// Publish sends msgs to topic (a queue name or URL) in batches of at most SendBatchMax messages
// and SendBatchBytesMax bytes, and returns once SQS stored every one. When SQS refuses messages
// of a batch, or a batch fails as a whole, Publish sends no later batch and returns an error
// naming each event not stored (those of the failed batch and of the later ones); events not
// named were stored. A caller that needs a key's order publishes its messages in separate
// calls, as the relay does.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	enc := make([]Encoded, len(msgs))
	for i, m := range msgs {
		e, err := Encode(m)
		if err != nil {
			return fmt.Errorf("idemsqs: publish to %s: message %d: %w", topic, i, err)
		}
		enc[i] = e
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemsqs: publish to %s: not sent: %w", topic, err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("idemsqs: publish to %s: sink closed", topic)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, PublishTimeoutDefault)
		defer cancel()
	}
	url, err := s.queueURL(ctx, topic)
	if err != nil {
		return fmt.Errorf("idemsqs: publish to %s: queue: %w", topic, err)
	}
	fifo := strings.HasSuffix(queueName(url), ".fifo")
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < SendBatchMax && (end == start || size+enc[end].size() <= SendBatchBytesMax) {
			size += enc[end].size()
			end++
		}
		entries := make([]types.SendMessageBatchRequestEntry, 0, end-start)
		for i := start; i < end; i++ {
			e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(enc[i].Body), MessageAttributes: enc[i].Attributes}
			if fifo {
				e.MessageGroupId = aws.String(GroupID(s.cfg.Key(msgs[i])))
				e.MessageDeduplicationId = aws.String(DeduplicationID(msgs[i]))
			}
			entries = append(entries, e)
		}
		out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			return publishError(topic, msgs, start, nil, err)
		}
		if len(out.Failed) > 0 {
			return publishError(topic, msgs, end, out.Failed, nil)
		}
		if len(out.Successful) != len(entries) {
			return publishError(topic, msgs, start, nil, fmt.Errorf("SQS confirmed %d of %d messages", len(out.Successful), len(entries)))
		}
		start = end
	}
	return nil
}

// publishError names the events not stored: those SQS refused in failed, and every one from
// msgs[from:] on (not sent, or in a batch whose outcome is unknown because of cause).
func publishError(topic string, msgs []idem.Message, from int, failed []types.BatchResultErrorEntry, cause error) error {
	var names []string
	for _, f := range failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(msgs) {
			names = append(names, fmt.Sprintf("entry %q (%s: %s)", aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message)))
			continue
		}
		names = append(names, fmt.Sprintf("%q (%s: %s)", msgs[i].EventID, aws.ToString(f.Code), aws.ToString(f.Message)))
		if cause == nil {
			cause = fmt.Errorf("SQS refused event %q: %s", msgs[i].EventID, aws.ToString(f.Code))
		}
	}
	for _, m := range msgs[from:] {
		names = append(names, fmt.Sprintf("%q", m.EventID))
	}
	return fmt.Errorf("idemsqs: publish to %s: events not stored: %s: %w", topic, strings.Join(names, ", "), cause)
}

// Close makes later Publish calls fail. The client stays open.
func (s *Sink) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}
