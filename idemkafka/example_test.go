package idemkafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkafka"
)

// Example publishes an event with its order id as the Kafka key and receives it through a
// consumer group. A consumer would run idem.Consumer.Run on the Source; here the delivery is
// acked by hand. It needs a Kafka cluster (the tests use franz-go's kfake), so it has no output.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers := kgo.SeedBrokers("localhost:9092")

	producer, err := kgo.NewClient(brokers) // idempotent, acks from all in-sync replicas
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	sink, err := idemkafka.NewSink(producer, idemkafka.SinkConfig{})
	if err != nil {
		log.Fatal(err)
	}
	err = sink.Publish(ctx, "payments", idem.Message{
		EventID: "pay-123-captured",
		Tenant:  "acme",
		Type:    "payment.captured",
		Payload: []byte(`{"order":"o-1","amount_cents":1250}`),
		// The ordering key: every event of order o-1 goes to one partition, in order.
		Headers: map[string]string{idemkafka.HeaderKey: "o-1"},
	})
	if err != nil {
		log.Fatal(err)
	}

	// The group's retry topics (idemkafka.RetryTopics: payments.retry.ledger.1000ms, …) must
	// exist, like the topic.
	src, err := idemkafka.NewSource(ctx, idemkafka.SourceConfig{
		Topic:         "payments",
		Group:         "ledger",
		ClientOptions: []kgo.Opt{brokers},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	ds, err := src.Receive(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		fmt.Println(d.Message().EventID, d.Message().Attempt)
		_ = d.Ack(ctx) // the offset is committed once every earlier record settled too
	}
}
