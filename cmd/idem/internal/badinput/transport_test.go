package badinput_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemamqp"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemredis"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

// transport is one real broker as the catalogue uses it: the consumer's source, the producer's
// sink, and the two ways of publishing that a well-behaved sink refuses.
type transport struct {
	source idem.Source
	// publish sends msgs through the transport's idem.Sink.
	publish func(t *testing.T, msgs ...idem.Message)
	// publishWithoutID sends msg with no event id at all, as a foreign producer could; the sinks
	// refuse to.
	publishWithoutID func(t *testing.T, msg idem.Message)
	// publishAgain sends msg whose event id the transport has carried before, making sure the
	// broker's own deduplication does not drop it: a late redelivery of a reused id.
	publishAgain func(t *testing.T, msg idem.Message)
	// maxPayload is the largest payload the broker accepts (0: no limit of its own).
	maxPayload int
}

const lease = 1500 * time.Millisecond

// queueSource is the queue-table source the catalogue consumes from.
func queueSource[TTx any](t *testing.T, store idemstore.QueueTxStore[TTx], queue string) idem.Source {
	t.Helper()
	src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: queue, Lease: lease, MaxWait: 200 * time.Millisecond})
	require.NoError(t, err)
	return src
}

// sinkPublish publishes through sink on topic, failing the test on error.
func sinkPublish(sink idem.Sink, topic string) func(t *testing.T, msgs ...idem.Message) {
	return func(t *testing.T, msgs ...idem.Message) {
		t.Helper()
		require.NoError(t, sink.Publish(context.Background(), topic, msgs...))
	}
}

// sqliteQueue is the queue table of a SQLite store. A message without an event id is written
// with plain SQL, as a producer in another language writing the queue table would: both the
// sink and the store refuse to enqueue it.
func sqliteQueue(t *testing.T, store *idemsqlite.Store) transport {
	queue := testdb.Name("bad_")
	sink := idemqueue.NewSink(store)
	table := store.Config().WithDefaults().Prefix + "queue"
	tr := transport{
		source:  queueSource(t, store, queue),
		publish: sinkPublish(sink, queue),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			require.Error(t, sink.Publish(context.Background(), queue, m), "the sink refuses an empty event id")
			// Since migration 053 a writer takes the job's id from its queue's range, in the
			// transaction of the insert (docs/sqlite.md), as idemsqlite's own publish does.
			ctx, ranges := context.Background(), table+"_ranges"
			now := time.Now().UnixMicro()
			tx, err := store.DB().BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			_, err = tx.ExecContext(ctx, `INSERT INTO `+ranges+` (queue, base, last_id)
				SELECT ?1, m + (1 << 44), m + (1 << 44) FROM (SELECT coalesce(max(base), 0) AS m FROM `+ranges+`) WHERE true
				ON CONFLICT (queue) DO NOTHING`, queue)
			require.NoError(t, err, "give %s its id range", queue)
			var id int64
			require.NoError(t, tx.QueryRowContext(ctx, `UPDATE `+ranges+` SET last_id = last_id + 1 WHERE queue = ? RETURNING last_id`, queue).Scan(&id))
			_, err = tx.ExecContext(ctx,
				`INSERT INTO `+table+` (id, queue, event_id, tenant, type, payload, headers, enqueued_at, available_at)
				 VALUES (?, ?, '', ?, ?, ?, '{}', ?, ?)`, id, queue, m.Tenant, m.Type, m.Payload, now, now)
			require.NoError(t, err, "insert a job without event id into %s", table)
			require.NoError(t, tx.Commit())
		},
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// postgresQueue is the queue table of a PostgreSQL store; see sqliteQueue.
func postgresQueue(t *testing.T, store *idempg.Store) transport {
	queue := testdb.Name("bad_")
	sink := idemqueue.NewSink(store)
	cfg := store.Config().WithDefaults()
	table := `"` + cfg.Schema + `"."` + cfg.Prefix + `queue"`
	tr := transport{
		source:  queueSource(t, store, queue),
		publish: sinkPublish(sink, queue),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			require.Error(t, sink.Publish(context.Background(), queue, m), "the sink refuses an empty event id")
			_, err := store.Pool().Exec(context.Background(),
				`INSERT INTO `+table+` (queue, event_id, tenant, type, payload, headers, enqueued_at, available_at)
				 VALUES ($1, '', $2, $3, $4, '{}', now(), now())`, queue, m.Tenant, m.Type, m.Payload)
			require.NoError(t, err, "insert a job without event id into %s", table)
		},
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// mysqlQueue is the queue table of a MySQL store; see sqliteQueue.
func mysqlQueue(t *testing.T, store *idemmysql.Store) transport {
	queue := testdb.Name("bad_")
	sink := idemqueue.NewSink(store)
	table := "`" + store.Config().WithDefaults().Prefix + "queue`"
	tr := transport{
		source:  queueSource(t, store, queue),
		publish: sinkPublish(sink, queue),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			require.Error(t, sink.Publish(context.Background(), queue, m), "the sink refuses an empty event id")
			now := time.Now().UnixMicro()
			_, err := store.DB().ExecContext(context.Background(),
				`INSERT INTO `+table+` (queue, event_id, tenant, type, payload, headers, enqueued_at, available_at, last_error)
				 VALUES (?, '', ?, ?, ?, '{}', ?, ?, '')`, queue, m.Tenant, m.Type, m.Payload, now, now)
			require.NoError(t, err, "insert a job without event id into %s", table)
		},
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// jetStream is a fresh memory stream on IDEM_NATS_URL (or a skip), deleted when t ends. Its
// duplicate window is the shortest JetStream allows (100ms), so that a reused event id can be
// published again after it, as a late redelivery would be.
func jetStream(t *testing.T) transport {
	t.Helper()
	url := testenv.NATS(t)
	nc, err := nats.Connect(url, nats.Name("idem-badinput-test"), nats.Timeout(5*time.Second))
	require.NoError(t, err, "connect to %s", url)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	stream, subject := "IDEMBAD_"+id, "idembad."+id+".events"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{"idembad." + id + ".>"},
		Storage:    jetstream.MemoryStorage,
		MaxAge:     10 * time.Minute, // a stream a crashed test leaves behind expires
		Duplicates: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})
	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: subject, Durable: "ledger", AckWait: lease, MaxWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })

	sink := idemnats.NewSink(js)
	return transport{
		source:  src,
		publish: sinkPublish(sink, subject),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idemnats.EncodeMessage(subject, m)
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			nm, err := idemnats.EncodeMessage(subject, m)
			require.NoError(t, err)
			// Neither idem's event id nor JetStream's message id (from which a foreign
			// producer's event id is taken).
			nm.Header.Del(idemnats.HeaderEventID)
			nm.Header.Del(jetstream.MsgIDHeader)
			_, err = js.PublishMsg(context.Background(), nm)
			require.NoError(t, err)
		},
		publishAgain: func(t *testing.T, m idem.Message) {
			t.Helper()
			nm, err := idemnats.EncodeMessage(subject, m)
			require.NoError(t, err)
			deadline := time.Now().Add(10 * time.Second)
			for {
				ack, err := js.PublishMsg(context.Background(), nm)
				require.NoError(t, err)
				if !ack.Duplicate {
					return
				}
				require.True(t, time.Now().Before(deadline), "JetStream kept dropping event %s as a duplicate", m.EventID)
				time.Sleep(50 * time.Millisecond)
			}
		},
		maxPayload: int(nc.MaxPayload()),
	}
}

// rabbitMQ is a fresh work queue on IDEM_AMQP_URL (or a skip) with its delay queues, deleted
// when t ends. RabbitMQ does not deduplicate, so a reused event id is simply published again.
func rabbitMQ(t *testing.T) transport {
	t.Helper()
	dial := idemamqp.DialURL(testenv.AMQP(t), "idem-badinput-test")
	var b [8]byte
	_, _ = rand.Read(b[:])
	queue := "idembad." + hex.EncodeToString(b[:])
	expires := amqp.Table{"x-expires": int64(10 * 60 * 1000)} // a queue a crashed test leaves behind expires
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := idemamqp.NewSource(ctx, dial, idemamqp.SourceConfig{Queue: queue, Lease: lease, QueueArgs: expires, DelayQueueArgs: expires,
		MessageTTL: 10 * time.Minute}) // bounds the redelivery window, which Run checks
	require.NoError(t, err)
	conn, err := dial(ctx)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = src.Close()
		for _, tier := range idemamqp.DelayTiersDefault {
			_, _ = ch.QueueDelete(idemamqp.DelayQueueName(queue, tier), false, false, false)
		}
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
		}
		_ = conn.Close()
	})
	sink, err := idemamqp.NewSink(ctx, dial, idemamqp.SinkConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	tr := transport{
		source:  src,
		publish: sinkPublish(sink, queue),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idemamqp.EncodeMessage(m)
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			p, err := idemamqp.EncodeMessage(m)
			require.NoError(t, err)
			p.MessageId = "" // neither message_id nor Idem-Event-Id, as a foreign producer could send
			require.NoError(t, ch.PublishWithContext(context.Background(), "", queue, true, false, p))
		},
		// RabbitMQ's own limit (max_message_size) is 128 MiB by default, far above the catalogue's.
		maxPayload: 128 << 20,
	}
	tr.publishAgain = func(t *testing.T, m idem.Message) { tr.publish(t, m) }
	return tr
}

// redisStreams is a fresh stream on IDEM_REDIS_URL (or a skip) read by a consumer group, its
// keys deleted when t ends. The sink's deduplication is bypassed for a reused event id by a
// broker message id of its own.
func redisStreams(t *testing.T) transport {
	t.Helper()
	opts, err := redis.ParseURL(testenv.URL(t, testenv.RedisVar))
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "idembad:" + hex.EncodeToString(b[:]) + ":"
	const topic = "payments"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{
		Prefix: prefix, Stream: topic, Group: "ledger", Lease: lease, Poll: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	// The broker holds what the sink allows; above the consumer's own 1 MiB limit, so that the
	// catalogue's oversized payload reaches the consumer.
	const maxPayload = 8 << 20
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{Prefix: prefix, MaxPayload: maxPayload})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = src.Close()
		_ = sink.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var keys []string
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete keys under %s: %v", prefix, err)
			}
		}
		_ = rdb.Close()
	})
	tr := transport{
		source:  src,
		publish: sinkPublish(sink, topic),
		publishWithoutID: func(t *testing.T, m idem.Message) {
			t.Helper()
			_, err := idemredis.EncodeMessage(m)
			require.Error(t, err, "the sink refuses an empty event id")
			m.EventID = "placeholder"
			fields, err := idemredis.EncodeMessage(m)
			require.NoError(t, err)
			values := make([]any, 0, len(fields))
			for i := 0; i+1 < len(fields); i += 2 {
				if fields[i] != idemredis.FieldEventID { // no Idem-Event-Id, as a foreign producer could send
					values = append(values, fields[i], fields[i+1])
				}
			}
			require.NoError(t, rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: sink.StreamKey(topic), Values: values}).Err())
		},
		maxPayload: maxPayload,
	}
	var again int
	tr.publishAgain = func(t *testing.T, m idem.Message) {
		m = m.Clone()
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		again++
		m.Headers[idemredis.HeaderBrokerMsgID] = fmt.Sprintf("%s~again~%d", m.EventID, again)
		tr.publish(t, m)
	}
	return tr
}
