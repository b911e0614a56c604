package e2e_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/watermillsuite"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// amqpSourceConfig is every e2e source on queue; its queues expire ten minutes after a crashed
// test left them unused.
func amqpSourceConfig(queue string, lease time.Duration) idemamqp.SourceConfig {
	return idemamqp.SourceConfig{
		Queue:          queue,
		Lease:          lease,
		MessageTTL:     10 * time.Minute, // bounds the redelivery window, which Run checks
		QueueArgs:      amqp.Table{"x-expires": int64(10 * 60 * 1000)},
		DelayQueueArgs: amqp.Table{"x-expires": int64(10 * 60 * 1000)},
		ReconnectMin:   20 * time.Millisecond,
		ReconnectMax:   500 * time.Millisecond,
	}
}

// amqpDeclare declares queue and its delay queues (so a sink can publish to it before a source
// opens), deleting them when tb ends.
func amqpDeclare(tb testing.TB, dial idemamqp.Dialer, cfg idemamqp.SourceConfig) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := idemamqp.NewSource(ctx, dial, cfg)
	if err != nil {
		tb.Fatalf("declare queue %s: %v", cfg.Queue, err)
	}
	_ = src.Close()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := dial(ctx)
		if err != nil {
			tb.Errorf("delete queue %s: %v", cfg.Queue, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			tb.Errorf("delete queue %s: %v", cfg.Queue, err)
			return
		}
		names := []string{cfg.Queue}
		for _, tier := range idemamqp.DelayTiersDefault {
			names = append(names, idemamqp.DelayQueueName(cfg.Queue, tier))
		}
		for _, n := range names {
			if _, err := ch.QueueDelete(n, false, false, false); err != nil {
				tb.Errorf("delete queue %s: %v", n, err)
				return
			}
		}
	})
}

// amqpHarness connects to IDEM_AMQP_URL (or skips) and gives each topic a queue of its own,
// routed to by name through the default exchange.
func amqpHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	dial := idemamqp.DialURL(testenv.AMQP(tb), "idem-e2e "+tb.Name())
	return transporttest.Harness{
		Features: transporttest.Features{DelayedNak: true, Persistent: true},
		NewTopic: func(tb testing.TB) string {
			q := "ideme2e." + testdb.Name("")
			amqpDeclare(tb, dial, amqpSourceConfig(q, time.Second))
			return q
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			src, err := idemamqp.NewSource(ctx, dial, amqpSourceConfig(topic, lease))
			if err != nil {
				tb.Fatalf("source on %s: %v", topic, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sink, err := idemamqp.NewSink(ctx, dial, idemamqp.SinkConfig{})
			if err != nil {
				tb.Fatalf("sink: %v", err)
			}
			tb.Cleanup(func() { _ = sink.Close() })
			return sink
		},
	}
}

func TestRuntimeSQLiteAMQP(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresAMQP")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return sqliteBundle(tb), amqpHarness(tb)
	})
}

func TestRuntimeBatchedSQLiteAMQP(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresAMQP and TestRuntimeBatchedMySQLNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return sqliteBundle(tb), amqpHarness(tb)
	}, consumertest.Batched(10))
}

func TestRuntimePostgresAMQP(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		return pgBundle(tb), amqpHarness(tb)
	})
}

// killer is a Dialer that keeps its connections so the test can kill them under the consumer.
type killer struct {
	dial  idemamqp.Dialer
	mu    sync.Mutex
	conns []*amqp.Connection
}

func (k *killer) Dial(ctx context.Context) (*amqp.Connection, error) {
	c, err := k.dial(ctx)
	if err == nil {
		k.mu.Lock()
		k.conns = append(k.conns, c)
		k.mu.Unlock()
	}
	return c, err
}

func (k *killer) kill() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, c := range k.conns {
		if !c.IsClosed() {
			_ = c.Close()
			n++
		}
	}
	return n
}

// TestAMQPConnectionLossAppliesOnce: the consumer runs while its connection is killed again and
// again. Deliveries in hand when their channel died cannot be acked; the broker redelivers them
// flagged redelivered, and the claim recognises those already committed. Every event is applied
// exactly once, none is lost, and the consumer keeps going on each new connection.
func TestAMQPConnectionLossAppliesOnce(t *testing.T) {
	t.Parallel()
	const n, kills = 300, 5
	_, b := testdb.SQLite(t)
	ctx := context.Background()
	require.NoError(t, b.CreateWallet(ctx, "w1"))
	k := &killer{dial: idemamqp.DialURL(testenv.AMQP(t), "idem-e2e "+t.Name())}
	queue := "ideme2e." + testdb.Name("")
	cfg := amqpSourceConfig(queue, 1500*time.Millisecond)
	cfg.Prefetch = 20
	amqpDeclare(t, k.dial, cfg)
	src, err := idemamqp.NewSource(ctx, k.Dial, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	sink, err := idemamqp.NewSink(ctx, k.dial, idemamqp.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })

	credit := storetest.CreditHandler(b)
	rec := &consumertest.Recorder{}
	// The kills happen while a handler is in its transaction: the first delivery of each of
	// these events asks the test to kill the connection and waits until it has, so that the
	// kills do not depend on how fast the consumer is (a fast one finished all 300 events
	// between two polls of a progress-driven loop, and only one kill happened).
	killAt := map[string]bool{}
	for j := 1; j <= kills; j++ {
		killAt[fmt.Sprintf("evt-%03d", j*n/(kills+1))] = true
	}
	var asked sync.Map
	killNow := make(chan chan struct{})
	c, err := idem.NewConsumer(b.Store, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			time.Sleep(2 * time.Millisecond) // keep deliveries in hand long enough to be caught by a kill
			if _, again := asked.LoadOrStore(msg.EventID, true); killAt[msg.EventID] && !again {
				done := make(chan struct{})
				select {
				case killNow <- done:
					<-done
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return credit(ctx, tx, msg)
		},
		Workers: 4,
		Failure: idem.FailureConfig{
			Retry: retry.Policy{MaxAttempts: 10, MaxElapsed: time.Minute, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond},
		},
		Claims: idem.ClaimConfig{
			Retention:        48 * time.Hour,
			RedeliveryWindow: 24 * time.Hour, // covers the source's: TTL + longest delay tier + consumer_timeout
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
	require.NoError(t, sink.Publish(ctx, queue, msgs...))

	killed := 0
	deadline := time.Now().Add(60 * time.Second)
	for rec.Count(idem.OutcomeProcessed, "") < n {
		require.True(t, time.Now().Before(deadline), "processed %d of %d", rec.Count(idem.OutcomeProcessed, ""), n)
		select {
		case done := <-killNow:
			killed += k.kill()
			close(done)
		case <-time.After(5 * time.Millisecond):
		}
	}
	time.Sleep(2 * time.Second) // anything still coming back must be a duplicate
	cancel()
	require.NoError(t, <-done)

	require.Equal(t, kills, killed)
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
	t.Logf("%d events, %d connection kills: %d processed, %d duplicates, %d abandoned, %d retried",
		n, killed, rec.Count(idem.OutcomeProcessed, ""), rec.Count(idem.OutcomeDuplicate, ""),
		rec.Count(idem.OutcomeAbandoned, ""), rec.Count(idem.OutcomeRetried, ""))
}

// TestAMQPRelayKeepsKeyOrder: the outbox relay publishes through the AMQP sink, and a consumer
// of the queue sees every key's events in the order they were enqueued.
func TestAMQPRelayKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	const keys, perKey = 5, 40
	store, _ := testdb.SQLite(t)
	ctx := context.Background()
	dial := idemamqp.DialURL(testenv.AMQP(t), "idem-e2e "+t.Name())
	queue := "ideme2e." + testdb.Name("")
	cfg := amqpSourceConfig(queue, 10*time.Second)
	amqpDeclare(t, dial, cfg)
	sink, err := idemamqp.NewSink(ctx, dial, idemamqp.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })

	// Enqueue the keys interleaved, one transaction each.
	for i := range perKey {
		for k := range keys {
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return store.EnqueueTx(ctx, tx, idem.Outgoing{
					EventID: fmt.Sprintf("k%d-%03d", k, i), Topic: queue, Key: fmt.Sprintf("k%d", k),
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

	src, err := idemamqp.NewSource(ctx, dial, cfg)
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

// TestWatermillAMQP: Watermill's universal suite over RabbitMQ. As on the queue table, every
// consumer name of a topic shares its one queue (competing consumers, no fan-out), so consumer
// groups are not claimed; the queue persists what is not acked; order after a nak is not kept
// (the copy goes through a delay queue), so the in-order check is not claimed either.
func TestWatermillAMQP(t *testing.T) {
	t.Parallel()
	watermillsuite.Run(t, amqpHarness(t), tests.Features{Persistent: true, ForceShort: true})
}
