package connect

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemredis"
)

// BrokerRedis is Redis Streams (--broker redis://USER:PASSWORD@HOST:PORT/DB, or rediss://).
const BrokerRedis = "redis"

// parseRedis parses a redis:// or rediss:// broker URL; ok is false for any other scheme.
func parseRedis(raw string) (bu BrokerURL, ok bool, err error) {
	scheme, _, found := strings.Cut(raw, "://")
	if !found || !strings.EqualFold(scheme, "redis") && !strings.EqualFold(scheme, "rediss") {
		return BrokerURL{}, false, nil
	}
	// go-redis accepts only lower-case schemes.
	raw = strings.ToLower(scheme) + raw[len(scheme):]
	if _, err := redis.ParseURL(raw); err != nil {
		return BrokerURL{}, true, fmt.Errorf("broker URL %q: %s", redactDSN(raw), redactErr(err))
	}
	return BrokerURL{Kind: BrokerRedis, URL: raw}, true, nil
}

// NewRedisClient returns a client for a redis:// or rediss:// URL that ParseBroker accepted,
// named so that CLIENT LIST shows who is connected.
func NewRedisClient(bu BrokerURL, name string) (*redis.Client, error) {
	opts, err := redis.ParseURL(bu.URL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %q: %s", bu, redactErr(err))
	}
	if name == "" {
		name = "idem"
	}
	opts.ClientName = strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' {
			return '-'
		}
		return r
	}, name)
	return redis.NewClient(opts), nil
}

// openRedis connects a sink to Redis and checks that the server answers. The sink adds the
// outbox topic's events to the stream idem:<topic>, deduplicating republishes within its window;
// go-redis dials again by itself after a lost connection, so Reconnect needs nothing more.
func openRedis(ctx context.Context, bu BrokerURL, opts BrokerOptions) (*idemredis.Sink, func(), error) {
	rdb, err := NewRedisClient(bu, opts.Name)
	if err != nil {
		return nil, nil, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, nil, notReached("broker", bu, err)
	}
	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return sink, func() { _ = sink.Close(); _ = rdb.Close() }, nil
}
