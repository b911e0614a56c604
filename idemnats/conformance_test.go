package idemnats_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/transporttest"
)

// harness runs the shared suite over js: a memory stream per topic, a durable pull consumer per
// source name.
func harness(js jetstream.JetStream) transporttest.Harness {
	return harnessWith(js, idemnats.SourceConfig{})
}

// harnessWith is harness whose sources take cfg's options (Stream, Subject, Durable and AckWait
// are the suite's).
func harnessWith(js jetstream.JetStream, cfg idemnats.SourceConfig) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{BrokerDedup: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			_, subject := testStream(tb, js)
			return subject
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			c := cfg
			c.Stream, c.Subject, c.Durable, c.AckWait = streamOf(tb, topic), topic, name, lease
			src, err := idemnats.NewSource(ctxT(tb, 10*time.Second), js, c)
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink { return idemnats.NewSink(js) },
		// The test streams store at most testMaxMsgSize bytes per message.
		Refuse: func(m idem.Message) idem.Message {
			m.Payload = make([]byte, 2*testMaxMsgSize)
			return m
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harness(connect(t)))
}

// TestConformanceAsyncAck runs the suite with AsyncAck, which idem bench's JetStream pipelines
// use: an ack not waited for must still settle the message exactly as a confirmed one does.
func TestConformanceAsyncAck(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harnessWith(connect(t), idemnats.SourceConfig{AsyncAck: true}))
}

func BenchmarkPublishReceive(b *testing.B) {
	transporttest.Benchmark(b, harness(connect(b)))
}
