package e2e_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/watermillsuite"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// redisClient connects to IDEM_REDIS_URL (or skips) under a client name, so a test can find
// and kill its connections; it closes the client when tb ends.
func redisClient(tb testing.TB, name string) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(testenv.URL(tb, testenv.RedisVar))
	if err != nil {
		tb.Fatalf("IDEM_REDIS_URL: %v", err)
	}
	opts.ClientName = name
	rdb := redis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// redisPrefix returns a key prefix of one test and deletes every key under it when tb ends.
func redisPrefix(tb testing.TB, rdb *redis.Client) string {
	tb.Helper()
	prefix := "ideme2e:" + testdb.Name("") + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var keys []string
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				tb.Errorf("delete keys under %s: %v", prefix, err)
			}
		}
	})
	return prefix
}

// redisHarness gives each topic a stream under a key prefix of the test, and each source name a
// consumer group of its own.
func redisHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	rdb := redisClient(tb, "idem-e2e")
	prefix := redisPrefix(tb, rdb)
	return transporttest.Harness{
		Features: transporttest.Features{BrokerDedup: true, DelayedNak: true, Persistent: true, FencedSettle: true, FanOut: true},
		NewTopic: func(testing.TB) string { return testdb.Name("") },
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{
				Prefix: prefix, Stream: topic, Group: name, Lease: lease, Poll: 100 * time.Millisecond,
			})
			if err != nil {
				tb.Fatalf("source on %s: %v", topic, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{Prefix: prefix})
			if err != nil {
				tb.Fatalf("sink: %v", err)
			}
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
	}
}

func TestRuntimeSQLiteRedis(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresRedis")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return sqliteBundle(tb), redisHarness(tb)
	})
}

func TestRuntimeBatchedSQLiteRedis(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresRedis and TestRuntimeBatchedMySQLNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return sqliteBundle(tb), redisHarness(tb)
	}, consumertest.Batched(10))
}

func TestRuntimePostgresRedis(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		return pgBundle(tb), redisHarness(tb)
	})
}

// killClients kills the connections Redis has open under the client name, as a restart of the
// server or a network cut would, and returns how many it killed.
func killClients(tb testing.TB, admin *redis.Client, name string) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := admin.ClientList(ctx).Result()
	require.NoError(tb, err)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		var id string
		named := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if f == "name="+name {
				named = true
			}
		}
		if named && id != "" && admin.ClientKillByFilter(ctx, "ID", id).Err() == nil {
			n++
		}
	}
	return n
}

// TestRedisConnectionLossAppliesOnce: the consumer runs while its connections are killed again
// and again. A settle or a read whose connection died fails or is retried by the client on a
// new one; a delivery whose ack was lost is claimed again after its lease, and the claim
// recognises it as committed. Every event is applied exactly once and none is lost.
func TestRedisConnectionLossAppliesOnce(t *testing.T) {
	t.Parallel()
	const n, kills = 300, 5
	_, b := testdb.SQLite(t)
	ctx := context.Background()
	require.NoError(t, b.CreateWallet(ctx, "w1"))
	name := "idem-e2e-kill-" + testdb.Name("")
	rdb := redisClient(t, name)
	admin := redisClient(t, "idem-e2e-admin")
	prefix := redisPrefix(t, admin)
	src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{
		Prefix: prefix, Stream: "payments", Group: "ledger", Lease: 1500 * time.Millisecond, Poll: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	sink, err := idemredis.NewSink(admin, idemredis.SinkConfig{Prefix: prefix})
	require.NoError(t, err)

	credit := storetest.CreditHandler(b)
	rec := &consumertest.Recorder{}
	c, err := idem.NewConsumer(b.Store, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			time.Sleep(2 * time.Millisecond) // keep deliveries in hand long enough to be caught by a kill
			return credit(ctx, tx, msg)
		},
		Workers: 4,
		Failure: idem.FailureConfig{
			Retry: retry.Policy{MaxAttempts: 10, MaxElapsed: time.Minute, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond},
		},
		Claims: idem.ClaimConfig{
			Retention:        48 * time.Hour,
			RedeliveryWindow: time.Hour,
		},
		Observe: idem.ObserveConfig{
			Observer: rec,
		},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, src) }()

	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = storetest.PaymentMessage("acme", fmt.Sprintf("evt-%03d", i), storetest.Payment{Wallet: "w1", Amount: 1})
	}
	require.NoError(t, sink.Publish(ctx, "payments", msgs...))

	killed, rounds := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for rec.Count(idem.OutcomeProcessed, "") < n {
		require.True(t, time.Now().Before(deadline), "processed %d of %d", rec.Count(idem.OutcomeProcessed, ""), n)
		if processed := rec.Count(idem.OutcomeProcessed, ""); rounds < kills && processed >= (rounds+1)*n/(kills+1) {
			killed += killClients(t, admin, name)
			rounds++
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // anything still coming back must be a duplicate
	cancel()
	require.NoError(t, <-done)

	require.Positive(t, killed, "connections were killed")
	for i := range n {
		rows, err := b.LedgerRows(ctx, fmt.Sprintf("evt-%03d", i))
		require.NoError(t, err)
		require.EqualValues(t, 1, rows, "event evt-%03d applied once", i)
	}
	bal, err := b.Balance(ctx, "w1")
	require.NoError(t, err)
	require.EqualValues(t, n, bal)
	require.Equal(t, n, rec.Count(idem.OutcomeProcessed, ""))
	dls, err := b.Store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, dls)
	t.Logf("%d events, %d connections killed in %d rounds: %d processed, %d duplicates, %d abandoned, %d retried",
		n, killed, rounds, rec.Count(idem.OutcomeProcessed, ""), rec.Count(idem.OutcomeDuplicate, ""),
		rec.Count(idem.OutcomeAbandoned, ""), rec.Count(idem.OutcomeRetried, ""))
}

// TestRedisRelayKeepsKeyOrder: the outbox relay publishes through the Redis sink, and a consumer
// group of the stream sees every key's events in the order they were enqueued.
func TestRedisRelayKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	const keys, perKey = 5, 40
	store, _ := testdb.SQLite(t)
	ctx := context.Background()
	rdb := redisClient(t, "idem-e2e")
	prefix := redisPrefix(t, rdb)
	topic := "orders"
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{Prefix: prefix})
	require.NoError(t, err)

	// Enqueue the keys interleaved, one transaction each.
	for i := range perKey {
		for k := range keys {
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return store.EnqueueTx(ctx, tx, idem.Outgoing{
					EventID: fmt.Sprintf("k%d-%03d", k, i), Topic: topic, Key: fmt.Sprintf("k%d", k),
					Payload: []byte(`{}`),
				})
			}))
		}
	}
	relay, err := idemrelay.New(store, sink, idemrelay.Config{})
	require.NoError(t, err)
	published := 0
	for published < keys*perKey {
		n, err := relay.RunOnce(ctx)
		require.NoError(t, err)
		require.Positive(t, n, "the relay made progress (%d of %d published)", published, keys*perKey)
		published += n
	}
	require.NoError(t, relay.Release(ctx))

	src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{Prefix: prefix, Stream: topic, Group: "ledger", Lease: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	next := make(map[string]int)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for got := 0; got < keys*perKey; {
		ds, err := src.Receive(rctx, 50)
		require.NoError(t, err, "received %d of %d", got, keys*perKey)
		for _, d := range ds {
			var k, i int
			_, err := fmt.Sscanf(d.Message().EventID, "k%d-%d", &k, &i)
			require.NoError(t, err)
			key := fmt.Sprintf("k%d", k)
			require.Equal(t, next[key], i, "key %s out of order", key)
			next[key]++
			require.NoError(t, d.Ack(rctx))
			got++
		}
	}
}

// TestWatermillRedis: Watermill's universal suite over Redis Streams. Each consumer group gets
// every entry of the stream (fan-out), and a subscriber without a group joins the one shared
// group and resumes its unacked entries; order after a nak is not kept (a delayed copy goes
// through the group's retry stream), so the in-order check is not claimed.
func TestWatermillRedis(t *testing.T) {
	t.Parallel()
	watermillsuite.Run(t, redisHarness(t), tests.Features{ConsumerGroups: true, Persistent: true, ForceShort: true})
}
