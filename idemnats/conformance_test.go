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
	return transporttest.Harness{
		Features: transporttest.Features{BrokerDedup: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			_, subject := testStream(tb, js)
			return subject
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idemnats.NewSource(ctxT(tb, 10*time.Second), js, idemnats.SourceConfig{
				Stream:  streamOf(tb, topic),
				Subject: topic,
				Durable: name,
				AckWait: lease,
			})
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

func BenchmarkPublishReceive(b *testing.B) {
	transporttest.Benchmark(b, harness(connect(b)))
}
