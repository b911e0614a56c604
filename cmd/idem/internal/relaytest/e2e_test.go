package relaytest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/retry"
)

// connectJS opens a JetStream client on IDEM_NATS_URL (or skips), closed when tb ends.
func connectJS(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	url := testenv.NATS(tb)
	nc, err := nats.Connect(url, nats.Name("idemrelay-test"), nats.Timeout(5*time.Second))
	require.NoError(tb, err, "connect to %s", url)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	return js
}

// testStream creates a memory stream IDEMRELAY_<hex> with the given duplicate window, deleted
// when tb ends, and returns its name and a subject it captures.
func testStream(tb testing.TB, js jetstream.JetStream, duplicates time.Duration) (stream, subject string) {
	tb.Helper()
	id := randomHex(tb, 8)
	stream = "IDEMRELAY_" + id
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{"idemrelay." + id + ".>"},
		Storage:    jetstream.MemoryStorage,
		MaxAge:     10 * time.Minute, // a stream a crashed test leaves behind expires
		Duplicates: duplicates,
	})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			tb.Errorf("delete stream %s: %v", stream, err)
		}
	})
	return stream, "idemrelay." + id + ".payments"
}

// crashAfterPublish publishes through the real sink, then kills its relay before the mark.
type crashAfterPublish struct {
	idem.Sink
	kill context.CancelFunc
}

func (c crashAfterPublish) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if err := c.Sink.Publish(ctx, topic, msgs...); err != nil {
		return err
	}
	c.kill()
	return context.Canceled
}

// outcomes counts a consumer's settled deliveries by outcome.
type outcomes struct {
	mu sync.Mutex
	n  map[idem.Outcome]int
}

func (o *outcomes) Observe(ev idem.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[idem.Outcome]int{}
	}
	o.n[ev.Outcome]++
}

func (o *outcomes) Paused(string) {}

func (o *outcomes) get(out idem.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

// End to end on PostgreSQL and JetStream: the producer writes its order and the payment event in
// one transaction; relay r1 publishes the event and dies before marking it; r2 takes over after
// the lease and publishes it again, past JetStream's duplicate window, so the stream holds two
// copies. The consumer — whose handler appends to a ledger without a unique key and adds to a
// balance — applies the effect once.
func TestEndToEndCrashedRelayEffectAppliesOnce(t *testing.T) {
	t.Parallel()
	js := connectJS(t)
	env := newPG(t, storeCfg{maxConns: 10})
	store, pool, schema := env.store, env.pool, env.schema
	ctx := ctxT(t, 30*time.Second)
	_, err := pool.Exec(ctx, `
		CREATE TABLE `+schema+`.orders (id text PRIMARY KEY, status text NOT NULL);
		CREATE TABLE `+schema+`.wallets (id text PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE `+schema+`.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, wallet text NOT NULL, amount bigint NOT NULL);
		INSERT INTO `+schema+`.wallets VALUES ('w1', 0);`)
	require.NoError(t, err)
	const dupWindow = 100 * time.Millisecond
	stream, subject := testStream(t, js, dupWindow)

	// Producer: business write and outbox row in one transaction.
	payload, _ := json.Marshal(map[string]any{"wallet": "w1", "amount": 5})
	require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders VALUES ('o1', 'paid')`); err != nil {
			return err
		}
		return store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "pay-1", Tenant: "acme", Topic: subject, Key: "o1",
			Type: "payment.captured", Payload: payload})
	}))

	sink := idemnats.NewSink(js)
	const ttl = 500 * time.Millisecond
	r1ctx, kill := context.WithCancel(ctx)
	defer kill()
	crashing := &crashStore{OutboxRelayStore: store}
	die := func() { crashing.crash(); kill() }
	r1 := newRelay(t, crashing, store, crashAfterPublish{Sink: sink, kill: die}, func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "r1", ttl })
	require.NoError(t, r1.Run(r1ctx))

	var pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`."idem_outbox" WHERE published_at IS NULL`).Scan(&pending))
	require.Equal(t, 1, pending, "r1 died between publish and mark")

	r2 := newRelay(t, env.anotherFn(t), store, sink, func(c *idemrelay.Config) { c.ID, c.LeaseTTL = "r2", ttl })
	start(t, r2)
	eventually(t, 10*time.Second, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`."idem_outbox" WHERE published_at IS NOT NULL`).Scan(&n))
		return n == 1
	}, "r2 republishes pay-1")
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, info.State.Msgs, "both copies reached the stream (the second came after the duplicate window)")

	// Consumer: claim and effect in one transaction.
	obs := &outcomes{}
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			var p struct {
				Wallet string `json:"wallet"`
				Amount int64  `json:"amount"`
			}
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return idem.Permanent(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.ledger (event_id, wallet, amount) VALUES ($1, $2, $3)`,
				msg.EventID, p.Wallet, p.Amount); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `UPDATE `+schema+`.wallets SET balance = balance + $2 WHERE id = $1`, p.Wallet, p.Amount)
			if err != nil {
				return err
			}
			return idem.ExpectRows(tag.RowsAffected(), 1)
		},
		Claims: idem.ClaimConfig{
			RedeliveryWindow: time.Hour,
			Retention:        48 * time.Hour,
		},
		Observe: idem.ObserveConfig{
			Observer: obs,
			Logger:   logger(),
		},
	})
	require.NoError(t, err)
	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Durable: "ledger", AckWait: 5 * time.Second, MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	cctx, stopConsumer := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(cctx, src) }()
	eventually(t, 10*time.Second, func() bool {
		return obs.get(idem.OutcomeProcessed)+obs.get(idem.OutcomeDuplicate) == 2
	}, "the consumer settles both copies")
	stopConsumer()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("consumer did not stop")
	}
	require.NoError(t, src.Close())

	require.Equal(t, 1, obs.get(idem.OutcomeProcessed))
	require.Equal(t, 1, obs.get(idem.OutcomeDuplicate))
	var ledger, balance int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.ledger WHERE event_id = 'pay-1'`).Scan(&ledger))
	require.NoError(t, pool.QueryRow(ctx, `SELECT balance FROM `+schema+`.wallets WHERE id = 'w1'`).Scan(&balance))
	require.EqualValues(t, 1, ledger, "one ledger row")
	require.EqualValues(t, 5, balance, "credited once")
}

// TestEndToEndRefusedRowHoldsItsKeyOnNATS: JetStream refuses one row of a batch (bigger than the
// stream's MaxMsgSize) while idemnats pipelines the batch. The key's later row must not reach
// the stream before it; another key's row does. Fails when a key's rows share a Publish call.
func TestEndToEndRefusedRowHoldsItsKeyOnNATS(t *testing.T) {
	t.Parallel()
	js := connectJS(t)
	k := newSQLite(t, storeCfg{})
	ctx := ctxT(t, 30*time.Second)
	id := randomHex(t, 8)
	stream := "IDEMRELAY_" + id
	_, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: stream, Subjects: []string{"idemrelay." + id + ".>"}, Storage: jetstream.MemoryStorage,
		MaxAge: 10 * time.Minute, MaxMsgSize: 1 << 10,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	subject := "idemrelay." + id + ".orders"

	big := ev("a-1", "a", subject)
	big.Payload = make([]byte, 4<<10)
	k.enqueue(t, big, ev("a-2", "a", subject), ev("b-1", "b", subject))
	r := newRelay(t, k.store, k.dlq, idemnats.NewSink(js), func(c *idemrelay.Config) {
		c.Retry = retry.Policy{MaxAttempts: 2, MaxElapsed: time.Minute, Base: time.Millisecond, Cap: time.Millisecond}
	})
	for range 5 {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	require.True(t, k.row(ctx, "a-1").Dead, "the refused row is dead after its budget")

	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	var got []string
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		got = append(got, m.Header.Get(idemnats.HeaderEventID))
	}
	require.Equal(t, []string{"b-1"}, got, "a-2 waits behind its refused, dead a-1; b-1 goes on")
	require.NoError(t, r.Release(ctx))
}
