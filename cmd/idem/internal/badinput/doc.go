// Package badinput holds the bad-input catalogue: one table-driven, end-to-end test that sends
// every kind of malformed, unauthenticated or abusive message through a real transport (the
// queue table on SQLite, PostgreSQL and MariaDB, NATS JetStream, RabbitMQ, Redis Streams, SQS,
// and Kafka and Pub/Sub on their in-process fakes) into a consumer with an idemauth
// Verifier and an idemschema Validator, and checks that each becomes exactly one dead letter
// with the right reason and a message a person can act on — with no effect, no retry, and the
// consumer still serving the next message. The package has no code of its own.
package badinput
