package idemredis_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredis"
)

// The ledger consumes the stream idem:payments in its own consumer group, and a relay (or any
// producer) adds events to it through a Sink. It needs a Redis server, so it only compiles.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	sink, err := idemredis.NewSink(rdb, idemredis.SinkConfig{})
	if err != nil {
		log.Fatal(err)
	}
	err = sink.Publish(ctx, "payments", idem.Message{
		EventID: "pay-123/captured", Tenant: "acme", Type: "payment.captured",
		Payload: []byte(`{"order":"o-1","amount_cents":1250}`),
	})
	if err != nil {
		log.Fatal(err)
	}

	src, err := idemredis.NewSource(ctx, rdb, idemredis.SourceConfig{
		Stream: "payments",
		Group:  "ledger@v1",
		Lease:  30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	// consumer.Run(ctx, src) receives, extends the lease while the handler runs, and acks after
	// the handler's transaction committed; by hand:
	ds, err := src.Receive(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		log.Printf("event %s, attempt %d", d.Message().EventID, d.Message().Attempt)
		if err := d.Ack(ctx); err != nil {
			log.Fatal(err)
		}
	}
}
