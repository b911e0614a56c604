package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemstore"
)

// Fixed settings of the scenario, chosen so that redeliveries and retries show up within
// seconds.
const (
	// lease is the queue-table lease and JetStream AckWait: a lost ack comes back after it.
	lease = 2 * time.Second
	// pollWait bounds an idle wait for new deliveries, so that delayed retries (which notify
	// nobody) are picked up promptly.
	pollWait = 100 * time.Millisecond
	// natsStreamDefault and natsRootDefault name the stream the demo creates and the subjects
	// it captures; each run publishes to <root>.payments.<run id> and reads with its own durable.
	natsStreamDefault = "IDEM_DEMO"
	natsRootDefault   = "idem.demo"
	// natsMaxAge bounds how long the stream keeps a run's messages (they are purged after the run
	// anyway); it is also the redelivery window the consumer's retention must cover.
	natsMaxAge = time.Hour
	// natsDuplicateWindow is the stream's deduplication window (the server's default). JetStream
	// drops a message whose Nats-Msg-Id it stored within the window, so the demo's deliberate
	// copies and key-reuse messages go out under another broker message id
	// (idemnats.HeaderBrokerMsgID) with the same event id.
	natsDuplicateWindow = 2 * time.Minute
)

// broker is the transport of one run.
type broker struct {
	// topic is the outbox topic: the queue name or the subject.
	topic  string
	source idem.Source
	sink   idem.Sink
	// again publishes injected duplicates (see chaosSink).
	again func(ctx context.Context, topic string, msgs []idem.Message) (sent, dropped int, err error)
	// reuse, when set, publishes key-reuse messages past the broker's deduplication.
	reuse func(ctx context.Context, topic string, msgs []idem.Message) error
	// redelivery is the consumer's RedeliveryWindow (0: idem's default).
	redelivery time.Duration
	// fanout, when set, is the e-mail consumer's source: a subscription of its own to topic,
	// receiving every event the ledger's source does (--fanout).
	fanout idem.Source
	// backlog reports messages the broker still holds for the run's consumers.
	backlog func(ctx context.Context) (int, error)
	close   func()
}

// queueBroker is the queue table in the store: per-run queue "demo.payments.<run id>". With
// fanout the queue is a topic with two subscriptions, "ledger" (source) and "email" (fanout),
// registered before anything is published, so each receives every event.
func queueBroker[TTx any](ctx context.Context, store idemstore.QueueTxStore[TTx], runID string, fanout bool) (*broker, error) {
	queue := "demo.payments." + runID
	open := func(subscription string) (*idemqueue.Source[TTx], error) {
		src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: queue, Subscription: subscription, Lease: lease, MaxWait: pollWait})
		if err != nil {
			return nil, err
		}
		return src, src.Subscribe(ctx)
	}
	var (
		src, email *idemqueue.Source[TTx]
		err        error
	)
	queues := []string{queue}
	if fanout {
		if email, err = open(emailSubscription); err != nil {
			return nil, err
		}
		if src, err = open(ledgerSubscription); err != nil {
			return nil, err
		}
		queues = append(queues, queue+idemstore.SubscriptionSeparator+ledgerSubscription, queue+idemstore.SubscriptionSeparator+emailSubscription)
	} else if src, err = open(""); err != nil {
		return nil, err
	}
	sink := idemqueue.NewSink(store)
	b := &broker{
		topic:  queue,
		source: src,
		sink:   sink,
		again: func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
			if err := sink.Publish(ctx, topic, msgs...); err != nil {
				return 0, 0, err
			}
			return len(msgs), 0, nil
		},
		backlog: func(ctx context.Context) (int, error) {
			n := 0
			for _, q := range queues {
				st, err := store.QueueStats(ctx, q)
				if err != nil {
					return n, err
				}
				n += int(st.Backlog)
			}
			return n, nil
		},
		close: func() { _ = src.Close() },
	}
	if email != nil {
		b.fanout = email
	}
	return b, nil
}

// natsBroker creates (or updates) the demo's stream and a durable for this run on the JetStream
// server at url. Closing it deletes the durable and purges the run's subject.
func natsBroker(ctx context.Context, url, stream, root, runID string) (*broker, error) {
	nc, err := nats.Connect(url, nats.Name("idem demo"), nats.Timeout(5*time.Second), nats.RetryOnFailedConnect(false))
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := idemnats.EnsureStream(sctx, js, jetstream.StreamConfig{
		Name:        stream,
		Description: "idem demo: payment.captured events, one subject per run",
		Subjects:    []string{root + ".>"},
		MaxAge:      natsMaxAge,
		Duplicates:  natsDuplicateWindow,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	subject := root + ".payments." + runID
	durable := "ledger-" + runID
	src, err := idemnats.NewSource(sctx, js, idemnats.SourceConfig{
		Stream:  stream,
		Subject: subject,
		Durable: durable,
		AckWait: lease,
		MaxWait: 500 * time.Millisecond,
	})
	if err != nil {
		return nil, err
	}
	cons, err := js.Consumer(sctx, stream, durable)
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", durable, err)
	}
	ok = true
	b := &broker{
		topic:      subject,
		source:     src,
		sink:       idemnats.NewSink(js),
		again:      natsAgain(js, "~copy"),
		redelivery: idemnats.RedeliveryWindow(st.CachedInfo()),
		backlog: func(ctx context.Context) (int, error) {
			info, err := cons.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int(info.NumPending) + info.NumAckPending, nil
		},
		close: func() {
			_ = src.Close()
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(cctx, stream, durable)
			_ = st.Purge(cctx, jetstream.WithPurgeSubject(subject))
			nc.Close()
		},
	}
	again := natsAgain(js, "~reuse")
	b.reuse = func(ctx context.Context, topic string, msgs []idem.Message) error {
		_, _, err := again(ctx, topic, msgs)
		return err
	}
	return b, nil
}

// natsAgain publishes messages one by one under the broker message id "<event id><suffix>"
// (idemnats.HeaderBrokerMsgID; the event id is unchanged), and counts those the stream still
// reports as duplicates.
func natsAgain(js jetstream.JetStream, suffix string) func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
	return func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
		sent, dropped := 0, 0
		var errs []error
		for _, m := range msgs {
			m = m.Clone()
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[idemnats.HeaderBrokerMsgID] = m.EventID + suffix
			nm, err := idemnats.EncodeMessage(topic, m)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ack, err := js.PublishMsg(ctx, nm)
			if err != nil {
				errs = append(errs, fmt.Errorf("event %s: %w", m.EventID, err))
				continue
			}
			sent++
			if ack.Duplicate {
				dropped++
			}
		}
		return sent, dropped, errors.Join(errs...)
	}
}
