package demo

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemredis"
)

// redisBroker reads the stream "idem:demo.payments.<run id>" on the Redis server at bu through
// a consumer group of this run. The relay adds to it with XADD. Closing it deletes the run's
// keys (the stream, the group's retry stream and delayed set, the dedup keys).
func redisBroker(ctx context.Context, bu connect.BrokerURL, runID string) (*broker, error) {
	topic := "demo.payments." + runID
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rdb, err := connect.NewRedisClient(bu, "idem demo")
	if err != nil {
		return nil, err
	}
	if err := rdb.Ping(sctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	src, err := idemredis.NewSource(sctx, rdb, idemredis.SourceConfig{
		Stream: topic,
		Group:  "ledger",
		Lease:  lease,
		Poll:   pollWait,
	})
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{})
	if err != nil {
		_ = src.Close()
		_ = rdb.Close()
		return nil, err
	}
	// A copy or a key-reuse message gets a broker message id of its own, so that the sink's
	// deduplication lets it through and the consumer's claims are what drop it.
	var copies atomic.Int64
	again := func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
		out := make([]idem.Message, len(msgs))
		for i, m := range msgs {
			m = m.Clone()
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[idemredis.HeaderBrokerMsgID] = m.EventID + "~copy~" + strconv.FormatInt(copies.Add(1), 10)
			out[i] = m
		}
		if err := sink.Publish(ctx, topic, out...); err != nil {
			return 0, 0, err
		}
		return len(out), 0, nil
	}
	return &broker{
		topic:  topic,
		source: src,
		sink:   sink,
		again:  again,
		reuse: func(ctx context.Context, topic string, msgs []idem.Message) error {
			_, _, err := again(ctx, topic, msgs)
			return err
		},
		// The run's stream holds only this run's events and is deleted after it, so idem's
		// default redelivery window covers it.
		backlog: func(ctx context.Context) (int, error) {
			n, err := src.Backlog(ctx)
			return int(n), err
		},
		close: func() {
			_ = src.Close()
			_ = sink.Close()
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			key := sink.StreamKey(topic)
			var keys []string
			iter := rdb.Scan(cctx, 0, key+"*", 1000).Iterator()
			for iter.Next(cctx) {
				keys = append(keys, iter.Val())
			}
			if len(keys) > 0 {
				_ = rdb.Del(cctx, keys...).Err()
			}
			_ = rdb.Close()
		},
	}, nil
}
