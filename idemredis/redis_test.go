package idemredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/transporttest"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// testPoll is the sources' poll in tests: short, so that lease expiries and due naks are
// noticed well within the suite's slack.
const testPoll = 100 * time.Millisecond

// newClient connects to IDEM_REDIS_URL and closes the client when tb ends.
func newClient(tb testing.TB) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(testenv.URL(tb, testenv.RedisVar))
	require.NoError(tb, err)
	rdb := redis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newPrefix returns a key prefix unique to one test and deletes every key under it when tb
// ends, so tests share one Redis and leave nothing behind.
func newPrefix(tb testing.TB, rdb redis.UniversalClient) string {
	tb.Helper()
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(tb, err)
	prefix := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			tb.Errorf("scan keys under %s: %v", prefix, err)
			return
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				tb.Errorf("delete keys under %s: %v", prefix, err)
			}
		}
	})
	return prefix
}

// ctxT returns a context bounded by d that ends with tb.
func ctxT(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// harness is the transporttest harness over IDEM_REDIS_URL: each topic lives under its own
// key prefix.
func harness(tb testing.TB) transporttest.Harness {
	rdb := newClient(tb)
	prefix := newPrefix(tb, rdb)
	return transporttest.Harness{
		Features: transporttest.Features{BrokerDedup: true, DelayedNak: true, Persistent: true, FencedSettle: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			var b [6]byte
			_, err := rand.Read(b[:])
			require.NoError(tb, err)
			return "topic-" + hex.EncodeToString(b[:])
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			src, err := idemredis.NewSource(ctxT(tb, 10*time.Second), rdb, idemredis.SourceConfig{
				Prefix: prefix, Stream: topic, Group: name, Lease: lease, Poll: testPoll,
			})
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{Prefix: prefix, MaxPayload: 1024})
			require.NoError(tb, err)
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
		Refuse: func(m idem.Message) idem.Message {
			m.Payload = make([]byte, 1025)
			return m
		},
	}
}

func TestConformance(t *testing.T) {
	transporttest.Exercise(t, harness(t))
}

func BenchmarkTransport(b *testing.B) {
	transporttest.Benchmark(b, harness(b))
}
