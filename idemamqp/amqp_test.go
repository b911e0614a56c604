package idemamqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/transporttest"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// testExpires is the x-expires of every test queue: a queue a crashed test leaves behind is
// deleted by the broker once unused this long.
const testExpires = int64(10 * 60 * 1000)

// recorder is a Dialer over IDEM_AMQP_URL that keeps the connections it opened, so a test can
// kill them (a connection loss as the broker or the network would cause it).
type recorder struct {
	dial  idemamqp.Dialer
	mu    sync.Mutex
	conns []*amqp.Connection
}

func newRecorder(tb testing.TB) *recorder {
	tb.Helper()
	return &recorder{dial: idemamqp.DialURL(testenv.AMQP(tb), "idemamqp-test "+tb.Name())}
}

func (r *recorder) Dial(ctx context.Context) (*amqp.Connection, error) {
	c, err := r.dial(ctx)
	if err == nil {
		r.mu.Lock()
		r.conns = append(r.conns, c)
		r.mu.Unlock()
	}
	return c, err
}

// killAll closes every open connection the recorder made and returns how many it closed.
func (r *recorder) killAll() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.conns {
		if !c.IsClosed() {
			_ = c.Close()
			n++
		}
	}
	return n
}

// newQueueName returns a unique queue name for one test.
func newQueueName(tb testing.TB) string {
	tb.Helper()
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(tb, err)
	return "idemtest." + hex.EncodeToString(b[:])
}

// sourceConfig is the configuration every test source on queue uses, with test queues that
// expire when a test leaves them behind.
func sourceConfig(queue string, lease time.Duration) idemamqp.SourceConfig {
	return idemamqp.SourceConfig{
		Queue:          queue,
		Lease:          lease,
		QueueArgs:      amqp.Table{"x-expires": testExpires},
		DelayQueueArgs: amqp.Table{"x-expires": testExpires},
		ReconnectMin:   20 * time.Millisecond,
		ReconnectMax:   500 * time.Millisecond,
	}
}

// declareQueue declares queue and its delay queues as a Source with cfg would, and deletes them
// when tb ends.
func declareQueue(tb testing.TB, dial idemamqp.Dialer, cfg idemamqp.SourceConfig) {
	tb.Helper()
	src, err := idemamqp.NewSource(ctxT(tb, 10*time.Second), dial, cfg)
	require.NoError(tb, err, "declare queue %s", cfg.Queue)
	require.NoError(tb, src.Close())
	tb.Cleanup(func() { deleteQueues(tb, dial, cfg) })
}

// deleteQueues deletes the work and delay queues of cfg.
func deleteQueues(tb testing.TB, dial idemamqp.Dialer, cfg idemamqp.SourceConfig) {
	conn, err := dial(ctxT(tb, 10*time.Second))
	if err != nil {
		tb.Errorf("delete queues of %s: %v", cfg.Queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Errorf("delete queues of %s: %v", cfg.Queue, err)
		return
	}
	names := []string{cfg.Queue}
	tiers := cfg.DelayTiers
	if tiers == nil {
		tiers = idemamqp.DelayTiersDefault
	}
	for _, t := range tiers {
		names = append(names, idemamqp.DelayQueueName(cfg.Queue, t))
	}
	for _, n := range names {
		if _, err := ch.QueueDelete(n, false, false, false); err != nil {
			tb.Errorf("delete queue %s: %v", n, err)
			return
		}
	}
}

// harness runs the shared suite: a queue per topic (declared before anything is published to
// it, since the sink publishes mandatory), the default exchange routing to it by name.
func harness(tb testing.TB) transporttest.Harness { return harnessWith(tb, idemamqp.SinkConfig{}) }

// harnessWith is harness with a sink configured by sinkCfg.
func harnessWith(tb testing.TB, sinkCfg idemamqp.SinkConfig) transporttest.Harness {
	dial := idemamqp.DialURL(testenv.AMQP(tb), "idemamqp-test "+tb.Name())
	return transporttest.Harness{
		Features: transporttest.Features{DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string {
			q := newQueueName(tb)
			declareQueue(tb, dial, sourceConfig(q, time.Second))
			return q
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idemamqp.NewSource(ctxT(tb, 10*time.Second), dial, sourceConfig(topic, lease))
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			sink, err := idemamqp.NewSink(ctxT(tb, 10*time.Second), dial, sinkCfg)
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
	}
}

// ctxT returns a context that ends after d or with the test.
func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, harness(t))
}

// BenchmarkPublishReceive publishes with the default sink, which orders a whole batch: each
// message waits for the confirm of the one before.
func BenchmarkPublishReceive(b *testing.B) {
	transporttest.Benchmark(b, harness(b))
}

// BenchmarkPublishReceiveUnordered publishes with an OrderKey that puts every message in a key
// of its own, so a batch is pipelined and confirmed together.
func BenchmarkPublishReceiveUnordered(b *testing.B) {
	transporttest.Benchmark(b, harnessWith(b, idemamqp.SinkConfig{OrderKey: func(idem.Message) string { return "" }}))
}
