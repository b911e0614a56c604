package idemsqs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
	"github.com/idemkit/idem/transporttest"
)

// maxMessageSize is the MaximumMessageSize of the suite's queues, so that Refuse can build a
// message SQS refuses without sending megabytes.
const maxMessageSize = 4096

// harness runs the shared suite on standard queues of one SQS endpoint. A source name maps to
// nothing on SQS: every source of a queue competes for its messages, as a durable consumer's
// do, so reopening "resumes" by construction. fifo_test.go adds what the suite cannot see of FIFO
// queues: group order and the deduplication ids on the wire.
func harness(c *sqs.Client) transporttest.Harness { return harnessOf(c, false) }

// harnessOf is harness on FIFO queues when fifo is set: the sink then gives each message a group
// of its own (deduplication without order), since the suite holds several messages of one event
// id at once, which one group would hand out one after the other.
func harnessOf(c *sqs.Client, fifo bool) transporttest.Harness {
	attrs := map[string]string{"MaximumMessageSize": "4096"}
	sinkCfg := idemsqs.SinkConfig{}
	if fifo {
		attrs["FifoQueue"] = "true"
		sinkCfg.Key = idemsqs.DeduplicationID
	}
	var mu sync.Mutex
	urls := map[string]string{} // topic → queue URL, for the sources
	return transporttest.Harness{
		Features: transporttest.Features{Takeover: true, DelayedNak: true, Persistent: true, BrokerDedup: fifo},
		NewTopic: func(tb testing.TB) string {
			url := newQueue(tb, c, attrs)
			topic := url[strings.LastIndexByte(url, '/')+1:]
			mu.Lock()
			urls[topic] = url
			mu.Unlock()
			return topic
		},
		Source: func(tb testing.TB, topic, _ string, lease time.Duration) idem.Source {
			mu.Lock()
			url := urls[topic]
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			src, err := idemsqs.NewSource(ctx, c, idemsqs.SourceConfig{QueueURL: url, Lease: lease, Wait: 2 * time.Second})
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			sink, err := idemsqs.NewSink(c, sinkCfg)
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
		// SQS refuses a message over the queue's MaximumMessageSize.
		Refuse: func(m idem.Message) idem.Message {
			m.Payload = []byte(strings.Repeat("x", maxMessageSize+1))
			return m
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harness(newClient(t)))
}

func TestConformanceFIFO(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harnessOf(newClient(t), true))
}

// TestHandover: two sources on one queue share its messages; one closing with deliveries held
// loses none (they come back after their visibility timeout), and its Ack after Close still
// deletes (the client stays open).
func TestHandover(t *testing.T) {
	t.Parallel()
	transporttest.ExerciseHandover(t, harness(newClient(t)))
}

func BenchmarkPublishReceive(b *testing.B) {
	transporttest.Benchmark(b, harness(newClient(b)))
}
