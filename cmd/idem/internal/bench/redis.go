package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemredis"
)

// pipelineRedis runs the pipeline over a fresh Redis stream, deleted afterwards.
func (e *env) pipelineRedis(ctx context.Context, workers, batch int) (Result, error) {
	return e.brokerPipeline(ctx, "pipeline_redis", workers, batch, e.openRedis)
}

// openRedis reads the stream topic, in one consumer group, on the server of Options.RedisURL.
func (e *env) openRedis(ctx context.Context, topic string) (brokerCase, error) {
	bu, err := connect.ParseBroker(e.opts.RedisURL)
	if err != nil {
		return brokerCase{}, err
	}
	if bu.Kind != connect.BrokerRedis {
		return brokerCase{}, fmt.Errorf("broker %s is not redis://", bu)
	}
	rdb, err := connect.NewRedisClient(bu, "idem bench")
	if err != nil {
		return brokerCase{}, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return brokerCase{}, fmt.Errorf("connect to %s: %w", bu, err)
	}
	src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{Stream: topic, Group: "pipeline", Poll: 100 * time.Millisecond})
	if err != nil {
		_ = rdb.Close()
		return brokerCase{}, err
	}
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{})
	if err != nil {
		_ = src.Close()
		_ = rdb.Close()
		return brokerCase{}, err
	}
	return brokerCase{
		src: src,
		publish: func(ctx context.Context, msgs []idem.Message) error {
			return sink.Publish(ctx, topic, msgs...)
		},
		close: func() {
			_ = src.Close()
			_ = sink.Close()
			// The stream and the sink's dedup keys under it.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			var keys []string
			iter := rdb.Scan(cctx, 0, sink.StreamKey(topic)+"*", 1000).Iterator()
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
