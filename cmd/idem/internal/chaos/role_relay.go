package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/retry"
)

// relayRetry never gives up on a row within a run: a broker restart or a cut must delay a
// publish, not turn it into a relay dead letter.
var relayRetry = retry.Policy{MaxAttempts: 100000, MaxElapsed: 6 * time.Hour, Base: 50 * time.Millisecond, Cap: time.Second}

// runRelay publishes the run's outbox to JetStream until ctx ends. A killed relay leaves its
// leases behind; they expire after LeaseTTL and another relay (or its restart) takes over.
func runRelay(ctx context.Context, a RoleArgs, st *stats) error {
	store, err := openRoleStore(ctx, a, 4)
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	defer store.close()
	sink, closeSink, err := relaySink(ctx, a, st)
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	defer closeSink()
	relay, err := store.newRelay(sink, idemrelay.Config{
		BatchSize:    100,
		PollInterval: 200 * time.Millisecond,
		LeaseTTL:     3 * time.Second,
		Retry:        relayRetry,
		Retention:    24 * time.Hour, // keep published rows: the verdict reads them
		Logger:       a.Logger,
	})
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	return relay.Run(ctx)
}

// relaySink is the relay's sink on the run's broker. On NATS the broker refuses a message of a
// pipelined batch now and then (refusingJetStream); RabbitMQ's and Redis's sinks do not
// pipeline that way, and their broker faults are connection kills instead.
func relaySink(ctx context.Context, a RoleArgs, st *stats) (idem.Sink, func(), error) {
	if a.BrokerURL != "" {
		b, err := openRoleBroker(a)
		if err != nil {
			return nil, nil, err
		}
		// The broker may be down when the process starts: keep trying.
		for failures := 1; ; failures++ {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			sink, err := b.sink(sctx)
			cancel()
			if err == nil {
				return sink, func() { closeQuietly(sink); b.close() }, nil
			}
			if ctx.Err() != nil || !sleepCtx(ctx, backoff(failures)) {
				b.close()
				return nil, nil, fmt.Errorf("open sink: %w", err)
			}
			a.Logger.LogAttrs(ctx, slog.LevelWarn, "chaos: relay: open sink", slog.String("error", err.Error()))
		}
	}
	js, closeNATS, err := connectJetStream(a.NATSURL, a.Name)
	if err != nil {
		return nil, nil, err
	}
	sink := idemnats.NewSink(&refusingJetStream{JetStream: js, seed: a.Seed, rate: a.Transient * sinkRefusalShare, stats: st, refused: map[string]bool{}})
	return sink, closeNATS, nil
}

// closeQuietly closes v when it has a Close method.
func closeQuietly(v any) {
	if c, ok := v.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// refusingJetStream is the relay's JetStream with a broker that now and then refuses one
// message of a pipelined batch: the message is not stored and its PubAck future fails, while
// the messages sent after it in the same batch go on. Which messages are refused is a function
// of the seed and the broker message id alone (the first pipelined publish of each chosen
// message, once per relay process), so the relay's retry gets it through.
type refusingJetStream struct {
	jetstream.JetStream
	seed  int64
	rate  float64
	stats *stats

	mu      sync.Mutex
	refused map[string]bool
}

// errRefused is the refusal's error, as a broker that refused to store a message reports it.
var errRefused = errors.New("nats: message refused by the stream (injected by idem chaos)")

// PublishMsgAsync is the pipelined publish the sink uses for batches of more than one message.
func (j *refusingJetStream) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	id := msg.Header.Get(jetstream.MsgIDHeader)
	if injectTransient(j.seed^sinkRefusalSalt, j.rate, id) {
		j.mu.Lock()
		first := !j.refused[id]
		j.refused[id] = true
		j.mu.Unlock()
		if first {
			j.stats.add("sink_refused", 1)
			return refusedFuture(msg), nil
		}
	}
	return j.JetStream.PublishMsgAsync(msg, opts...)
}

// sinkRefusalShare scales the transient rate down to the refusal rate per pipelined message
// (0.5% at the default 5%): a refused message makes the relay publish the rest of its batch
// one row at a time, so a batch of ~60 rows should meet one now and then, not nearly always.
const sinkRefusalShare = 0.1

// sinkRefusalSalt makes the refusal decision independent of the transient-failure one.
const sinkRefusalSalt = 0x5eed_51c4

// refusedFuture is the future of a refused message: its error is ready, no PubAck comes.
func refusedFuture(msg *nats.Msg) jetstream.PubAckFuture {
	f := &failedFuture{msg: msg, err: make(chan error, 1)}
	f.err <- errRefused
	return f
}

type failedFuture struct {
	msg *nats.Msg
	err chan error
}

func (f *failedFuture) Ok() <-chan *jetstream.PubAck { return nil }
func (f *failedFuture) Err() <-chan error            { return f.err }
func (f *failedFuture) Msg() *nats.Msg               { return f.msg }
